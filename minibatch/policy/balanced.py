"""Backfill Balanced (BB) and Improved Backfill Balanced (IBB): K-resource backfill.

Seed 003: Liu, Luan, Wang, Qian, *IBB: Improved K-Resource Aware Backfill
Balanced Scheduling for HTCondor*, NPC 2016, LNCS 9966. BB itself is Leinberger,
Karypis & Kumar, *Job scheduling in the presence of multiple resource
requirements*, SC 1999 (the seed's reference [3]).

Both are EASY backfilling (the first job that does not fit gets a reservation,
:class:`~minibatch.policy.backfill.Backfill` with ``depth=1``) with a different
choice of which candidates to backfill. A *candidate* is a job behind the
reservation that meets "the basic backfilling requirements": it fits now, on its
nodes, for its requested time, without touching the reservation. Over the K
resources the machine has (CPUs; memory when every node reports it; GPUs if any
node has them), ``S_i`` is the fraction of resource i in use now and ``R_i^j`` the
fraction job j asks for (Table 1 of the seed).

* **BB** traverses the candidates once and backfills the one with the lowest
  score (Eq. 1)::

      max_i(S_i + R_i^j) / (sum_i(S_i + R_i^j) / K)  *  (1 - sum_i(S_i + R_i^j) / K)

  a balance measure (max over mean: 1 when all resources are equally used) times
  a fullness modifier that lets a job filling the machine win over a smaller,
  better balanced one. Ties go to the job earlier in priority order. That is
  at most one backfill per scheduling pass: the seed's "it can only select one
  job to backfill in one traversal", which is what IBB improves on. The other
  candidates that fit wait for the next pass ("not backfilled: one backfill per
  pass (bb)"), which comes with the next arrival or end (a start does not
  cause a pass, in the simulator or live; live, also every ``interval``). With
  ``rescan=true`` BB traverses again after each start until no candidate fits
  (the loop of Maui's BESTFIT, with Eq. 1 as the metric).
* **IBB** traverses the candidates once, in priority order, and backfills
  *every* one that does not worsen the balance (Eq. 2), with S updated after
  each::

      max_i(S_i + R_i^j) / (sum_i(S_i + R_i^j) / K)  <=  max_i(S_i) / (sum_i S_i / K)

  A candidate that would worsen it waits for a later pass. An idle machine
  (all S_i = 0) counts as balanced (ratio 1). Eq. 2 is tested with a relative
  tolerance of 1e-12, so that equal ratios are not split by rounding.

With one resource (CPUs only) the balance measure is always 1: BB then picks the
largest candidate (Maui's BESTFIT on processors) and IBB backfills every
candidate (EASY with first fit).

The seed's Algorithm 1 is given only as a figure; the text says what it does
("if the job meets the basic backfilling requirements and will not worsen the
resource imbalance in the system, it can be selected"; "in one traversal of the
job queue, backfill all the jobs [that] meet the above requirement"), which is
what IBB does here.

Parameters (both): ``depth`` (reservations before backfilling, default 1),
``order`` (a priority function, given in code); BB also ``rescan`` (default
false: one backfill per pass; ``true``/``"true"``: traverse again after each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from minibatch.core.snapshot import PendingView
from minibatch.policy.backfill import Backfill, pick_repeatedly
from minibatch.policy.base import Order, as_bool
from minibatch.policy.planning import Pass
from minibatch.policy.profile import Profile

#: Relative tolerance of Eq. 2's comparison.
TOLERANCE = 1e-12


def balance(levels: Sequence[float]) -> float:
    """Max over mean of resource levels; 1 for an idle machine."""
    mean = sum(levels) / len(levels)
    return max(levels) / mean if mean > 0 else 1.0


def bb_score(used: Sequence[float], need: Sequence[float]) -> float:
    """Eq. 1: the lower, the better the job balances the machine."""
    after = [s + r for s, r in zip(used, need, strict=True)]
    mean = sum(after) / len(after)
    return balance(after) * (1.0 - mean)


def ibb_accepts(used: Sequence[float], need: Sequence[float]) -> bool:
    """Eq. 2: the job does not make the balance ratio worse."""
    after = [s + r for s, r in zip(used, need, strict=True)]
    before = balance(used)
    return balance(after) <= before * (1 + TOLERANCE)


#: Why a BB candidate that fits now was not the one backfilled.
PASSED_OVER = "not backfilled: one backfill per pass (bb)"


class BackfillBalanced:
    """BB's selection: the candidate with the lowest Eq. 1, once per pass
    (``rescan``: again after each start, until none fits)."""

    name = "bb"

    def __init__(self, rescan: bool | str = False) -> None:
        self.rescan = as_bool("rescan", rescan)

    def run(self, p: Pass, jobs: list[PendingView]) -> None:
        # Eq. 1 depends on S and the job's shape only: one score per shape and
        # traversal (S changes when a job starts).
        scores: dict[tuple[int, object], float] = {}

        def score(job: PendingView) -> float:
            key = (len(p.starts), job.request)
            value = scores.get(key)
            if value is None:
                value = scores[key] = bb_score(p.utilization(), p.demand(job))
            return value

        if self.rescan:
            pick_repeatedly(p, jobs, score)
            return
        best: tuple[PendingView, Profile, list[int]] | None = None
        best_score = 0.0
        fits: set[int] = set()
        for job in jobs:
            found = p.fit(job)
            if found is None:
                continue
            fits.add(job.id)
            s = score(job)
            if best is None or s < best_score:
                best, best_score = (job, *found), s
        if best is not None:
            p.start(*best)
        for job in jobs:
            if best is None or job is not best[0]:
                p.reasons[job.id] = PASSED_OVER if job.id in fits else p.reason(job)


class ImprovedBackfillBalanced:
    """IBB's selection: one traversal, every candidate that passes Eq. 2."""

    name = "ibb"

    def run(self, p: Pass, jobs: list[PendingView]) -> None:
        # Eq. 2 depends on S and the job's shape only: one verdict per shape
        # until something starts (most candidates fail it on a CPU-bound mix).
        verdicts: dict[object, bool] = {}
        for job in jobs:
            key = job.request
            ok = verdicts.get(key)
            if ok is None:
                ok = verdicts[key] = ibb_accepts(p.utilization(), p.demand(job))
            if not ok:
                p.reasons[job.id] = "not backfilled: would unbalance the machine (ibb)"
                continue
            found = p.fit(job)
            if found is None:
                p.reasons[job.id] = p.reason(job)
            else:
                p.start(job, *found)
                verdicts.clear()


class BB(Backfill):
    """EASY with seed 003's BB selection: ``Backfill(depth=1, select="bb")``;
    ``rescan``: backfill again after each start rather than once per pass."""

    name: ClassVar[str] = "bb"

    def __init__(
        self,
        depth: int | str = 1,
        order: Order | None = None,
        rescan: bool | str = False,
    ) -> None:
        select = BackfillBalanced(rescan)
        super().__init__(depth=depth, select=select, order=order)


class IBB(Backfill):
    """EASY with seed 003's IBB selection: ``Backfill(depth=1, select="ibb")``."""

    name: ClassVar[str] = "ibb"

    def __init__(self, depth: int | str = 1, order: Order | None = None) -> None:
        super().__init__(depth=depth, select=ImprovedBackfillBalanced(), order=order)
