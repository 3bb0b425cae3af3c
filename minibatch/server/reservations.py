"""Advance reservations in the resource manager: the book, placement, enforcement.

The server owns reservations (``setres`` creates them, ``releaseres`` removes
them, they are dropped when their window ends) and picks their concrete CPUs.
Placement (:func:`place`) takes CPUs that no other reservation holds during the
window and that no running job holds past the start, by the job's walltime (the
node daemons enforce walltime, so it is a promise). Among those it prefers CPUs
that other reservations hold at other times, then CPUs busy until before the
start, then idle ones: reservations stack on the same CPUs and leave whole CPUs
for long jobs.

Every policy must keep jobs off reserved CPUs; the server checks again when it
starts a job (:class:`JobCpus`, defense in depth): a job may take a CPU only if
no reservation it does not belong to holds that CPU at any time during
``[now, now + walltime)``, and a job submitted into a reservation (``qsub -l
advres=NAME``) runs on that reservation's CPUs, inside its window. Among the CPUs
a job may take, those claimed soonest by a reservation go first, so short jobs
fill the gaps before reservations and unreserved CPUs stay free for long jobs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping

from minibatch.core.job import Allocation, Job
from minibatch.core.reservation import Reservation
from minibatch.core.snapshot import ReservationView
from minibatch.core.units import format_cpu_list
from minibatch.errors import InfeasibleRequest
from minibatch.server.nodes import Node, NodeRegistry

#: Conflicts named in a refusal at most (the message stays one line).
MAX_NAMED = 4


def clock_text(t: float, now: float) -> str:
    """``14:02:11`` today, ``2025-03-01 14:02:11`` on another day (local time)."""
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    layout = "%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S"
    return time.strftime(layout, time.localtime(t))


class ReservationBook:
    """The reservations not yet over, by name."""

    def __init__(self, reservations: Iterable[Reservation] = ()) -> None:
        self.by_name: dict[str, Reservation] = {r.name: r for r in reservations}
        self._views: tuple[ReservationView, ...] | None = None
        #: Reservations whose start has been announced (or had passed at load).
        self.started: set[str] = set()

    def __iter__(self) -> Iterator[Reservation]:
        return iter(sorted(self.by_name.values(), key=lambda r: (r.start, r.name)))

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Reservation | None:
        return self.by_name.get(name)

    def add(self, resv: Reservation) -> None:
        self.by_name[resv.name] = resv
        self._views = None

    def remove(self, name: str) -> Reservation | None:
        self._views = None
        self.started.discard(name)
        return self.by_name.pop(name, None)

    def views(self) -> tuple[ReservationView, ...]:
        """What the snapshot carries; rebuilt only after a change."""
        if self._views is None:
            self._views = tuple(r.view() for r in self)
        return self._views

    def holding(
        self, node: str, t0: float, t1: float, member: str = ""
    ) -> dict[int, str]:
        """CPU id -> reservation, for the CPUs of ``node`` that reservations other
        than ``member`` hold at some time in ``[t0, t1)``."""
        out: dict[int, str] = {}
        for resv in self.by_name.values():
            if resv.name != member and resv.overlaps(t0, t1):
                for cpu in resv.cpus_on(node):
                    out[cpu] = resv.name
        return out

    def next_claim(self, node: str, after: float) -> dict[int, float]:
        """CPU id -> the earliest start at or after ``after`` of a reservation
        holding it (CPUs no reservation claims later are left out)."""
        out: dict[int, float] = {}
        for resv in self.by_name.values():
            if resv.start >= after:
                for cpu in resv.cpus_on(node):
                    out[cpu] = min(out.get(cpu, math.inf), resv.start)
        return out

    def next_boundary(self, now: float) -> float | None:
        """The next start or end after ``now``: a scheduling pass is due then."""
        times = [t for r in self.by_name.values() for t in (r.start, r.end) if t > now]
        return min(times, default=None)


class JobCpus:
    """The CPUs one job may take, given the reservations (a ``CpuChooser``)."""

    def __init__(
        self, book: ReservationBook, job: Job, now: float, end: float | None = None
    ) -> None:
        self.book, self.job, self.now = book, job, now
        #: Until when the CPUs are wanted (default: a start now, for its walltime).
        self.end = now + job.request.walltime if end is None else end

    def refusal(self) -> str | None:
        """Why the job may not start now at all (its reservation), or None."""
        name = self.job.advres
        if not name:
            return None
        resv = self.book.get(name)
        if resv is None:
            return f"reservation {name!r} no longer exists"
        if self.now < resv.start:
            return f"reservation {name!r} starts at {clock_text(resv.start, self.now)}"
        if self.end > resv.end:
            return (
                f"job {self.job.display_id} would run past the end of reservation "
                f"{name!r} ({clock_text(resv.end, self.now)})"
            )
        return None

    def cpus(self, node: Node) -> list[int]:
        free = node.free_cpus()
        if self.job.advres:
            resv = self.book.by_name[self.job.advres]
            own = set(resv.cpus_on(node.name))
            return [c for c in free if c in own]
        held = self.book.holding(node.name, self.now, self.end)
        usable = [c for c in free if c not in held]
        claims = self.book.next_claim(node.name, self.end)
        if claims:
            usable.sort(key=lambda c: (claims.get(c, math.inf), c))
        return usable

    def shortfall(self, node: Node, ppn: int, usable: int) -> str:
        if self.job.advres:
            return (
                f"node {node.name} has {usable} free CPUs of reservation "
                f"{self.job.advres!r}, {ppn} needed"
            )
        held = self.book.holding(node.name, self.now, self.end)
        names = ", ".join(repr(n) for n in sorted(set(held.values())))
        return (
            f"node {node.name} has {usable} free CPUs outside reservations "
            f"{names} during the job's walltime, {ppn} needed"
        )


# ---------------------------------------------------------------- placement


def _conflicts(
    node: Node,
    book: ReservationBook,
    ends: Mapping[int, float],
    start: float,
    end: float,
) -> dict[int, str]:
    """CPU id -> why it cannot be part of a reservation over ``[start, end)``."""
    out: dict[int, str] = {}
    for cpu, other in book.holding(node.name, start, end).items():
        out[cpu] = f"reserved by {other!r}"
    for cpu, jid in node.used.items():
        if cpu not in out and ends.get(jid, math.inf) > start:
            until = ends.get(jid)
            when = "" if until is None else f" until {clock_text(until, start)}"
            out[cpu] = f"held by job {jid}{when}"
    return out


def _candidates(
    node: Node, book: ReservationBook, conflicts: dict[int, str]
) -> list[int]:
    """Usable CPUs, best first: reserved at other times, busy until before the
    start, idle; lowest id first within each."""
    reserved_elsewhere = {
        cpu for r in book.by_name.values() for cpu in r.cpus_on(node.name)
    }
    ok = [c for c in node.cpus if c not in conflicts]
    return sorted(
        ok, key=lambda c: (c not in reserved_elsewhere, c not in node.used, c)
    )


def _explain(
    what: str, conflicts: Iterable[tuple[str, dict[int, str]]], start: float, now: float
) -> InfeasibleRequest:
    """One line: what could not be reserved, and the first few reasons why."""
    by_reason: list[str] = []
    for name, found in conflicts:
        groups: dict[str, list[int]] = {}
        for cpu, why in found.items():
            groups.setdefault(why, []).append(cpu)
        for why, cpus in groups.items():
            word = "CPU" if len(cpus) == 1 else "CPUs"
            by_reason.append(f"{name} {word} {format_cpu_list(cpus)} {why}")
    more = len(by_reason) - MAX_NAMED
    detail = "; ".join(by_reason[:MAX_NAMED]) + (f"; {more} more" if more > 0 else "")
    return InfeasibleRequest(
        f"cannot reserve {what} from {clock_text(start, now)}: "
        + (detail or "no node is up")
    )


def place(
    registry: NodeRegistry,
    book: ReservationBook,
    ends: Mapping[int, float],
    start: float,
    end: float,
    now: float,
    *,
    names: list[str] | None = None,
    count: int = 0,
    cpus: int = 0,
    any_state: bool = False,
) -> list[Allocation]:
    """Concrete CPUs for a reservation over ``[start, end)``, or raise why not.

    Args:
        registry: The nodes.
        book: The other reservations.
        ends: Running job id -> its end by walltime.
        start: The window's start.
        end: The window's end.
        now: The current time (for messages).
        names: Whole nodes, by name (any state: e.g. maintenance of a down node).
        count: A number of whole nodes, chosen among the usable ones.
        cpus: A number of CPUs: on the node that fits them most tightly (then
            the one where they are least idle now), else spread over the nodes
            with the most usable CPUs.
        any_state: Also choose down and offline nodes (downtime reservations).

    Raises:
        InfeasibleRequest: Not enough CPUs are free of other reservations and of
            running jobs that end after the start; the message names them.
    """
    nodes = registry.nodes
    if names:
        found = {n: _conflicts(nodes[n], book, ends, start, end) for n in names}
        if any(found.values()):
            what = "node" + ("s " if len(names) > 1 else " ") + ",".join(names)
            raise _explain(what, ((n, c) for n, c in found.items() if c), start, now)
        return [Allocation(n, list(nodes[n].cpus)) for n in names]
    pool = [n for n in nodes.values() if any_state or n.usable]
    found = {n.name: _conflicts(n, book, ends, start, end) for n in pool}
    if count:
        whole = [n for n in pool if not found[n.name]]
        if len(whole) < count:
            what = f"{count} whole node{'s' if count > 1 else ''}"
            raise _explain(what, ((n, c) for n, c in found.items() if c), start, now)
        return [Allocation(n.name, list(n.cpus)) for n in whole[:count]]
    usable = {n.name: _candidates(n, book, found[n.name]) for n in pool}
    fitting = [n.name for n in pool if len(usable[n.name]) >= cpus]
    if fitting:
        # Tightest node first; then the one whose chosen CPUs are least idle now.
        def cost(name: str) -> tuple[int, int]:
            idle = sum(1 for c in usable[name][:cpus] if c not in nodes[name].used)
            return len(usable[name]), idle

        best = min(fitting, key=cost)
        return [Allocation(best, sorted(usable[best][:cpus]))]
    if sum(len(c) for c in usable.values()) < cpus:
        raise _explain(
            f"{cpus} CPUs", ((n, c) for n, c in found.items() if c), start, now
        )
    allocs: list[Allocation] = []
    left = cpus
    for name in sorted(usable, key=lambda n: -len(usable[n])):
        take = usable[name][:left]
        if take:
            allocs.append(Allocation(name, sorted(take)))
            left -= len(take)
        if not left:
            break
    return allocs
