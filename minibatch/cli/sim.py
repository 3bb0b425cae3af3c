"""Simulation commands: ``mb sim``, ``mb compare``, ``mb experiment`` and
``mb bench sim`` (``mb report`` is in :mod:`minibatch.cli.report`).

    mb sim TRACE --policy easy [--param k=v] [--procs N | --nodes N --cpus-per-node C]
           [--mem 96gb] [--limit N] [--estimates trace|exact] [--kill-at-walltime]
           [--downtime START,LENGTH[,CPUS]] [--malleable none|all|FRACTION]
           [--malleable-range MIN,MAX] [--runtime-model ideal|worst] --out DIR
    mb compare TRACE --policies fifo,easy [...] [--out DIR]
               [--workers N | --cluster URL]
    mb compare TRACE --live-vs-sim --policy easy      (TRACE from ``mb acct --swf``)
    mb experiment NAME [--out DIR] [--workers N | --cluster URL] | --list
    mb bench sim [TRACE] [--policy easy] [--procs N] [--repeat 3] [--depth-curve]

The functions are plain typer commands; ``minibatch.cli.app`` registers them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from minibatch.cli import common
from minibatch.cli.report import summary_nodes, write_plots
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    from minibatch.sim.parallel import Pool
    from minibatch.sim.runner import SimConfig

E = TypeVar("E", bound=Enum)

# Option declarations shared by sim and compare.
PolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="Policy name.")]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param", help="Policy parameter k=v (repeatable).", show_default=False
    ),
]
ProcsOpt = Annotated[
    int | None, typer.Option("--procs", help="One flat pool of N processors.")
]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Number of nodes.")]
CpusOpt = Annotated[
    int | None, typer.Option("--cpus-per-node", help="CPUs of each node.")
]
MemOpt = Annotated[
    str | None,
    typer.Option("--mem", help="Memory of the pool or of each node (e.g. 96gb)."),
]
MachinesOpt = Annotated[
    str | None,
    typer.Option("--machines", help="Nodes from an Alea .machines file."),
]
MemUnitOpt = Annotated[
    str,
    typer.Option(
        "--mem-unit", help="Trace memory field: kb-per-proc (SWF) or bytes-per-job."
    ),
]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", help="Only the first N valid jobs.")
]
EstimatesOpt = Annotated[
    str, typer.Option("--estimates", help="trace: requested times; exact: run times.")
]
KillOpt = Annotated[
    bool,
    typer.Option("--kill-at-walltime", help="End jobs at their requested time."),
]
MalleableOpt = Annotated[
    str,
    typer.Option(
        "--malleable",
        help="Which jobs are malleable: none, all or a fraction (chosen by job "
        "id, the same in every run).",
    ),
]
MalleableRangeOpt = Annotated[
    str,
    typer.Option(
        "--malleable-range",
        help="MIN,MAX: a malleable job's fewest and most CPUs as shares of its "
        "request.",
    ),
]
RuntimeModelOpt = Annotated[
    str,
    typer.Option(
        "--runtime-model",
        help="How a resized job's run time stretches: ideal (Eq. 5) or worst (Eq. 6).",
    ),
]
DowntimeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--downtime",
        help="START,LENGTH[,CPUS]: CPUs reserved for nobody, START after the "
        "first submission (repeatable).",
        show_default=False,
    ),
]
# Where the runs of compare, experiment and sweep go (minibatch.sim.parallel).
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Runs at once, each in its own process (default: one per core; "
        "1: one after the other, in this process).",
        show_default=False,
    ),
]
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="Send the runs to the Dask scheduler at this address "
        "(tcp://HOST:PORT; needs the dask extra of minibatch).",
    ),
]
RunProgressOpt = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Progress bar over runs on stderr (default: when it is a terminal).",
    ),
]


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``["depth=2", "name=x", "on=true"]`` -> typed dict (int, float, bool, str)."""
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"malformed --param {item!r} (expected k=v)")
        params[key.strip()] = parse_value(text)
    return params


