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
  power of two) the cache keeps the earliest start of that *relaxed* job (no
  GPUs), a lower bound of the real job's. Coarse memory keeps the number of
  bounds small when memory hardly matters, and the bounds tight when it does.
  A pass only ever takes resources, so an earliest start can only move later
  and a bound, once true, stays true for the rest of the pass: the nodes are
  kept sorted by bound, a node changed since its bound was made is searched
  again from the bound only when it comes up (and only as far as the best
  start found so far: past it, the node cannot win), and the search stops when
  no node left can start before the answer so far.
* **memory out of the bounds when it cannot decide**: where every change
  point with a free CPU has at least ``spare`` memory free per free CPU, a job
  asking at most ``spare`` per CPU finds memory wherever it finds CPUs, so its
  bounds are those of its CPUs alone: the same bounds in fewer tables, each
  used more often, hence fresher. Jobs rarely ask more memory per CPU than a
  node has, so ``spare`` usually holds for a whole pass; a take of more per
  CPU (or of memory alone, or anything given back) sets it to 0, and bounds
  keep memory from then on.

Several nodes: the answer is the ``nodes``-th smallest of the nodes' own
earliest starts, if that many nodes can start at that very time; else the
search moves there and asks again (a node free at one time may be busy later).

The result is the same as asking every node (tests check it against a
second-by-second model and a plain reference profile); only the work differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from minibatch.policy.timeline import INF, NATIVE

if TYPE_CHECKING:
    from minibatch.policy.profile import Profile
    from minibatch.policy.timeline import Need, Timeline

#: What a job needs on each node: (nodes, ppn, memory per node or 0, gpus per node).
Shape = tuple[int, int, int, int]


