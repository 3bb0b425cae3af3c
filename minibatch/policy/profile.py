"""Free CPUs, memory and GPUs per node over time: what every policy plans with.

A :class:`Profile` is, for each node, a step function of its free resources from
*now* on. Segment 0 is the node as it is (``NodeView.free_*``); later segments
add back what running jobs release at ``RunningView.expected_end(now)`` (start +
requested time; a job past it releases *now*, in a segment of its own after
segment 0, so it counts for reservations but its CPUs are not used before they
are really free). Releases at one instant are applied together. Placing a job
subtracts its request over its window ``[start, start + walltime)``.

A start *now* takes from segment 0 onwards; a reservation at a time ``t`` takes
from the segment at ``t`` (after any release at ``t``). A job fits now on a node
if, over its whole window, every segment has room for it: jobs keep off what is
reserved later, which is how a backfilled job never delays a reservation. The
minimum of a step function over a window lies at its start or where it drops, so
each node keeps its *dips* (the times a reservation begins) and a window check
looks only at segment 0 and the dips inside the window; with no dip before the
window ends (plain FIFO, EASY before its head), it is a test of segment 0 alone.

Placement is first fit in node order: a job takes the first ``nodes`` nodes that
each have ``ppn`` CPUs, its per-node memory and ``gpus`` GPUs over the window.
A node without memory figures (``free_mem_kb`` None) has unlimited memory; a node
without GPUs has none. :meth:`Profile.earliest` finds the earliest time at which
``nodes`` nodes fit at once (the nodes then chosen first fit at that time).

The views a pass plans in (advance reservations) are in :mod:`minibatch.policy.book`;
the earliest-start search over many nodes in :mod:`minibatch.policy.search`.

Nothing here is policy: it answers "where could this job run, and from when".
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter

from minibatch.core.job import JobRequest
from minibatch.policy.search import INF, Search, Shape, direct

_first, _second = itemgetter(0), itemgetter(1)

#: A placement on one node: (time, node, cpus, memory, gpus).
_Step = tuple[float, int, int, int, int]
#: What a node gets back at a time: (time, cpus, memory, gpus), or (time, cpus)
#: when no node has memory figures or GPUs (a "plain" profile).
Release = tuple[float, int, int, int] | tuple[float, int]


def shape_of(req: JobRequest) -> Shape:
    mem = 0 if req.mem_kb is None else -(-req.mem_kb // req.nodes)
    return (req.nodes, req.ppn, mem, req.gpus)


class Profile:
    """One view of the nodes' free resources over time (see the module docstring).

    ``names`` fixes the node order (first fit) and the node indices every method
    takes and returns. Node ``i`` is stored as its segment-0 values (``c0``,
    ``m0``, ``g0``) and its change points: ``times[i][k]`` with the changes
    ``dc``/``dm``/``dg[i][k]`` of free CPUs, memory and GPUs at that time (index
    0 is segment 0, change 0). A value at a time is segment 0 plus the changes up
    to it; placing a job is two changes. Several change points may share a time:
    a value is only read after the last of them.
    """

    __slots__ = (
        "mask",
        "now",
        "names",
        "times",
        "dc",
        "dm",
        "dg",
        "c0",
        "m0",
        "g0",
        "dips",
        "first_dip",
        "built",
        "_started",
        "labels",
        "plain",
        "log",
        "_search",
        "_searches",
        "_vals",
        "_room",
    )

    times: list[list[float]]
    dc: list[list[int]]
    dm: list[list[int] | None]
    dg: list[list[int] | None]
    dips: list[list[float]]
    _vals: list[tuple[list[int], list[int] | None, list[int] | None] | None]

    def __init__(
        self,
        now: float,
        names: tuple[str, ...],
        cpus: list[int],
        mem: list[int | None],
        gpus: list[int | None],
        plain: bool = False,
    ) -> None:
        self.now = now
        self.names = names
        #: No memory figures and no GPUs on any node: CPUs are all there is.
        self.plain = plain
        self.c0 = cpus
        self.m0 = mem
        self.g0 = gpus
        # The future (``times``, ``dc``, ``dm``, ``dg``, ``dips``, ``_vals``) is
        # made by :meth:`build`, which many passes never need: FIFO without
        # reservations, EASY with no blocked job.
        #: The earliest dip on any node: windows ending by then test segment 0 only.
        self.first_dip = INF
        self.built = False
        self._started: list[_Step] = []
        #: Who owns the dip at a time, for reasons: a job id (its reservation) or
        #: words ("run into reservation 'maint'").
        self.labels: dict[float, str | int] = {}
        #: The nodes changed since the first search with bounds, in order (it
        #: keeps its bounds up to date from it), and that search's state.
        self.log: list[int] = []
        self._search: Search | None = None
        self._searches = 0
        #: :meth:`roomiest` by CPUs, until segment 0 changes.
        self._room: dict[int, float] = {}
        #: While set (:meth:`Book.only`), the nodes a job may use: searches
        #: and fits skip the others.
        self.mask: list[bool] | None = None

    # ------------------------------------------------------------------ building

    def build(self, releases: list[list[Release]]) -> None:
        """Add the future: ``releases[i]`` of node ``i`` (time, cpus, memory,
        gpus) and the ends of the jobs started so far."""
        plain = self.plain
        if self._started:
            for end, i, c, m, g in self._started:
                releases[i].append((end, c) if plain else (end, c, m, g))
            self._started = []
        now, m0, g0 = self.now, self.m0, self.g0
        self.built = True
        self._vals = [None] * len(releases)
        if plain and len(releases) == 1:
            steps = releases[0]
            steps.sort()
            only_times: list[float] = [now]
            only_dc: list[int] = [0]
            only_times += map(_first, steps)
            only_dc += map(_second, steps)
            self.times, self.dc = [only_times], [only_dc]
            self.dm, self.dg, self.dips = [None], [None], [[]]
            return
        times: list[list[float]] = []
        dc: list[list[int]] = []
        dm: list[list[int] | None] = []
        dg: list[list[int] | None] = []
        for i, steps in enumerate(releases):
            if steps and plain:
                steps.sort()
                ts, dcs = zip(*steps)  # noqa: B905 (pairs)
                times.append([now, *ts])
                dc.append([0, *dcs])
                dm.append(None)
                dg.append(None)
            elif steps:
                steps.sort()
                ts, dcs, dms, dgs = zip(*steps)  # noqa: B905 (all of one length)
                times.append([now, *ts])
                dc.append([0, *dcs])
                dm.append(None if m0[i] is None else [0, *dms])
                dg.append(None if g0[i] is None else [0, *dgs])
            else:
                times.append([now])
                dc.append([0])
                dm.append(None if m0[i] is None else [0])
                dg.append(None if g0[i] is None else [0])
        self.times, self.dc, self.dm, self.dg = times, dc, dm, dg
        self.dips = [[] for _ in releases]

    def segments(self, i: int) -> list[tuple[float, int, int | None, int | None]]:
        """Node ``i`` as (start, cpus, memory, gpus) per segment, one per time
        (segment 0 first, on its own)."""
        times, dc, dm, dg = self.times[i], self.dc[i], self.dm[i], self.dg[i]
        c, m, g = self.c0[i], self.m0[i], self.g0[i]
        out = [(times[0], c, m, g)]
        for k in range(1, len(times)):
            c += dc[k]
            if m is not None and dm is not None:
                m += dm[k]
            if g is not None and dg is not None:
                g += dg[k]
            if k > 1 and times[k] == times[k - 1]:
                out[-1] = (times[k], c, m, g)
            else:
                out.append((times[k], c, m, g))
        return out

    def set_segments(
        self, i: int, segments: Sequence[tuple[float, int, int | None, int | None]]
    ) -> None:
        """The inverse of :meth:`segments` (segment 0 first)."""
        if self._search is not None:
            self._search.forget()
        if self.built:
            self._vals[i] = None
        t0, c, m, g = segments[0]
        self.c0[i], self.m0[i], self.g0[i] = c, m, g
        self._room = {}
        times, dc = [t0], [0]
        dm: list[int] | None = None if m is None else [0]
        dg: list[int] | None = None if g is None else [0]
        for t, c1, m1, g1 in segments[1:]:
            times.append(t)
            dc.append(c1 - c)
            if dm is not None:
                dm.append((m1 or 0) - (m or 0))
            if dg is not None:
                dg.append((g1 or 0) - (g or 0))
            c, m, g = c1, m1, g1
        self.times[i], self.dc[i], self.dm[i], self.dg[i] = times, dc, dm, dg

    # ------------------------------------------------------------------ queries

    def widest(self) -> int:
        """The most CPUs free now on one node."""
        return max(self.c0, default=0)

    def free_cpus(self) -> int:
        """CPUs free now, all nodes together."""
        return sum(self.c0)

    def roomiest(self, ppn: int) -> float:
        """The most memory free now on a node with ``ppn`` free CPUs (INF if
        such a node has no memory figures); -1 if no node has the CPUs."""
        room = self._room.get(ppn)
        if room is None:
            room = -1.0
            for c, m in zip(self.c0, self.m0, strict=True):
                if c >= ppn:
                    if m is None:
                        room = INF
                        break
                    room = max(room, m)
            self._room[ppn] = room
        return room

    def fit_now(self, shape: Shape, end: float) -> list[int] | None:
        """The first nodes where ``shape`` fits from now until ``end``, or None."""
        count, ppn, mem, gpus = shape
        if mem and mem > self.roomiest(ppn):
            return None  # no node has the CPUs and the memory: no need to look
        c0, m0, g0, mask = self.c0, self.m0, self.g0, self.mask
        check_dips = end > self.first_dip  # only once built
        dips = self.dips if check_dips else []
        chosen: list[int] = []
        for i, c in enumerate(c0):
            if c < ppn or (mask is not None and not mask[i]):
                continue
            if mem:
                m = m0[i]
                if m is not None and m < mem:
                    continue
            if gpus:
                g = g0[i]
                if g is None or g < gpus:
                    continue
            if check_dips and dips[i] and self._dip_fails(i, end, shape) >= 0:
                continue
            chosen.append(i)
            if len(chosen) == count:
                return chosen
        return None

    def fits_on(self, i: int, shape: Shape, end: float) -> bool:
        """Whether node ``i`` alone holds one node's share of ``shape`` from now
        until ``end`` (:meth:`fit_now` for a node chosen by the caller)."""
        _, ppn, mem, gpus = shape
        if self.c0[i] < ppn or (self.mask is not None and not self.mask[i]):
            return False
        m, g = self.m0[i], self.g0[i]
        if mem and m is not None and m < mem:
            return False
        if gpus and (g is None or g < gpus):
            return False
        return not (end > self.first_dip and self.dips[i]) or (
            self._dip_fails(i, end, shape) < 0
        )

    def fits_at_all_now(self, shape: Shape) -> bool:
        """Whether ``shape`` fits in segment 0 alone (ignoring what comes later)."""
        return self.fit_now(shape, self.now) is not None

    def blocker(self, shape: Shape, end: float) -> str:
        """Who keeps a job that fits right now from running until ``end``."""
        label: str | int = "delay a reservation"
        if len(self.labels) == 1:
            label = next(iter(self.labels.values()))
        else:
            _, ppn, mem, gpus = shape
            for i in range(len(self.names)):
                m, g = self.m0[i], self.g0[i]
                room_now = (
                    self.c0[i] >= ppn
                    and (not mem or m is None or m >= mem)
                    and (not gpus or (g is not None and g >= gpus))
                )
                when = self._dip_fails(i, end, shape) if room_now else -1.0
                if when >= 0:
                    label = self.labels.get(when, label)
                    break
        return f"delay job {label}'s reservation" if isinstance(label, int) else label

    def _values(self, i: int) -> tuple[list[int], list[int] | None, list[int] | None]:
        """Node ``i``'s free CPUs, memory and GPUs at each change point (made
        from the changes when first asked for after a change; at a time with
        several change points, the value after the last one counts)."""
        v = self._vals[i]
        if v is None:
            cs = list(accumulate(self.dc[i], initial=self.c0[i]))
            del cs[0]
            dm, dg = self.dm[i], self.dg[i]
            ms: list[int] | None = None
            gs: list[int] | None = None
            if dm is not None:
                ms = list(accumulate(dm, initial=self.m0[i] or 0))
                del ms[0]
            if dg is not None:
                gs = list(accumulate(dg, initial=self.g0[i] or 0))
                del gs[0]
            v = self._vals[i] = (cs, ms, gs)
        return v

    def _dip_fails(self, i: int, end: float, shape: Shape) -> float:
        """The first dip before ``end`` on node ``i`` without room, or -1."""
        _, ppn, mem, gpus = shape
        times = self.times[i]
        if self._vals[i] is None:
            return self._dip_fails_summing(i, end, shape)
        cs, ms, gs = self._values(i)
        for d in self.dips[i]:
            if d >= end:
                break
            j = bisect_right(times, d) - 1
            if cs[j] < ppn:
                return d
            if mem and ms is not None and ms[j] < mem:
                return d
            if gpus and (gs is None or gs[j] < gpus):
                return d
        return -1.0

    def _dip_fails_summing(self, i: int, end: float, shape: Shape) -> float:
        """:meth:`_dip_fails` from the changes: cheaper than making the values
        when the node changes between calls (EASY's backfill takes)."""
        _, ppn, mem, gpus = shape
        times, dc, dm, dg = self.times[i], self.dc[i], self.dm[i], self.dg[i]
        c, m, g = self.c0[i], self.m0[i], self.g0[i]
        k = 0
        for d in self.dips[i]:
            if d >= end:
                break
            j = bisect_right(times, d) - 1
            c += sum(dc[k + 1 : j + 1])
            if c < ppn:
                return d
            if mem and m is not None and dm is not None:
                m += sum(dm[k + 1 : j + 1])
                if m < mem:
                    return d
            if gpus:
                if g is None or dg is None:
                    return d
                g += sum(dg[k + 1 : j + 1])
                if g < gpus:
                    return d
            k = j
        return -1.0

    def next_start(
        self, i: int, shape: Shape, w: float, x: float, limit: float = INF
    ) -> float | None:
        """The earliest ``t >= x`` (and ``<= limit``) at which node ``i`` holds
        one node's share of ``shape`` over ``[t, t + w)``, or None."""
        _, ppn, mem, gpus = shape
        if self._vals[i] is None and not mem and not gpus and not self.dips[i]:
            # One question about a node that keeps changing (EASY's head):
            # running sums are cheaper than making its values.
            times, dc = self.times[i], self.dc[i]
            n = len(times)
            k = bisect_right(times, x) - 1
            c = self.c0[i] + sum(dc[1 : k + 1])
            while c < ppn or (k + 1 < n and times[k + 1] == times[k]):
                k += 1
                if k == n:
                    return None
                c += dc[k]
            t = times[k] if times[k] > x else x
            return None if t > limit else t
        cs, ms, gs = self._values(i)
        if not mem:
            ms = None
        if gpus:
            if gs is None:
                return None
        else:
            gs = None
        times, dips = self.times[i], self.dips[i]
        n = len(times)
        k = bisect_right(times, x) - 1
        while True:
            # The first change point from k on with room (the last at its time).
            while (
                cs[k] < ppn
                or (ms is not None and ms[k] < mem)
                or (gs is not None and gs[k] < gpus)
            ):
                k += 1
                if k == n:
                    return None
                while k + 1 < n and times[k + 1] == times[k]:
                    k += 1
            t = times[k] if times[k] > x else x
            if t > limit:
                return None
            if not dips:
                return t
            # Between dips values only rise: test the dips inside the window.
            end = t + w
            p = bisect_right(dips, t)
            bad = -1
            while p < len(dips) and dips[p] < end:
                j = bisect_right(times, dips[p]) - 1
                if (
                    cs[j] < ppn
                    or (ms is not None and ms[j] < mem)
                    or (gs is not None and gs[j] < gpus)
                ):
                    bad = j
                    break
                p += 1
            if bad < 0:
                return t
            # Every start up to the failing dip overlaps it: look after it.
            k, x = bad, t

    def earliest(
        self, shape: Shape, w: float, after: float
    ) -> tuple[float, list[int]] | None:
        """The earliest time ``>= after`` at which ``shape`` fits for ``w``, with
        the nodes (first fit at that time); None if it never does (see
        :class:`~minibatch.policy.search.Search`)."""
        self._searches += 1
        if self._searches == 1 or len(self.names) == 1 or self.mask is not None:
            return direct(self, shape, w, after)
        if self._search is None:
            self._search = Search(self)
        return self._search.earliest(shape, w, after)

    # ------------------------------------------------------------------ placing

    def _change(self, i: int, t: float, c: int, m: int, g: int) -> None:
        """Add a change point on node ``i`` at ``t`` (after segment 0)."""
        if self._search is not None:
            self.log.append(i)
        self._vals[i] = None
        times = self.times[i]
        k = bisect_left(times, t, 1)
        dm, dg = self.dm[i], self.dg[i]
        if k < len(times) and times[k] == t:
            self.dc[i][k] += c
            if dm is not None:
                dm[k] += m
            if dg is not None:
                dg[k] += g
            return
        times.insert(k, t)
        self.dc[i].insert(k, c)
        if dm is not None:
            dm.insert(k, m)
        if dg is not None:
            dg.insert(k, g)

    def add(
        self,
        i: int,
        start: float | None,
        end: float,
        cpus: int,
        mem: int,
        gpus: int,
        label: str | int = "",
    ) -> None:
        """Add (or, negative, take) resources on node ``i`` over ``[start, end)``.

        ``start`` None is *now*: from segment 0 on. A take that begins later, or
        an addition that ends, makes a dip.
        """
        if (cpus > 0 or mem > 0 or gpus > 0) and self._search is not None:
            self._search.forget()  # resources come back: bounds may be too late
        if start is None:
            if self._room:
                self._room = {}
            if self._search is not None:
                self.log.append(i)
            if self.built:
                self._vals[i] = None
            self.c0[i] += cpus
            m, g = self.m0[i], self.g0[i]
            if m is not None:
                self.m0[i] = m + mem
            if g is not None:
                self.g0[i] = g + gpus
            if not self.built:
                # The future is not built yet: keep the end for :meth:`build`.
                self._started.append((end, i, -cpus, -mem, -gpus))
                return
        elif not self.built:
            raise RuntimeError("a reservation needs a built profile")
        else:
            self._change(i, start, cpus, mem, gpus)
        if end < INF:
            self._change(i, end, -cpus, -mem, -gpus)
        if cpus < 0 or mem < 0 or gpus < 0:
            dip = -1.0 if start is None else start
        else:
            dip = end if end < INF else -1.0
        if dip >= 0:
            dips = self.dips[i]
            p = bisect_right(dips, dip)
            if not (p and dips[p - 1] == dip):
                dips.insert(p, dip)
            if dip < self.first_dip:
                self.first_dip = dip
            if label != "" and dip not in self.labels:
                self.labels[dip] = label
