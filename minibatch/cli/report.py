"""``mb report``: the metrics of a simulated or a live run, as tables and plots.

    mb report DIR | --live [--out DIR] [--by user|class|size ...] [--top N]

DIR is what ``mb sim`` wrote (``jobs.csv``, ``summary.json``); ``--live`` reads
the finished jobs of the running cluster. The same metrics module scores both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from minibatch.cli import common
from minibatch.errors import InvalidArgument


def summary_nodes(summary: dict[str, Any]) -> list[tuple[str, int]]:
    """(name, CPUs) of the nodes a run's ``summary.json`` describes."""
    listed = summary.get("machine_nodes") or []
    if listed:
        return [(str(n[0]), int(n[1])) for n in listed]
    return [("pool", int(summary.get("machine_procs") or 1))]


def write_plots(
    records: Any, eet: Any, nodes: list[tuple[str, int]], out: Path, label: str
) -> list[Path]:
    """The report's plots (PNG and SVG) in ``out``; matplotlib loads only here."""
    from minibatch.metrics import plots

    return plots.report_plots(records, eet, nodes, out, label)


def report_command(
    directory: Annotated[
        str | None, typer.Argument(help="A directory written by mb sim.")
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Finished jobs of the running cluster.")
    ] = False,
    out: Annotated[
        str | None,
        typer.Option(
            "--out", "-o", help="Where plots go (default: DIR, or ./mb-report)."
        ),
    ] = None,
    by: Annotated[
        list[str] | None,
        typer.Option("--by", help="Group tables: user, class, size (repeatable)."),
    ] = None,
    top: Annotated[int, typer.Option(help="Rows per group table (busiest).")] = 20,
    plots: Annotated[bool, typer.Option("--plots/--no-plots")] = True,
) -> None:
    """Print the metrics of a run and write its plots (PNG and SVG)."""
    from minibatch.metrics import eet as eet_metrics
    from minibatch.metrics import records as rec
    from minibatch.metrics.summary import per_group, summarize
    from minibatch.metrics.table import group_table, run_table
    from minibatch.sim.runner import eet_summary, write_summary

    with common.reporting("mb report"):
        if live == (directory is not None):
            raise InvalidArgument("give a directory written by mb sim, or --live")
        if directory is not None:
            records = rec.read_csv(Path(directory) / "jobs.csv")
            saved = Path(directory) / "summary.json"
            meta = json.loads(saved.read_text()) if saved.is_file() else {}
            nodes = summary_nodes(meta) if meta else [("pool", _peak(records))]
            target = Path(out or directory)
        else:
            records, nodes = _live_records()
            meta = {}
            target = Path(out or "mb-report")
        if not records:
            raise InvalidArgument("no finished jobs to report on")
        capacity = sum(c for _, c in nodes)
        eet = eet_metrics.expected_end_times(
            records, capacity, mem_capacity_kb=_memory(meta, records)
        )
        summary = {**summarize(records, capacity), **eet_summary(records, eet)}
        for key in ("wall_s", "jobs_per_s"):
            if key in meta:
                summary[key] = meta[key]
        typer.echo(run_table(summary), nl=False)
        for grouping in by or ["user", "class"]:
            rows = per_group(records, grouping, eet)
            typer.echo(f"\nper {grouping} ({len(rows)}):")
            typer.echo(group_table(rows, grouping, top), nl=False)
        if live:
            target.mkdir(parents=True, exist_ok=True)
            rec.write_csv(target / "jobs.csv", records, eet)
            write_summary(target / "summary.json", summary)
        if plots:
            paths = write_plots(records, eet, nodes, target, "live" if live else "")
            typer.echo(f"\nwrote {len(paths)} plot files to {target}")


def _memory(meta: dict[str, Any], records: Any) -> int | None:
    """Machine memory when the run modelled it (memory is then an EET resource)."""
    mems = [n[2] for n in meta.get("machine_nodes") or []]
    if not mems or any(m is None for m in mems):
        return None
    return sum(mems) if any(r.mem_kb for r in records) else None


def _peak(records: Any) -> int:
    """Most processors in use at once: the capacity when nothing else says."""
    steps = sorted(
        [(r.start, r.procs) for r in records] + [(r.end, -r.procs) for r in records],
        key=lambda s: (s[0], s[1]),
    )
    level = peak = 0
    for _, delta in steps:
        level += delta
        peak = max(peak, level)
    return max(peak, 1)


def _live_records() -> tuple[Any, list[tuple[str, int]]]:
    from minibatch.metrics.records import from_jobs
    from minibatch.protocol.messages import QueryJobs, QueryNodes

    jobs = common.call(QueryJobs(finished=True, active=False)).jobs
    node_list = common.call(QueryNodes()).nodes
    nodes = [(n.name, len(n.cpus)) for n in node_list]
    return from_jobs(jobs), nodes or [("pool", 1)]
