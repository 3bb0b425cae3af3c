"""``mb sweep``: a grid of simulations, run in parallel, as one table and one
plot per metric.

    mb sweep TRACE... --policies easy,bb --loads 0.7,0.9,1.1 [--param k=v1,v2]
             [--metrics mean_wait_s,...] [--procs N | --machines FILE]
             [--mem-unit kb-per-proc|bytes-per-job] [--limit N] [--out DIR]
             [--workers N | --cluster tcp://HOST:PORT]

The grid and its table are :mod:`minibatch.sim.sweep`; the runs go where
``--workers``/``--cluster`` say (:mod:`minibatch.sim.parallel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from minibatch.cli import common
from minibatch.cli.sim import (
    ClusterOpt,
    LimitOpt,
    MachinesOpt,
    MemUnitOpt,
    ProcsOpt,
    RunProgressOpt,
    WorkersOpt,
    build_config,
    parse_value,
    run_pool,
)
from minibatch.errors import InvalidArgument


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_grid(items: list[str] | None) -> dict[str, list[Any]]:
    """``["depth=1,2", "rescan=true,false"]`` -> each parameter's values."""
    values: dict[str, list[Any]] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not _names(text):
            raise InvalidArgument(f"malformed --param {item!r} (expected k=v1,v2)")
        values[key.strip()] = [parse_value(v) for v in _names(text)]
    return values


def parse_loads(text: str) -> list[float]:
    try:
        return [float(v) for v in _names(text)]
    except ValueError as exc:
        raise InvalidArgument(f"malformed --loads {text!r}: {exc}") from exc


def sweep_command(
    traces: Annotated[
        list[str], typer.Argument(help="SWF traces (plain or .gz), paths or names.")
    ],
    policies: Annotated[
        str, typer.Option("--policies", help="Comma-separated policy names.")
    ] = "fifo,easy",
    loads: Annotated[
        str,
        typer.Option(
            "--loads",
            help="Comma-separated relative loads: submission times divided by each.",
        ),
    ] = "1",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="k=v1,v2: every value of a policy parameter, for every policy "
            "(repeatable).",
            show_default=False,
        ),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            help="Comma-separated summary keys, a column and a plot each "
            "(default: mean_wait_s,mean_bounded_slowdown,utilization).",
            show_default=False,
        ),
    ] = None,
    procs: ProcsOpt = None,
    machines: MachinesOpt = None,
    mem_unit: MemUnitOpt = "kb-per-proc",
    limit: LimitOpt = None,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Output directory.")
    ] = "mb-sweep",
    plots: Annotated[bool, typer.Option("--plots/--no-plots")] = True,
    workers: WorkersOpt = None,
    cluster: ClusterOpt = None,
    progress: RunProgressOpt = None,
) -> None:
    """Run every trace x policy x parameter value x load; write DIR/sweep.csv
    and a plot per metric over the load."""
    from minibatch.sim import sweep
    from minibatch.sim.swf import find_trace

    with common.reporting("mb sweep"):
        chosen = _names(metrics) if metrics is not None else sweep.DEFAULT_METRICS
        sweep.check_metrics(chosen)
        # Full paths: workers elsewhere (a Dask cluster) find the files by them.
        paths = [str(find_trace(t).resolve()) for t in traces]
        if machines is not None:
            machines = str(find_trace(machines).resolve())
        points = sweep.grid_points(
            paths, _names(policies), parse_loads(loads), parse_grid(param)
        )
        base = build_config(
            paths[0], "easy", None, procs, None, None, None, machines,
            mem_unit, limit, "trace", False,
        )  # fmt: skip
        with run_pool(workers, cluster, progress, "sweep") as pool:
            summaries = sweep.run(points, base, pool)
        target = Path(out)
        sweep.write_csv(target / "sweep.csv", points, summaries, chosen)
        if plots:
            for metric in chosen:
                sweep.plot(points, summaries, metric, target / metric)
        typer.echo(sweep.text_table(points, summaries, chosen), nl=False)
        typer.echo(
            f"\nwrote {target / 'sweep.csv'}"
            + (f" and {len(chosen)} plots" if plots else "")
        )