def _floor16(n: int) -> int:
    """``n`` rounded down to a power of 16 (0 stays 0)."""
    return 1 << ((n.bit_length() - 1) // 4 * 4) if n > 0 else 0


def _spare(nodes: Sequence[Timeline]) -> float:
    """The least memory free per free CPU at any change point with a free CPU
    (INF if none; nodes without memory figures have all they need)."""
    spare = INF
    for node in nodes:
        mem = node.mem
        if mem is not None:
            for c, m in zip(node.cpu, mem, strict=True):
                if c > 0 and m < spare * c:
                    spare = m / c
    return spare


class _Bounds:
    """The bounds of one relaxed job: per node, and the nodes by bound (those
    that can never hold it left out; equal bounds in no set order); per node,
    the profile's count of its changes when its bound was made (another
    count: stale)."""

    __slots__ = ("seen", "values", "order")

    def __init__(self, seen: list[int], values: list[float]) -> None:
        self.seen = seen
        self.values = values
        order = self.order = [i for i, b in enumerate(values) if b < INF]
        # Node numbers sorted by a key: a third faster than sorting (bound,
        # node) pairs.
        order.sort(key=values.__getitem__)

    def settle(self, raised: list[int]) -> None:
        """Put the nodes whose bounds a search raised in place back in order
        (those that can never hold the job out). Compiled, moving the few a
        search raises costs less than sorting them all again."""
        order, values = self.order, self.values
        if not NATIVE:
            # In the interpreter one sort by a key (in C) costs less.
            order.sort(key=values.__getitem__)
            while order and values[order[-1]] == INF:
                order.pop()
            return
        for i in raised:
            order.remove(i)
        for i in raised:
            v = values[i]
            if v < INF:
                # bisect.insort with a key would call it from C for each
                # probe; compiled, this loop is plain C.
                lo, hi = 0, len(order)
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if values[order[mid]] <= v:
                        lo = mid + 1
                    else:
                        hi = mid
                order.insert(lo, i)


class Search:
    """The earliest-start searches of one profile, in one pass."""

    __slots__ = ("prof", "_cache", "spare")

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self._cache: dict[tuple[int, int, int], _Bounds] = {}
        #: Memory free per free CPU, at least, at every change point with a
        #: free CPU (kept true by :meth:`Profile.add
        #: <minibatch.policy.profile.Profile.add>`, or 0).
        self.spare = _spare(prof.nodes)

    def forget(self) -> None:
        """Drop every bound (resources came back: they may be too late)."""
        self._cache.clear()
        self.spare = 0.0

    def earliest(
        self, shape: Shape, w: float, after: float
    ) -> tuple[float, list[int]] | None:
        """The earliest time ``>= after`` at which ``shape`` fits for ``w``, with
        the nodes (first fit at that time); None if it never does."""
        _, ppn, mem, _ = shape
        relaxed = (ppn, 0 if mem <= self.spare * ppn else _floor16(mem), 0)
        bounds, span = self._bounds(relaxed, w, after)
        if shape[0] == 1:
            return self._one(shape, w, after, relaxed, span, bounds)
        return self._many(shape, w, after, relaxed, span, bounds)

    def _one(
        self,
        shape: Shape,
        w: float,
        after: float,
        relaxed: Need,
        span: float,
        bounds: _Bounds,
    ) -> tuple[float, list[int]] | None:
        """:meth:`earliest` for one node: the smallest start, ties to the first
        node. Nodes come up by bound until none can beat the best so far; a
        stale bound is brought up to date first (searching no further than
        the best: beyond it the node cannot win, and its bound becomes the
        lower bound that search ends on, still stale)."""
        nodes = self.prof.nodes
        _, ppn, mem, gpus = shape
        need = (ppn, mem, gpus)
        order, values, seen = bounds.order, bounds.values, bounds.seen
        changes = self.prof.changes
        best, where = INF, len(values)
        raised: list[int] = []
        for i in order:
            b = values[i]
            if b >= best:
                if b > best:
                    break
                if i > where:
                    continue  # it could only tie, on a later node
            node = nodes[i]
            if seen[i] != changes[i]:
                nb = node.start(relaxed, span, b, best)
                if nb != b:
                    values[i] = nb
                    raised.append(i)
                if nb > best:
                    # The node cannot win: its bound moves past the best,
                    # still stale (searching it further would cost more).
                    continue
                seen[i] = changes[i]
                b = nb
            e = node.start(need, w, b if b > after else after, best)
            if e < INF and e <= best and (e < best or i < where):
                best, where = e, i
        if raised:
            bounds.settle(raised)
        return None if best == INF else (best, [where])

    def _many(
        self,
        shape: Shape,
        w: float,
        after: float,
        relaxed: Need,
        span: float,
        bounds: _Bounds,
    ) -> tuple[float, list[int]] | None:
        """:meth:`earliest` for several nodes: a sweep over time. Each node
        looked at gets its first stretch of possible starts from the sweep's
        time on, ``[first, last]`` (``last`` found only once the sweep
        reaches ``first``); the sweep moves to the next stretch's first start
        and stops at the first time that ``nodes`` stretches hold
        (every node that may start then has been looked at: first fit). Nodes
        come in by bound, and a node is searched again only when the sweep
        passes its stretch."""
        count, ppn, mem, gpus = shape
        need = (ppn, mem, gpus)
        nodes = self.prof.nodes
        order, values, seen = bounds.order, bounds.values, bounds.seen
        changes = self.prof.changes
        # (first start, node, 0 from ``order`` or -1 once searched), and the
        # stretches that hold ``t``: node -> last start.
        queue: list[tuple[float, int, int]] = []
        holding: dict[int, float] = {}
        raised: dict[int, None] = {}  # in order, once each
        p, t = 0, after
        while True:
            while True:
                if p < len(order) and values[order[p]] <= t:
                    i = order[p]
                    heappush(queue, (values[i], i, 0))
                    p += 1
                    continue
                if not queue or queue[0][0] > t:
                    break
                lb, i, at = heappop(queue)
                node = nodes[i]
                if at >= 0 and seen[i] != changes[i]:
                    nb = node.start(relaxed, span, lb, t)
                    if nb <= t:
                        seen[i] = changes[i]
                    if nb != lb:
                        values[i] = nb
                        raised[i] = None
                        if nb > t:
                            if nb < INF:
                                heappush(queue, (nb, i, at))
                            continue
                if at < 0:
                    # Its stretch starts now: only now is its end worth finding.
                    end = node.latest(need, w, lb)
                    if end >= t:
                        holding[i] = end
                        continue
                self._stretch(node, i, need, w, t, queue, holding)
            for i in [i for i, end in holding.items() if end < t]:
                del holding[i]
                self._stretch(nodes[i], i, need, w, t, queue, holding)
            if len(holding) >= count:
                break
            nxt = min(
                queue[0][0] if queue else INF,
                values[order[p]] if p < len(order) else INF,
            )
            if nxt == INF:
                t = INF
                break
            t = nxt
        if raised:
            bounds.settle(list(raised))
        return None if t == INF else (t, sorted(holding)[:count])

    @staticmethod
    def _stretch(
        node: Timeline,
        i: int,
        need: Need,
        w: float,
        t: float,
        queue: list[tuple[float, int, int]],
        holding: dict[int, float],
    ) -> None:
        """Find node ``i``'s first stretch of starts from ``t`` on: it holds
        ``t``, or it waits in ``queue`` (or the node never fits again)."""
        first = node.start(need, w, t)
        if first == INF:
            return
        if first == t:
            holding[i] = node.latest(need, w, first)
        else:
            heappush(queue, (first, i, -1))

    def _bounds(self, relaxed: Need, w: float, after: float) -> tuple[_Bounds, float]:
        """The bounds for ``relaxed`` (one node's CPUs, memory rounded down to a
        power of 16 or none, no GPUs) for ``w`` rounded down to a power of two, and
        that walltime. They are kept per (CPUs, memory, walltime) for the whole
        pass when searched from now: a pass only ever takes resources, so an
        earliest start can only move later and a bound, once true, stays true.
        A node changed since its bound was made is stale; the caller searches
        it again from the bound, only when the bound is needed.
        """
        wb = int(w).bit_length() - 1 if w >= 1 else -1
        span = float(1 << wb) if wb >= 0 else 0.0
        prof = self.prof
        key = (relaxed[0], relaxed[1], wb)
        cached = after == prof.now
        bounds = self._cache.get(key) if cached else None
        if bounds is None:
            values = []
            for node in prof.nodes:
                values.append(node.start(relaxed, span, after))
            bounds = _Bounds(prof.changes[:], values)
            if cached:
                self._cache[key] = bounds
        return bounds, span


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
