"""User-agnostic metrics: wait, response, slowdown, utilization, makespan, throughput.

Definitions (``docs/simulator.md`` has the same list):

* wait = start - submit; response = end - submit; run = end - start;
* slowdown = response / run, with run floored at 1 s (live jobs can end at once);
  a malleable job's run is its *static* run time, on the CPUs it asked for
  (seed 002's definition), so a job slowed by a shrink counts as slowed;
* bounded slowdown = max(1, response / max(run, tau)), tau = 10 s (Feitelson);
* makespan = last end - first submit;
* utilization = sum(procs x run) / (machine procs x makespan) (a malleable
  job's procs x run is the CPU-seconds it held);
* throughput = jobs / makespan (reported per hour);
* prediction error = |start - predicted start| over the jobs with a predicted
  start (the policy's at submission; a job started then has its submit time).

Seed 001 warns that means over skewed distributions mislead, so every per-job
metric comes with its median, 90th and 99th percentiles and maximum. Percentiles
interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from minibatch.metrics.records import JobRecord

#: Bounded-slowdown threshold (seconds).
TAU = 10.0


class Stats(msgspec.Struct, frozen=True):
    """Location and spread of one metric over a set of jobs."""

    mean: float
    median: float
    p90: float
    p99: float
    max: float


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linear interpolation."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def describe(values: Iterable[float]) -> Stats:
    """Mean, median, p90, p99 and max of ``values`` (NaN for none)."""
    ordered = sorted(values)
    if not ordered:
        return Stats(math.nan, math.nan, math.nan, math.nan, math.nan)
    return Stats(
        mean=math.fsum(ordered) / len(ordered),
        median=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


def slowdown(r: JobRecord) -> float:
    return r.response / max(r.static_run_time, 1.0)


def bounded_slowdown(r: JobRecord, tau: float = TAU) -> float:
    return max(1.0, r.response / max(r.static_run_time, tau))


#: Per-job metrics by name, each a function of one record.
PER_JOB: dict[str, Callable[[JobRecord], float]] = {
    "wait": lambda r: r.wait,
    "response": lambda r: r.response,
    "slowdown": slowdown,
    "bounded_slowdown": bounded_slowdown,
}


def makespan(records: Sequence[JobRecord]) -> float:
    if not records:
        return 0.0
    return max(r.end for r in records) - min(r.submit for r in records)


def utilization(records: Sequence[JobRecord], capacity: int) -> float:
    """Processor-seconds used over processor-seconds available during the makespan."""
    span = makespan(records)
    if span <= 0 or capacity <= 0:
        return math.nan
    used = math.fsum(r.cpu_seconds for r in records)
    return used / (capacity * span)


def summarize(records: Sequence[JobRecord], capacity: int | None) -> dict[str, Any]:
    """The summary of a run: counts, each per-job metric's stats, machine metrics.

    Keys: ``jobs``, ``{mean,median,p90,p99,max}_{wait_s,response_s}``,
    ``{mean,median,p90,p99,max}_{slowdown,bounded_slowdown}``, ``utilization``,
    ``makespan_s``, ``throughput_jobs_per_h``, ``predicted_jobs``,
    ``{mean,median}_abs_prediction_error_s``.
    """
    out: dict[str, Any] = {"jobs": len(records)}
    for name, fn in PER_JOB.items():
        stats = describe(fn(r) for r in records)
        unit = "_s" if name in ("wait", "response") else ""
        for stat in ("mean", "median", "p90", "p99", "max"):
            out[f"{stat}_{name}{unit}"] = getattr(stats, stat)
    span = makespan(records)
    out["utilization"] = (
        utilization(records, capacity) if capacity is not None else math.nan
    )
    out["makespan_s"] = span
    out["throughput_jobs_per_h"] = len(records) / span * 3600 if span > 0 else math.nan
    errors = describe(
        abs(r.start - r.predicted_start)
        for r in records
        if r.predicted_start is not None
    )
    out["predicted_jobs"] = sum(r.predicted_start is not None for r in records)
    out["mean_abs_prediction_error_s"] = errors.mean
    out["median_abs_prediction_error_s"] = errors.median
    if any(r.static_run is not None for r in records):
        out["malleable_jobs"] = sum(r.static_run is not None for r in records)
        out["guest_jobs"] = sum(r.guest for r in records)
        out["resized_jobs"] = sum(r.resizes > 0 for r in records)
        out["guest_pct"] = 100.0 * out["guest_jobs"] / len(records)
    return out


def group_by(
    records: Iterable[JobRecord], key: Callable[[JobRecord], str]
) -> dict[str, list[JobRecord]]:
    """Records per group, groups in natural order of their names."""
    groups: dict[str, list[JobRecord]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return {k: groups[k] for k in sorted(groups, key=natural_key)}


def natural_key(text: str) -> tuple[int, float, str]:
    """Sort numbers numerically and before names: 2 < 10 < alice."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


