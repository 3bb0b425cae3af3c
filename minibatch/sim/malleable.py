"""Malleable jobs in the simulator: which jobs are, and how resizes play out.

**Which jobs** (``mb sim --malleable none|all|FRACTION``): a job is malleable when
it runs on one node and a hash of its id falls under the fraction, so the choice
is the same in every run and for every policy. Its range is a share of its
request (``--malleable-range 0.5,1`` by default: down to half its CPUs, up to
what it asked for; ``0.5,2`` lets idle CPUs double it), within the node.

**How a resize plays out.** The decisions are checked with the rules the
resource manager applies (:mod:`minibatch.core.resize`: the range, CPUs free on
the node, a guest's start and its mates' shrinks together, mates growing back
when their guest ends), and a start the server would refuse is a policy bug
(:class:`PlanRejected`). A malleable job's trace run time
is its *static* run time: its work, done at the rate of the run-time model
(``--runtime-model ideal|worst``, seed 002 Eq. 5 and 6, uncapped: more CPUs
than asked for run it faster). Each resize moves its end; the time limit the
policy sees stretches as the server's does (worst case, never under the
request).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from minibatch.core.job import JobRequest
from minibatch.core.resize import (
    RuntimeModel,
    give_back_target,
    limit_rate,
    new_limit,
    rate,
    refusal,
    start_limit,
)
from minibatch.core.snapshot import Resize, RunningView
from minibatch.errors import InvalidArgument
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob

#: Knuth's multiplicative hash: a job id -> a fraction in [0, 1), stable.
_GOLDEN = 2654435761


class PlanRejected(RuntimeError):
    """A policy proposed a decision the resource manager would refuse: a bug."""


def parse_fraction(text: str) -> float:
    """``none`` (0), ``all`` (1) or a fraction of the jobs in [0, 1]."""
    value = text.strip().lower()
    if value in ("none", "all"):
        return 0.0 if value == "none" else 1.0
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise InvalidArgument(
            f"--malleable takes none, all or a fraction in [0, 1], not {text!r}"
        )
    return number


def parse_range(text: str) -> tuple[float, float]:
    """``0.5,1``: the fewest and most CPUs as shares of the request."""
    low, _, high = text.partition(",")
    try:
        shares = float(low), float(high)
    except ValueError:
        shares = (math.nan, math.nan)
    if not 0 < shares[0] <= 1 <= shares[1]:
        raise InvalidArgument(
            f"--malleable-range takes MIN,MAX shares with 0 < MIN <= 1 <= MAX, "
            f"not {text!r}"
        )
    return shares


def make_malleable(
    jobs: list[TraceJob],
    machine: Machine,
    fraction: float,
    shares: tuple[float, float] = (0.5, 1.0),
) -> list[TraceJob]:
    """``jobs`` with the chosen ones malleable (see the module docstring)."""
    if fraction <= 0:
        return jobs
    widest = max(n.cpus for n in machine.nodes)
    out = []
    for job in jobs:
        req = job.request
        chosen = (job.id * _GOLDEN) % 2**32 / 2**32 < fraction
        if chosen and req.nodes == 1:
            low = max(1, math.ceil(req.ppn * shares[0]))
            high = max(req.ppn, min(widest, math.floor(req.ppn * shares[1])))
            request = msgspec.structs.replace(req, malleable=(low, high))
            job = msgspec.structs.replace(job, request=request)
        out.append(job)
    return out


@dataclass
class Run:
    """A running malleable job: its CPUs, its work and its time limit."""

    node: str
    held: int
    ppn: int
    malleable: tuple[int, int] | None
    start: float
    asked: float
    limit: float
    #: Static seconds of work left at ``since``, done at ``rate`` from then on.
    work: float
    since: float
    rate: float
    end: float = 0.0
    #: CPU-seconds held up to ``since``.
    cpu_s: float = 0.0


class Malleability:
    """The simulator's malleable jobs; it changes the engine's own structures.

    Args:
        model: how a job's rate follows its CPUs.
        kill: end a job at its time limit (``--kill-at-walltime``).
        free, running, ends: the engine's free CPUs per node, running jobs'
            views and end heap, changed in place.
    """

    def __init__(
        self,
        model: RuntimeModel,
        kill: bool,
        free: dict[str, int],
        running: dict[int, RunningView],
        ends: list[tuple[float, int]],
        on_change: Callable[[int, int, float], None] | None = None,
        room: Callable[[str, int, float, float], int] | None = None,
    ) -> None:
        self.model, self.kill = model, kill
        self.free, self.running, self.ends = free, running, ends
        #: Told (job, CPUs, time) after each resize (fairshare charges them).
        self.on_change = on_change
        #: (node, job, now, until) -> the CPUs the job may hold on its node
        #: over [now, until): its own and the free ones, outside downtimes
        #: (default: no downtimes).
        self.room = room or (
            lambda node, jid, now, until: self.free[node] + self.runs[jid].held
        )
        self.runs: dict[int, Run] = {}
        #: Guest id -> mate id -> CPUs lent, while the guest runs.
        self.borrowed: dict[int, dict[int, int]] = {}
        #: Resizes per job, the jobs that started as guests, and each ended
        #: malleable job's CPU-seconds.
        self.resized: dict[int, int] = {}
        self.guests: set[int] = set()
        self.cpu_s: dict[int, float] = {}

    # --------------------------------------------------------------- starts

    def start(
        self, jid: int, req: JobRequest, node: str, ppn: int, now: float, run: float
    ) -> float:
        """Register a malleable job started with ``ppn`` CPUs; its end."""
        asked = float(req.walltime)
        limit = start_limit(asked, req.ppn, ppn)
        r = Run(
            node=node,
            held=ppn,
            ppn=req.ppn,
            malleable=req.malleable,
            start=now,
            asked=asked,
            limit=limit,
            work=run,
            since=now,
            rate=rate([ppn], req.ppn, self.model),
        )
        self.runs[jid] = r
        r.end = self._end(r, now)
        return r.end

    def guest_start(self, jid: int, shrinks: list[Resize], now: float) -> None:
        """Check and apply the shrinks a guest starts on (all or nothing)."""
        for s in shrinks:
            mate = self.runs.get(s.job)
            if mate is None:
                raise PlanRejected(f"guest {jid}: mate {s.job} is not running")
            if s.cpus >= mate.held:
                raise PlanRejected(f"guest {jid}: mate {s.job} does not shrink")
            self._check(s.job, mate, s.cpus, now)
        self.borrowed[jid] = {s.job: self.runs[s.job].held - s.cpus for s in shrinks}
        self.guests.add(jid)
        for s in shrinks:
            self._apply(s.job, self.runs[s.job], s.cpus, now)

    # -------------------------------------------------------------- resizes

    def resize(self, s: Resize, now: float) -> None:
        """A resize without a guest (growth into idle CPUs, or a shrink)."""
        r = self.runs.get(s.job)
        if r is None:
            raise PlanRejected(f"resize of job {s.job}, which is not running")
        self._check(s.job, r, s.cpus, now)
        self._apply(s.job, r, s.cpus, now)

    def _check(self, jid: int, r: Run, cpus: int, now: float) -> None:
        """The server's rules for a resize, downtimes included (a growth must
        find its CPUs outside them, a shrink must not stretch the job into
        one), or raise."""
        why = refusal(jid, r.malleable, r.held, cpus, cpus)  # the range first
        if why is None:
            room = self.room(r.node, jid, now, r.start + self._limit(r, cpus, now))
            if cpus > r.held:
                why = refusal(jid, r.malleable, r.held, cpus, room - r.held)
            elif room < cpus:
                why = f"job {jid} on {cpus} CPUs would run into a downtime"
        if why is not None:
            raise PlanRejected(why)

    def _limit(self, r: Run, cpus: int, now: float) -> float:
        before = limit_rate([r.held], r.ppn)
        after = limit_rate([cpus], r.ppn)
        return new_limit(now - r.start, r.limit, r.asked, before, after)

    def _apply(self, jid: int, r: Run, cpus: int, now: float) -> None:
        if cpus == r.held:
            return
        r.work -= (now - r.since) * r.rate
        r.cpu_s += (now - r.since) * r.held
        r.since = now
        r.limit = self._limit(r, cpus, now)
        self.free[r.node] += r.held - cpus
        r.held, r.rate = cpus, rate([cpus], r.ppn, self.model)
        self.resized[jid] = self.resized.get(jid, 0) + 1
        r.end = self._end(r, now)
        heapq.heappush(self.ends, (r.end, jid))
        view = self.running[jid]
        self.running[jid] = msgspec.structs.replace(
            view, nodes=((r.node, cpus),), walltime=r.limit
        )
        if self.on_change is not None:
            self.on_change(jid, cpus, now)

    def _end(self, r: Run, now: float) -> float:
        end = r.since + max(0.0, r.work) / r.rate
        return min(end, r.start + r.limit) if self.kill else end

    def growable(self) -> bool:
        """Whether some running malleable job could grow into idle CPUs (a
        pass is due even with nothing waiting)."""
        free = self.free
        return any(
            r.malleable is not None and r.held < r.malleable[1] and free[r.node]
            for r in self.runs.values()
        )

    # ----------------------------------------------------------------- ends

    def stale(self, jid: int, end: float) -> bool:
        """Whether a heap entry is an end a resize has since moved."""
        r = self.runs.get(jid)
        return r is not None and r.end != end

    def ended(self, jid: int, now: float) -> None:
        """A job ended (its CPUs already freed): its mates grow back."""
        r = self.runs.pop(jid, None)
        if r is not None:
            self.cpu_s[jid] = r.cpu_s + (now - r.since) * r.held
        for mate_id, lent in sorted(self.borrowed.pop(jid, {}).items()):
            mate = self.runs.get(mate_id)
            if mate is None or mate.malleable is None:
                continue
            want = min(mate.malleable[1], mate.held + lent)
            until = mate.start + self._limit(mate, want, now)
            room = self.room(mate.node, mate_id, now, until) - mate.held
            target = give_back_target(mate.held, lent, mate.malleable[1], room)
            if target > mate.held:
                self._apply(mate_id, mate, target, now)
