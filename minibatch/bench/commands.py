"""``mb bench commands``: the wall time of each command a user types in a loop.

It starts a fresh cluster in a temporary ``MB_HOME`` (one 1-CPU node per usable
core, as ``mb bench throughput``), queues ``jobs`` held jobs (1,000 by default),
runs a few to their end (for ``mb acct``) and keeps one running on each CPU,
then runs every command of :func:`commands` as a user would, a process of its
own from the console script, ``runs`` times (20 by default), with
``python -c pass`` (the yardstick) among them.

The commands are run in rounds, each round every command once, after an untimed
warm-up round: a shared machine's speed drifts by 1.5x within minutes, and
rounds spread the drift over every command alike, so the ratio of a command to
the yardstick means the same for each. Each command's CPU time is measured
too, which the machine's other work changes least. Each ``qdel`` deletes a held
job of its own; each ``qsub`` queues one more held job.
"""

from __future__ import annotations

import getpass
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minibatch.bench.load import queue_held
from minibatch.bench.throughput import fresh_cluster, trivial_spec
from minibatch.cluster import layout as layouts
from minibatch.core.job import JobRequest, JobSpec, JobState
from minibatch.errors import InvalidArgument
from minibatch.net.client import Client
from minibatch.protocol.messages import QueryJobs, Status, Submit

#: The issue's limits, in ms (median): every command, and ``mb status``.
LIMIT_MS = 60.0
LIMITS_MS = {"mb status": 80.0}
#: Jobs run to their end before the measure, so ``mb acct`` has some to list.
FINISHED = 10
YARDSTICK = "python -c pass"


def commands(bindir: Path, job: int, user: str) -> dict[str, list[str]]:
    """Each measured command line by its label; ``job`` is a held job's id.

    ``qdel`` has no id yet: each run appends one of its own.
    """

    def script(name: str, *args: str) -> list[str]:
        return [str(bindir / name), *args]

    return {
        "qstat": script("qstat"),
        "qstat -a": script("qstat", "-a"),
        "qstat -f ID": script("qstat", "-f", str(job)),
        "qstat -u USER": script("qstat", "-u", user),
        "qstat ID": script("qstat", str(job)),
        "qsub": script("qsub", "-h", "--", "/bin/true"),
        "qdel": script("qdel"),
        "showq": script("showq"),
        "pbsnodes -a": script("pbsnodes", "-a"),
        "checkjob ID": script("checkjob", str(job)),
        "mb status": script("mb", "status"),
        "mb acct": script("mb", "acct"),
        YARDSTICK: [sys.executable, "-c", "pass"],
    }


def _wait_until(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout} s")
        time.sleep(0.05)


def sleeper(workdir: str) -> JobSpec:
    """A job that holds one CPU for an hour."""
    return JobSpec(
        name="sleeper",
        workdir=workdir,
        request=JobRequest(ppn=1, walltime=3600),
        argv=["sleep", "3600"],
        stdout_path="/dev/null",
        stderr_path="/dev/null",
    )


def prepare(client: Client, endpoint: str, workdir: str, jobs: int, cpus: int) -> None:
    """A few finished jobs, ``jobs`` held ones and one running job per CPU."""
    done = trivial_spec(workdir, name="done")
    for _ in range(FINISHED):
        client.call(Submit(spec=done))
    _wait_until(lambda: not client.call(Status()).jobs, "jobs not finished")
    queue_held(endpoint, workdir, jobs)
    for _ in range(cpus):
        client.call(Submit(spec=sleeper(workdir)))

    def all_running() -> bool:
        listed = client.call(QueryJobs()).jobs
        return sum(j.state is JobState.RUNNING for j in listed) >= cpus

    _wait_until(all_running, "sleepers not running")


def _held_ids(client: Client) -> list[int]:
    return sorted(
        j.id for j in client.call(QueryJobs()).jobs if j.state is JobState.HELD
    )


def _byte_compile() -> None:
    """Bytecode for every module, as ``make`` leaves it: under
    PYTHONDONTWRITEBYTECODE a module edited since would be compiled again by
    every run, which measures the edit, not the command."""
    import compileall

    import minibatch

    compileall.compile_dir(Path(minibatch.__file__).parent, quiet=2)


