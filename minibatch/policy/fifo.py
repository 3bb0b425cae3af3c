"""Strict first-come, first-served.

Algorithm: walk the pending queue in priority order (submission order by default)
and start each job that fits; stop at the first job that does not fit, so no job
ever starts before a job ahead of it. Guarantee: start order equals queue order.
This is the baseline every backfilling policy is measured against (seed 001,
Tóth & Klusáček, "fifo"; seed 004, Bode et al., PBS's default scheduler before its
starving-job mechanism).
"""

from __future__ import annotations

from typing import ClassVar

from minibatch.core.snapshot import ClusterSnapshot, Plan, Start
from minibatch.policy.base import Pool, waiting_reason


class Fifo:
    name: ClassVar[str] = "fifo"

    def plan(self, snap: ClusterSnapshot) -> Plan:
        pool = Pool(snap)
        starts: list[Start] = []
        reasons: dict[int, str] = {}
        default = ""
        for job in snap.pending:
            nodes = pool.fit(job.request)
            if nodes is None:
                reasons[job.id] = waiting_reason(job.request, pool)
                default = f"queued behind job {job.id} (fifo)"
                break  # head blocked: stop to preserve FIFO order
            pool.take(nodes, job.request)
            starts.append(Start(job.id, nodes))
        return Plan(
            generation=snap.generation,
            starts=starts,
            reasons=reasons,
            default_reason=default,
        )
