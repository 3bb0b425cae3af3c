"""``mb bench load --curve 1000,10000,100000``: how a deep queue slows the system.

For each depth N, on a fresh cluster (one 1-CPU node per usable core):

1. one ``sleep`` job per CPU, so that nothing else can start, then N eligible
   jobs (``qsub -- /bin/true``: queued, not held) through the API;
2. the commands as a user runs them (a new process each, output to
   ``/dev/null``): ``qstat``, ``qstat -u USER`` for a user with no job among
   the N (the server must still find that out), ``qstat ID`` of the middle
   job, with ``python -c pass`` in every round as the yardstick (see
   :mod:`minibatch.bench.commands`); medians of ``runs`` rounds, of the
   wall time and of the command's own CPU time;
3. the drain rate: the sleepers are deleted and the queue's jobs run; the rate
   is over the first :func:`drained` jobs to end (the jobs that ended by the
   time that many ids have), while the queue is still deep (all N would take
   minutes at 100,000).

``ratio`` of a depth is its drain rate over the first depth's: the issue asks
for at least 0.8 at 100,000 against 1,000.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from minibatch.bench.commands import YARDSTICK, sleeper, time_rounds
from minibatch.bench.load import TIMEOUT, queue_held
from minibatch.bench.throughput import fresh_cluster
from minibatch.cluster import layout as layouts
from minibatch.core.job import JobState
from minibatch.errors import InvalidArgument
from minibatch.net.client import Client
from minibatch.protocol.messages import JobControl, QueryJobs, Status, Submit

#: A user who owns none of the queue's jobs, for ``qstat -u``.
OTHER_USER = "nobody"


def drained(depth: int) -> int:
    """Jobs whose ends time the drain: enough for a steady rate, few enough
    that the queue stays deep (half of it at most)."""
    return max(1, min(depth // 2, 2000))


def _sleepers(client: Client, workdir: str, cpus: int) -> list[int]:
    ids = [client.call(Submit(spec=sleeper(workdir))).ids[0] for _ in range(cpus)]
    deadline = time.monotonic() + TIMEOUT
    selectors = [str(i) for i in ids]
    while time.monotonic() < deadline:
        jobs = client.call(QueryJobs(selectors=selectors)).jobs
        if all(j.state is JobState.RUNNING for j in jobs):
            return ids
        time.sleep(0.05)
    raise TimeoutError("the sleepers did not start")


def _drain_rate(client: Client, sleepers: list[int], depth: int) -> float:
    """Jobs per second from deleting the sleepers to the end of the
    ``drained(depth)``-th queued job. Polled by that job's id: counting every
    job (``Status``) would cost the server a scan of the queue each time."""
    target = sleepers[-1] + drained(depth)
    t0 = time.perf_counter()
    client.call(JobControl(action="cancel", selectors=[str(i) for i in sleepers]))
    deadline = time.monotonic() + max(TIMEOUT, drained(depth) / 5)
    while time.monotonic() < deadline:
        (job,) = client.call(QueryJobs(selectors=[str(target)])).jobs
        if job.state is JobState.FINISHED:
            elapsed = time.perf_counter() - t0
            left: int = sum(client.call(Status()).jobs.values())
            return (depth - left) / elapsed
        time.sleep(0.01)
    raise TimeoutError(f"job {target} did not end")


def one_depth(depth: int, runs: int) -> dict[str, Any]:
    cpus = layouts.usable_cpus()
    layout = layouts.plan_nodes(len(cpus), 1, cpus, False, None)
    with fresh_cluster(layout) as (paths, report):
        endpoint, workdir = report.server_endpoint, str(paths.home)
        with Client(endpoint, timeout=TIMEOUT) as client:
            sleepers = _sleepers(client, workdir, len(layout))
            t0 = time.perf_counter()
            queue_held(endpoint, workdir, depth, hold=False)
            queued_s = time.perf_counter() - t0
            middle = sleepers[-1] + depth // 2
            bindir = Path(sys.executable).parent
            lines = {
                "qstat": [str(bindir / "qstat")],
                "qstat -u USER": [str(bindir / "qstat"), "-u", OTHER_USER],
                "qstat ID": [str(bindir / "qstat"), str(middle)],
                YARDSTICK: [sys.executable, "-c", "pass"],
            }
            env = dict(os.environ, MB_HOME=str(paths.home))
            times, cpu = time_rounds(lines, env, runs, [])
            rate = _drain_rate(client, sleepers, depth)
    return {
        "depth": depth,
        "queue_s": round(queued_s, 2),
        "ms": {k: round(statistics.median(v), 1) for k, v in times.items()},
        "range_ms": {k: [round(min(v), 1), round(max(v), 1)] for k, v in times.items()},
        "cpu_ms": {k: round(statistics.median(v), 1) for k, v in cpu.items()},
        "drained": drained(depth),
        "drain_per_s": round(rate, 1),
    }


def parse_depths(text: str) -> list[int]:
    """``--curve``'s queue depths: positive integers separated by commas."""
    words = [w.strip() for w in text.split(",")]
    if not all(w.isdigit() and int(w) > 0 for w in words):
        raise InvalidArgument(
            f"--curve: expected queue depths as positive integers separated "
            f"by commas (1000,10000,100000), got {text!r}"
        )
    return [int(w) for w in words]


def run(depths: list[int], runs: int = 5) -> dict[str, Any]:
    """Every depth in turn, each on its own fresh cluster."""
    points = [one_depth(d, runs) for d in depths]
    first = points[0]["drain_per_s"]
    for p in points:
        p["drain_ratio"] = round(p["drain_per_s"] / first, 2) if first else 0.0
    return {"runs": runs, "curve": points}


def render(result: dict[str, Any]) -> str:
    labels = ("qstat", "qstat -u USER", "qstat ID", YARDSTICK)
    head = f"{'queued':>8} {'drain/s':>8} {'ratio':>6}" + "".join(
        f" {label:>15}" for label in labels
    )
    runs = result["runs"]
    title = (
        f"median{'s' if runs != 1 else ''} of {runs} run{'s' if runs != 1 else ''}:"
        " wall ms (the command's CPU ms); ratio: drain rate over the first depth's"
    )
    lines = [title, head]
    for p in result["curve"]:
        wall, cpu = p["ms"], p["cpu_ms"]
        cells = "".join(
            " " + f"{wall[label]} ({cpu[label]})".rjust(15) for label in labels
        )
        lines.append(
            f"{p['depth']:>8} {p['drain_per_s']:>8} {p['drain_ratio']:>6}{cells}"
        )
    return "\n".join(lines)