def _children_cpu_ms() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (used.ru_utime + used.ru_stime) * 1000


def time_rounds(
    lines: dict[str, list[str]], env: dict[str, str], runs: int, victims: list[int]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall ms and CPU ms of each command per round; ``qdel`` takes its ids
    from ``victims``.

    The CPU time (user and system, of the command's process) is what the
    machine's other work changes least: on a busy machine the wall time is
    mostly waiting for a core, and it says what the command costs.
    """
    walls: dict[str, list[float]] = {label: [] for label in lines}
    cpus: dict[str, list[float]] = {label: [] for label in lines}
    for round_ in range(runs + 1):  # round 0 warms up and is not kept
        for label, argv in lines.items():
            if label == "qdel":
                argv = [*argv, str(victims.pop())]
            # The cluster's daemons are children too, but still running: only
            # the command, once waited for, adds to the children's usage.
            cpu0, t0 = _children_cpu_ms(), time.perf_counter()
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            elapsed = (time.perf_counter() - t0) * 1000
            if round_:
                walls[label].append(elapsed)
                cpus[label].append(_children_cpu_ms() - cpu0)
    return walls, cpus


def run(jobs: int = 1000, runs: int = 20) -> dict[str, Any]:
    """Every command's median, fastest and slowest run on a fresh cluster."""
    if jobs < runs + 2:
        raise InvalidArgument(f"{runs} runs of qdel need --jobs {runs + 2} or more")
    _byte_compile()
    cpus = layouts.usable_cpus()
    layout = layouts.plan_nodes(len(cpus), 1, cpus, False, None)
    with fresh_cluster(layout) as (paths, report):
        env = dict(os.environ, MB_HOME=str(paths.home))
        with Client(report.server_endpoint, timeout=60) as client:
            prepare(client, report.server_endpoint, str(paths.home), jobs, len(cpus))
            held = _held_ids(client)
            # The first held job is looked at; qdel takes the last ones.
            lines = commands(Path(sys.executable).parent, held[0], getpass.getuser())
            times, used = time_rounds(lines, env, runs, held[-(runs + 1) :])
    yardstick = statistics.median(times[YARDSTICK])
    measured = {
        label: {
            "median_ms": round(statistics.median(values), 1),
            "min_ms": round(min(values), 1),
            "max_ms": round(max(values), 1),
            "ratio": round(statistics.median(values) / yardstick, 2),
            "cpu_ms": round(statistics.median(used[label]), 1),
            "limit_ms": None if label == YARDSTICK else LIMITS_MS.get(label, LIMIT_MS),
        }
        for label, values in times.items()
    }
    return {
        "jobs": jobs,
        "runs": runs,
        "nodes": len(layout),
        "python_startup_ms": round(yardstick, 1),
        "commands": measured,
    }


def render(result: dict[str, Any]) -> str:
    """The result as a table for people."""
    lines = [
        f"{result['jobs']} held jobs, {result['nodes']} running; "
        f"median of {result['runs']} run{'s' if result['runs'] != 1 else ''} (ms)",
        f"{'command':<16} {'median':>7} {'range':>15} {'x yardstick':>12} "
        f"{'limit':>6} {'CPU':>6}",
    ]
    over = 0
    for label, m in result["commands"].items():
        span = f"{m['min_ms']:.1f}-{m['max_ms']:.1f}"
        limit = "" if m["limit_ms"] is None else f"{m['limit_ms']:.0f}"
        late = m["limit_ms"] is not None and m["median_ms"] > m["limit_ms"]
        over += late
        lines.append(
            f"{label:<16} {m['median_ms']:>7.1f} {span:>15} "
            f"{m['ratio']:>12.2f} {limit:>6} {m['cpu_ms']:>6.1f}"
            + ("  over the limit" if late else "")
        )
    lines.append(
        f"{over} of the commands over their limit" if over else "all within limits"
    )
    return "\n".join(lines)
