"""``mb bench throughput``: how fast a live cluster takes, starts and finishes jobs.

It starts a fresh cluster in a temporary ``MB_HOME`` (one 1-CPU node per usable
core, the embedded broker publishing every event) and measures:

* ``submit_per_s``: sequential submissions through the API (one request, one
  committed reply each), of held jobs so nothing else competes;
* ``e2e_jobs_per_s``: 1,000 ``/bin/true`` jobs from first submission to last end,
  and ``e2e_cpu_ms_per_job``: what each daemon spent on a job meanwhile (CPU
  time, all threads), the budget a faster cycle must cut;
* ``latency_p50_ms`` / ``latency_p95_ms``: submission to process start, one job at a
  time on an idle cluster (start = the node daemon's spawn time);
* ``idle``: CPU % and RSS of each daemon over 5 s with nothing to do;
* ``qsub_wall_ms`` / ``array1000_wall_ms``: wall time of the ``qsub`` command itself,
  for one job and for a 1,000-task array;
* ``python_startup_ms``: wall time of ``python -c pass``, the yardstick for the
  command times (on a shared VM it swings by 1.5x within minutes).

Rates are medians over ``repeat`` runs. Wall-clock numbers on a shared machine are
noisy: compare medians and ratios, never single runs.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from minibatch.cluster import layout as layouts
from minibatch.cluster import lifecycle, probe
from minibatch.config import Config, Paths
from minibatch.core.job import JobRequest, JobSpec, JobState
from minibatch.net.client import Client
from minibatch.protocol.messages import (
    JobControl,
    JobList,
    QueryJobs,
    Status,
    Submit,
    Submitted,
)


def trivial_spec(workdir: str, hold: bool = False, name: str = "bench") -> JobSpec:
    """What ``qsub [-h] -- /bin/true`` sends."""
    return JobSpec(
        name=name,
        workdir=workdir,
        request=JobRequest(ppn=1, walltime=60),
        argv=["/bin/true"],
        stdout_path="/dev/null",
        stderr_path="/dev/null",
        hold=hold,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cancel(client: Client, ids: list[int]) -> None:
    for i in range(0, len(ids), 500):
        client.call(
            JobControl(action="cancel", selectors=[str(j) for j in ids[i : i + 500]])
        )


def submit_rate(client: Client, workdir: str, count: int) -> float:
    spec = trivial_spec(workdir, hold=True)
    ids: list[int] = []
    t0 = time.perf_counter()
    for _ in range(count):
        reply: Submitted = client.call(Submit(spec=spec))
        ids.extend(reply.ids)
    elapsed = time.perf_counter() - t0
    _cancel(client, ids)
    return count / elapsed


def _wait_finished(client: Client, ids: list[int], timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    selectors = [str(i) for i in ids]
    while True:
        jobs = client.call(QueryJobs(selectors=selectors)).jobs
        if all(j.state is JobState.FINISHED for j in jobs):
            return list(jobs)
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs not finished after {timeout} s")
        time.sleep(0.002 if len(ids) == 1 else 0.05)


def end_to_end_rate(client: Client, workdir: str, count: int) -> float:
    spec = trivial_spec(workdir)
    ids = set()
    for _ in range(count):
        ids.update(client.call(Submit(spec=spec)).ids)
    # Watch the cheap job counts, not the jobs: polling 1,000 job records would
    # load the server we are measuring.
    deadline = time.monotonic() + 600
    while client.call(Status()).jobs:
        if time.monotonic() > deadline:
            raise TimeoutError("jobs not finished after 600 s")
        time.sleep(0.05)
    done = client.call(QueryJobs(finished=True, active=False)).jobs
    jobs = [j for j in done if j.id in ids]
    first: float = min(j.submit_time for j in jobs)
    last: float = max(j.end_time for j in jobs)
    return count / (last - first)


def start_latencies(client: Client, workdir: str, count: int) -> list[float]:
    spec = trivial_spec(workdir)
    out = []
    for _ in range(count):
        (jid,) = client.call(Submit(spec=spec)).ids
        (job,) = _wait_finished(client, [jid], timeout=30)
        out.append((job.start_time - job.submit_time) * 1000)
    return out


def daemons(paths: Paths) -> dict[str, psutil.Process]:
    """The cluster's running daemons by name (``server``, ...), sorted.

    The broker is the process that does its work: ``mb-broker --mosquitto``
    only waits for its mosquitto child, whose CPU would otherwise go unseen.
    """
    procs = {}
    for name, pid in sorted(probe.running(paths).items()):
        proc = psutil.Process(pid)
        if name == "broker":
            proc = next(iter(proc.children()), proc)
        procs[name] = proc
    return procs


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}


def idle_usage(paths: Paths, seconds: float = 5.0) -> dict[str, dict[str, float]]:
    procs = daemons(paths)
    for proc in procs.values():
        proc.cpu_percent(None)
    time.sleep(seconds)
    return {
        name: {
            "cpu_pct": round(proc.cpu_percent(None), 2),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
        }
        for name, proc in procs.items()
    }


def command_wall_ms(args: list[str], env: dict[str, str], runs: int) -> float:
    """Median wall time of a command, after one untimed warm-up run."""
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


@contextlib.contextmanager
def fresh_cluster(
    layout: list[layouts.NodeLayout], config_text: str = ""
) -> Iterator[tuple[Paths, lifecycle.UpReport]]:
    """A new cluster of ``layout`` in a temporary ``MB_HOME`` (with
    ``config_text`` as its minibatch.toml), stopped and removed on leaving.

    ``MB_HOME`` names it meanwhile, so what this process starts finds it.
    """
    paths = Paths(Path(tempfile.mkdtemp(prefix="mb-bench-")))
    if config_text:
        paths.config.write_text(config_text)
    old_home = os.environ.get("MB_HOME")
    os.environ["MB_HOME"] = str(paths.home)
    try:
        yield paths, lifecycle.up(paths, Config(), layout)
    finally:
        lifecycle.down(paths)
        if old_home is None:
            os.environ.pop("MB_HOME", None)
        else:
            os.environ["MB_HOME"] = old_home
        if not probe.running(paths):
            shutil.rmtree(paths.home, ignore_errors=True)


def bench_layout(cgroups: bool) -> tuple[list[int], list[layouts.NodeLayout], str]:
    """The usable CPUs, a 1-CPU node on each, and the config text saying
    whether nodes put jobs in cgroups (when they can)."""
    cpus = layouts.usable_cpus()
    layout = layouts.plan_nodes(len(cpus), 1, cpus, False, None)
    return cpus, layout, "" if cgroups else "[node]\ncgroups = false\n"


def run(
    jobs: int = 1000,
    submits: int = 2000,
    repeat: int = 3,
    idle_s: float = 5.0,
    cgroups: bool = True,
) -> dict[str, Any]:
    """Every measure on a fresh cluster (``idle_s``: how long idle cost is
    sampled; ``cgroups``: whether nodes put jobs in cgroups when they can)."""
    cpus, layout, text = bench_layout(cgroups)
    with fresh_cluster(layout, text) as (paths, report):
        env = dict(os.environ, MB_HOME=str(paths.home))
        workdir = str(paths.home)
        with Client(report.server_endpoint, timeout=60) as client:
            result: dict[str, Any] = {"nodes": len(layout), "cpus": len(cpus)}
            result["submit_per_s"] = round(
                statistics.median(
                    submit_rate(client, workdir, submits) for _ in range(repeat)
                )
            )
            procs = daemons(paths)
            before = cpu_seconds(procs)
            result["e2e_jobs_per_s"] = round(
                statistics.median(
                    end_to_end_rate(client, workdir, jobs) for _ in range(repeat)
                ),
                1,
            )
            after = cpu_seconds(procs)
            result["e2e_cpu_ms_per_job"] = {
                name: round(1000 * (after[name] - before[name]) / (jobs * repeat), 3)
                for name in procs
            }
            lat = start_latencies(client, workdir, 100)
            result["latency_p50_ms"] = round(statistics.median(lat), 2)
            result["latency_p95_ms"] = round(percentile(lat, 0.95), 2)
            time.sleep(min(1.0, idle_s))
            result["idle"] = idle_usage(paths, idle_s)
            # As an installed package would be (make does this too): byte-compiled.
            compileall.compile_dir(Path(__file__).parents[1], quiet=2)
            bindir = Path(sys.executable).parent
            qsub = [str(bindir / "qsub"), "-h", "--", "/bin/true"]
            result["qsub_wall_ms"] = round(command_wall_ms(qsub, env, 10), 1)
            array = [str(bindir / "qsub"), "-h", "-t", "1-1000", "--", "/bin/true"]
            result["array1000_wall_ms"] = round(command_wall_ms(array, env, 3), 1)
            bare = [sys.executable, "-c", "pass"]
            result["python_startup_ms"] = round(command_wall_ms(bare, env, 10), 1)
            held: JobList = client.call(QueryJobs())
            _cancel(client, [j.id for j in held.jobs])
    return result


def render(result: dict[str, Any]) -> str:
    """The result as a short table for people."""
    lines = [
        f"cluster: {result['nodes']} nodes x 1 CPU",
        f"submissions through the API  {result['submit_per_s']:>10} /s",
        f"jobs end to end (/bin/true)  {result['e2e_jobs_per_s']:>10} /s",
        "  daemon CPU per job: "
        + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in result["e2e_cpu_ms_per_job"].items()
        ),
        f"submit-to-start latency p50  {result['latency_p50_ms']:>10} ms",
        f"submit-to-start latency p95  {result['latency_p95_ms']:>10} ms",
        f"qsub wall time               {result['qsub_wall_ms']:>10} ms",
        f"qsub -t 1-1000 wall time     {result['array1000_wall_ms']:>10} ms",
        f"python -c pass (yardstick)   {result['python_startup_ms']:>10} ms",
        "idle daemons:",
    ]
    for name, usage in result["idle"].items():
        lines.append(
            f"  {name:<12} {usage['cpu_pct']:>6} % CPU {usage['rss_mb']:>8} MB RSS"
        )
    return "\n".join(lines)
