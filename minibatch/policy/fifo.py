"""Strict first-come, first-served.

Algorithm: walk the pending queue in priority order (submission order by default)
and start each job that fits (on its nodes, for its whole requested time, clear of
advance reservations); stop at the first job that does not fit, so no job ever
starts before a job ahead of it. Jobs submitted into an advance reservation form
a queue of their own per reservation (they use only its CPUs), with the same rule.

Guarantee: within each queue, start order equals queue order. This is the
baseline every backfilling policy is measured against (seed 001, Tóth &
Klusáček, "fifo"; seed 004, Bode et al., PBS's default scheduler without its
starving-job mechanism is *not* this: it skips jobs that do not fit, see
:mod:`minibatch.policy.pbsfifo`).

Parameters: ``order`` (a priority function, given in code).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.policy.base import Order, as_order
from minibatch.policy.planning import Pass
from minibatch.policy.profile import shape_of


class Fifo:
    name: ClassVar[str] = "fifo"

    def __init__(self, order: Order | None = None) -> None:
        self.order = as_order("order", order)

    def plan(self, snap: ClusterSnapshot) -> Plan:
        p = Pass(snap)
        queue: Sequence[PendingView] = (
            snap.pending if self.order is None else self.order(snap)
        )
        in_submission_order = self.order is None
        book = p.book
        general = book.general
        now = snap.now
        blocked: dict[str, int] = {}  # queue ("" = general) -> its blocked head
        for job in queue:
            key = job.advres
            head = blocked.get(key)
            if head is not None:
                p.reasons[job.id] = f"queued behind job {head} (fifo)"
                continue
            if not key and not job.features:
                req = job.request
                nodes = general.fit_now(shape_of(req), now + req.walltime)
                if nodes is not None:
                    p.start(job, general, nodes)
                    continue
            else:
                found = p.fit(job)
                if found is not None:
                    p.start(job, *found)
                    continue
            p.reasons[job.id] = p.reason(job)
            blocked[key] = job.id
            if key == "" and not book.views:
                # Head blocked: stop to preserve FIFO order; the rest share a reason.
                default = f"queued behind job {job.id} (fifo)"
                return p.plan(default, queue, by_submission=in_submission_order)
        return p.plan(order=queue, by_submission=in_submission_order)
