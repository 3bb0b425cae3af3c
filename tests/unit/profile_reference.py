"""A plain availability profile, for tests only: the answers of
:class:`minibatch.policy.profile.Profile`, found the obvious way.

Each node is a list of segments ``[start, cpus, memory, gpus]`` (segment 0 at
*now* first, on its own; memory None: unlimited; GPUs None: none). A window
fits on a node if every segment it overlaps has room; the earliest start of a
node is the first of ``x`` and the segment starts after it whose window fits;
the earliest start of a job asks every node, moves to the ``nodes``-th
smallest start and asks again until that many nodes can start there. No
bounds, no caches, no holes: what the product's searches must agree with.

Dips (where a take begins, or an addition ends) are kept as the product keeps
them, for what policies read: ``first_dip`` and the owners' labels in reasons.
"""

from __future__ import annotations

from minibatch.policy.search import Shape

INF = float("inf")

Need = tuple[int, int, int]


def _room(seg: list, need: Need) -> bool:
    ppn, mem, gpus = need
    _, c, m, g = seg
    return (
        c >= ppn
        and (not mem or m is None or m >= mem)
        and (not gpus or (g is not None and g >= gpus))
    )


class ReferenceProfile:
    """Drop-in for :class:`~minibatch.policy.profile.Profile` in a
    :class:`~minibatch.policy.book.Book` (patch ``book.Profile``)."""

    def __init__(
        self,
        now: float,
        names: tuple[str, ...],
        cpus: list[int],
        mem: list[int | None],
        gpus: list[int | None],
        plain: bool = False,
    ) -> None:
        self.now, self.names, self.plain = now, names, plain
        self.c0, self.m0, self.g0 = cpus, mem, gpus  # segment 0, read by policies
        self.first_dip = INF
        self.built = False
        self.labels: dict[float, str | int] = {}
        self.mask: list[bool] | None = None
        self._started: list[tuple[float, int, int, int, int]] = []
        self.seg: list[list[list]] = []

    # ------------------------------------------------------------------ building

    def build(self, releases: list[list[tuple]]) -> None:
        for end, i, c, m, g in self._started:
            releases[i].append((end, c, m, g))
        self._started = []
        self.built = True
        self.seg = []
        for i, steps in enumerate(releases):
            segs = [[self.now, self.c0[i], self.m0[i], self.g0[i]]]
            for step in sorted(steps):
                t, c = step[0], step[1]
                m, g = (step[2], step[3]) if len(step) > 2 else (0, 0)
                if len(segs) > 1 and segs[-1][0] == t:
                    seg = segs[-1]
                else:
                    seg = [t, *segs[-1][1:]]
                    segs.append(seg)
                seg[1] += c
                if seg[2] is not None:
                    seg[2] += m
                if seg[3] is not None:
                    seg[3] += g
            self.seg.append(segs)

    def segments(self, i: int) -> list[tuple]:
        return [tuple(s) for s in self.seg[i]]

    def set_segments(self, i: int, segments: list[tuple]) -> None:
        self.seg[i] = [list(s) for s in segments]
        _, self.c0[i], self.m0[i], self.g0[i] = segments[0]
        for prev, seg in zip(segments, segments[1:], strict=False):
            if any(
                b is not None and a is not None and b < a
                for a, b in zip(prev[1:], seg[1:], strict=True)
            ):
                self.first_dip = min(self.first_dip, seg[0])
                break

    # ------------------------------------------------------------------ placing

    def _split(self, i: int, t: float) -> int:
        """The index of a segment starting at ``t`` (after segment 0)."""
        segs = self.seg[i]
        for j in range(1, len(segs)):
            if segs[j][0] == t:
                return j
            if segs[j][0] > t:
                segs.insert(j, [t, *segs[j - 1][1:]])
                return j
        segs.append([t, *segs[-1][1:]])
        return len(segs) - 1

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
        if start is None:
            self.c0[i] += cpus
            if self.m0[i] is not None:
                self.m0[i] += mem
            if self.g0[i] is not None:
                self.g0[i] += gpus
            if not self.built:
                self._started.append((end, i, -cpus, -mem, -gpus))
                return
            lo = 0
        else:
            assert self.built
            lo = self._split(i, start)
        hi = len(self.seg[i]) if end == INF else self._split(i, end)
        for seg in self.seg[i][lo:hi]:
            seg[1] += cpus
            if seg[2] is not None:
                seg[2] += mem
            if seg[3] is not None:
                seg[3] += gpus
        if cpus < 0 or mem < 0 or gpus < 0:
            dip = -1.0 if start is None else start
        else:
            dip = end if end < INF else -1.0
        if dip >= 0:
            self.first_dip = min(self.first_dip, dip)
            if label != "" and dip not in self.labels:
                self.labels[dip] = label

    # ------------------------------------------------------------------ questions

    def _short(self, i: int, end: float, need: Need) -> float:
        """The first segment after segment 0 starting before ``end`` without
        room, or -1."""
        if not self.built:
            return -1.0
        for seg in self.seg[i][1:]:
            if seg[0] >= end:
                break
            if not _room(seg, need):
                return seg[0]
        return -1.0

    def _now(self, i: int, need: Need, end: float) -> bool:
        """Room on node ``i`` from now until ``end`` (segment 0 onwards)."""
        if self.mask is not None and not self.mask[i]:
            return False
        seg0 = [self.now, self.c0[i], self.m0[i], self.g0[i]]
        return _room(seg0, need) and self._short(i, end, need) < 0

    def widest(self) -> int:
        return max(self.c0, default=0)

    def free_cpus(self) -> int:
        return sum(self.c0)

    def roomiest(self, ppn: int) -> float:
        room = -1.0
        for c, m in zip(self.c0, self.m0, strict=True):
            if c >= ppn:
                room = max(room, INF if m is None else m)
        return room

    def fit_now(self, shape: Shape, end: float) -> list[int] | None:
        count, *need = shape
        fit = [i for i in range(len(self.names)) if self._now(i, tuple(need), end)]
        return fit[:count] if len(fit) >= count else None

    def fits_on(self, i: int, shape: Shape, end: float) -> bool:
        return self._now(i, shape[1:], end)

    def fits_at_all_now(self, shape: Shape) -> bool:
        return self.fit_now(shape, self.now) is not None

    def blocker(self, shape: Shape, end: float) -> str:
        label: str | int = "delay a reservation"
        if len(self.labels) == 1:
            label = next(iter(self.labels.values()))
        else:
            need = shape[1:]
            for i in range(len(self.names)):
                seg0 = [self.now, self.c0[i], self.m0[i], self.g0[i]]
                when = self._short(i, end, need) if _room(seg0, need) else -1.0
                if when >= 0:
                    label = self.labels.get(when, label)
                    break
        return f"delay job {label}'s reservation" if isinstance(label, int) else label

    def _fits_at(self, i: int, t: float, w: float, need: Need) -> bool:
        """Room on node ``i`` over ``[t, t + w)`` for a start at ``t`` (the
        segment holding ``t``, after any release at ``t``, and those after)."""
        segs = self.seg[i]
        first = max(j for j, seg in enumerate(segs) if seg[0] <= t)
        return all(
            _room(seg, need)
            for j, seg in enumerate(segs)
            if j == first or (j > first and seg[0] < t + w)
        )

    def next_start(
        self, i: int, shape: Shape, w: float, x: float, limit: float = INF
    ) -> float | None:
        need = shape[1:]
        if need[2] and self.g0[i] is None:
            return None
        for t in sorted({x, *(seg[0] for seg in self.seg[i] if seg[0] > x)}):
            if t > limit:
                return None
            if self._fits_at(i, t, w, need):
                return t
        return None

    def earliest(
        self, shape: Shape, w: float, after: float
    ) -> tuple[float, list[int]] | None:
        count = shape[0]
        nodes = [i for i in range(len(self.names)) if self.mask is None or self.mask[i]]
        x = after
        while True:
            starts = {i: self.next_start(i, shape, w, x) for i in nodes}
            ready = sorted(s for s in starts.values() if s is not None)
            if len(ready) < count:
                return None
            t = ready[count - 1]
            if t == x:
                return x, [i for i in nodes if starts[i] == x][:count]
            x = t
