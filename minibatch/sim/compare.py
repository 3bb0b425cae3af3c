"""Several policies on one workload, and a recorded schedule against its replay.

:func:`compare` runs each policy on the *same* filtered jobs (the trace is read
once per process: :mod:`minibatch.sim.parallel`) and writes each run's files
plus the side-by-side plots.
:func:`live_vs_sim` replays a trace (typically a live run exported with
``mb acct --swf``) and reports, per job, how far the simulated start is from the
start the trace records (submit + wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minibatch.metrics.records import JobRecord, format_number
from minibatch.metrics.summary import Stats, describe
from minibatch.sim.engine import Progress
from minibatch.sim.parallel import Pool, SimTask
from minibatch.sim.runner import SimConfig, SimRun, simulate, write_run


def compare(
    config: SimConfig,
    policies: Sequence[str],
    out: Path | None = None,
    plots: bool = True,
    pool: Pool | None = None,
) -> list[SimRun]:
    """Run every policy on ``config``'s workload, on ``pool`` (default: here,
    one after the other).

    With ``out``, each run goes to ``out/<policy>/`` (``jobs.csv``,
    ``summary.json``) and, with ``plots``, the comparison plots to ``out``.
    """
    tasks = [SimTask(replace(config, policy=name)) for name in policies]
    runs = (pool or Pool(workers=1)).all(tasks)
    if out is not None:
        for name, run in zip(policies, runs, strict=True):
            write_run(run, out / _slug(name))
        if plots:
            compare_plots(runs, out)
    return runs


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def compare_plots(runs: Sequence[SimRun], out: Path, title: str = "") -> list[Path]:
    """Box plots, stacked heatmaps and utilization of several runs into ``out``."""
    from minibatch.metrics import plots

    named = {r.config.policy: (r.records, r.eet) for r in runs}
    capacity = runs[0].machine.procs
    paths = plots.boxplots(named, out / "boxplots", title)
    paths += plots.compare_heatmaps(named, capacity, out / "eet_heatmaps", title)
    paths += plots.compare_utilization(
        {r.config.policy: r.records for r in runs}, capacity, out / "utilization"
    )
    return paths


@dataclass
class StartDelta:
    """One job: the start the trace recorded and the simulated one."""

    job: int
    user: str
    trace_start: float
    sim_start: float

    @property
    def delta(self) -> float:
        """Simulated minus recorded start (positive: the simulation started later)."""
        return self.sim_start - self.trace_start


@dataclass
class LiveVsSim:
    """A replay of a recorded schedule and how far it is from the record."""

    run: SimRun
    deltas: list[StartDelta]

    @property
    def abs_stats(self) -> Stats:
        return describe(abs(d.delta) for d in self.deltas)

    def summary(self) -> dict[str, Any]:
        stats = self.abs_stats
        exact = sum(1 for d in self.deltas if abs(d.delta) < 1e-6)
        return {
            "jobs": len(self.deltas),
            "same_start": exact,
            "mean_abs_start_delta_s": stats.mean,
            "median_abs_start_delta_s": stats.median,
            "p90_abs_start_delta_s": stats.p90,
            "max_abs_start_delta_s": stats.max,
            "mean_start_delta_s": describe(d.delta for d in self.deltas).mean,
        }


def start_deltas(records: Sequence[JobRecord]) -> list[StartDelta]:
    """Per job with a recorded start: simulated vs recorded start."""
    return [
        StartDelta(r.job, r.user, r.trace_start, r.start)
        for r in records
        if r.trace_start is not None
    ]


def live_vs_sim(config: SimConfig, progress: Progress | None = None) -> LiveVsSim:
    """Replay ``config.trace`` under ``config.policy``; compare starts job by job."""
    run = simulate(config, progress=progress)
    return LiveVsSim(run, start_deltas(run.records))


def write_deltas(path: Path, deltas: Sequence[StartDelta]) -> None:
    """``starts.csv``: job, user, trace_start, sim_start, delta."""
    lines = ["job,user,trace_start,sim_start,delta"]
    lines += [
        f"{d.job},{d.user},{format_number(d.trace_start)},"
        f"{format_number(d.sim_start)},{format_number(d.delta)}"
        for d in deltas
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
