"""One node's free CPUs, memory and GPUs from now on, and the earliest start on it.

A :class:`Timeline` keeps the node's change points (``times``, one per instant,
except that index 1 may also be *now*: the releases of overrunning jobs, which
count for reservations but not for a start now) and the free CPUs, memory and
GPUs from each (``mem`` None: no memory figures, unlimited; ``gpu`` None: no
GPUs). Values are kept ready and changed in place by a placement: a
conservative pass places thousands of jobs and asks about the nodes between
placements, so summing changes at each question would cost more. A window's
minimum is one slice of each list.

A conservative plan leaves nodes full most of the time: most change points have
no free CPU. The timeline keeps its *holes*, the stretches with a free CPU
(``starts``/``ends``); every job needs a CPU, so a window lies inside one hole
and the walk of :meth:`Timeline.start` looks only at holes long enough for it,
not at every change point. A placement only widens the stretch of time whose
holes are out of date (``_lo``, ``_hi``); the next question that needs holes
makes them again there. EASY asks once a pass and then only places, so it never
pays for them after.

Free resources only drop where a take begins (a *dip*); ``dip`` is the node's
first, so a window that ends by then is a test of its start alone.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Final

INF: Final = float("inf")
#: Whether this module runs compiled (minibatch/native.py). The hot walk of
#: :meth:`Timeline.start` branches on it: in the interpreter, bisect's C
#: functions and ``min`` of a slice beat any loop of ours (and a call of a
#: helper costs more than they do); compiled, a loop over the list is plain C
#: and beats a call into them with boxed numbers. The answers are the same.
NATIVE: Final = not __file__.endswith(".py")


def _left(a: list[float], x: float, lo: int) -> int:
    """``bisect_left(a, x, lo)``, as compiled code does it faster."""
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _right(a: list[float], x: float, lo: int) -> int:
    """``bisect_right(a, x, lo)``, as compiled code does it faster."""
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: What a job needs on one node: (CPUs, memory or 0, GPUs).
Need = tuple[int, int, int]
#: One segment of a node: (start, cpus, memory or None, gpus or None).
Segment = tuple[float, int, int | None, int | None]


def _room(
    cpu: list[int],
    free: list[int] | None,
    gpu: list[int] | None,
    lo: int,
    hi: int,
    need: Need,
) -> bool:
    """Whether change points ``lo`` to ``hi - 1`` (some) all have room for
    ``need`` (``free``, ``gpu``: None when it asks none)."""
    ppn, mem, gpus = need
    if not NATIVE:
        return (
            min(cpu[lo:hi]) >= ppn
            and (free is None or min(free[lo:hi]) >= mem)
            and (gpu is None or min(gpu[lo:hi]) >= gpus)
        )
    for k in range(lo, hi):
        if (
            cpu[k] < ppn
            or (free is not None and free[k] < mem)
            or (gpu is not None and gpu[k] < gpus)
        ):
            return False
    return True


class Timeline:
    """One node's free resources over time (see the module docstring)."""

    __slots__ = ("times", "cpu", "mem", "gpu", "starts", "ends", "dip", "_lo", "_hi")

    def __init__(
        self,
        times: list[float],
        cpu: list[int],
        mem: list[int] | None,
        gpu: list[int] | None,
        dip: float = INF,
    ) -> None:
        self.times = times
        self.cpu = cpu
        self.mem = mem
        self.gpu = gpu
        self.dip = dip
        self.starts: list[float] = []
        self.ends: list[float] = []
        # The stretch of time whose holes are out of date: all of it, at first.
        self._lo, self._hi = times[0], INF

    @classmethod
    def of(cls, segments: list[Segment]) -> Timeline:
        """A timeline from (start, cpus, memory, gpus) segments (segment 0
        first); its first dip is where any resource first drops."""
        _, _, m, g = segments[0]
        cpu = [s[1] for s in segments]
        mem = None if m is None else [s[2] or 0 for s in segments]
        gpu = None if g is None else [s[3] or 0 for s in segments]
        dip = INF
        for k in range(1, len(segments)):
            if (
                cpu[k] < cpu[k - 1]
                or (mem is not None and mem[k] < mem[k - 1])
                or (gpu is not None and gpu[k] < gpu[k - 1])
            ):
                dip = segments[k][0]
                break
        return cls([s[0] for s in segments], cpu, mem, gpu, dip)

    def segments(self) -> list[Segment]:
        """(start, cpus, memory, gpus) per change point (segment 0 first)."""
        n = len(self.times)
        mem: list[int] | list[None] = self.mem or [None] * n
        gpu: list[int] | list[None] = self.gpu or [None] * n
        return list(zip(self.times, self.cpu, mem, gpu, strict=True))

    # ------------------------------------------------------------------ holes

    def _holes(self, lo: int, hi: int) -> tuple[list[float], list[float]]:
        """The holes among change points ``lo`` to ``hi - 1`` (the point at
        ``hi``, if any, has no free CPU), as lists of starts and ends."""
        times, cpu = self.times, self.cpu
        n = len(times)
        starts: list[float] = []
        ends: list[float] = []
        k = lo
        while k < hi:
            if cpu[k] > 0:
                starts.append(times[k])
                k += 1
                while k < hi and cpu[k] > 0:
                    k += 1
                ends.append(times[k] if k < n else INF)
            else:
                k += 1
        return starts, ends

    def _settle(self) -> None:
        """Make the holes again where free CPUs changed since they were made."""
        times = self.times
        lo = bisect_left(times, self._lo)
        hi = len(times) if self._hi == INF else bisect_left(times, self._hi)
        self._lo = INF
        self._hi = -INF
        cpu = self.cpu
        n = len(cpu)
        while lo > 0 and cpu[lo - 1] > 0:
            lo -= 1
        while hi < n and cpu[hi] > 0:
            hi += 1
        p = bisect_left(self.starts, times[lo])
        q = len(self.starts) if hi == n else bisect_left(self.starts, times[hi], p)
        self.starts[p:q], self.ends[p:q] = self._holes(lo, hi)

    # ------------------------------------------------------------------ changes

    def point(self, t: float) -> int:
        """The index of the change point at ``t`` (after segment 0), made with
        the values just before ``t`` if there is none (holes stay as they are)."""
        times = self.times
        k = bisect_left(times, t, 1)
        if k < len(times) and times[k] == t:
            return k
        times.insert(k, t)
        cpu = self.cpu
        cpu.insert(k, cpu[k - 1])
        mem, gpu = self.mem, self.gpu
        if mem is not None:
            mem.insert(k, mem[k - 1])
        if gpu is not None:
            gpu.insert(k, gpu[k - 1])
        return k

    def add(self, lo: int, hi: int, cpus: int, mem: int, gpus: int) -> None:
        """Add (negative: take) resources at change points ``lo`` to ``hi - 1``."""
        if cpus:
            cpu = self.cpu
            before = cpu[lo:hi]
            after = cpu[lo:hi] = [v + cpus for v in before]
            # Holes change only where a point's last free CPU goes or comes
            # back: most takes leave a CPU free (and the holes as they are).
            if before and min(after if cpus < 0 else before) <= 0:
                times = self.times
                if times[lo] < self._lo:
                    self._lo = times[lo]
                t = times[hi] if hi < len(times) else INF
                if t > self._hi:
                    self._hi = t
        free = self.mem
        if mem and free is not None:
            free[lo:hi] = [v + mem for v in free[lo:hi]]
        free = self.gpu
        if gpus and free is not None:
            free[lo:hi] = [v + gpus for v in free[lo:hi]]

    # ------------------------------------------------------------------ questions

    def short(self, end: float, need: Need) -> float:
        """The first change point after segment 0 and before ``end`` without
        room for ``need`` (always a dip), or -1."""
        if end <= self.dip:
            return -1.0
        ppn, mem, gpus = need
        times, cpu = self.times, self.cpu
        ke = bisect_left(times, end, 1)
        free = self.mem if mem else None
        gpu = self.gpu if gpus else None
        if ke <= 1 or _room(cpu, free, gpu, 1, ke, need):
            return -1.0
        for k in range(1, ke):
            if (
                cpu[k] < ppn
                or (free is not None and free[k] < mem)
                or (gpu is not None and gpu[k] < gpus)
            ):
                return times[k]
        return -1.0  # unreachable: the minimum above is short somewhere

    def latest(self, need: Need, w: float, t: float) -> float:
        """The last start of the stretch of starts from ``t`` (where ``need``
        holds for ``w``) that all hold: the first change point from ``t + w``
        on without room, less ``w`` (INF if none)."""
        ppn, mem, gpus = need
        times, cpu = self.times, self.cpu
        free = self.mem if mem else None
        gpu = self.gpu if gpus else None
        n = len(times)
        k = bisect_left(times, t + w)
        while k < n and (
            cpu[k] >= ppn
            and (free is None or free[k] >= mem)
            and (gpu is None or gpu[k] >= gpus)
        ):
            k += 1
        return INF if k == n else times[k] - w

    def start(self, need: Need, w: float, x: float, limit: float = INF) -> float:
        """The earliest ``t >= x`` at which the node holds ``need`` over ``[t,
        t + w)`` if it is ``<= limit``; else a lower bound of it past ``limit``
        (INF: never): hole by hole (those long enough), and inside a hole
        change point by change point. The bound spares a search a second walk
        to find where a node it gave up on may start. One method, no helper per
        hole: it runs hundreds of thousands of times a pass."""
        ppn, mem, gpus = need
        if gpus and self.gpu is None:
            return INF
        if ppn < 1:  # needs no CPU: the whole timeline is one hole
            starts, ends = [self.times[0]], [INF]
        else:
            if self._lo < INF:
                self._settle()
            starts, ends = self.starts, self.ends
        h0 = _right(ends, x, 0) if NATIVE else bisect_right(ends, x)
        for h in range(h0, len(starts)):
            a = starts[h]
            if a < x:
                a = x
            end_of_hole = ends[h]
            last = end_of_hole - w  # the latest start inside this hole
            if last < a:
                continue
            if a > limit:
                return a  # most walks of a search end here, past the best
            if last > limit:
                last = limit
            # Only now the change points (a walk past the limit skips this).
            times, cpu, dip = self.times, self.cpu, self.dip
            free = self.mem if mem else None
            gpu = self.gpu if gpus else None
            if NATIVE:
                k = _right(times, a, 0) - 1
                stop = _left(times, end_of_hole, k)
            else:
                k = bisect_right(times, a) - 1
                stop = bisect_left(times, end_of_hole, k)
            while True:
                # The first change point from k on with room (none: next hole).
                while (
                    cpu[k] < ppn
                    or (free is not None and free[k] < mem)
                    or (gpu is not None and gpu[k] < gpus)
                ):
                    k += 1
                    if k == stop:
                        break
                else:
                    t = times[k]
                    if t < a:
                        t = a
                    if t > last:
                        if t > limit:
                            return t  # nothing before t: none up to limit
                        break
                    end = t + w
                    if end <= dip:
                        return t  # values only rise before the node's first dip
                    if NATIVE:
                        ke = _left(times, end, k + 1)
                        k += 1
                        if ke == k or _room(cpu, free, gpu, k, ke, need):
                            return t
                    else:
                        ke = bisect_left(times, end, k + 1)
                        k += 1
                        if ke == k or (
                            min(cpu[k:ke]) >= ppn
                            and (free is None or min(free[k:ke]) >= mem)
                            and (gpu is None or min(gpu[k:ke]) >= gpus)
                        ):
                            return t
                    # Every start up to the last point in the window without
                    # room overlaps it: look after it.
                    k = ke - 1
                    while (
                        cpu[k] >= ppn
                        and (free is None or free[k] >= mem)
                        and (gpu is None or gpu[k] >= gpus)
                    ):
                        k -= 1
                    k += 1
                    if k < stop:
                        continue
                break
        return INF
