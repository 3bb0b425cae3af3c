"""The state of one planning pass, shared by every policy of this package.

A :class:`Pass` holds the :class:`~minibatch.policy.book.Book` of profiles and
the plan so far (starts, reasons, predicted starts), and offers the steps the
policies are made of: :meth:`Pass.fit` (where a job can start now, if
anywhere), :meth:`Pass.start`, :meth:`Pass.reserve` (at the earliest start,
held in the profile so later jobs keep off it) and :meth:`Pass.reason`. It also
gives seed 003's resource vectors for BB and IBB: :meth:`Pass.utilization` (S)
and :meth:`Pass.demand` (R^j).
"""

from __future__ import annotations

from collections.abc import Iterable

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan, Start
from minibatch.policy.base import NEVER, reserved_reason, waiting_reason
from minibatch.policy.book import Book
from minibatch.policy.profile import Profile, shape_of
from minibatch.policy.search import Shape


class Pass:
    """The state of one planning pass: the profile book and the plan so far.

    Selections work through :meth:`fit`, :meth:`start` and :meth:`reason`;
    :meth:`utilization` gives seed 003's S vector (CPUs, memory, GPUs in use as
    fractions of the machine, for the resources the machine has).
    """

    __slots__ = (
        "snap",
        "now",
        "book",
        "starts",
        "backfilled",
        "reasons",
        "predicted",
        "failed",
        "failed_general",
        "heads",
        "counts",
        "_taken",
        "_capacity",
        "_used0",
        "_has_mem",
        "_has_gpus",
    )

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap
        self.now = float(snap.now)  # as the book's (book.releases)
        self.book = Book(snap)
        self.starts: list[Start] = []
        self.backfilled: list[int] = []
        self.reasons: dict[int, str] = {}
        self.predicted: dict[int, float] = {}
        #: (view, shape) -> the shortest walltime end known not to fit now; the
        #: same for the general view by shape alone (the hot loop's).
        self.failed: dict[tuple[int, Shape], float] = {}
        self.failed_general: dict[Shape, float] = {}
        #: The first reserved job of each view ("" = general), for reasons.
        self.heads: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        #: CPUs, memory and GPUs taken by the jobs started in this pass.
        self._taken = [0, 0, 0]
        # Seed 003's machine totals (``_capacity``, ``_used0``, ``_has_mem``,
        # ``_has_gpus``) are made by the first :meth:`utilization`.
        self._capacity: list[float] = []

    def fit(self, job: PendingView) -> tuple[Profile, list[int]] | None:
        """Where ``job`` can start now, or None."""
        view = self.book.view_for(job)
        if view is None:
            return None
        req = job.request
        shape = shape_of(req)
        end = self.now + req.walltime
        if job.features:  # only some nodes will do: no shared shape caches
            view.mask = self.book.mask_for(job)
            try:
                nodes = view.fit_now(shape, end)
            finally:
                view.mask = None
            return None if nodes is None else (view, nodes)
        # A shape that did not fit until an end cannot fit for longer, until
        # something starts (which clears these).
        if view is self.book.general:
            bad = self.failed_general.get(shape)
            if bad is not None and end >= bad:
                return None
            nodes = view.fit_now(shape, end)
            if nodes is None:
                self.failed_general[shape] = end
        else:
            key = (id(view), shape)
            bad = self.failed.get(key)
            if bad is not None and end >= bad:
                return None
            nodes = view.fit_now(shape, end)
            if nodes is None:
                self.failed[key] = end
        return None if nodes is None else (view, nodes)

    def start(
        self,
        job: PendingView,
        view: Profile,
        nodes: list[int],
        shape: Shape | None = None,
    ) -> None:
        req = job.request
        if shape is None:
            shape = shape_of(req)
        self.book.place(view, nodes, shape, None, self.now + req.walltime)
        names = self.book.names
        if len(nodes) == 1:
            self.starts.append(Start(job.id, (names[nodes[0]],)))
        else:
            self.starts.append(Start(job.id, tuple([names[i] for i in nodes])))
        if self.counts:  # a job ahead of this one holds a reservation
            self.backfilled.append(job.id)
        self.failed.clear()
        self.failed_general.clear()
        count, ppn, mem, gpus = shape
        taken = self._taken
        taken[0] += count * ppn
        taken[1] += count * mem
        taken[2] += count * gpus

    def reserve(
        self,
        job: PendingView,
        view: Profile,
        key: str,
        base: str = "",
        shape: Shape | None = None,
    ) -> int:
        """Reserve ``job`` at its earliest start; 1 if done, 0 if it never fits.

        ``base`` is why it does not start now, when the caller knows.
        """
        book = self.book
        if not book.general.built:
            book.build()
        req = job.request
        if shape is None:
            shape = shape_of(req)
        if job.features:
            view.mask = book.mask_for(job)
        try:
            found = view.earliest(shape, req.walltime, self.now)
            if not base:
                base = self.why(job, view, shape)
        finally:
            view.mask = None
        if found is None:
            self.reasons[job.id] = f"{base}; {NEVER}"
            return 0
        t, nodes = found
        book.place(view, nodes, shape, t, t + req.walltime, job.id)
        self.predicted[job.id] = t
        self.reasons[job.id] = reserved_reason(base, t, self.now)
        counts = self.counts
        if key in counts:
            counts[key] += 1
        else:
            counts[key] = 1
            self.heads[key] = job.id
        return 1

    def reason(self, job: PendingView) -> str:
        """Why ``job`` does not start now."""
        view = self.book.view_for(job)
        if view is None:
            return self.book.refusals[job.id]
        if job.features:
            view.mask = self.book.mask_for(job)
        try:
            return self.why(job, view, shape_of(job.request))
        finally:
            view.mask = None

    def why(self, job: PendingView, view: Profile, shape: Shape) -> str:
        req = job.request
        widest = view.widest()
        # A one-node job of CPUs only that has them now is kept by a reservation
        # (not so when only some nodes have the features it needs).
        simple = shape[0] == 1 and not shape[2] and not shape[3] and not job.features
        if req.ppn > widest or (not simple and not view.fits_at_all_now(shape)):
            if view is not self.book.general:
                return f"waiting for room in reservation {job.advres!r}"
            if job.features:
                cpus = "1 CPU" if req.ppn == 1 else f"{req.ppn} CPUs"
                return f"waiting for {cpus} on a node with {', '.join(job.features)}"
            return waiting_reason(req, widest)
        who = view.blocker(shape, self.now + req.walltime)
        return f"would {who} (walltime too long)"

    # -------------------------------------------------------------- seed 003's S

    def utilization(self) -> list[float]:
        """Fractions of the machine's CPUs, memory and GPUs in use now (the
        resources it has: memory when every node reports it, GPUs if any)."""
        if not self._capacity:
            nodes = self.snap.nodes
            self._has_mem = bool(nodes) and all(n.mem_kb for n in nodes)
            self._has_gpus = any(n.gpus for n in nodes)
            cap = [sum(n.cpus for n in nodes)]
            used = [sum(n.cpus - n.free_cpus for n in nodes)]
            if self._has_mem:
                cap.append(sum(n.mem_kb or 0 for n in nodes))
                used.append(sum((n.mem_kb or 0) - (n.free_mem_kb or 0) for n in nodes))
            if self._has_gpus:
                cap.append(sum(n.gpus for n in nodes))
                used.append(sum(n.gpus - n.free_gpus for n in nodes))
            self._capacity = [float(c) for c in cap]
            self._used0 = [float(u) for u in used]
        taken = self._amounts(self._taken)
        return [
            (u + t) / c if c else 0.0
            for u, t, c in zip(self._used0, taken, self._capacity, strict=True)
        ]

    def demand(self, job: PendingView) -> list[float]:
        """Seed 003's R^j: the job's request as fractions of the machine."""
        self.utilization()
        count, ppn, mem, gpus = shape_of(job.request)
        amounts = self._amounts((count * ppn, count * mem, count * gpus))
        return [
            a / c if c else 0.0 for a, c in zip(amounts, self._capacity, strict=True)
        ]

    def _amounts(self, totals: tuple[int, int, int] | list[int]) -> list[float]:
        out = [float(totals[0])]
        if self._has_mem:
            out.append(float(totals[1]))
        if self._has_gpus:
            out.append(float(totals[2]))
        return out

    def plan(
        self,
        default: str = "",
        order: Iterable[PendingView] = (),
        by_submission: bool = False,
    ) -> Plan:
        """The plan so far; ``order`` is the priority order the pass walked, whose
        head (less what starts now) becomes the plan's ``upcoming``;
        ``by_submission``: that order is the snapshot's (submission order)."""
        return Plan(
            generation=self.snap.generation,
            starts=self.starts,
            reasons=self.reasons,
            predicted=self.predicted,
            default_reason=default,
            upcoming=upcoming(self.snap, order, self.starts),
            upcoming_by_submission=by_submission,
            backfilled=self.backfilled,
        )


def upcoming(
    snap: ClusterSnapshot, order: Iterable[PendingView], starts: list[Start]
) -> list[int]:
    """The first ``snap.upcoming`` jobs of ``order`` that ``starts`` leaves
    waiting (see :attr:`Plan.upcoming`)."""
    # Jobs of advance reservations are left out: the server's fast start
    # places jobs on the general nodes only.
    limit = snap.upcoming
    if limit <= 0:
        return []
    started = {s.job for s in starts}
    out: list[int] = []
    for job in order:
        if job.id in started or job.advres:
            continue
        out.append(job.id)
        if len(out) == limit:
            break
    return out
