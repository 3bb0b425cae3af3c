"""Backfilling with a reservation depth: EASY, conservative and anything between.

Algorithm (one pass, over :class:`~minibatch.policy.profile.Profile`):

1. Walk the pending jobs in priority order (``order(snap)``, by default the
   snapshot's order: submission order). A job that fits now (on its nodes, for
   its whole requested time, without touching anything reserved) starts. A job
   that does not gets a **reservation** at the earliest time it fits, as long as
   fewer than ``depth`` jobs hold one (Maui ``RESERVATIONDEPTH``); the
   reservation is put in the profile, so later jobs keep off it.
2. Once ``depth`` jobs hold reservations, the rest are **backfill** candidates;
   ``select`` picks which start (Maui ``BACKFILLPOLICY``): ``firstfit`` starts
   each one that fits, in priority order; ``bestfit`` starts, per traversal of
   the candidates, the one that fits with the best ``metric`` (``procs``: most
   CPUs, ``procseconds``: most CPUs x walltime, ``seconds``: longest walltime),
   and traverses again until none fits; ``bb``/``ibb`` are seed 003's K-resource
   selections (:mod:`minibatch.policy.balanced`).

``depth=1`` is EASY (Lifka 1995; Mu'alem & Feitelson, IEEE TPDS 12(6), 2001):
only the first job that does not fit is protected. ``depth="all"`` is
conservative backfilling (same paper): every job gets a reservation and no job
ever delays one ahead of it. ``depth=0`` reserves nothing (greedy).

Exact semantics (docs/policies.md, "Backfill"): running jobs release at start +
requested time, all releases at one instant together; a job past its requested
end releases *now* (for reservations; its CPUs are not used this pass); nothing
is stored between passes, every reservation is recomputed each pass from the
snapshot; advance reservations are honoured by the profile; a job that can never
fit (e.g. its nodes are down) gets no reservation and does not count in the depth.

Guarantee: a started job never overlaps, by its requested time, a reservation
made before it in the pass, so with jobs ending by their requested times no
backfilled job delays a reserved one.

Parameters: ``depth`` (int >= 0 or ``all``), ``select`` (``firstfit``,
``bestfit``, ``bb``, ``ibb``), ``metric`` (for ``bestfit``), ``order`` (a
priority function, given in code: ``Backfill(order=fn)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.policy import cpuonly
from minibatch.policy.base import Order, as_choice, as_int, as_order, waiting_reason
from minibatch.policy.planning import Pass
from minibatch.policy.profile import Profile
from minibatch.policy.search import Shape
from minibatch.policy.timeline import INF

METRICS = ("procs", "procseconds", "seconds")


class Selection(Protocol):
    """Which backfill candidates start (after the reservations are made)."""

    name: str

    def run(self, p: Pass, jobs: list[PendingView]) -> None: ...


def pick_repeatedly(
    p: Pass, jobs: list[PendingView], score: Callable[[PendingView], float]
) -> None:
    """Per traversal, start the fitting candidate with the lowest ``score``
    (ties: the earlier in priority order); traverse again until none fits."""
    left = list(jobs)
    while left:
        best = -1
        best_score = INF
        best_fit: tuple[Profile, list[int]] | None = None
        for k, job in enumerate(left):
            found = p.fit(job)
            if found is None:
                continue
            s = score(job)
            if best < 0 or s < best_score:
                best, best_score, best_fit = k, s, found
        if best_fit is None:
            break
        p.start(left.pop(best), *best_fit)
    for job in left:
        p.reasons[job.id] = p.reason(job)


class BestFit:
    """Maui ``BESTFIT``: per traversal, the fitting job with the largest metric."""

    def __init__(self, metric: str = "procs") -> None:
        self.metric = as_choice("metric", metric, METRICS)
        self.name = "bestfit"

    def run(self, p: Pass, jobs: list[PendingView]) -> None:
        def score(job: PendingView) -> float:
            req = job.request
            if self.metric == "procs":
                return -float(req.cpus)
            if self.metric == "seconds":
                return -float(req.walltime)
            return -float(req.cpus * req.walltime)

        pick_repeatedly(p, jobs, score)


def selection(name: str | Selection, metric: str = "procs") -> Selection | None:
    """A selection by name; None stands for the built-in first fit."""
    if not isinstance(name, str):
        return name
    choice = as_choice("select", name, ("firstfit", "bestfit", "bb", "ibb"))
    if choice == "firstfit":
        return None
    if choice == "bestfit":
        return BestFit(metric)
    from minibatch.policy.balanced import BackfillBalanced, ImprovedBackfillBalanced

    return BackfillBalanced() if choice == "bb" else ImprovedBackfillBalanced()


class Backfill:
    """Reservations for the first ``depth`` blocked jobs, then backfill.

    Args:
        depth: jobs that get a reservation (``"all"``/None: every job).
        select: ``firstfit``, ``bestfit``, ``bb``, ``ibb`` or a :class:`Selection`.
        metric: what ``bestfit`` maximises: ``procs``, ``procseconds``, ``seconds``.
        order: the priority order (default: the snapshot's order).
    """

    name: ClassVar[str] = "backfill"

    def __init__(
        self,
        depth: int | str | None = 1,
        select: str | Selection = "firstfit",
        metric: str = "procs",
        order: Order | None = None,
    ) -> None:
        self.depth = as_int("depth", depth, minimum=0, unlimited=True)
        self.metric = as_choice("metric", metric, METRICS)
        self.selection = selection(select, self.metric)
        self.order = as_order("order", order)
        # EASY with first fit may plan on CPUs alone, from what ends first.
        simple = self.depth == 1 and self.selection is None
        self.needs = frozenset({"running_by_end"} if simple else ())

    def plan(self, snap: ClusterSnapshot) -> Plan:
        # One long method on purpose: it runs on every scheduling pass, and
        # locals are what keeps a pass cheap (the simulator makes ~100,000).
        queue: Sequence[PendingView] = (
            snap.pending if self.order is None else self.order(snap)
        )
        in_submission_order = self.order is None
        if self.depth == 1 and self.selection is None:
            fast = cpuonly.plan(snap, queue, in_submission_order)
            if fast is not None:
                return fast
        p = Pass(snap)
        limit = INF if self.depth is None else self.depth
        general, now = p.book.general, snap.now
        reasons = p.reasons
        # Caches valid until a start (p.start clears ``failed``): a shape that
        # did not fit until an end cannot fit for longer, and one reason text
        # serves every job of a shape.
        failed = p.failed_general
        waiting: dict[tuple[int, int], str] = {}
        widest = general.widest()
        rest: list[PendingView] = []
        jobs = iter(queue)
        # 1. In order: start what fits, reserve what does not, up to ``limit``.
        reserved = 0
        for job in jobs if limit > 0 else ():
            if job.advres:
                self._other(p, job, limit, rest)
                continue
            if job.features:  # only some nodes will do: the general path
                placed = p.fit(job)
                if placed is not None:
                    p.start(job, *placed)
                    widest = general.widest()
                    waiting.clear()
                else:
                    reserved += p.reserve(job, general, "")
                    if reserved >= limit:
                        break
                continue
            req = job.request
            ppn, count = req.ppn, req.nodes
            shape: Shape | None = None
            window = False  # fits now, but would run into a reservation
            if ppn <= widest:  # else it is wider than any node's free CPUs
                mem = req.mem_kb  # shape_of(req), inlined: once per candidate
                shape = (count, ppn, 0 if mem is None else -(-mem // count), req.gpus)
                end = now + req.walltime
                bad = failed.get(shape)
                if bad is None or end < bad:
                    found = general.fit_now(shape, end)
                    if found is not None:
                        p.start(job, general, found, shape)
                        widest = general.widest()
                        waiting.clear()
                        continue
                    failed[shape] = end
                window = end > general.first_dip
            base = ""  # p.reserve finds out why, if it may be a reservation
            if not window:
                base = waiting.get((count, ppn), "")
                if not base:
                    base = waiting[(count, ppn)] = waiting_reason(req, widest)
            reserved += p.reserve(job, general, "", base, shape)
            if reserved >= limit:
                break
        selection = self.selection
        if selection is not None:
            for job in jobs:
                if job.advres:
                    self._other(p, job, limit, rest)
                else:
                    rest.append(job)
            if rest:
                selection.run(p, rest)
            return p.plan(order=queue, by_submission=in_submission_order)
        # 2. First fit: start every job left that fits, in order.
        others = bool(p.book.views)  # advance reservations with their own queues
        said: dict[Shape, str] = {}
        free = general.free_cpus()
        for job in jobs:
            if job.advres:
                self._other(p, job, limit, rest)
                continue
            if free == 0 and not others:
                head = p.heads.get("")
                behind = "the running jobs" if head is None else f"job {head}"
                # Nothing more can start: the rest share one reason.
                return p.plan(
                    f"queued behind {behind} (no free CPUs)",
                    queue,
                    by_submission=in_submission_order,
                )
            if job.features:
                placed = p.fit(job)
                if placed is not None:
                    p.start(job, *placed)
                    widest, free = general.widest(), general.free_cpus()
                    said.clear()
                    waiting.clear()
                else:
                    reasons[job.id] = p.reason(job)
                continue
            req = job.request
            ppn, count = req.ppn, req.nodes
            if ppn > widest:  # wider than any node's free CPUs: no fit test
                text = waiting.get((count, ppn))
                if text is None:
                    text = waiting[(count, ppn)] = waiting_reason(req, widest)
                reasons[job.id] = text
                continue
            mem = req.mem_kb  # shape_of(req), inlined: once per candidate
            shape = (count, ppn, 0 if mem is None else -(-mem // count), req.gpus)
            end = now + req.walltime
            bad = failed.get(shape)
            if bad is None or end < bad:
                found = general.fit_now(shape, end)
                if found is not None:
                    p.start(job, general, found, shape)
                    widest, free = general.widest(), general.free_cpus()
                    said.clear()
                    waiting.clear()
                    continue
                failed[shape] = end
            if end <= general.first_dip:
                # Nothing is reserved before it would end: it does not fit now.
                text = waiting.get((count, ppn))
                if text is None:
                    text = waiting[(count, ppn)] = waiting_reason(req, widest)
            else:
                text = said.get(shape)
                if text is None:
                    text = said[shape] = p.why(job, general, shape)
            reasons[job.id] = text
        return p.plan(order=queue, by_submission=in_submission_order)

    def _other(
        self, p: Pass, job: PendingView, limit: float, rest: list[PendingView]
    ) -> None:
        """A job inside an advance reservation: the same rules, in its own view
        with its own depth (it never competes with the general queue's CPUs)."""
        view = p.book.view_for(job)
        if view is None:
            p.reasons[job.id] = p.book.refusals[job.id]
            return
        key = job.advres
        if p.counts.get(key, 0) >= limit and self.selection is not None:
            rest.append(job)
            return
        found = p.fit(job)
        if found is not None:
            p.start(job, *found)
        elif p.counts.get(key, 0) < limit:
            p.reserve(job, view, key)
        else:
            p.reasons[job.id] = p.reason(job)


class Easy(Backfill):
    """EASY backfilling: ``Backfill(depth=1)``."""

    name: ClassVar[str] = "easy"

    def __init__(
        self,
        select: str | Selection = "firstfit",
        metric: str = "procs",
        order: Order | None = None,
    ) -> None:
        super().__init__(depth=1, select=select, metric=metric, order=order)


class Conservative(Backfill):
    """Conservative backfilling: ``Backfill(depth="all")``."""

    name: ClassVar[str] = "conservative"

    def __init__(self, order: Order | None = None) -> None:
        super().__init__(depth=None, order=order)
