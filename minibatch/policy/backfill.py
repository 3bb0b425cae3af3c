"""EASY backfilling (Lifka 1995; Mu'alem & Feitelson, IEEE TPDS 12(6), 2001).

Algorithm: start jobs in queue order while they fit. The first job that does not
fit (the head) gets a reservation at its *shadow time*: the earliest time at which
enough running jobs will have ended, by their requested walltimes, for it to fit.
Later jobs are then started out of order ("backfilled") if they fit now and either
end, by their own walltime, before the shadow time, or use only resources the head
will not need at the shadow time (the *extra* CPUs and memory on each node).

Guarantee: a backfilled job never delays the head's reservation, provided running
jobs end by their walltimes (the node daemons enforce walltime, so live they do).
The reservation is recomputed on every pass; a running job already past its
requested end is treated as ending now. Only the head is protected (reservation
depth 1, Maui's ``RESERVATIONDEPTH 1``): jobs behind it may be delayed by backfill.
Seed 004 (Bode et al.) describes the same mechanism as Maui's default backfill.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import ClassVar

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import (
    ClusterSnapshot,
    PendingView,
    Plan,
    RunningView,
    Start,
)
from minibatch.policy.base import (
    Pool,
    mem_per_node,
    reserved_reason,
    waiting_reason,
)

#: (end time, ((node, cpus), ...), memory per node) for every job holding resources.
_Release = tuple[float, tuple[tuple[str, int], ...], int]


class Easy:
    name: ClassVar[str] = "easy"

    def plan(self, snap: ClusterSnapshot) -> Plan:
        now = snap.now
        pool = Pool(snap)
        # Jobs started in this pass before the head hold resources until then.
        started: list[_Release] = []
        starts: list[Start] = []
        reasons: dict[int, str] = {}
        predicted: dict[int, float] = {}
        queue = iter(snap.pending)
        # Start jobs in queue order while they fit; the first that does not is the
        # head. A job wider than the widest free node cannot fit: no fit test.
        widest = _widest(pool)
        head: PendingView | None = None
        for job in queue:
            req = job.request
            nodes = pool.fit(req) if req.ppn <= widest else None
            if nodes is None:
                head = job
                break
            pool.take(nodes, req)
            starts.append(Start(job.id, nodes))
            started.append(_release(now + req.walltime, nodes, req))
            widest = _widest(pool)
        if head is None:
            return Plan(generation=snap.generation, starts=starts)
        shadow, extra = _shadow(pool, snap.running, started, now, head)
        base = waiting_reason(head.request, pool)
        if shadow is None:
            reasons[head.id] = f"{base}; no usable node has room for it now"
        else:
            reasons[head.id] = reserved_reason(base, shadow, now)
            predicted[head.id] = shadow
        # Backfill. ``free_total``, ``widest`` and the reasons of jobs that do not
        # fit (one text per job shape) change only when a job is taken, so they are
        # refreshed then and the rest of the queue is passed over cheaply.
        free_total = pool.free_cpus()
        said: dict[tuple[int, int], str] = {}
        failed: set[tuple[int, int, int | None]] = set()
        # Free now *and* left over at the shadow time; rebuilt after every take.
        both: Pool | None = None
        both_widest = 0
        both_failed: set[tuple[int, int, int | None]] = set()
        delays = f"would delay job {head.id}'s reservation (walltime too long)"
        default = ""
        for job in queue:
            if free_total == 0:
                default = f"queued behind job {head.id} (no free CPUs)"
                break  # nothing more can start: the rest share one reason
            req = job.request
            if req.ppn > widest:
                nodes = None
            else:
                # fit() depends only on the pool and the job's shape: a shape
                # that did not fit will not fit again until something is taken.
                shape = (req.nodes, req.ppn, req.mem_kb)
                nodes = None if shape in failed else pool.fit(req)
                if nodes is None:
                    failed.add(shape)
            if nodes is None:
                key = (req.nodes, req.ppn)
                reason = said.get(key)
                if reason is None:
                    reason = said[key] = waiting_reason(req, pool)
                reasons[job.id] = reason
                continue
            if shadow is None or extra is None or now + req.walltime <= shadow:
                pool.take(nodes, req)  # ends before the head starts: no conflict
            else:
                if both is None:
                    both = _both(pool, extra)
                    both_widest = _widest(both)
                    both_failed.clear()
                shape = (req.nodes, req.ppn, req.mem_kb)
                if req.ppn > both_widest or shape in both_failed:
                    nodes = None
                else:
                    nodes = both.fit(req)
                if nodes is None:
                    both_failed.add(shape)
                    reasons[job.id] = delays
                    continue
                pool.take(nodes, req)
                extra.take(nodes, req)
            starts.append(Start(job.id, nodes))
            free_total, widest = pool.free_cpus(), _widest(pool)
            said.clear()
            failed.clear()
            both = None
        return Plan(
            generation=snap.generation,
            starts=starts,
            reasons=reasons,
            predicted=predicted,
            default_reason=default,
        )


def _widest(pool: Pool) -> int:
    return max(pool.cpus.values(), default=0)


def _release(end: float, nodes: tuple[str, ...], req: JobRequest) -> _Release:
    return (end, tuple((n, req.ppn) for n in nodes), mem_per_node(req) or 0)


def _shadow(
    pool: Pool,
    running: Iterable[RunningView],
    started: list[_Release],
    now: float,
    head: PendingView,
) -> tuple[float | None, Pool | None]:
    """The head's shadow time and the resources left over at it, per node.

    Running jobs release at ``RunningView.expected_end(now)`` (an overrunning job
    ends now), jobs ``started`` in this pass at their own ends. Releases with the
    same end time are applied together before testing, so the leftover (``extra``)
    counts everything free at that instant.
    """
    releases: list[_Release] = [
        (
            end if (end := r.start_time + r.walltime) > now else now,
            r.nodes,
            r.mem_kb_per_node or 0,
        )
        for r in running
    ]
    releases.extend(started)
    releases.sort(key=itemgetter(0))
    future = pool.copy()
    cpus, mem = future.cpus, future.mem
    need = head.request.cpus
    total = sum(cpus.values())
    i, count = 0, len(releases)
    while i < count:
        when = releases[i][0]
        while i < count and releases[i][0] == when:
            _, held, held_mem = releases[i]
            for name, n in held:
                if name not in cpus:
                    continue  # the node went down or offline: nothing comes back
                cpus[name] += n
                total += n
                free_mem = mem[name]
                if free_mem is not None:
                    mem[name] = free_mem + held_mem
            i += 1
        # Fewer free CPUs in all than the head needs: no placement can exist yet.
        if total < need:
            continue
        nodes = future.fit(head.request)
        if nodes is not None:
            future.take(nodes, head.request)
            return when, future
    return None, None


def _both(pool: Pool, extra: Pool) -> Pool:
    """Per node, the lesser of what is free now and what the head leaves over.

    A long job may start there: it fits now and does not touch what the head
    needs at its shadow time.
    """
    both = pool.copy()
    for name in both.order:
        both.cpus[name] = min(both.cpus[name], extra.cpus[name])
        mem, extra_mem = both.mem[name], extra.mem[name]
        if mem is not None and extra_mem is not None:
            both.mem[name] = min(mem, extra_mem)
    return both