#: Classes for ``by="size"``: upper bounds on processors.
SIZE_CLASSES: tuple[tuple[int, str], ...] = (
    (1, "1"),
    (4, "2-4"),
    (16, "5-16"),
    (64, "17-64"),
    (256, "65-256"),
)


def size_class(r: JobRecord) -> str:
    for bound, label in SIZE_CLASSES:
        if r.procs <= bound:
            return label
    return f">{SIZE_CLASSES[-1][0]}"


#: Groupings ``mb report --by`` offers.
GROUPINGS: dict[str, Callable[[JobRecord], str]] = {
    "user": lambda r: r.user,
    "class": lambda r: r.queue or "-",
    "size": size_class,
}


def per_group(
    records: Sequence[JobRecord],
    by: str,
    eet: dict[int, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per group: jobs, wait stats, mean bounded slowdown, EET violations."""
    if by not in GROUPINGS:
        raise ValueError(f"unknown grouping {by!r} (known: {', '.join(GROUPINGS)})")
    rows = []
    for name, members in group_by(records, GROUPINGS[by]).items():
        wait = describe(r.wait for r in members)
        row: dict[str, Any] = {
            by: name,
            "jobs": len(members),
            "mean_wait_s": wait.mean,
            "median_wait_s": wait.median,
            "p90_wait_s": wait.p90,
            "mean_bounded_slowdown": describe(
                bounded_slowdown(r) for r in members
            ).mean,
        }
        if eet is not None:
            late = [r for r in members if r.job in eet and r.end > eet[r.job]]
            row["veet_pct"] = 100.0 * len(late) / len(members)
            row["wt_cpu_s"] = math.fsum(r.procs * (r.end - eet[r.job]) for r in late)
        rows.append(row)
    return rows


def utilization_series(
    records: Sequence[JobRecord], capacity: int, bins: int = 400
) -> tuple[list[float], list[float]]:
    """Mean busy fraction of the machine in ``bins`` equal slices of the makespan.

    Returns (slice start times, fractions). Exact: each slice gets the integral of
    the busy processors over it, divided by its length and the capacity.
    """
    if not records or capacity <= 0:
        return [], []
    t0 = min(r.submit for r in records)
    t1 = max(r.end for r in records)
    width = (t1 - t0) / bins if t1 > t0 else 1.0
    steps: dict[float, int] = {}
    for r in records:
        if r.end > r.start:
            steps[r.start] = steps.get(r.start, 0) + r.procs
            steps[r.end] = steps.get(r.end, 0) - r.procs
    area = [0.0] * bins
    busy = 0
    last = t0
    for when in sorted(steps):
        _spread(area, busy, last, when, t0, width)
        busy += steps[when]
        last = when
    starts = [t0 + i * width for i in range(bins)]
    return starts, [a / (width * capacity) for a in area]


def _spread(
    area: list[float], level: int, a: float, b: float, t0: float, width: float
) -> None:
    """Add ``level`` x time over [a, b) to the slices it covers."""
    if level == 0 or b <= a:
        return
    bins = len(area)
    i = min(int((a - t0) / width), bins - 1)
    while a < b and i < bins:
        edge = t0 + (i + 1) * width
        stop = b if i == bins - 1 else min(b, edge)
        area[i] += level * (stop - a)
        a = stop
        i += 1
