"""``mb``: the umbrella command. Cluster lifecycle, accounting, benchmarks, and every
PBS command again as a subcommand (``mb qsub`` is ``qsub``).

Importing this module costs next to nothing: the commands are a table of where
each one lives, and ``mb NAME`` imports NAME's module alone. The commands that
answer at once (:data:`QUICK`: ``mb status``, ``mb acct``, the PBS, Maui and
Slurm commands) run without typer when :mod:`minibatch.cli.fastargs` can parse
their command line; typer runs everything else, and all of ``mb --help``.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, fastargs
from minibatch.errors import MinibatchError

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

#: ``mb NAME`` -> (``module:function`` of its typer command, the name of the
#: module's context settings or ""), in the order ``mb --help`` lists them. A
#: ``:register`` function adds the command itself (qsub: ``-h`` is hold).
COMMANDS: dict[str, tuple[str, str]] = {
    "qsub": ("minibatch.cli.qsub:register", ""),
    "qstat": ("minibatch.cli.qstat:qstat_command", "CONTEXT_SETTINGS"),
    "qdel": ("minibatch.cli.jobctl:qdel_command", "CONTEXT_SETTINGS"),
    "qhold": ("minibatch.cli.jobctl:qhold_command", "CONTEXT_SETTINGS"),
    "qrls": ("minibatch.cli.jobctl:qrls_command", "CONTEXT_SETTINGS"),
    "qalter": ("minibatch.cli.jobctl:qalter_command", "CONTEXT_SETTINGS"),
    "qselect": ("minibatch.cli.pbsctl:qselect_command", "CONTEXT_SETTINGS"),
    "qsig": ("minibatch.cli.pbsctl:qsig_command", "CONTEXT_SETTINGS"),
    "qrerun": ("minibatch.cli.pbsctl:qrerun_command", "CONTEXT_SETTINGS"),
    "qmove": ("minibatch.cli.pbsctl:qmove_command", "CONTEXT_SETTINGS"),
    "tracejob": ("minibatch.cli.pbsctl:tracejob_command", "CONTEXT_SETTINGS"),
    "pbsnodes": ("minibatch.cli.pbsnodes:pbsnodes_command", "CONTEXT_SETTINGS"),
    "acct": ("minibatch.cli.acct:acct_command", "CONTEXT_SETTINGS"),
    "backup": ("minibatch.cli.backup:backup_command", ""),
    "squeue": ("minibatch.cli.slurmcmds:squeue_command", "CONTEXT_SETTINGS"),
    "sinfo": ("minibatch.cli.sinfo:sinfo_command", "CONTEXT_SETTINGS"),
    "scancel": ("minibatch.cli.slurmcmds:scancel_command", "HELP_SETTINGS"),
    "sacct": ("minibatch.cli.slurmacct:sacct_command", "HELP_SETTINGS"),
    "scontrol": ("minibatch.cli.slurmctl:scontrol_command", "CONTEXT_SETTINGS"),
    "showq": ("minibatch.cli.showq:showq_command", "CONTEXT_SETTINGS"),
    "showstart": ("minibatch.cli.showq:showstart_command", "CONTEXT_SETTINGS"),
    "showbf": ("minibatch.cli.showq:showbf_command", "CONTEXT_SETTINGS"),
    "setres": ("minibatch.cli.resv:setres_command", "CONTEXT_SETTINGS"),
    "showres": ("minibatch.cli.resv:showres_command", "CONTEXT_SETTINGS"),
    "releaseres": ("minibatch.cli.resv:releaseres_command", "CONTEXT_SETTINGS"),
    "checkjob": ("minibatch.cli.diag:checkjob_command", "CONTEXT_SETTINGS"),
    "diagnose": ("minibatch.cli.diag:diagnose_command", "CONTEXT_SETTINGS"),
    "watch": ("minibatch.cli.watch:watch_command", "CONTEXT_SETTINGS"),
    "sim": ("minibatch.cli.sim:sim_command", ""),
    "report": ("minibatch.cli.report:report_command", ""),
    "compare": ("minibatch.cli.sim:compare_command", ""),
    "replay": ("minibatch.cli.replay:replay_command", ""),
    "whatif": ("minibatch.cli.whatif:whatif_command", ""),
    "experiment": ("minibatch.cli.sim:experiment_command", ""),
    "sweep": ("minibatch.cli.sweep:sweep_command", ""),
    "up": ("minibatch.cli.app:up", ""),
    "down": ("minibatch.cli.app:down", ""),
    "status": ("minibatch.cli.app:status", ""),
    "top": ("minibatch.cli.app:top", ""),
    "web": ("minibatch.cli.app:web", ""),
    "demo": ("minibatch.cli.app:demo", ""),
}
#: ``mb bench NAME``, likewise.
BENCH: dict[str, tuple[str, str]] = {
    "sim": ("minibatch.cli.sim:bench_sim", ""),
    "scheduler": ("minibatch.bench.scheduler:bench_scheduler", ""),
    "throughput": ("minibatch.cli.app:bench_throughput", ""),
    "resize": ("minibatch.cli.app:bench_resize", ""),
    "load": ("minibatch.cli.app:bench_load", ""),
    "commands": ("minibatch.cli.app:bench_commands", ""),
}
#: ``mb NAME SUBCOMMAND``: typer apps of their own, ``module:app``.
GROUPS: dict[str, str] = {
    "policy": "minibatch.cli.policy:policy_app",
    "keys": "minibatch.cli.keys:keys_app",
}
# fmt: off
#: Commands that make a request or two and print the answer: run without typer
#: when :func:`fastargs.parse` can parse their command line, and ended as their
#: console scripts are (:func:`common.run_and_exit`).
QUICK = frozenset({
    "qstat", "qdel", "qhold", "qrls", "qalter", "qselect", "qsig", "qrerun", "qmove",
    "tracejob", "pbsnodes", "acct", "squeue", "sinfo", "scancel", "sacct", "scontrol",
    "showq", "showstart", "showbf", "setres", "showres", "releaseres", "checkjob",
    "diagnose", "status",
})
# fmt: on


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _settings(target: str, settings: str) -> dict[str, Any]:
    module = target.partition(":")[0]
    return dict(getattr(importlib.import_module(module), settings)) if settings else {}


def _add(app: typer.Typer, name: str, target: str, settings: str) -> None:
    function = _load(target)
    if target.endswith(":register"):
        function(app, name)
    else:
        app.command(name, context_settings=_settings(target, settings))(function)


def build(only: str | None = None) -> typer.Typer:
    """``mb`` as a typer app: every command, or only ``only`` (a name of
    :data:`COMMANDS`, ``bench`` or one of :data:`GROUPS`)."""
    app = typer.Typer(
        name="mb",
        help="minibatch: a real batch system for one workstation.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for name, (target, settings) in COMMANDS.items():
        if only in (None, name):
            _add(app, name, target, settings)
    if only in COMMANDS:
        # One command alone would be run as ``mb`` itself: a callback keeps
        # ``mb NAME`` a subcommand, as in the whole app.
        app.callback()(lambda: None)
    if only in (None, "bench"):
        bench_app = typer.Typer(
            help="Measure speed (never asserted in tests).", no_args_is_help=True
        )
        for name, (target, settings) in BENCH.items():
            _add(bench_app, name, target, settings)
        app.add_typer(bench_app, name="bench")
    for name, target in GROUPS.items():
        if only in (None, name):
            app.add_typer(_load(target), name=name)
    return app


def __getattr__(name: str) -> Any:
    # PEP 562: ``app`` (every command) is built when first asked for.
    if name == "app":
        return build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def up(
    nodes: Annotated[
        int | None, typer.Option("--nodes", "-n", help="Number of nodes.")
    ] = None,
    cpus_per_node: Annotated[
        int | None, typer.Option("--cpus-per-node", "-c", help="CPUs of each node.")
    ] = None,
    oversubscribe: Annotated[
        bool,
        typer.Option(
            help="When there are too few cores, give each node virtual CPUs "
            "(numbered 0..N-1, carried by the real cores round-robin)."
        ),
    ] = False,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for the cluster.")
    ] = 20.0,
) -> None:
    """Start the broker, server, scheduler and nodes that are not already running."""
    from minibatch.cluster import lifecycle, probe, stopping
    from minibatch.cluster.layout import layout_for_up, virtual_note

    with common.reporting("mb up"):
        paths, config = common.home()
        # Before the layout: another user's cluster is refused whatever the flags.
        probe.check_owner(paths, "start")
        # One mb up at a time decides the layout and starts it.
        with lifecycle.one_at_a_time(paths, wait + 30):
            # A cluster with a daemon or a kept job still running keeps the
            # layout it started with: a kept job is re-adopted by the node of
            # the same name.
            alive = probe.running(paths) or stopping.kept_jobs(paths)
            last = probe.load_layout(paths)
            running = last if alive else None
            layout = layout_for_up(
                config, nodes, cpus_per_node, oversubscribe, running, last
            )
            if running is None and layout is last:  # reused, not merely equal
                typer.echo(
                    "the layout of the last mb up (mb down, then mb up --nodes N "
                    "--cpus-per-node C, for another)"
                )
            report = lifecycle.up(paths, config, layout, wait=wait)
        for name in report.started:
            typer.echo(f"started {name} (pid {report.pids[name]})")
        for name in report.already_running:
            typer.echo(f"{name} already running (pid {report.pids[name]})")
        for node in report.layout:
            line = f"  {node.name}: CPUs {node.cpus}, mem {node.mem or 'unlimited'}"
            if node.real_cpus:
                line += f"; {virtual_note(node.real_map())}"
            elif node.shared_cpus:
                line += f", CPUs {node.shared_cpus} shared with other nodes"
            typer.echo(line)
        typer.echo(
            f"server {report.server_endpoint}; events {report.mqtt_url or 'off'}"
        )


def down(
    drain: Annotated[
        bool,
        typer.Option(
            "--drain", help="Start nothing new; stop once the running jobs ended."
        ),
    ] = False,
    keep_running: Annotated[
        bool,
        typer.Option(
            "--keep-running",
            help="Leave running jobs in their cgroups for the next mb up.",
        ),
    ] = False,
) -> None:
    """Stop every daemon of this MB_HOME. Queued jobs stay queued; running ones
    are killed and requeued when rerunnable (or drained, or kept running)."""
    from minibatch.cluster import lifecycle

    with common.reporting("mb down"):
        if drain and keep_running:
            raise MinibatchError("--drain and --keep-running exclude each other")
        paths, config = common.home()

        def progress(running: int) -> None:
            typer.echo(f"draining: {running} job(s) still running", err=True)

        stopped = lifecycle.down(
            paths, config, keep_running=keep_running, drain=progress if drain else None
        )
        typer.echo(
            "stopped " + ", ".join(stopped) if stopped else "nothing was running"
        )


def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="Machine-readable output.")
    ] = False,
) -> None:
    """Each daemon with its pid and endpoint, and the MQTT URL."""
    from minibatch.cluster import probe

    with common.reporting("mb status"):
        paths, config = common.home()
        info = probe.status(paths, config)
        # With no daemon up, jobs a node daemon left running (mb down
        # --keep-running, or a daemon that died): the next mb up re-adopts them.
        spool, down = paths.spool, not any(d["alive"] for d in info["daemons"])
        kept = len(list(spool.glob("*.run"))) if down and spool.is_dir() else 0
        info["kept_jobs"] = kept
        if as_json:
            sys.stdout.write(common.dump_json(info))
            return
        alive = sum(d["alive"] for d in info["daemons"])
        said = "up" if info["up"] else "partly up" if alive else "down"
        print(f"MB_HOME {info['home']}: {said}")
        for d in info["daemons"]:
            where = d.get("endpoint") or (f"CPUs {d['cpus']}" if "cpus" in d else "")
            state = f"pid {d['pid']}" if d["alive"] else "not running"
            if "limits" in d:
                where += f"  {d['state']}, limits by {d['limits']}"
                where += f" ({d['comment']})" if d.get("comment") else ""
            if "virtual" in d:
                where += f"; {d['virtual']}"
            print(f"  {d['name']:<14} {state:<12} {where}".rstrip())
        print(f"  events         {info['mqtt_url'] or 'off'}{_events(info)}")
        if kept:
            print(
                f"  {info['kept_jobs']} job(s) left running in their cgroups: "
                "mb up (same layout) re-adopts them, mb down kills them"
            )
        if not info["up"]:
            raise SystemExit(common.ERROR_EXIT)


def _events(info: dict[str, Any]) -> str:
    counts = info.get("events") or {}
    if not counts:
        return ""
    line = f"  {counts['sent']} sent"
    if not counts["connected"]:
        line += f", broker unreachable, {counts['pending']} buffered"
    if counts["dropped"]:
        line += f", {counts['dropped']} dropped (buffer full)"
    return line


def top() -> None:
    """A live dashboard: nodes, queue, running jobs, passes; keys act on jobs."""
    with common.reporting("mb top"):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            common.fail("mb top", "needs a terminal (for a log of events: mb watch)")
        paths, config = common.home()
        # textual is imported here only: other commands do not pay for it.
        from minibatch.top.app import run_top

        run_top(paths, config)


def web(
    port: Annotated[
        int,
        typer.Option(
            "--port", "-p", min=0, max=65535, help="Port on 127.0.0.1 (0: any free)."
        ),
    ] = 8642,
) -> None:
    """A live page on 127.0.0.1: Gantt chart, nodes, queue, events (read-only)."""
    with common.reporting("mb web"):
        paths, config = common.home()
        from minibatch.web.server import serve

        serve(paths, config, port)


def demo(
    quick: Annotated[
        bool, typer.Option("--quick", help="6x faster (under a minute; for CI).")
    ] = False,
    top: Annotated[
        bool, typer.Option("--top", help="Show mb top while it runs (a terminal).")
    ] = False,
    seed: Annotated[int, typer.Option(help="Which mix of seed 004's recipe.")] = 1,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Where the table and plots go.")
    ] = "mb-demo",
    tour: Annotated[
        bool,
        typer.Option(
            "--tour", help="Instead: a tour of the commands on a small workload."
        ),
    ] = False,
    keep: Annotated[
        bool, typer.Option(help="Leave the cluster running afterwards.")
    ] = False,
) -> None:
    """Seed 004's job mix, live on virtual CPUs, under PBS FIFO then Maui
    backfill with fairshare, side by side."""
    with common.reporting("mb demo"):
        if tour:
            from minibatch.cli.tour import run_tour

            run_tour(keep=keep)
            return
        from minibatch.cli.demo import run_demo

        run_demo(quick=quick, top=top, seed=seed, out=out, keep=keep)


def bench_throughput(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[
        int, typer.Option(min=1, help="Jobs in the end-to-end run.")
    ] = 1000,
    repeat: Annotated[
        int, typer.Option(min=1, help="Runs per rate; the median is kept.")
    ] = 3,
    cgroups: Annotated[
        bool, typer.Option(help="Nodes put jobs in cgroups (when root).")
    ] = True,
    vs_task_spooler: Annotated[
        bool,
        typer.Option(
            "--vs-task-spooler",
            help="Only jobs/s end to end, in turns with Debian's task-spooler.",
        ),
    ] = False,
) -> None:
    """Submissions/s, jobs/s end to end, start latency, idle cost, qsub wall time."""
    with common.reporting("mb bench"):
        if vs_task_spooler:
            from minibatch.bench import spooler

            versus = spooler.side_by_side(jobs=jobs, repeat=repeat, cgroups=cgroups)
            _print(versus, as_json, spooler.render)
            return
        from minibatch.bench import throughput

        result = throughput.run(jobs=jobs, repeat=repeat, cgroups=cgroups)
        _print(result, as_json, throughput.render)


def bench_resize(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    resizes: Annotated[
        int, typer.Option(min=1, help="Resizes, 1 and 2 CPUs in turn.")
    ] = 200,
    threads: Annotated[
        int, typer.Option(min=1, help="Threads of the resized job.")
    ] = 64,
) -> None:
    """Time from a resize decision to the job's signal, every thread's mask checked."""
    from minibatch.bench import resize

    with common.reporting("mb bench"):
        result = resize.run(resizes=resizes, threads=threads)
        _print(result, as_json, resize.render)
        if result["mismatches"]:
            common.fail("mb bench", f"{result['mismatches']} threads kept a stale mask")


def bench_load(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[int, typer.Option(min=1, help="Held jobs queued first.")] = 20_000,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 50,
    seconds: Annotated[
        float, typer.Option(min=0.1, help="How long the clients run.")
    ] = 60.0,
    full_every: Annotated[
        int, typer.Option(min=0, help="Rounds between full qstat listings (0: none).")
    ] = 50,
    curve: Annotated[
        str,
        typer.Option(
            help="Instead: drain rate and qstat latencies at these queue depths "
            "(1000,10000,100000)."
        ),
    ] = "",
    runs: Annotated[int, typer.Option(min=1, help="Rounds of commands (--curve).")] = 5,
) -> None:
    """Latency of submit/qstat under a deep queue and many clients; server RSS, CPU."""
    from minibatch.bench import load

    with common.reporting("mb bench"):
        if curve:
            from minibatch.bench import curve as curves

            _print(curves.run(curves.parse_depths(curve), runs), as_json, curves.render)
            return
        result = load.run(
            jobs=jobs, clients=clients, seconds=seconds, full_every=full_every
        )
        _print(result, as_json, load.render)
        if result["errors"]:
            common.fail("mb bench", f"{result['errors']} requests failed")


def bench_commands(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[int, typer.Option(min=1, help="Held jobs queued first.")] = 1000,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs of each command.")] = 20,
) -> None:
    """Wall time of qstat, qsub, showq, mb status... against python -c pass."""
    from minibatch.bench import commands

    with common.reporting("mb bench"):
        result = commands.run(jobs=jobs, runs=runs)
        _print(result, as_json, commands.render)


def _print(
    result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]
) -> None:
    """A benchmark's result: JSON, or the table ``render`` makes of it."""
    sys.stdout.write(common.dump_json(result) if as_json else render(result) + "\n")


def main() -> None:
    """The ``mb`` console script."""
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name in QUICK:
        # Off before the command's imports, as for the console scripts
        # (minibatch.cli.launch); on again if typer is to run it.
        gc.disable()
        target, settings = COMMANDS[name]
        function: Callable[..., Any] = _load(target)
        kwargs = fastargs.parse(function, sys.argv[2:], _settings(target, settings))
        if kwargs is not None:
            common.run_and_exit(lambda: function(**kwargs))
        gc.enable()
    known = name in COMMANDS or name in GROUPS or name == "bench"
    try:
        build(name if known else None)()
    except KeyboardInterrupt:
        sys.exit(130)