def parse_value(text: str) -> Any:
    """A parameter's value: a bool, an int, a float, or else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _choice(option: str, kind: type[E], text: str) -> E:
    """``text`` as one of ``kind``'s values, or an error listing them."""
    try:
        return kind(text)
    except ValueError:
        values = ", ".join(str(v.value) for v in kind)
        raise InvalidArgument(f"{option} {text!r}: expected one of {values}") from None


def build_config(
    trace: str,
    policy: str,
    params: list[str] | None,
    procs: int | None,
    nodes: int | None,
    cpus_per_node: int | None,
    mem: str | None,
    machines: str | None,
    mem_unit: str,
    limit: int | None,
    estimates: str,
    kill_at_walltime: bool,
    downtimes: list[str] | None = None,
    malleable: str = "none",
    malleable_range: str = "0.5,1",
    runtime_model: str = "ideal",
) -> SimConfig:
    """A :class:`~minibatch.sim.runner.SimConfig` from command-line values."""
    from minibatch.core.resize import RuntimeModel
    from minibatch.sim import downtime
    from minibatch.sim.malleable import parse_fraction, parse_range
    from minibatch.sim.runner import MachineSpec, SimConfig
    from minibatch.sim.swf import Estimates, MemoryUnit

    est = _choice("--estimates", Estimates, estimates)
    unit = _choice("--mem-unit", MemoryUnit, mem_unit)
    model = _choice("--runtime-model", RuntimeModel, runtime_model)
    if limit is not None and limit < 1:
        raise InvalidArgument("--limit must be at least 1")
    return SimConfig(
        trace=trace,
        policy=policy,
        params=parse_params(params),
        machine=MachineSpec(procs, nodes, cpus_per_node, mem, machines),
        limit=limit,
        estimates=est,
        kill_at_walltime=kill_at_walltime,
        mem_unit=unit,
        downtimes=tuple(downtime.parse(d) for d in downtimes or ()),
        malleable=parse_fraction(malleable),
        malleable_range=parse_range(malleable_range),
        runtime_model=model,
    )


@contextmanager
def progress_bar(
    enabled: bool, label: str, unit: str = "jobs"
) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, as a progress callback (done, total)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} " + unit),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=1)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield update


def _want_progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


@contextmanager
def run_pool(
    workers: int | None, cluster: str | None, progress: bool | None, label: str
) -> Iterator[Pool]:
    """The pool of ``--workers``/``--cluster``, with a progress bar over runs."""
    from minibatch.sim.parallel import Pool

    with (
        progress_bar(_want_progress(progress), label, "runs") as update,
        Pool(workers, cluster, update) as pool,
    ):
        yield pool


# ----------------------------------------------------------------- mb sim


