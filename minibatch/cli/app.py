"""``mb``: the umbrella command. Cluster lifecycle, accounting, benchmarks, and every
PBS command again as a subcommand (``mb qsub`` is ``qsub``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from minibatch.bench.scheduler import bench_scheduler
from minibatch.cli import (
    acct,
    common,
    diag,
    jobctl,
    pbsctl,
    pbsnodes,
    policy,
    qstat,
    qsub,
    report,
    resv,
    showq,
    sim,
    slurmacct,
    slurmcmds,
    slurmctl,
)

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
app.command("sim")(sim.sim_command)
app.command("report")(report.report_command)
app.command("compare")(sim.compare_command)
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
        bool, typer.Option(help="Let nodes share real cores when there are too few.")
    ] = False,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for the cluster.")
    ] = 20.0,
) -> None:
    """Start the broker, server, scheduler and nodes that are not already running."""
    from minibatch.cluster import lifecycle
    from minibatch.cluster.layout import layout_for_up

    with common.reporting("mb up"):
        paths, config = common.home()
        # A cluster with a daemon still running keeps the layout it started with.
        running = lifecycle.load_layout(paths) if lifecycle.running(paths) else None
        layout = layout_for_up(config, nodes, cpus_per_node, oversubscribe, running)
        report = lifecycle.up(paths, config, layout, wait=wait)
        for name in report.started:
            typer.echo(f"started {name} (pid {report.pids[name]})")
        for name in report.already_running:
            typer.echo(f"{name} already running (pid {report.pids[name]})")
        for node in report.layout:
            line = f"  {node.name}: CPUs {node.cpus}, mem {node.mem or 'unlimited'}"
            if node.shared_cpus:
                line += f", CPUs {node.shared_cpus} shared with other nodes"
            typer.echo(line)
        typer.echo(
            f"server {report.server_endpoint}; events {report.mqtt_url or 'off'}"
        )


@app.command()
def down() -> None:
    """Stop every daemon of this MB_HOME; no process is left behind."""
    from minibatch.cluster import lifecycle

    with common.reporting("mb down"):
        paths, _ = common.home()
        stopped = lifecycle.down(paths)
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
            typer.echo(f"  {d['name']:<14} {state:<12} {where}")
        typer.echo(f"  events         {info['mqtt_url'] or 'off'}")
        if not info["up"]:
            raise typer.Exit(1)


@app.command()
def demo(
    keep: Annotated[
        bool, typer.Option(help="Leave the cluster running afterwards.")
    ] = False,
) -> None:
    """Start a local cluster, run a real workload on it, and show the result."""
    from minibatch.cli.demo import run_demo

    with common.reporting("mb demo"):
        run_demo(keep=keep)


@bench_app.command("throughput")
def bench_throughput(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
    jobs: Annotated[int, typer.Option(help="Jobs in the end-to-end run.")] = 1000,
    repeat: Annotated[int, typer.Option(help="Runs per rate; the median is kept.")] = 3,
) -> None:
    """Submissions/s, jobs/s end to end, start latency, idle cost, qsub wall time."""
    from minibatch.bench import throughput

    with common.reporting("mb bench"):
        result = throughput.run(jobs=jobs, repeat=repeat)
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
