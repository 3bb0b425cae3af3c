"""SD-Policy: slowdown-driven backfill with malleable jobs (seed 002).

D'Amico, Jokanovic, Corbalan, *Holistic Slowdown Driven Scheduling and Resource
Management for Malleable Jobs*, ICPP 2019. One pass (Listing 1), jobs in
priority order:

1. **Static first.** A job that fits now starts; the first that does not is
   reserved (EASY, ``depth`` 1) and later ones backfill around it.
2. **Malleable start.** A malleable job that cannot start statically may start
   at once on one node with as few as its minimum CPUs, on CPUs taken from at
   most ``mates`` running malleable jobs there (Listing 2), if its predicted end
   beats the static one: ``now + req_time x ppn/cpus`` (Eq. 6; Eq. 5 is the same
   on one node) ``< static start + req_time``, the static start being its
   earliest start in the availability profile.
3. **Mates** are chosen among the running malleable jobs on the node by the
   penalty of Eq. 4, ``p = (wait + increase + req_time) / req_time`` (wait
   before its start, increase of its predicted run time over its request after
   this shrink), under the cut-off ``max_slowdown`` (a number, or ``dynamic``:
   the mean predicted slowdown of the running jobs, Section 3.2.2). Every set of
   at most ``mates`` of the ``candidates`` lowest-penalty mates is tried
   (Section 3.2.4); the set of least total penalty wins (Eq. 1). A mate gives at
   most ``sharing_factor`` of its CPUs and never goes below its minimum; the
   guest must end before each mate's (stretched) end, and mates grow back when
   it ends (the resource manager does that, Listing 3).
4. **Idle CPUs** (``expand``): after the walk, CPUs nothing waiting could use go
   to running malleable jobs on their node (highest predicted slowdown first),
   up to their maximum. CPUs a job holds beyond its request are given back
   without penalty to any job that needs them to start (also a rigid one),
   so a job grown into idle CPUs never keeps a waiting job out.

Departures from the paper, and why (docs/policies.md): jobs are malleable on
one node (CPUs within a node, as DROM does), so constraint 3 is "every mate on
the guest's node"; a guest may also use CPUs free on its node; predicted
slowdowns use requested times, as the paper says the scheduler must.

Parameters: ``mates`` (2), ``max_slowdown`` (``dynamic`` or a number; ``inf``
for no cut-off), ``sharing_factor`` (0.5), ``expand`` (true), ``candidates``
(8: mates considered per node, lowest penalty first).
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import ClassVar

import msgspec

from minibatch.core.snapshot import (
    ClusterSnapshot,
    PendingView,
    Plan,
    Resize,
    Start,
)
from minibatch.errors import InvalidArgument
from minibatch.policy.base import as_bool, as_int
from minibatch.policy.mates import Mate, Room, Seat, Seats
from minibatch.policy.planning import Pass
from minibatch.policy.profile import Profile, shape_of
from minibatch.policy.search import Shape


class SlowdownDriven:
    """SD-Policy (see the module docstring)."""

    name: ClassVar[str] = "sd"

    def __init__(
        self,
        mates: int | str = 2,
        max_slowdown: float | str = "dynamic",
        sharing_factor: float | str = 0.5,
        expand: bool | str = True,
        candidates: int | str = 8,
        tries: int | str = 100,
    ) -> None:
        self.mates = as_int("mates", mates, minimum=1) or 1
        self.tries = as_int("tries", tries, minimum=0) or 0
        self.candidates = as_int("candidates", candidates, minimum=1) or 1
        self.expand = as_bool("expand", expand)
        self.sharing = _fraction("sharing_factor", sharing_factor)
        text = str(max_slowdown).strip().lower()
        self.dynamic = text == "dynamic"
        if self.dynamic or text in ("inf", "infinite", "none", "unlimited"):
            self.max_slowdown = math.inf
        else:
            try:
                self.max_slowdown = float(text)
            except ValueError:
                raise InvalidArgument(
                    "parameter max_slowdown: expected a number, 'dynamic' or "
                    f"'inf', got {max_slowdown!r}"
                ) from None
            if not self.max_slowdown >= 1:
                raise InvalidArgument(
                    f"parameter max_slowdown: must be >= 1, got {max_slowdown!r}"
                )

    # ---------------------------------------------------------------- the pass

    def plan(self, snap: ClusterSnapshot) -> Plan:
        p = Pass(snap)
        general, now = p.book.general, snap.now
        by_node: dict[str, list[Mate]] = {}
        for r in snap.running:
            if r.malleable is not None and len(r.nodes) == 1 and not r.advres:
                mate = Mate(r, now)
                by_node.setdefault(mate.node, []).append(mate)
        if snap.pending:
            self._reclaim(general, by_node)
        cutoff = self._cutoff(snap) if by_node else math.inf
        seats = Seats(
            by_node,
            lambda mates: Seat(
                mates,
                self.sharing,
                lambda m: self._eligible(m, cutoff),
                self.candidates,
                self.mates,
            ),
        )
        tries = self.tries
        resizes: list[Resize] = []
        ppns: dict[int, int] = {}
        # Shapes no guest could start with until something starts (cleared then).
        failed: set[tuple[int, int, int, int, int]] = set()
        reserved = 0
        #: Malleable jobs started statically now, and their node.
        fresh: list[tuple[PendingView, int]] = []
        #: Why a job of a shape waits, until something starts or is reserved.
        said: dict[tuple[int, Shape, tuple[str, ...]], str] = {}
        for job in snap.pending:
            found = p.fit(job)
            if found is not None:
                p.start(job, *found)
                failed.clear()
                said.clear()
                if job.request.malleable is not None and found[0] is general:
                    fresh.append((job, found[1][0]))
                continue
            malleable = job.request.malleable is not None
            plain = not job.advres and not job.features
            if by_node and malleable and plain and tries > 0:
                tries -= 1
                room = self._room(p, job, seats, failed)
                if room is not None:
                    self._start_guest(p, job, room, resizes, ppns)
                    seats.changed(general.names[room.node])
                    failed.clear()
                    said.clear()
                    continue
            view = p.book.view_for(job)
            if view is not None and reserved < 1 and not job.advres:
                reserved += p.reserve(job, view, "")
                said.clear()
            else:
                shape = (id(view), shape_of(job.request), job.features)
                text = said.get(shape)
                if text is None:
                    text = said[shape] = p.reason(job)
                p.reasons[job.id] = text
        if self.expand:
            self._grow(general, by_node)
            self._grow_fresh(general, fresh, ppns, now)
        # A mate that lent has its guest's resize; any other that changed
        # (its surplus taken back, or grown) gets one of its own. Resizes are
        # applied in order before the starts (guests' with their guest), so
        # every shrink comes first: a start or a growth may use what it frees.
        # A mate that lent after giving its surplus back shrinks to its
        # request first, on its own, for the starts that took the surplus.
        own = [
            Resize(m.view.id, m.ppn if m.lent else m.held)
            for mates in by_node.values()
            for m in mates
            if (m.ppn if m.lent else m.held) != m.snapshot_held
            and (not m.lent or m.snapshot_held > m.ppn)
        ]
        before = {m.view.id: m.snapshot_held for ms in by_node.values() for m in ms}
        own.sort(key=lambda r: r.cpus > before[r.job])
        resizes = own + resizes
        plan = p.plan(order=snap.pending, by_submission=True)
        starts = [
            Start(s.job, s.nodes, ppns[s.job]) if s.job in ppns else s
            for s in plan.starts
        ]
        return msgspec.structs.replace(plan, starts=starts, resizes=resizes)

    @staticmethod
    def _reclaim(general: Profile, by_node: dict[str, list[Mate]]) -> None:
        """Jobs grown beyond their request give the extra CPUs back when jobs
        wait: the pass plans with them free (any job may start on them), and
        what nothing uses is grown again at the end (``expand``)."""
        index = {name: i for i, name in enumerate(general.names)}
        for name, mates in by_node.items():
            i = index.get(name)
            if i is None:
                continue
            for m in mates:
                extra = m.held - m.ppn
                if extra > 0:
                    general.add(i, None, m.end, extra, 0, 0)
                    m.held = m.ppn

    def _cutoff(self, snap: ClusterSnapshot) -> float:
        """MAX_SLOWDOWN: the number given, or the running jobs' mean predicted
        slowdown (requested times: all the scheduler can know)."""
        if not self.dynamic:
            return self.max_slowdown
        values = [
            (r.start_time - r.submit_time + r.walltime) / req
            for r in snap.running
            if (req := r.req_walltime or r.walltime) > 0
        ]
        return sum(values) / len(values) if values else math.inf

    # ------------------------------------------------------------ a guest's room

    def _room(
        self,
        p: Pass,
        job: PendingView,
        seats: Seats,
        failed: set[tuple[int, int, int, int, int]],
    ) -> Room | None:
        """The best way to start malleable ``job`` now on CPUs mates lend
        (Listings 1 and 2), or None."""
        req = job.request
        count, ppn, mem, gpus = shape_of(req)
        if count != 1 or req.malleable is None:
            return None
        low = req.malleable[0]
        key = (low, ppn, mem, gpus, req.walltime)
        if key in failed:
            return None
        general, now = p.book.general, p.now
        nodes = seats.nodes_for(general, low, ppn, mem)
        if not nodes:
            failed.add(key)
            return None
        # Listing 1 (static_end > mall_end) as the fewest CPUs worth running
        # on: the static end is when it would end if it waited.
        wait_end = self._static_end(p, job) - now
        if wait_end <= req.walltime:
            failed.add(key)
            return None  # it would not wait long enough for any shrinking
        need = max(low, math.floor(req.walltime * ppn / wait_end) + 1)
        # The nodes of the ``candidates`` lowest-penalty lenders of all
        # (Section 3.2.4: "the first nm mates, with lower p"), each with those
        # of its lenders.
        lenders = sorted(
            (
                (seat.penalty[m], i, m)
                for i in nodes
                if (seat := seats.of(general.names[i])) is not None
                for m in seat.lenders
            ),
            key=lambda x: (x[0], x[1]),
        )
        chosen: dict[int, list[Mate]] = {}
        for _, i, m in lenders[: self.candidates]:
            chosen.setdefault(i, []).append(m)
        best: Room | None = None
        for i, mine in chosen.items():
            seat = seats.of(general.names[i])
            assert seat is not None
            best = self._best_on(general, i, seat, tuple(mine), job, need, now, best)
        if best is None:
            failed.add(key)
        return best

    def _best_on(
        self,
        general: Profile,
        i: int,
        seat: Seat,
        lenders: tuple[Mate, ...],
        job: PendingView,
        need: int,
        now: float,
        best: Room | None,
    ) -> Room | None:
        """The best room on node ``i``, or ``best`` if none beats it: the node's
        idle CPUs, and CPUs lent by a set of at most ``mates`` of ``lenders``."""
        req = job.request
        _, ppn, mem, gpus = shape_of(req)
        free = min(general.c0[i], ppn)
        for size in range(1, self.mates + 1):
            for chosen in combinations(lenders, size):
                # Penalties only grow with a shrink: a set whose mates'
                # penalties before it already exceed the best cannot beat it.
                if best is not None and (
                    sum(seat.penalty[m] for m in chosen) > best.penalty
                ):
                    continue
                room = self._try(general, i, seat, chosen, free, job, need, now)
                if room is not None and room.better_than(best):
                    best = room
        return best

    def _try(
        self,
        general: Profile,
        i: int,
        seat: Seat,
        chosen: tuple[Mate, ...],
        free: int,
        job: PendingView,
        need: int,
        now: float,
    ) -> Room | None:
        """The room ``chosen`` make on node ``i`` with its ``free`` idle CPUs,
        if it keeps every rule."""
        req = job.request
        _, ppn, mem, gpus = shape_of(req)
        cpus = free
        gives: list[tuple[Mate, int]] = []
        for m in chosen:
            lend = min(seat.lendable[m], ppn - cpus)
            if lend <= 0:
                return None  # a smaller set already covers it
            gives.append((m, lend))
            cpus += lend
        if cpus < need:
            return None
        end = now + req.walltime * ppn / cpus
        penalty = 0.0
        ends: list[float] = []
        for m, lend in gives:
            mate_end = m.end_after(lend, now, end)
            # The guest ends inside its mates' allocation (3.2.4).
            if mate_end < end:
                return None
            penalty += m.penalty(mate_end)
            ends.append(mate_end)
        # The mates hold all their CPUs longer: nothing planned (a
        # reservation, the queue's head) may need them before the new ends.
        held = sum(m.held for m in chosen)
        since = min(m.end for m in chosen)
        if (
            max(ends) > since
            and general.next_start(i, (1, held, 0, 0), max(ends) - since, since, since)
            is None
        ):
            return None
        shape: Shape = (1, free, mem, gpus)
        if (free or mem or gpus) and not general.fits_on(i, shape, end):
            return None
        return Room(
            penalty,
            cpus,
            i,
            free,
            tuple((m, lend, e) for (m, lend), e in zip(gives, ends, strict=True)),
        )

    def _eligible(self, mate: Mate, cutoff: float) -> bool:
        """Listing 2's filter, on the mate's predicted slowdown now: Eq. 2 (p <
        MAX_SLOWDOWN) for a number; for ``dynamic``, not above the mean (the
        text: "jobs exceeding the average slowdown are not considered")."""
        p = mate.penalty(mate.end)
        return p <= cutoff if self.dynamic else p < cutoff

    def _static_end(self, p: Pass, job: PendingView) -> float:
        """When ``job`` would end if it waited for its static start."""
        book = p.book
        if not book.general.built:
            book.build()
        req = job.request
        found = book.general.earliest(shape_of(req), req.walltime, p.now)
        return math.inf if found is None else found[0] + req.walltime

    def _start_guest(
        self,
        p: Pass,
        job: PendingView,
        room: Room,
        resizes: list[Resize],
        ppns: dict[int, int],
    ) -> None:
        req = job.request
        _, _, mem, gpus = shape_of(req)
        end = p.now + req.walltime * req.ppn / room.cpus
        general = p.book.general
        p.book.place(general, [room.node], (1, room.free, mem, gpus), None, end)
        p.starts.append(Start(job.id, (general.names[room.node],)))
        if room.cpus != req.ppn:
            ppns[job.id] = room.cpus
        for mate, lend, mate_end in room.gives:
            if mate_end > mate.end:
                general.add(room.node, mate.end, mate_end, -mate.held, 0, 0)
            mate.end, mate.held, mate.lent = mate_end, mate.held - lend, True
            resizes.append(Resize(mate.view.id, mate.held, guest=job.id))

    # -------------------------------------------------------------- idle CPUs

    @staticmethod
    def _grow(general: Profile, by_node: dict[str, list[Mate]]) -> None:
        """Give CPUs nobody waiting can use to running malleable jobs (not to
        one that lent in this pass), highest predicted slowdown first."""
        for i, name in enumerate(general.names):
            mates = by_node.get(name)
            if not general.c0[i] or not mates:
                continue
            for m in sorted(mates, key=lambda m: -m.penalty(m.end)):
                if not m.lent:
                    m.held += _idle(general, i, m.high - m.held, m.end)

    @staticmethod
    def _grow_fresh(
        general: Profile,
        fresh: list[tuple[PendingView, int]],
        ppns: dict[int, int],
        now: float,
    ) -> None:
        """Start malleable jobs on the idle CPUs left, up to their maximum."""
        for job, i in fresh:
            req = job.request
            high = req.malleable[1] if req.malleable is not None else req.ppn
            more = _idle(general, i, high - req.ppn, now + req.walltime)
            if more:
                ppns[job.id] = req.ppn + more


def _idle(general: Profile, i: int, want: int, until: float) -> int:
    """Take up to ``want`` idle CPUs of node ``i`` until ``until``, none that a
    reservation claims before then; how many were taken."""
    want = min(want, general.c0[i])
    while want > 0 and not general.fits_on(i, (1, want, 0, 0), until):
        want -= 1
    if want > 0:
        general.add(i, None, until, -want, 0, 0)
    return max(0, want)


def _fraction(name: str, value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        raise InvalidArgument(
            f"parameter {name}: expected a number, got {value!r}"
        ) from None
    if not 0 < number <= 1:
        raise InvalidArgument(f"parameter {name}: must be in (0, 1], got {value!r}")
    return number