def sim_command(
    trace: Annotated[str, typer.Argument(help="SWF trace (plain or .gz).")],
    out: Annotated[str, typer.Option("--out", "-o", help="Output directory.")],
    policy: PolicyOpt = "easy",
    param: ParamOpt = None,
    procs: ProcsOpt = None,
    nodes: NodesOpt = None,
    cpus_per_node: CpusOpt = None,
    mem: MemOpt = None,
    machines: MachinesOpt = None,
    mem_unit: MemUnitOpt = "kb-per-proc",
    limit: LimitOpt = None,
    estimates: EstimatesOpt = "trace",
    kill_at_walltime: KillOpt = False,
    downtime: DowntimeOpt = None,
    malleable: MalleableOpt = "none",
    malleable_range: MalleableRangeOpt = "0.5,1",
    runtime_model: RuntimeModelOpt = "ideal",
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="Progress bar on stderr."),
    ] = None,
    plots: Annotated[
        bool, typer.Option("--plots", help="Also write the report's plots.")
    ] = False,
) -> None:
    """Replay TRACE under a policy; write DIR/jobs.csv and DIR/summary.json."""
    from minibatch.metrics.table import run_table
    from minibatch.sim import runner

    with common.reporting("mb sim"):
        config = build_config(
            trace, policy, param, procs, nodes, cpus_per_node, mem, machines,
            mem_unit, limit, estimates, kill_at_walltime, downtime,
            malleable, malleable_range, runtime_model,
        )  # fmt: skip
        work = runner.load(config)
        show = _want_progress(progress) and len(work.jobs) >= 10_000
        with progress_bar(show, f"{config.policy}") as update:
            run = runner.simulate(config, work, update)
        jobs_csv, summary_json = runner.write_run(run, out)
        if plots:
            write_plots(
                run.records, run.eet, summary_nodes(run.summary), Path(out), policy
            )
        typer.echo(run_table(run.summary), nl=False)
        if work.left_out:
            why = ", ".join(f"{n} {r}" for r, n in sorted(work.left_out.items()))
            typer.echo(f"\nleft out by the job filter (docs/simulator.md): {why}")
        typer.echo(f"\nwrote {jobs_csv} and {summary_json}")


# ------------------------------------------------------------- mb compare


def compare_command(
    trace: Annotated[str, typer.Argument(help="SWF trace (plain or .gz).")],
    policies: Annotated[
        str, typer.Option("--policies", help="Comma-separated policy names.")
    ] = "fifo,easy",
    live_vs_sim: Annotated[
        bool,
        typer.Option(
            "--live-vs-sim",
            help="Replay TRACE (e.g. from mb acct --swf) and compare each job's "
            "simulated start with the recorded one.",
        ),
    ] = False,
    policy: PolicyOpt = "easy",
    param: ParamOpt = None,
    procs: ProcsOpt = None,
    nodes: NodesOpt = None,
    cpus_per_node: CpusOpt = None,
    mem: MemOpt = None,
    machines: MachinesOpt = None,
    mem_unit: MemUnitOpt = "kb-per-proc",
    limit: LimitOpt = None,
    estimates: EstimatesOpt = "trace",
    kill_at_walltime: KillOpt = False,
    downtime: DowntimeOpt = None,
    malleable: MalleableOpt = "none",
    malleable_range: MalleableRangeOpt = "0.5,1",
    runtime_model: RuntimeModelOpt = "ideal",
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="Write runs and plots here (default ./mb-compare; with "
            "--live-vs-sim nothing is written unless given).",
        ),
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots")] = True,
    workers: WorkersOpt = None,
    cluster: ClusterOpt = None,
    progress: RunProgressOpt = None,
) -> None:
    """Run several policies on TRACE side by side (or a recorded run vs its replay)."""
    from minibatch.metrics.table import compare_table
    from minibatch.sim import compare as comparing
    from minibatch.sim.swf import find_trace

    with common.reporting("mb compare"):
        config = build_config(
            trace, policy, param, procs, nodes, cpus_per_node, mem, machines,
            mem_unit, limit, estimates, kill_at_walltime, downtime,
            malleable, malleable_range, runtime_model,
        )  # fmt: skip
        if live_vs_sim:
            show_live_vs_sim(config, out)
            return
        names = [p.strip() for p in policies.split(",") if p.strip()]
        if not names:
            raise InvalidArgument("--policies needs at least one name")
        # Workers elsewhere (a Dask cluster) find the trace by its full path.
        config = replace(config, trace=str(find_trace(config.trace).resolve()))
        target = Path(out or "mb-compare")
        with run_pool(workers, cluster, progress, "compare") as pool:
            runs = comparing.compare(config, names, target, plots=plots, pool=pool)
        head = runs[0]
        typer.echo(
            f"{len(head.records):,} jobs on {head.machine.describe()}\n"
            + compare_table(names, [r.summary for r in runs]),
            nl=False,
        )
        typer.echo(f"\nwrote runs{' and plots' if plots else ''} to {target}")


