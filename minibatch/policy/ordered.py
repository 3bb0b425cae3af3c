"""A priority order over EASY or FIFO, and the QOS limits that block jobs.

:class:`OrderedPolicy` is the shared shape of the ``maui``, ``fairshare`` and
``psp`` policies: a pure ``order(snap)`` puts the pending jobs in priority order
(a permutation of ``snap.pending``; ties keep the snapshot's order, which is
submission order), ``blocked`` takes out the jobs a policy limit forbids to start
now (each with a reason), and the rest goes, reordered, to the unchanged
:class:`~minibatch.policy.backfill.Easy` (``backfill=True``, reservation depth 1)
or :class:`~minibatch.policy.fifo.Fifo` (``backfill=False``) on a copy of the
snapshot (``msgspec.structs.replace``). Same guarantees as those policies, over
the new order.

**QOS limits** (Maui ``QOSCFG[q] MAXJOB`` per user, seed 004's QOS): a pending job
whose user already runs ``max_jobs_per_user`` jobs under its QOS is *blocked*.
Within one pass the limit is applied in priority order: the first
``limit - running`` pending jobs of a user and QOS may start, the rest are blocked
("QOS q allows u N jobs at once"), so a pass never exceeds the limit even if it
starts several of them. Running jobs count under ``RunningView.qos`` when the
snapshot carries it, else under the default QOS "".

A policy declares what the snapshot must carry in ``needs`` ("fairshare",
"accuracy", "running_by_end"): the simulator computes usage windows, accuracy
history or keeps the running jobs by end only then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.policy.backfill import Easy
from minibatch.policy.base import Policy, as_bool
from minibatch.policy.fifo import Fifo
from minibatch.policy.presets import ORDERED

#: The presets this part adds, for the ``minibatch.policies`` entry points.
PRESETS = ORDERED


def running_qos(run: object) -> str:
    """The QOS a running job runs under ("" when the snapshot does not say)."""
    qos = getattr(run, "qos", "")
    return qos if isinstance(qos, str) else ""


def qos_blocked(
    snap: ClusterSnapshot, ordered: Sequence[PendingView]
) -> dict[int, str]:
    """Jobs over their QOS's jobs-per-user limit, with the reason; by job id."""
    limits = {
        name: q.max_jobs_per_user
        for name, q in snap.qos.items()
        if q.max_jobs_per_user is not None
    }
    if not limits:
        return {}
    held: dict[tuple[str, str], int] = {}
    for run in snap.running:
        key = (run.user, running_qos(run))
        if key[1] in limits:
            held[key] = held.get(key, 0) + 1
    out: dict[int, str] = {}
    for job in ordered:
        limit = limits.get(job.qos)
        if limit is None:
            continue
        key = (job.user, job.qos)
        count = held.get(key, 0)
        if count >= limit:
            label = job.qos or "(default)"
            out[job.id] = (
                f"blocked: QOS {label} allows {job.user} {limit} "
                f"job{'' if limit == 1 else 's'} at once"
            )
        else:
            held[key] = count + 1
    return out


class OrderedPolicy:
    """Order, block, then EASY (or FIFO) over what is left."""

    name: ClassVar[str] = "ordered"
    #: What the snapshot must carry: "fairshare", "accuracy".
    needs: frozenset[str] = frozenset()

    def __init__(self, backfill: bool = True) -> None:
        self.backfill = as_bool("backfill", backfill)
        self._base: Policy = Easy() if self.backfill else Fifo()

    def order(self, snap: ClusterSnapshot) -> list[PendingView]:
        """Pending jobs in priority order (stable). Subclasses rank."""
        return list(snap.pending)

    def blocked(
        self, snap: ClusterSnapshot, ordered: Sequence[PendingView]
    ) -> dict[int, str]:
        """Jobs a limit forbids to start now, with the reason."""
        return qos_blocked(snap, ordered)

    def __call__(self, snap: ClusterSnapshot) -> list[PendingView]:
        """``order`` as a plain callable (for ``Backfill(order=...)``)."""
        return self.order(snap)

    def plan(self, snap: ClusterSnapshot) -> Plan:
        ordered = self.order(snap)
        blocked = self.blocked(snap, ordered)
        if blocked:
            ordered = [job for job in ordered if job.id not in blocked]
        plan = self._base.plan(msgspec.structs.replace(snap, pending=ordered))
        # The base policy walked our order, not the submission order it thinks.
        plan = msgspec.structs.replace(plan, upcoming_by_submission=False)
        if not blocked:
            return plan
        return msgspec.structs.replace(plan, reasons={**plan.reasons, **blocked})
