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
  from the extra. So a job that would end by then fits where a node has its
  CPUs free, and one that would not where a node has them in its *room*, the
  lesser of its free CPUs and its extra: one comparison with the widest node
  (or the roomiest) rules out most jobs without a fit test.

A snapshot that asks for no reasons (``reasons=False``: the simulator, which
keeps none) gets the same plan less ``reasons`` and ``default_reason``, and
its jobs wider than every node's free CPUs are passed over after reading their
CPUs alone: nothing about them can change the plan. So the cost of a pass is
one look at each queued job, most of which cannot start.

:func:`plan` returns None when the snapshot is not such a case, and the caller
plans it the general way. The simulator plans ~60,000 times a trace, and this
is most of what EASY costs there (docs/benchmarks.md, "Simulator").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, NodeView, PendingView, Plan, Start
from minibatch.policy.base import NEVER, reserved_reason, waiting_reason
from minibatch.policy.book import releases
from minibatch.policy.planning import upcoming

INF = float("inf")
#: What a node gets back, (time, CPUs): a plain profile's releases.
Steps = list[tuple[float, int]]


def plan(
    snap: ClusterSnapshot, queue: Sequence[PendingView], by_submission: bool
) -> Plan | None:
    """EASY's plan of ``snap`` walking ``queue``, or None when memory, GPUs,
    features or reservations count (see the module docstring)."""
    nodes = snap.nodes
    free: list[int] = []  # per node, as the pass takes them
    for n in nodes:
        if n.free_mem_kb is not None or n.gpus:
            return None
        free.append(n.free_cpus)
    now = snap.now
    for r in snap.reservations:
        if r.end > now:
            return None
    say = snap.reasons
    widest = max(free) if free else 0
    starts: list[Start] = []
    reasons: dict[int, str] = {}
    predicted: dict[int, float] = {}
    ends: list[tuple[float, int, int]] = []  # (end, node, cpus) of starts so far
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
                starts.append(Start(job.id, _names(nodes, chosen)))
                widest = max(free)
                continue
        found = _earliest(snap, free, ends, count, ppn)
        base = waiting_reason(req, widest) if say else ""
        if found is None:
            if say:
                reasons[job.id] = f"{base}; {NEVER}"
            continue  # it never fits: it holds no reservation
        shadow, extra = found
        head = job.id
        predicted[head] = shadow
        if say:
            reasons[head] = reserved_reason(base, shadow, now)
        break
    # 2. First fit for the rest: nothing may run past the shadow time on the
    # head's nodes unless their extra CPUs hold it, so a job that would
    # (``late``) may take a node's ``room``, the lesser of its free CPUs and
    # its extra, and a job that would not its free CPUs.
    backfilled: list[int] = []
    default = ""
    if head is not None and (widest or say):  # else nothing more can start
        room = free.copy()
        for i, c in extra.items():
            if c < room[i]:
                room[i] = c
        roomiest = max(room)
        total = sum(free)
        blocked = (
            f"would delay job {head}'s reservation (walltime too long)" if say else ""
        )
        # Until something starts: the shapes (nodes, CPUs, late) of many
        # nodes that did not fit, and the reason each shape gets.
        failed: set[tuple[int, int, bool]] = set()
        said: dict[tuple[int, int, bool], str] = {}
        for job in jobs:
            req = job.request
            ppn = req.ppn
            if ppn > widest and not say:
                continue  # it cannot start, and nobody asks why
            late = now + req.walltime > shadow
            if late and ppn > roomiest and not say:
                continue  # the same, for want of room past the shadow time
            if job.advres:
                return None
            if total == 0:
                if say:
                    default = f"queued behind job {head} (no free CPUs)"
                break
            if job.features or req.mem_kb or req.gpus or ppn < 1:
                return None
            count = req.nodes
            if ppn <= (roomiest if late else widest):
                # Always a fit for one node; many may not fit together.
                key = (count, ppn, late)
                if count == 1 or key not in failed:
                    chosen = _first_fit(room if late else free, count, ppn)
                    if chosen is not None:
                        for i in chosen:
                            c = free[i] = free[i] - ppn
                            if i in extra:
                                if late:
                                    extra[i] -= ppn
                                c = min(c, extra[i])
                            room[i] = c
                        starts.append(Start(job.id, _names(nodes, chosen)))
                        backfilled.append(job.id)
                        widest, roomiest = max(free), max(room)
                        total -= count * ppn
                        failed.clear()
                        said.clear()
                        if total == 0 and not say:
                            break
                        continue
                    failed.add(key)
            if say:
                key = (count, ppn, late)
                text = said.get(key)
                if text is None:
                    text = said[key] = _why(req, free, widest, late, blocked)
                reasons[job.id] = text
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


def _names(nodes: Sequence[NodeView], chosen: list[int]) -> tuple[str, ...]:
    """The names of the ``chosen`` nodes, for a start."""
    if len(chosen) == 1:  # most jobs: no comprehension to set up
        return (nodes[chosen[0]].name,)
    return tuple([nodes[i].name for i in chosen])


def _why(
    req: JobRequest, free: list[int], widest: int, late: bool, blocked: str
) -> str:
    """Why a job after the head does not start: it would delay the head, or
    it does not fit even where nothing is reserved."""
    count, ppn = req.nodes, req.ppn
    if late and ppn <= widest and (count == 1 or sum(c >= ppn for c in free) >= count):
        return blocked
    return waiting_reason(req, widest)


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
    if len(nodes) == 1:  # a flat pool: no node to choose
        if count > 1:
            return None  # it needs more nodes than there are
        only = nodes[0].name
        order = snap.running_by_end
        steps: Iterable[tuple[float, int]]
        if order is not None and not ends:
            # Already in time order: read only as far as the head needs.
            steps = (
                (r.start_time + r.walltime, cpus)
                for r in order
                for name, cpus in r.nodes
                if name == only
            )
        else:
            steps = cast(Steps, releases(snap, (only,), plain=True)[0])
            steps += [(end, cpus) for end, _, cpus in ends]
            steps.sort()
        found = _climb(steps, free[0], ppn, now)
        return None if found is None else (found[0], {0: found[1] - ppn})
    steps_of = cast(list[Steps], releases(snap, [n.name for n in nodes], plain=True))
    for end, i, cpus in ends:
        steps_of[i].append((end, cpus))
    first: list[tuple[float, int, int]] = []  # (time, node, free then)
    for i, steps in enumerate(steps_of):
        steps.sort()
        found = _climb(steps, free[i], ppn, now)
        if found is not None:
            first.append((found[0], i, found[1]))
    if len(first) < count:
        return None
    first.sort()
    shadow = first[count - 1][0]
    extra: dict[int, int] = {}
    for i, t, c in sorted((i, t, c) for t, i, c in first if t <= shadow)[:count]:
        if t < shadow:
            c = free[i] + sum(cpus for end, cpus in steps_of[i] if end <= shadow)
        extra[i] = c - ppn
    return shadow, extra


def _climb(
    steps: Iterable[tuple[float, int]], c: int, ppn: int, t: float
) -> tuple[float, int] | None:
    """The first time from ``t`` on that a node with ``c`` CPUs free at ``t``
    has ``ppn`` free, given what it gets back (``steps``, in time order; one
    before ``t`` comes back at ``t``), and what it has free then (every
    release at that instant counts); None if never."""
    for end, cpus in steps:
        if end > t:
            if c >= ppn:
                return t, c
            t = end
        c += cpus
    return (t, c) if c >= ppn else None
