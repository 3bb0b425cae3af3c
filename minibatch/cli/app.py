"""``mb``: the umbrella command. Cluster lifecycle, accounting, benchmarks, and every
PBS command again as a subcommand (``mb qsub`` is ``qsub``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from minibatch.bench.scheduler import bench_scheduler
from minibatch.cli import (
    acct,
    backup,
    common,
    diag,
    jobctl,
    keys,
    pbsctl,
    pbsnodes,
    policy,
    qstat,
    qsub,
    replay,
    report,
    resv,
    showq,
    sim,
    slurmacct,
    slurmcmds,
    slurmctl,
    watch,
    whatif,
)
from minibatch.errors import MinibatchError

app = typer.Typer(
    name="mb",
    help="minibatch: a real batch system for one workstation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Measure speed (never asserted in tests).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")

qsub.register(app)
app.command("qstat", context_settings=qstat.CONTEXT_SETTINGS)(qstat.qstat_command)
app.command("qdel", context_settings=jobctl.CONTEXT_SETTINGS)(jobctl.qdel_command)
app.command("qhold", context_settings=jobctl.CONTEXT_SETTINGS)(jobctl.qhold_command)
app.command("qrls", context_settings=jobctl.CONTEXT_SETTINGS)(jobctl.qrls_command)
app.command("qalter", context_settings=jobctl.CONTEXT_SETTINGS)(jobctl.qalter_command)
for _pbs_name, _pbs_command in (
    ("qselect", pbsctl.qselect_command),
    ("qsig", pbsctl.qsig_command),
    ("qrerun", pbsctl.qrerun_command),
    ("qmove", pbsctl.qmove_command),
    ("tracejob", pbsctl.tracejob_command),
):
    app.command(_pbs_name, context_settings=pbsctl.CONTEXT_SETTINGS)(_pbs_command)
app.command("pbsnodes", context_settings=pbsnodes.CONTEXT_SETTINGS)(
    pbsnodes.pbsnodes_command
)
app.command("acct", context_settings=acct.CONTEXT_SETTINGS)(acct.acct_command)
app.command("backup")(backup.backup_command)
# Slurm's commands.
for _slurm_name, _slurm_command, _slurm_settings in (
    ("squeue", slurmcmds.squeue_command, slurmcmds.CONTEXT_SETTINGS),
    ("scancel", slurmcmds.scancel_command, slurmcmds.HELP_SETTINGS),
    ("sacct", slurmacct.sacct_command, slurmcmds.HELP_SETTINGS),
    ("scontrol", slurmctl.scontrol_command, slurmctl.CONTEXT_SETTINGS),
):
    app.command(_slurm_name, context_settings=_slurm_settings)(_slurm_command)
# Maui's commands.
for _name, _command in (
    ("showq", showq.showq_command),
    ("showstart", showq.showstart_command),
    ("showbf", showq.showbf_command),
    ("setres", resv.setres_command),
    ("showres", resv.showres_command),
    ("releaseres", resv.releaseres_command),
    ("checkjob", diag.checkjob_command),
    ("diagnose", diag.diagnose_command),
):
    app.command(_name, context_settings={"help_option_names": ["--help"]})(_command)
app.add_typer(policy.policy_app, name="policy")
app.add_typer(keys.keys_app, name="keys")
app.command("watch", context_settings=watch.CONTEXT_SETTINGS)(watch.watch_command)
app.command("sim")(sim.sim_command)
app.command("report")(report.report_command)
app.command("compare")(sim.compare_command)
app.command("replay")(replay.replay_command)
app.command("whatif")(whatif.whatif_command)
app.command("experiment")(sim.experiment_command)
bench_app.command("sim")(sim.bench_sim)
bench_app.command("scheduler")(bench_scheduler)


@app.command()
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
    from minibatch.cluster import lifecycle, stopping
    from minibatch.cluster.layout import layout_for_up, virtual_note

    with common.reporting("mb up"):
        paths, config = common.home()
        # A cluster with a daemon or a kept job still running keeps the layout it
        # started with: a kept job is re-adopted by the node of the same name.
        alive = lifecycle.running(paths) or stopping.kept_jobs(paths)
        running = lifecycle.load_layout(paths) if alive else None
        layout = layout_for_up(config, nodes, cpus_per_node, oversubscribe, running)
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


@app.command()
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


@app.command()
def status(
    as_json: Annotated[
        bool, typer.Option("--json", help="Machine-readable output.")
    ] = False,
) -> None:
    """Each daemon with its pid and endpoint, and the MQTT URL."""
    from minibatch.cluster import lifecycle

    with common.reporting("mb status"):
        paths, config = common.home()
        info = lifecycle.status(paths, config)
        if as_json:
            typer.echo(json.dumps(info, indent=2))
            return
        typer.echo(
            f"MB_HOME {info['home']}: {'up' if info['up'] else 'not (fully) up'}"
        )
        for d in info["daemons"]:
            where = d.get("endpoint") or (f"CPUs {d['cpus']}" if "cpus" in d else "")
            state = f"pid {d['pid']}" if d["alive"] else "not running"
            if "limits" in d:
                where += f"  {d['state']}, limits by {d['limits']}"
                where += f" ({d['comment']})" if d.get("comment") else ""
            if "virtual" in d:
                where += f"; {d['virtual']}"
            typer.echo(f"  {d['name']:<14} {state:<12} {where}")
        typer.echo(f"  events         {info['mqtt_url'] or 'off'}{_events(info)}")
        if not info["up"]:
            raise typer.Exit(1)


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


@app.command()
def top() -> None:
    """A live dashboard: nodes, queue, running jobs, passes; keys act on jobs."""
    with common.reporting("mb top"):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            common.fail("mb top", "needs a terminal (for a log of events: mb watch)")
        paths, config = common.home()
        # textual is imported here only: other commands do not pay for it.
        from minibatch.top.app import run_top

        run_top(paths, config)


@app.command()
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


@app.command()
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


@bench_app.command("throughput")
def bench_throughput(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[int, typer.Option(help="Jobs in the end-to-end run.")] = 1000,
    repeat: Annotated[int, typer.Option(help="Runs per rate; the median is kept.")] = 3,
    cgroups: Annotated[
        bool, typer.Option(help="Nodes put jobs in cgroups (when root).")
    ] = True,
) -> None:
    """Submissions/s, jobs/s end to end, start latency, idle cost, qsub wall time."""
    from minibatch.bench import throughput

    with common.reporting("mb bench"):
        result = throughput.run(jobs=jobs, repeat=repeat, cgroups=cgroups)
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        typer.echo(throughput.render(result))


@bench_app.command("resize")
def bench_resize(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    resizes: Annotated[int, typer.Option(help="Resizes, 1 and 2 CPUs in turn.")] = 200,
    threads: Annotated[int, typer.Option(help="Threads of the resized job.")] = 64,
) -> None:
    """Time from a resize decision to the job's signal, every thread's mask checked."""
    from minibatch.bench import resize

    with common.reporting("mb bench"):
        result = resize.run(resizes=resizes, threads=threads)
        typer.echo(json.dumps(result, indent=2) if as_json else resize.render(result))
        if result["mismatches"]:
            common.fail("mb bench", f"{result['mismatches']} threads kept a stale mask")


@bench_app.command("load")
def bench_load(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[int, typer.Option(help="Held jobs queued first.")] = 20_000,
    clients: Annotated[int, typer.Option(help="Concurrent clients.")] = 50,
    seconds: Annotated[float, typer.Option(help="How long the clients run.")] = 60.0,
    full_every: Annotated[
        int, typer.Option(help="Rounds between full qstat listings (0: none).")
    ] = 50,
) -> None:
    """Latency of submit/qstat under a deep queue and many clients; server RSS, CPU."""
    from minibatch.bench import load

    with common.reporting("mb bench"):
        result = load.run(
            jobs=jobs, clients=clients, seconds=seconds, full_every=full_every
        )
        typer.echo(json.dumps(result, indent=2) if as_json else load.render(result))
        if result["errors"]:
            common.fail("mb bench", f"{result['errors']} requests failed")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
