"""User-aware metrics: expected end time (EET), VEET_u, WT_u, the violation heatmap.

Tóth & Klusáček, "User-Aware Metrics for Measuring Quality of Parallel Job
Schedules" (seed 001). Each user expects a *share* of the machine (by default the
machine size divided by the number of users). Algorithm 1 pours the user's jobs,
in arrival order, into that share in 1-second blocks: from its arrival, a job
takes ``min(share left in the block, its request)`` per block until its
request x run time is used up; its EET is the end of its last block. A job wider
than the share becomes longer and narrower; a narrow one never becomes shorter.
With several resources (CPUs and memory) the EET is the latest of the per-resource
EETs. A job *violates* its EET when it ends after it.

* VEET_u = 100 x (violated jobs of u) / (jobs of u)                  (Formula 1)
* T_j = max(0, C_j - EET_j); WT_u = sum over u's jobs of procs_j x T_j  (2, 3)
* heatmap: users x time; a violated job adds 1 to the cells from
  ``EET - run time`` (the latest start that would have met its EET) for T_j.

Algorithm 1 loops over seconds; this implementation keeps each user's remaining
share as a list of constant segments and consumes whole runs of blocks at once,
so it is exact (same blocks, including the whole last block a job takes) and
fast on two-year traces. Arrival times that are not whole blocks are rounded up
to the next block boundary.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence

import msgspec

from minibatch.metrics.records import JobRecord
from minibatch.metrics.summary import natural_key

# Capacities below this are treated as used up (guards float round-off).
_EPS = 1e-9


class _Share:
    """One user's remaining share over time: constant segments from ``starts[i]``.

    The last segment runs to infinity at the full share. Segments before the
    current arrival are never touched again (jobs come in arrival order), so they
    are dropped as the clock passes them.
    """

    __slots__ = ("starts", "caps", "full")

    def __init__(self, full: float) -> None:
        self.full = full
        self.starts: list[int] = [-(1 << 62)]
        self.caps: list[float] = [full]

    def pour(self, arrival: int, request: float, blocks_area: float) -> int:
        """Pour ``blocks_area`` (request x blocks) from ``arrival``; the end block."""
        if blocks_area <= 0:
            return arrival  # nothing to pour: Algorithm 1's loop does not run
        starts, caps = self.starts, self.caps
        i = bisect_right(starts, arrival) - 1
        if i > 64:  # forget the past now and then (list deletion is a memmove)
            del starts[:i], caps[:i]
            i = 0
        if starts[i] < arrival:
            starts.insert(i + 1, arrival)
            caps.insert(i + 1, caps[i])
            i += 1
        remaining = blocks_area
        while True:
            cap = caps[i]
            last = i + 1 == len(starts)
            if cap <= _EPS:
                i += 1
                if last:  # cannot happen: the open-ended segment is never used up
                    raise AssertionError("share exhausted forever")
                continue
            rate = min(cap, request)
            # Relative slack: remaining / rate carries float round-off that
            # grows with the job's size, and must not add a block.
            blocks = remaining / rate
            need = max(1, math.ceil(blocks - _EPS * max(1.0, blocks)))
            length = math.inf if last else starts[i + 1] - starts[i]
            if need <= length:
                end = starts[i] + need
                if need < length:
                    starts.insert(i + 1, end)
                    caps.insert(i + 1, cap)
                caps[i] = cap - rate
                self._merge(i)
                return end
            caps[i] = cap - rate
            remaining -= rate * length
            i = self._merge(i) + 1

    def _merge(self, i: int) -> int:
        """Join segment i with its left neighbour when equal; its new index."""
        caps = self.caps
        if i > 0 and abs(caps[i] - caps[i - 1]) <= _EPS:
            del self.starts[i], caps[i]
            return i - 1
        return i


def _user_eet(
    jobs: Sequence[JobRecord],
    share: float,
    request: Callable[[JobRecord], float | None],
    block: float,
) -> dict[int, float]:
    pool = _Share(share)
    out: dict[int, float] = {}
    for r in jobs:
        amount = request(r)
        if amount is None or amount <= 0:
            continue
        arrival = math.ceil(r.submit / block - _EPS)
        blocks = r.run_time / block
        end = pool.pour(arrival, amount, amount * blocks)
        out[r.job] = end * block
    return out


def expected_end_times(
    records: Iterable[JobRecord],
    capacity: float,
    *,
    share: float | None = None,
    mem_capacity_kb: float | None = None,
    block: float = 1.0,
) -> dict[int, float]:
    """EET of every job (seed 001, Algorithm 1), keyed by job id.

    Args:
        records: the jobs (any order; taken per user in (submit, id) order).
        capacity: machine processors.
        share: processors each user expects; default ``capacity / users``.
        mem_capacity_kb: machine memory; when given, memory is a second resource
            (share ``mem_capacity_kb / users``) and a job's EET is the later of
            the two. Jobs without a memory request use the CPU EET.
        block: block length in seconds (1 s in the paper).
    """
    by_user: dict[str, list[JobRecord]] = {}
    for r in records:
        by_user.setdefault(r.user, []).append(r)
    if not by_user:
        return {}
    users = len(by_user)
    cpu_share = share if share is not None else capacity / users
    mem_share = None if mem_capacity_kb is None else mem_capacity_kb / users
    eet: dict[int, float] = {}
    for jobs in by_user.values():
        jobs.sort(key=lambda r: (r.submit, r.job))
        eet.update(_user_eet(jobs, cpu_share, lambda r: float(r.procs), block))
        if mem_share is not None:
            mem = _user_eet(
                jobs,
                mem_share,
                lambda r: None if r.mem_kb is None else float(r.mem_kb),
                block,
            )
            for job, when in mem.items():
                eet[job] = max(eet[job], when)
    return eet


class UserEet(msgspec.Struct, frozen=True):
    """VEET_u (percent of jobs past their EET) and WT_u (CPU-weighted tardiness)."""

    user: str
    jobs: int
    violated: int
    veet_pct: float
    wt_cpu_s: float


def tardiness(r: JobRecord, eet: dict[int, float]) -> float:
    """T_j = max(0, C_j - EET_j) (Formula 2)."""
    return max(0.0, r.end - eet[r.job])


def per_user(records: Iterable[JobRecord], eet: dict[int, float]) -> list[UserEet]:
    """VEET_u and WT_u of every user (Formulas 1 and 3), users in natural order."""
    acc: dict[str, list[float]] = {}
    for r in records:
        late = tardiness(r, eet)
        row = acc.setdefault(r.user, [0, 0, 0.0])
        row[0] += 1
        if late > 0:
            row[1] += 1
            row[2] += r.procs * late
    return [
        UserEet(
            user=u,
            jobs=int(row[0]),
            violated=int(row[1]),
            veet_pct=100.0 * row[1] / row[0],
            wt_cpu_s=row[2],
        )
        for u, row in sorted(acc.items(), key=lambda kv: natural_key(kv[0]))
    ]


class Heatmap(msgspec.Struct, frozen=True):
    """Violated EETs per user (rows) and time cell (columns) (seed 001, Fig. 7)."""

    users: list[str]
    t0: float
    cell_s: float
    cells: list[list[int]]


def heatmap(
    records: Sequence[JobRecord],
    eet: dict[int, float],
    *,
    cell_s: float = 60.0,
    max_cells: int = 2000,
) -> Heatmap:
    """The violated-EET heatmap.

    A job with tardiness T adds 1 to ``ceil(T / cell)`` consecutive cells of its
    user's row from ``EET - run time``. Cells are one minute as in the paper,
    widened to whole minutes when the schedule would need more than ``max_cells``.
    """
    users = sorted({r.user for r in records}, key=natural_key)
    if not records:
        return Heatmap(users=users, t0=0.0, cell_s=cell_s, cells=[])
    # A violation's cells run from EET - run time for T = end - EET, so they end
    # at the job's start: the schedule's span bounds the map.
    t0 = min(r.submit for r in records)
    t1 = max(r.end for r in records)
    span = max(t1 - t0, cell_s)
    if span / cell_s > max_cells:
        cell_s = math.ceil(span / max_cells / 60.0) * 60.0
    width = math.ceil(span / cell_s) + 1
    row_of = {u: i for i, u in enumerate(users)}
    diff = [[0] * (width + 1) for _ in users]
    for r in records:
        late = tardiness(r, eet)
        if late <= 0:
            continue
        first = max(0, int((eet[r.job] - r.run_time - t0) // cell_s))
        count = max(1, math.ceil(late / cell_s))
        last = min(width, first + count)
        row = diff[row_of[r.user]]
        row[first] += 1
        row[last] -= 1
    cells = []
    for row in diff:
        level, out = 0, []
        for step in row[:width]:
            level += step
            out.append(level)
        cells.append(out)
    return Heatmap(users=users, t0=t0, cell_s=cell_s, cells=cells)
