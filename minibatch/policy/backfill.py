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

from typing import ClassVar

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan, Start
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
        releases: list[_Release] = [
            (r.expected_end(now), r.nodes, r.mem_kb_per_node or 0) for r in snap.running
        ]
        starts: list[Start] = []
        reasons: dict[int, str] = {}
        predicted: dict[int, float] = {}
        head: PendingView | None = None
        shadow: float | None = None
        extra: Pool | None = None
        default = ""
        for job in snap.pending:
            req = job.request
            if head is None:
                nodes = pool.fit(req)
                if nodes is not None:
                    pool.take(nodes, req)
                    starts.append(Start(job.id, nodes))
                    releases.append(_release(now + req.walltime, nodes, req))
                    continue
                head = job
                shadow, extra = _shadow(pool, releases, job)
                base = waiting_reason(req, pool)
                if shadow is None:
                    reasons[job.id] = f"{base}; no usable node has room for it now"
                else:
                    reasons[job.id] = reserved_reason(base, shadow, now)
                    predicted[job.id] = shadow
                continue
            if pool.free_cpus() == 0:
                default = f"queued behind job {head.id} (no free CPUs)"
                break  # nothing more can start: the rest share one reason
            nodes = pool.fit(req)
            if nodes is None:
                reasons[job.id] = waiting_reason(req, pool)
                continue
            if shadow is None or extra is None or now + req.walltime <= shadow:
                pool.take(nodes, req)
                starts.append(Start(job.id, nodes))
                continue
            nodes = _fit_both(pool, extra, job)
            if nodes is None:
                reasons[job.id] = (
                    f"would delay job {head.id}'s reservation (walltime too long)"
                )
                continue
            pool.take(nodes, req)
            extra.take(nodes, req)
            starts.append(Start(job.id, nodes))
        return Plan(
            generation=snap.generation,
            starts=starts,
            reasons=reasons,
            predicted=predicted,
            default_reason=default,
        )


def _release(end: float, nodes: tuple[str, ...], req: JobRequest) -> _Release:
    return (end, tuple((n, req.ppn) for n in nodes), mem_per_node(req) or 0)


def _shadow(
    pool: Pool, releases: list[_Release], head: PendingView
) -> tuple[float | None, Pool | None]:
    """The head's shadow time and the resources left over at it, per node.

    Releases with the same end time are applied together before testing, so the
    leftover (``extra``) counts everything free at that instant.
    """
    future = pool.copy()
    ordered = sorted(releases, key=lambda r: r[0])
    i = 0
    while i < len(ordered):
        when = ordered[i][0]
        while i < len(ordered) and ordered[i][0] == when:
            _, held, mem = ordered[i]
            for name, cpus in held:
                future.give((name,), cpus, mem)
            i += 1
        nodes = future.fit(head.request)
        if nodes is not None:
            future.take(nodes, head.request)
            return when, future
    return None, None


def _fit_both(pool: Pool, extra: Pool, job: PendingView) -> tuple[str, ...] | None:
    """Nodes where the job fits now *and* within the head's leftover resources."""
    both = pool.copy()
    for name in both.order:
        both.cpus[name] = min(both.cpus[name], extra.cpus[name])
        mem, extra_mem = both.mem[name], extra.mem[name]
        if mem is not None and extra_mem is not None:
            both.mem[name] = min(mem, extra_mem)
    return both.fit(job.request)