def show_live_vs_sim(config: SimConfig, out: str | Path | None) -> None:
    """Replay ``config.trace`` (a recorded run) and print how far each job's
    simulated start is from the recorded one (``mb compare --live-vs-sim``,
    ``mb replay``); with ``out``, write the run, ``starts.csv`` and
    ``live_vs_sim.json`` there."""
    from minibatch.metrics.table import grid, number
    from minibatch.sim import compare as comparing
    from minibatch.sim import runner

    result = comparing.live_vs_sim(config)
    stats = result.summary()
    rows = [[k, number(v)] for k, v in stats.items()]
    typer.echo(grid([f"{config.policy}: simulated vs recorded start", ""], rows))
    worst = sorted(result.deltas, key=lambda d: -abs(d.delta))[:10]
    typer.echo(
        grid(
            ["job", "user", "recorded start", "simulated start", "delta (s)"],
            [
                [
                    str(d.job),
                    d.user,
                    number(d.trace_start),
                    number(d.sim_start),
                    number(d.delta),
                ]
                for d in worst
            ],
        ),
        nl=False,
    )
    if out is not None:
        runner.write_run(result.run, out)
        comparing.write_deltas(Path(out) / "starts.csv", result.deltas)
        runner.write_summary(Path(out) / "live_vs_sim.json", stats)
        typer.echo(f"\nwrote {out}/starts.csv")


# ---------------------------------------------------------- mb experiment


def experiment_command(
    name: Annotated[
        str | None, typer.Argument(help="Experiment name (see --list).")
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="Output directory (default results/NAME)."),
    ] = None,
    list_them: Annotated[
        bool, typer.Option("--list", help="List the experiments.")
    ] = False,
    plots: Annotated[bool, typer.Option("--plots/--no-plots")] = True,
    workers: WorkersOpt = None,
    cluster: ClusterOpt = None,
    progress: RunProgressOpt = None,
) -> None:
    """Run a named, reproducible comparison and write its table and plots."""
    from minibatch.sim import experiments

    with common.reporting("mb experiment"):
        if list_them or name is None:
            typer.echo(experiments.describe_all(), nl=False)
            return
        target = Path(out or f"results/{name}")
        with run_pool(workers, cluster, progress, name) as pool:
            experiments.run_experiment(
                name,
                target,
                plots=plots,
                pool=pool,
                say=lambda s: typer.echo(s, err=True),
            )
        typer.echo((target / "results.md").read_text(), nl=False)
        typer.echo(f"\nwrote {target}")


# ------------------------------------------------------------ mb bench sim


def bench_sim(
    trace: Annotated[
        str, typer.Argument(help="Trace file or name (default: SDSC-SP2, bundled).")
    ] = "SDSC-SP2-1998-4.2-cln.swf.gz",
    policy: PolicyOpt = "easy",
    procs: ProcsOpt = None,
    repeat: Annotated[int, typer.Option(min=1, help="Runs; the median is kept.")] = 3,
    depth_curve: Annotated[
        bool,
        typer.Option(
            "--depth-curve", help="Also time each pass by the number of jobs queued."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Simulated jobs/s of a policy on a whole trace, next to a bare event loop."""
    from minibatch.sim import bench
    from minibatch.sim.runner import MachineSpec, SimConfig, load
    from minibatch.sim.swf import find_trace

    with common.reporting("mb bench sim"):
        config = SimConfig(
            trace=str(find_trace(trace)),
            policy=policy,
            machine=MachineSpec(procs=procs),
        )
        work = load(config)
        result = bench.run(config, repeat=repeat, work=work)
        if depth_curve:
            result["depth_curve"] = bench.depth_curve(config, work)
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        typer.echo(bench.render(result), nl=False)
        if depth_curve:
            typer.echo("\npolicy time per pass, by jobs queued:")
            typer.echo(bench.render_curve(result["depth_curve"]), nl=False)
