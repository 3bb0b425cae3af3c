"""SD-Policy's view of the running malleable jobs: mates, rooms, seats.

A :class:`Mate` is a running malleable job as one pass sees it (its CPUs change
within the pass as guests are placed); its Eq. 4 penalty and its predicted end
after lending come from the run-time model of :mod:`minibatch.core.resize`. A
:class:`Seat` is one node's mates as lenders, ranked by penalty, made once per
pass and again after the node's mates change (:class:`Seats`); a :class:`Room`
is one way to seat a guest. The choice between rooms is the policy's
(:mod:`minibatch.policy.sd`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from minibatch.core.resize import limit_rate
from minibatch.core.snapshot import RunningView
from minibatch.policy.profile import Profile


class Mate:
    """A running malleable job as this pass sees it (its CPUs change in the pass)."""

    __slots__ = ("view", "node", "held", "end", "low", "high", "ppn", "req", "lent")

    def __init__(self, view: RunningView, now: float) -> None:
        self.view = view
        self.node, self.held = view.nodes[0]
        self.low, self.high = view.malleable or (self.held, self.held)
        self.ppn = view.ppn or self.held
        self.req = view.req_walltime or view.walltime
        #: Its predicted end (start + time limit, as stretched).
        self.end = max(view.start_time + view.walltime, now)
        #: It lent CPUs to a guest in this pass (it does not grow in it then).
        self.lent = False

    @property
    def snapshot_held(self) -> int:
        return self.view.nodes[0][1]

    def lendable(self, sharing: float) -> int:
        """CPUs it may lend: in all at most ``sharing`` of its request (what it
        lends already counts), never below its minimum (Section 3.3)."""
        return max(
            0,
            min(
                math.floor(sharing * self.ppn) - (self.ppn - self.held),
                self.held - self.low,
            ),
        )

    def end_after(self, give: int, now: float, until: float) -> float:
        """Its predicted end if it gives ``give`` CPUs until ``until`` and then
        grows back: the work left at the lower rate, the rest at the old one."""
        before = limit_rate([self.held], self.ppn)
        during = limit_rate([self.held - give], self.ppn)
        work = (self.end - now) * before
        done = (until - now) * during
        if work <= done:
            return now + work / during
        return until + (work - done) / before

    def penalty(self, end: float) -> float:
        """Eq. 4: its predicted slowdown with its run ending at ``end``."""
        if self.req <= 0:
            return math.inf
        wait = self.view.start_time - self.view.submit_time
        increase = max(0.0, end - (self.view.start_time + self.req))
        return (wait + increase + self.req) / self.req


class Room(NamedTuple):
    """A way to start a guest now on one node."""

    #: Eq. 1: the sum of the lending mates' penalties.
    penalty: float
    cpus: int
    node: int
    #: Idle CPUs of the node it takes.
    free: int
    #: (mate, CPUs it gives, its predicted end after), in the order taken.
    gives: tuple[tuple[Mate, int, float], ...]

    def better_than(self, other: Room | None) -> bool:
        if other is None:
            return True
        return (self.penalty, -self.cpus, len(self.gives)) < (
            other.penalty,
            -other.cpus,
            len(other.gives),
        )


class Seat:
    """A node's running malleable jobs as lenders, for this pass."""

    __slots__ = ("lenders", "lendable", "penalty", "room")

    def __init__(
        self,
        mates: list[Mate],
        sharing: float,
        eligible: Callable[[Mate], bool],
        candidates: int,
        size: int,
    ) -> None:
        #: Each mate's penalty before any shrink (Listing 2's filter and sort).
        self.penalty = {m: m.penalty(m.end) for m in mates}
        self.lendable = {m: m.lendable(sharing) for m in mates}
        ranked = [m for m in mates if self.lendable[m] and eligible(m)]
        ranked.sort(key=self.penalty.__getitem__)
        self.lenders = ranked[:candidates]
        #: The most CPUs ``size`` lenders can give.
        most = sorted((self.lendable[m] for m in self.lenders), reverse=True)
        self.room = sum(most[:size])


class Seats:
    """The seats of every node with running malleable jobs, made when first
    needed and made again after a node's mates change."""

    def __init__(
        self,
        by_node: dict[str, list[Mate]],
        make: Callable[[list[Mate]], Seat],
    ) -> None:
        self.by_node, self.make = by_node, make
        self._seats: dict[str, Seat] = {}

    def of(self, name: str) -> Seat | None:
        seat = self._seats.get(name)
        if seat is None and name in self.by_node:
            seat = self._seats[name] = self.make(self.by_node[name])
        return seat

    def changed(self, name: str) -> None:
        self._seats.pop(name, None)

    def nodes_for(self, general: Profile, low: int, ppn: int, mem: int) -> list[int]:
        """The nodes where a guest of at least ``low`` CPUs (and ``mem``) could
        possibly sit on idle and lent CPUs."""
        out = []
        for i, name in enumerate(general.names):
            if name not in self.by_node:
                continue
            m = general.m0[i]
            if mem and m is not None and m < mem:
                continue
            seat = self.of(name)
            assert seat is not None
            if min(general.c0[i], ppn) + seat.room >= low:
                out.append(i)
        return out
