"""The earliest start of a job over many nodes: exact, and fast when repeated.

:meth:`Search.earliest` answers "when, at the earliest, do ``nodes`` nodes each
hold the job for its whole requested time, and which ones (first fit at that
time)". Per node the answer is :meth:`Profile.next_start
<minibatch.policy.profile.Profile.next_start>`; over the nodes:

* the **first search of a pass**, and any search on a single node, asks every
  node (EASY reserves once per pass: nothing to amortise);
* **later searches** (conservative backfilling reserves every pending job) use
  branch and bound on cached lower bounds. Per node and per (CPUs per node,
  memory per node rounded down to a power of 16, walltime rounded down to a
  power of two) the cache keeps the exact earliest start of that *relaxed* job
  (no GPUs), a lower bound of the real job's. Coarse memory keeps the number of
  bounds small when memory hardly matters, and the bounds tight when it does.
  A pass only ever takes resources, so an earliest start can only move later
  and a bound, once true, stays true for the rest of the pass: nodes come off
  a heap by bound, a node changed since its bound was made is searched again
  from the bound only when it comes up, and the search stops when no node left
  can start before the answer so far.

Several nodes: the answer is the ``nodes``-th smallest of the nodes' own
earliest starts, if that many nodes can start at that very time; else the
search moves there and asks again (a node free at one time may be busy later).

The result is the same as asking every node (tests check it against a
second-by-second model); only the work differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minibatch.policy.profile import Profile

INF = float("inf")

#: What a job needs on each node: (nodes, ppn, memory per node or 0, gpus per node).
Shape = tuple[int, int, int, int]
#: Bounds per (CPUs, memory, walltime) key: (log position, per-node bounds, a
#: heap of (bound, node), nodes whose bound may be stale).
_Entry = tuple[int, list[float], list[tuple[float, int]], set[int]]


def _floor16(n: int) -> int:
    """``n`` rounded down to a power of 16 (0 stays 0)."""
    return 1 << ((n.bit_length() - 1) // 4 * 4) if n > 0 else 0


class Search:
    """The earliest-start searches of one profile, in one pass."""

    __slots__ = ("prof", "_cache")

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self._cache: dict[tuple[int, int, int], _Entry] = {}

    def forget(self) -> None:
        """Drop every bound (resources came back: they may be too late)."""
        self._cache.clear()

    def earliest(
        self, shape: Shape, w: float, after: float
    ) -> tuple[float, list[int]] | None:
        """The earliest time ``>= after`` at which ``shape`` fits for ``w``, with
        the nodes (first fit at that time); None if it never does."""
        count = shape[0]
        relaxed = (1, shape[1], _floor16(shape[2]), 0)
        bounds, heap, stale, span = self._bounds(relaxed, w, after)
        x = after
        exact: dict[int, float] = {}  # node -> its earliest start >= x (INF: never)
        floor: dict[int, float] = {}  # node -> a start it cannot beat (a cut search)
        popped: list[int] = []
        try:
            while True:
                top = self._smallest(
                    shape, w, x, count, bounds, heap, stale, span, exact, floor, popped
                )
                # Put every visited node back with its (maybe raised) bound.
                for i in popped:
                    if bounds[i] < INF:
                        heappush(heap, (bounds[i], i))
                popped.clear()
                if len(top) < count:
                    return None
                t = -top[0][0]
                if t == x or count == 1:
                    return t, sorted(i for i, e in exact.items() if e == t)[:count]
                x = t
        finally:
            for i in popped:
                if bounds[i] < INF:
                    heappush(heap, (bounds[i], i))

    def _smallest(
        self,
        shape: Shape,
        w: float,
        x: float,
        count: int,
        bounds: list[float],
        heap: list[tuple[float, int]],
        stale: set[int],
        span: float,
        exact: dict[int, float],
        floor: dict[int, float],
        popped: list[int],
    ) -> list[tuple[float, int]]:
        """The ``count`` smallest earliest starts ``>= x`` over the nodes, as a
        max-heap of (-start, node): nodes come off ``heap`` by bound, a stale
        bound is refreshed when it comes up, and the search stops when no node
        left can beat what is found (branch and bound)."""
        relaxed = (1, shape[1], _floor16(shape[2]), 0)
        top: list[tuple[float, int]] = []
        while heap:
            lb, i = heappop(heap)
            if lb != bounds[i]:
                continue  # an old entry (the node is in the heap again)
            if len(top) == count and max(lb, x) > -top[0][0]:
                heappush(heap, (lb, i))
                break  # no node from here on can start sooner
            popped.append(i)
            if i in stale:
                stale.discard(i)
                lb = bounds[i] = self._relaxed(i, relaxed, span, lb)
                popped.pop()
                if lb < INF:
                    heappush(heap, (lb, i))
                continue
            e = exact.get(i)
            if e is None or e < x:
                limit = -top[0][0] if len(top) == count else INF
                start = max(x, lb, floor.get(i, lb))
                if start > limit:
                    continue
                found = self.prof.next_start(i, shape, w, start, limit)
                if found is None and limit < INF:
                    floor[i] = limit  # not by ``limit``; maybe later
                    exact.pop(i, None)
                    continue
                e = exact[i] = INF if found is None else found
            if e == INF or (len(top) == count and e > -top[0][0]):
                continue
            heappush(top, (-e, i))
            if len(top) > count:
                heappop(top)
        return top

    def _bounds(
        self, relaxed: Shape, w: float, after: float
    ) -> tuple[list[float], list[tuple[float, int]], set[int], float]:
        """Per node, a lower bound of the earliest start of any one-node share
        at least ``relaxed`` for at least ``w``; a heap of (bound, node) over
        the nodes that may ever fit; the nodes whose bound may be stale; and the
        relaxed walltime the bounds are for.

        A bound is the exact earliest start of the ``relaxed`` job (the CPUs per
        node, the memory per node rounded down to a power of 16, no GPUs), for
        ``w`` rounded down to a power of two, kept per (CPUs, memory, walltime)
        for the whole pass: a pass only ever takes resources, so an earliest
        start can only move later and a bound, once true, stays true. A node
        changed since its bound was made is searched again from the bound, only
        when the bound is needed (the caller does it).
        """
        wb = int(w).bit_length() - 1 if w >= 1 else -1
        span = float(1 << wb) if wb >= 0 else 0.0
        key = (relaxed[1], relaxed[2], wb)
        entry = self._cache.get(key) if after == self.prof.now else None
        if entry is None:
            count = len(self.prof.names)
            values = [self._relaxed(i, relaxed, span, after) for i in range(count)]
            heap = [(b, i) for i, b in enumerate(values) if b < INF]
            heapify(heap)
            entry = (len(self.prof.log), values, heap, set())
            if after == self.prof.now:
                self._cache[key] = entry
        seen, values, heap, stale = entry
        if seen < len(self.prof.log):
            stale.update(self.prof.log[seen:])
            self._cache[key] = (len(self.prof.log), values, heap, stale)
        # The caller refreshes entries in place: they stay true bounds.
        return values, heap, stale, span

    def _relaxed(self, i: int, relaxed: Shape, w: float, x: float) -> float:
        found = self.prof.next_start(i, relaxed, w, x)
        return INF if found is None else found


def direct(
    prof: Profile, shape: Shape, w: float, after: float
) -> tuple[float, list[int]] | None:
    """:meth:`Search.earliest` by asking every node: for a pass that reserves
    once (EASY), or a single node, bounds would cost more than they save."""
    count = shape[0]
    nodes: Sequence[int] = range(len(prof.names))
    if prof.mask is not None:  # a job that needs node features
        nodes = [i for i in nodes if prof.mask[i]]
    if count == 1:
        best, where = INF, -1
        for i in nodes:
            t = prof.next_start(i, shape, w, after, best)
            if t is not None and t < best:
                best, where = t, i
        return None if where < 0 else (best, [where])
    x = after
    starts: list[float | None] = [None] * len(prof.names)
    for i in nodes:
        starts[i] = prof.next_start(i, shape, w, x)
    while True:
        ready = sorted(s for s in starts if s is not None)
        if len(ready) < count:
            return None  # a node that cannot start now never will
        t = ready[count - 1]
        if t == x:
            return x, [i for i in nodes if starts[i] == x][:count]
        x = t
        for i in nodes:
            s = starts[i]
            if s is not None and s < x:
                starts[i] = prof.next_start(i, shape, w, x)
