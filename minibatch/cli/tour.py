"""``mb demo --tour``: a local cluster, a real workload, and what the batch system
says.

Every step is a real command, printed as a user would type it, run against real
daemons in ``$MB_HOME``: CPU burners, a parameter sweep, a dependency chain whose
failure is handled, a job killed at its walltime, one killed for using too much
memory, and a request no node can satisfy (rejected at submission).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import typer

from minibatch.cluster import lifecycle
from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.config import Paths, load
from minibatch.core.job import JobState
from minibatch.net.client import Client
from minibatch.protocol.messages import QueryJobs

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "examples"


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _run(args: list[str], cwd: Path, check: bool = True) -> str:
    typer.secho("$ " + " ".join(shlex.quote(a) for a in args), bold=True)
    proc = subprocess.run(
        [_bin(args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True
    )
    out = (proc.stdout + proc.stderr).rstrip()
    if out:
        typer.echo(out)
    if check and proc.returncode != 0:
        raise SystemExit(f"mb demo: `{args[0]}` failed with status {proc.returncode}")
    return proc.stdout.strip()


def _wait_all(client: Client, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = client.call(QueryJobs()).jobs
        if not any(j.state is not JobState.FINISHED for j in jobs):
            return
        time.sleep(0.5)
    raise SystemExit(f"mb demo: the workload did not finish within {timeout:g} s")


def run_tour(keep: bool = False) -> None:
    paths = Paths.from_env()
    config = load(paths)
    cpus = usable_cpus()
    per_node = max(1, len(cpus) // 2)
    layout = plan_nodes(2, per_node, cpus, len(cpus) < 2, None)
    typer.secho(f"MB_HOME={paths.home}", bold=True)
    typer.secho(f"$ mb up --nodes 2 --cpus-per-node {per_node}", bold=True)
    report = lifecycle.up(paths, config, layout)
    typer.echo(f"cluster up: {', '.join(report.started) or 'already running'}")
    work = paths.home / "demo"
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("BURN_SECONDS", "4")
    try:
        typer.echo()
        for _ in range(3):
            _run(["qsub", "-v", "BURN_SECONDS=4", str(JOBS / "burn.sh")], work)
        _run(["qsub", str(JOBS / "array.sh")], work)
        failing = _run(["qsub", str(JOBS / "fail.sh")], work)
        _run(
            [
                "qsub",
                "-N",
                "cleanup",
                "-W",
                f"depend=afternotok:{failing}",
                "--",
                "/bin/echo",
                "cleaning up after a failure",
            ],
            work,
        )
        _run(
            [
                "qsub",
                "-N",
                "report",
                "-W",
                f"depend=afterok:{failing}",
                "--",
                "/bin/echo",
                "never printed",
            ],
            work,
        )
        _run(
            ["qsub", "-N", "overtime", "-l", "walltime=00:00:02", "--", "sleep", "60"],
            work,
        )
        _run(["qsub", str(JOBS / "memhog.py")], work)
        _run(
            ["qsub", "-l", f"ncpus={per_node + 1}", "--", "/bin/true"],
            work,
            check=False,
        )
        typer.echo()
        time.sleep(1.0)
        _run(["qstat", "-a"], work)
        typer.echo()
        _run(["pbsnodes", "-a"], work)
        with Client(report.server_endpoint, timeout=10) as client:
            _wait_all(client, timeout=120)
        typer.echo()
        _run(
            [
                "mb",
                "acct",
                "--format",
                "JobID,JobName,State,ExitCode,Elapsed,TotalCPU,MaxRSS,NodeList",
            ],
            work,
        )
        typer.echo()
        typer.secho(f"$ cat {work}/burn.o1", bold=True)
        typer.echo((work / "burn.o1").read_text().rstrip())
    finally:
        if not keep:
            typer.echo()
            typer.secho("$ mb down", bold=True)
            typer.echo("stopped " + ", ".join(lifecycle.down(paths)))
        else:
            typer.echo("\nthe cluster is still up (try qstat, pbsnodes -a, mb acct)")
            typer.echo("`mb down` stops it")
