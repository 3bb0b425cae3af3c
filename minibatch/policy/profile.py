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
reserved later, which is how a backfilled job never delays a reservation.

Segment 0 of every node is kept in flat lists (``c0``, ``m0``, ``g0``): what
fits now is asked far more often than anything else. The future of each node is
a :class:`~minibatch.policy.timeline.Timeline`, made only when a pass first
needs it (FIFO without reservations and EASY with no blocked job never do).

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

from itertools import accumulate
from operator import itemgetter

from minibatch.core.job import JobRequest
from minibatch.policy.search import Search, Shape, direct
from minibatch.policy.timeline import INF, Segment, Timeline

_parts = (itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3))

#: What a node gets back at a time: (time, cpus, memory, gpus), or (time, cpus)
#: when no node has memory figures or GPUs (a "plain" profile).
Release = tuple[float, int, int, int] | tuple[float, int]


def shape_of(req: JobRequest) -> Shape:
    mem = 0 if req.mem_kb is None else -(-req.mem_kb // req.nodes)
    return (req.nodes, req.ppn, mem, req.gpus)


class Profile:
    """One view of the nodes' free resources over time (see the module docstring).

    ``names`` fixes the node order (first fit) and the node indices every method
    takes and returns. Segment 0 of node ``i`` is ``c0``/``m0``/``g0[i]``;
    once built, ``nodes[i]`` is its timeline (whose change point 0 is segment
    0 again, kept equal).
    """

    __slots__ = (
        "mask",
        "now",
        "names",
        "nodes",
        "c0",
        "m0",
        "g0",
        "first_dip",
        "built",
        "_started",
        "labels",
        "plain",
        "changes",
        "_search",
        "_searches",
        "_room",
        "_rooms",
        "_widest",
    )

    nodes: list[Timeline]

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
        #: The earliest dip on any node: windows ending by then test segment 0 only.
        self.first_dip = INF
        self.built = False
        self._started: list[tuple[float, int, int, int, int]] = []
        #: Who owns the dip at a time, for reasons: a job id (its reservation) or
        #: words ("run into reservation 'maint'").
        self.labels: dict[float, str | int] = {}
        #: How many times each node changed since the first search with
        #: bounds (a bound made at another count is stale), and that search.
        self.changes = [0] * len(names)
        self._search: Search | None = None
        self._searches = 0
        # What segment 0 answers, until it changes: :meth:`roomiest` by CPUs,
        # the nodes with room by (CPUs, memory, GPUs), :meth:`widest`.
        self._room: dict[int, float] = {}
        self._rooms: dict[tuple[int, int, int], list[int]] = {}
        self._widest = -1
        #: While set (:meth:`Book.only`), the nodes a job may use: searches
        #: and fits skip the others.
        self.mask: list[bool] | None = None

    # ------------------------------------------------------------------ building

    def build(self, releases: list[list[Release]]) -> None:
        """Add the future: ``releases[i]`` of node ``i`` (time, cpus, memory,
        gpus) and the ends of the jobs started so far."""
        plain = self.plain
        if self._started:
            for end, i, dc, dm, dg in self._started:
                releases[i].append((end, dc) if plain else (end, dc, dm, dg))
            self._started = []
        now, c0, m0, g0 = self.now, self.c0, self.m0, self.g0
        self.built = True
        self.nodes = nodes = []
        at, cpus, mems, gpus = _parts
        for i, steps in enumerate(releases):
            m, g = m0[i], g0[i]
            if not steps:
                nodes.append(
                    Timeline(
                        [now],
                        [c0[i]],
                        None if m is None else [m],
                        None if g is None else [g],
                    )
                )
                continue
            steps.sort()
            ts = [now]
            ts += map(at, steps)
            cs = list(accumulate(map(cpus, steps), initial=c0[i]))
            ms = gs = None
            if m is not None:
                ms = list(accumulate(map(mems, steps), initial=m))
            if g is not None:
                gs = list(accumulate(map(gpus, steps), initial=g))
            if len(set(ts)) < len(ts) - (ts[1] == now):
                # Releases at one instant: keep the value after the last.
                keep = [0]
                keep += [k for k in range(1, len(ts) - 1) if ts[k] != ts[k + 1]]
                keep.append(len(ts) - 1)
                ts = [ts[k] for k in keep]
                cs = [cs[k] for k in keep]
                ms = None if ms is None else [ms[k] for k in keep]
                gs = None if gs is None else [gs[k] for k in keep]
            nodes.append(Timeline(ts, cs, ms, gs))

    def segments(self, i: int) -> list[Segment]:
        """Node ``i`` as (start, cpus, memory, gpus) per segment, one per time
        (segment 0 first, on its own)."""
        return self.nodes[i].segments()

    def set_segments(self, i: int, segments: list[Segment]) -> None:
        """The inverse of :meth:`segments` (segment 0 first)."""
        if self._search is not None:
            self._search.forget()
        _, c, m, g = segments[0]
        self.c0[i], self.m0[i], self.g0[i] = c, m, g
        self._changed_now()
        node = self.nodes[i] = Timeline.of(segments)
        self.first_dip = min(self.first_dip, node.dip)

    def _changed_now(self) -> None:
        """Forget what segment 0 answered."""
        if self._room:
            self._room = {}
        if self._rooms:
            self._rooms = {}
        self._widest = -1

    # ------------------------------------------------------------------ queries

    def widest(self) -> int:
        """The most CPUs free now on one node."""
        if self._widest < 0:
            self._widest = max(self.c0, default=0)
        return self._widest

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

    def rooms(self, ppn: int, mem: int, gpus: int) -> list[int]:
        """The nodes, in order, with ``ppn`` CPUs, ``mem`` memory and ``gpus``
        GPUs free now (features not considered)."""
        key = (ppn, mem, gpus)
        found = self._rooms.get(key)
        if found is None:
            c0, m0, g0 = self.c0, self.m0, self.g0
            found = self._rooms[key] = [
                i
                for i, c in enumerate(c0)
                if c >= ppn
                and (not mem or (m := m0[i]) is None or m >= mem)
                and (not gpus or ((g := g0[i]) is not None and g >= gpus))
            ]
        return found

    def fit_now(self, shape: Shape, end: float) -> list[int] | None:
        """The first nodes where ``shape`` fits from now until ``end``, or None."""
        count, ppn, mem, gpus = shape
        if mem and mem > self.roomiest(ppn):
            return None  # no node has the CPUs and the memory: no need to look
        rooms = self.rooms(ppn, mem, gpus)
        if len(rooms) < count:
            return None
        mask = self.mask
        nodes = self.nodes if end > self.first_dip else None  # only once built
        need = (ppn, mem, gpus)
        chosen: list[int] = []
        for i in rooms:
            if mask is not None and not mask[i]:
                continue
            if nodes is not None and nodes[i].short(end, need) >= 0:
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
        return end <= self.first_dip or self.nodes[i].short(end, (ppn, mem, gpus)) < 0

    def fits_at_all_now(self, shape: Shape) -> bool:
        """Whether ``shape`` fits in segment 0 alone (ignoring what comes later)."""
        return self.fit_now(shape, self.now) is not None

    def blocker(self, shape: Shape, end: float) -> str:
        """Who keeps a job that fits right now from running until ``end``."""
        label: str | int = "delay a reservation"
        if len(self.labels) == 1:
            label = next(iter(self.labels.values()))
        elif self.built:
            _, ppn, mem, gpus = shape
            need = (ppn, mem, gpus)
            for i in self.rooms(ppn, mem, gpus):
                when = self.nodes[i].short(end, need)
                if when >= 0:
                    label = self.labels.get(when, label)
                    break
        return f"delay job {label}'s reservation" if isinstance(label, int) else label

    def next_start(
        self, i: int, shape: Shape, w: float, x: float, limit: float = INF
    ) -> float | None:
        """The earliest ``t >= x`` (and ``<= limit``) at which node ``i`` holds
        one node's share of ``shape`` over ``[t, t + w)``, or None."""
        _, ppn, mem, gpus = shape
        t = self.nodes[i].start((ppn, mem, gpus), w, x, limit)
        return None if t > limit or t == INF else t

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
        search = self._search
        if (cpus > 0 or mem > 0 or gpus > 0) and search is not None:
            search.forget()  # resources come back: bounds may be too late
        if start is None:
            self._changed_now()
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
            node = self.nodes[i]
            lo = 0
        elif not self.built:
            raise RuntimeError("a reservation needs a built profile")
        else:
            node = self.nodes[i]
            lo = node.point(start)
        hi = len(node.times) if end == INF else node.point(end)
        if search is not None:
            self.changes[i] += 1
            if mem and (cpus >= 0 or -mem > search.spare * -cpus):
                search.spare = 0.0  # more memory per CPU than the bounds assume
        node.add(lo, hi, cpus, mem, gpus)
        if cpus < 0 or mem < 0 or gpus < 0:
            dip = -1.0 if start is None else start
        else:
            dip = end if end < INF else -1.0
        if dip >= 0:
            if dip < node.dip:
                node.dip = dip
                if dip < self.first_dip:
                    self.first_dip = dip
            if label != "" and dip not in self.labels:
                self.labels[dip] = label
