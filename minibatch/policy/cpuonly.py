"""EASY backfilling when only CPUs count: the general plan, found with less.

When no node reports memory or GPUs, no advance reservation is active and no job
asks for memory, GPUs, node features or a reservation (the classic simulated
machine: a trace on a pool of processors), EASY's availability profile reduces
to a few numbers, and :func:`plan` finds the very plan
:class:`~minibatch.policy.backfill.Backfill` (``depth=1``, first fit) finds with
the profile: the same starts on the same nodes, the same reservation, the same
reasons. ``tests/unit/test_policy_cpuonly.py`` compares the two on random
snapshots. Why it holds:

* Before the head's reservation nothing is reserved, so a job fits now where
  its nodes have the CPUs free now (first fit in node order).
* A node's free CPUs only rise after *now* (running jobs and jobs started in
  the pass give theirs back; a job past its requested end counts as giving
  them back at *now* for reservations, not for a start now). So each node's
  earliest start for the head is the first release that brings it to the
  head's CPUs, and the head starts when ``nodes`` of them can: on the first
  ``nodes`` nodes, in node order, that can by then.
* After the reservation a node's free CPUs only dip where it begins (the
  *shadow time*): a job fits on a node of the head if it ends by then, or if
  what the node has free at the shadow time, less the head's CPUs (its
  *extra*), holds it too. Each start that runs past the shadow time takes
  from the extra.

:func:`plan` returns None when the snapshot is not such a case, and the caller
plans it the general way. The simulator plans ~60,000 times a trace, and this
is most of what EASY costs there (docs/benchmarks.md, "Simulator").
"""

from __future__ import annotations

from collections.abc import Sequence

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan, Start
from minibatch.policy.base import NEVER, reserved_reason, waiting_reason
from minibatch.policy.book import releases
from minibatch.policy.planning import upcoming

INF = float("inf")


def plan(
    snap: ClusterSnapshot, queue: Sequence[PendingView], by_submission: bool
) -> Plan | None:
    """EASY's plan of ``snap`` walking ``queue``, or None when memory, GPUs,
    features or reservations count (see the module docstring)."""
    nodes = snap.nodes
    for n in nodes:
        if n.free_mem_kb is not None or n.gpus:
            return None
    now = snap.now
    for r in snap.reservations:
        if r.end > now:
            return None
    free = [n.free_cpus for n in nodes]
    widest = max(free, default=0)
    starts: list[Start] = []
    reasons: dict[int, str] = {}
    predicted: dict[int, float] = {}
    ends: list[tuple[float, int, int]] = []  # (end, node, cpus) of starts so far
    waiting: dict[tuple[int, int], str] = {}
    jobs = iter(queue)
    head: int | None = None
    shadow: float = INF
    extra: dict[int, int] = {}
    # 1. In order: start what fits, until a job gets the reservation.
    for job in jobs:
        req = job.request
        if job.advres or job.features or req.mem_kb or req.gpus or req.ppn < 1:
            return None
        count, ppn = req.nodes, req.ppn
        if ppn <= widest:
            chosen = _first_fit(free, count, ppn)
            if chosen is not None:
                end = now + req.walltime
                for i in chosen:
                    free[i] -= ppn
                    ends.append((end, i, ppn))
                starts.append(Start(job.id, tuple([nodes[i].name for i in chosen])))
                widest = max(free)
                waiting.clear()
                continue
        base = waiting.get((count, ppn))
        if base is None:
            base = waiting[(count, ppn)] = waiting_reason(req, widest)
        found = _earliest(snap, free, ends, count, ppn)
        if found is None:
            reasons[job.id] = f"{base}; {NEVER}"
            continue  # it never fits: it holds no reservation
        shadow, extra = found
        head = job.id
        predicted[head] = shadow
        reasons[head] = reserved_reason(base, shadow, now)
        break
    # 2. First fit for the rest: nothing may run past the shadow time on the
    # head's nodes unless their extra CPUs hold it.
    backfilled: list[int] = []
    default = ""
    if head is not None:
        total = sum(free)
        blocked = f"would delay job {head}'s reservation (walltime too long)"
        # Why a (nodes, CPUs, past the shadow time) shape did not start, until
        # something starts: every job of that shape fails the same way.
        said: dict[tuple[int, int, bool], str] = {}
        for job in jobs:
            if job.advres:
                return None
            if total == 0:
                default = f"queued behind job {head} (no free CPUs)"
                break
            req = job.request
            if job.features or req.mem_kb or req.gpus:
                return None
            count, ppn = req.nodes, req.ppn
            end = now + req.walltime
            late = end > shadow
            key = (count, ppn, late)
            text = said.get(key)
            if text is not None:
                reasons[job.id] = text
                continue
            if ppn < 1:
                return None
            if ppn <= widest:
                chosen = []
                for i, c in enumerate(free):
                    if c >= ppn and (not late or extra.get(i, c) >= ppn):
                        chosen.append(i)
                        if len(chosen) == count:
                            break
                if len(chosen) == count:
                    for i in chosen:
                        free[i] -= ppn
                        if late and i in extra:
                            extra[i] -= ppn
                    total -= count * ppn
                    names = tuple([nodes[i].name for i in chosen])
                    starts.append(Start(job.id, names))
                    backfilled.append(job.id)
                    widest = max(free)
                    said.clear()
                    continue
                if late and (count == 1 or sum(c >= ppn for c in free) >= count):
                    reasons[job.id] = said[key] = blocked
                    continue
            # It does not fit even where nothing is reserved.
            reasons[job.id] = said[key] = waiting_reason(req, widest)
    return Plan(
        generation=snap.generation,
        starts=starts,
        reasons=reasons,
        predicted=predicted,
        default_reason=default,
        upcoming=upcoming(snap, queue, starts),
        upcoming_by_submission=by_submission,
        backfilled=backfilled,
    )


def _first_fit(free: list[int], count: int, ppn: int) -> list[int] | None:
    """The first ``count`` nodes with ``ppn`` CPUs free, or None."""
    if count == 1:
        for i, c in enumerate(free):
            if c >= ppn:
                return [i]
        return None
    chosen = [i for i, c in enumerate(free) if c >= ppn][:count]
    return chosen if len(chosen) == count else None


def _earliest(
    snap: ClusterSnapshot,
    free: list[int],
    ends: list[tuple[float, int, int]],
    count: int,
    ppn: int,
) -> tuple[float, dict[int, int]] | None:
    """The head's reservation: its start (the shadow time) and, for each of
    its nodes, the extra CPUs (free at the shadow time, less the head's);
    None if ``count`` nodes never have ``ppn`` CPUs free."""
    now, nodes = snap.now, snap.nodes
    steps_of = releases(snap, [n.name for n in nodes], plain=True)
    for end, i, cpus in ends:
        steps_of[i].append((end, cpus))
    # Each node's first time with ``ppn`` CPUs free from now on (``now``
    # itself counts the releases of jobs past their requested end).
    first: list[tuple[float, int]] = []
    for i, steps in enumerate(steps_of):
        c = free[i]
        if c >= ppn:
            first.append((now, i))
            continue
        steps.sort()
        for step in steps:  # (end, CPUs): a plain profile's releases
            c += step[1]
            if c >= ppn:
                first.append((step[0], i))
                break
    if len(first) < count:
        return None
    first.sort()
    shadow = first[count - 1][0]
    held = sorted(i for t, i in first if t <= shadow)[:count]
    extra: dict[int, int] = {}
    for i in held:
        c = free[i] - ppn
        c += sum(step[1] for step in steps_of[i] if step[0] <= shadow)
        extra[i] = c
    return shadow, extra
