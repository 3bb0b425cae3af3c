"""``mb sweep``: every trace x policy x parameter value x relative load, one run
each, and the table and plots of the chosen metrics.

A relative load L divides every submission time by L, as the bb-vs-ibb
experiment does (:func:`minibatch.sim.paper_ibb.at_load`): the same jobs, run
times and requests, arriving L times as fast. ``--param k=v1,v2`` adds a
dimension: every value of every parameter, for every policy (each policy must
accept the parameters). The runs go through a :class:`~minibatch.sim.parallel.Pool`;
the table has one row per run, in grid order (the load varies fastest), and
each metric's plot has one panel per trace and one line per policy and
parameter values, over the load.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from minibatch.errors import InvalidArgument
from minibatch.metrics import plots
from minibatch.metrics.records import format_number
from minibatch.metrics.table import PER_JOB_ROWS, RUN_ROWS, grid, number
from minibatch.sim import paper_ibb
from minibatch.sim.parallel import Pool, SimTask, shared
from minibatch.sim.runner import SimConfig, Workload, policy_ref

DEFAULT_METRICS = ("mean_wait_s", "mean_bounded_slowdown", "utilization")
#: The metrics of mb sim's table, the ones a sweep can show.
METRICS = frozenset(
    [
        f"{stat}_{key}"
        for stat in ("mean", "median", "p90", "p99", "max")
        for key, _ in PER_JOB_ROWS
    ]
    + [key for key, _ in RUN_ROWS]
)


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    trace: str
    policy: str
    params: tuple[tuple[str, Any], ...]
    load: float

    @property
    def line(self) -> str:
        """The policy and its parameter values: a line of the plots."""
        return " ".join([self.policy, *(f"{k}={v}" for k, v in self.params)])


def grid_points(
    traces: Sequence[str],
    policies: Sequence[str],
    loads: Sequence[float],
    params: Mapping[str, Sequence[Any]],
) -> list[Point]:
    """The grid, trace by trace, policy by policy, parameter values, then loads."""
    if not traces or not policies or not loads:
        raise InvalidArgument("a sweep needs at least one trace, policy and load")
    if any(load <= 0 for load in loads):
        raise InvalidArgument("loads must be positive")
    names = list(params)
    values = list(itertools.product(*(params[n] for n in names)))
    return [
        Point(trace, policy, tuple(zip(names, chosen, strict=True)), load)
        for trace in traces
        for policy in policies
        for chosen in values
        for load in loads
    ]


def check_metrics(metrics: Sequence[str]) -> None:
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise InvalidArgument(
            f"unknown metric {', '.join(unknown) or '(none given)'} "
            f"(known: {', '.join(sorted(METRICS))})"
        )


def at_load(config: SimConfig, load: float) -> Workload:
    """``config``'s workload at relative ``load`` (runs where the task runs)."""
    work = shared(config)
    return replace(work, jobs=paper_ibb.at_load(work.jobs, load))


def tasks(points: Sequence[Point], base: SimConfig) -> list[SimTask]:
    """A task per point: ``base`` with the point's trace, policy and parameters."""
    return [
        SimTask(
            replace(
                base,
                trace=p.trace,
                policy=policy_ref(p.policy),
                params=dict(p.params),
            ),
            partial(at_load, load=p.load),
        )
        for p in points
    ]


def run(points: Sequence[Point], base: SimConfig, pool: Pool) -> list[dict[str, Any]]:
    """Every point's summary, in the points' order (records are not kept)."""
    return [r.summary for r in pool.each(tasks(points, base))]


def header(points: Sequence[Point], metrics: Sequence[str]) -> list[str]:
    return ["trace", "policy", *(k for k, _ in points[0].params), "load", *metrics]


def _cells(point: Point) -> list[str]:
    return [
        Path(point.trace).name,
        point.policy,
        *(str(v) for _, v in point.params),
        f"{point.load:g}",
    ]


def text_table(
    points: Sequence[Point],
    summaries: Sequence[Mapping[str, Any]],
    metrics: Sequence[str],
) -> str:
    """The printed table: a row per run."""
    rows = [
        [*_cells(p), *(number(s[m]) for m in metrics)]
        for p, s in zip(points, summaries, strict=True)
    ]
    return grid(header(points, metrics), rows)


def write_csv(
    path: Path,
    points: Sequence[Point],
    summaries: Sequence[Mapping[str, Any]],
    metrics: Sequence[str],
) -> None:
    """``sweep.csv``: the table, with full precision."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header(points, metrics))
        for p, s in zip(points, summaries, strict=True):
            writer.writerow([*_cells(p), *(format_number(s[m]) for m in metrics)])


def plot(
    points: Sequence[Point],
    summaries: Sequence[Mapping[str, Any]],
    metric: str,
    base: Path,
) -> list[Path]:
    """``metric`` over the load: a panel per trace, a line per policy/parameters."""
    traces = list(dict.fromkeys(p.trace for p in points))
    fig, axes = plots._figure(
        rows=len(traces), height=3.5 * len(traces), layout="constrained"
    )
    for ax, trace in zip(axes, traces, strict=True):
        lines: dict[str, list[tuple[float, float]]] = {}
        for p, s in zip(points, summaries, strict=True):
            if p.trace == trace:
                lines.setdefault(p.line, []).append((p.load, float(s[metric])))
        for label, xy in lines.items():
            xs, ys = zip(*sorted(xy), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(f"{metric}: {Path(trace).name}")
        ax.set_xlabel("relative load (submission times divided by it)")
        ax.set_ylabel(metric)
        ax.legend(fontsize="small")
    return plots.save(fig, base)
