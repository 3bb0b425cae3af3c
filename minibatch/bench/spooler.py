"""``mb bench throughput --vs-task-spooler``: minibatch and task-spooler side by side.

Debian's ``task-spooler`` (the ``tsp`` program) is the yardstick issue 12 names:
a queue server with slots and nothing else (no resource manager, no scheduler
process, no persistence, no events). Both run the same trivial jobs in the same
sitting, in turns, so the machine's drift falls on both alike:

* task-spooler gets as many slots as the cluster has CPUs (``tsp -S N``) and a
  socket and ``TMPDIR`` of its own, so it never meets the user's queue; each job
  is ``tsp -n /bin/true`` (no output kept, as minibatch's jobs write to
  ``/dev/null``), submitted one command after another as a shell loop would,
  and timed from just before the first submission to the end of the last job;
* minibatch runs :func:`minibatch.bench.throughput.end_to_end_rate` on a fresh
  cluster (one 1-CPU node per core), which times from the server's record of
  the first submission to the node's record of the last end.

The rates are medians over ``repeat`` rounds; the round's order alternates
(task-spooler first, then minibatch first) so neither always gets the warmer
minutes. ``ratio`` is minibatch's median over task-spooler's. ``floor`` is
what the kernel work of a job alone allows (:mod:`.floor`), measured after
the rounds: the highest ratio any implementation of the same guarantees
reaches.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from minibatch.bench import floor, throughput
from minibatch.errors import Unavailable
from minibatch.net.client import Client

#: Debian's name for it (upstream's ``ts`` clashes with moreutils' ``ts``).
PROGRAM = "tsp"
#: One ``tsp`` after another, as a user's loop submits them: from the shell,
#: whose fork costs a fraction of Python's (about 470 against 380 jobs/s).
SUBMIT_LOOP = """i=0
while [ "$i" -lt "$1" ]; do
  "$0" -n /bin/true >/dev/null || exit 1
  i=$((i + 1))
done"""
#: Seconds a whole run may take before the bench gives up.
RUN_TIMEOUT = 600.0


def executable() -> str:
    found = shutil.which(PROGRAM)
    if found is None:
        raise Unavailable(
            "task-spooler is not installed (Debian: apt-get install task-spooler)"
        )
    return found


@contextlib.contextmanager
def private_spooler(slots: int) -> Iterator[dict[str, str]]:
    """A task-spooler server with ``slots`` slots in a temporary directory;
    yields the environment its clients need, and kills the server on leaving."""
    program = executable()
    where = tempfile.mkdtemp(prefix="mb-bench-tsp-")
    env = dict(os.environ, TMPDIR=where, TS_SOCKET=os.path.join(where, "socket"))
    env.pop("TS_ONFINISH", None)  # a user's hook would run once per job
    try:
        # Any client starts the server; this one also gives it its slots.
        _tsp(program, env, "-S", str(slots))
        yield env
    finally:
        subprocess.run([program, "-K"], env=env, stdout=subprocess.DEVNULL, check=False)
        shutil.rmtree(where, ignore_errors=True)


def _tsp(program: str, env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [program, *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=RUN_TIMEOUT,
    )


def spooler_rate(env: dict[str, str], count: int, slots: int, first: int) -> float:
    """Jobs/s of ``count`` ``/bin/true`` jobs through task-spooler, whose
    server numbers them from ``first`` (it counts from 0 and never reuses a
    number; ``-n`` leaves the number unsaid)."""
    program = executable()
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", SUBMIT_LOOP, program, str(count)], env=env, check=True)
    # Jobs start in submission order, so the last ``slots`` are the last to
    # end; waiting for one already finished returns at once.
    for job in range(first + max(0, count - slots), first + count):
        _tsp(program, env, "-w", str(job))
    elapsed = time.perf_counter() - t0
    _tsp(program, env, "-C")  # forget the finished jobs before the next run
    return count / elapsed


def side_by_side(
    jobs: int = 500, repeat: int = 3, cgroups: bool = True
) -> dict[str, Any]:
    """Both on ``jobs`` trivial jobs, ``repeat`` rounds in alternating order."""
    executable()  # refuse before starting a cluster
    cpus, layout, text = throughput.bench_layout(cgroups)
    mb_rates: list[float] = []
    tsp_rates: list[float] = []
    with (
        throughput.fresh_cluster(layout, text) as (paths, report),
        Client(report.server_endpoint, timeout=60) as client,
        private_spooler(len(cpus)) as env,
    ):
        procs = throughput.daemons(paths)
        spent: list[dict[str, float]] = []

        def minibatch() -> None:
            before = throughput.cpu_seconds(procs)
            mb_rates.append(throughput.end_to_end_rate(client, str(paths.home), jobs))
            after = throughput.cpu_seconds(procs)
            spent.append({n: after[n] - before[n] for n in procs})

        def spooler() -> None:
            tsp_rates.append(spooler_rate(env, jobs, len(cpus), jobs * len(tsp_rates)))

        rounds: tuple[Callable[[], None], ...] = (spooler, minibatch)
        for i in range(repeat):
            for step in rounds if i % 2 == 0 else rounds[::-1]:
                step()
    mb = statistics.median(mb_rates)
    ts = statistics.median(tsp_rates)
    ceiling = floor.per_job(len(cpus), count=jobs, repeat=repeat, cgroups=cgroups)
    ceiling["ceiling_ratio"] = round(ceiling["ceiling_jobs_per_s"] / ts, 3)
    return {
        "cpus": len(cpus),
        "jobs": jobs,
        "repeat": repeat,
        "e2e_jobs_per_s": round(mb, 1),
        "tsp_jobs_per_s": round(ts, 1),
        "ratio": round(mb / ts, 3),
        "e2e_runs": [round(r, 1) for r in mb_rates],
        "tsp_runs": [round(r, 1) for r in tsp_rates],
        "e2e_cpu_ms_per_job": {
            name: round(1000 * sum(s[name] for s in spent) / (jobs * repeat), 3)
            for name in procs
        },
        "floor": ceiling,
    }


def render(result: dict[str, Any]) -> str:
    """The result as a short table for people."""
    runs = ", ".join
    low = result["floor"]
    return "\n".join(
        [
            f"{result['jobs']} /bin/true jobs on {result['cpus']} CPUs, "
            f"{result['repeat']} rounds in turns",
            f"minibatch      {result['e2e_jobs_per_s']:>8} jobs/s  "
            f"({runs(str(r) for r in result['e2e_runs'])})",
            f"task-spooler   {result['tsp_jobs_per_s']:>8} jobs/s  "
            f"({runs(str(r) for r in result['tsp_runs'])})",
            f"ratio          {result['ratio']:>8}",
            "  minibatch daemon CPU per job: "
            + ", ".join(
                f"{name} {ms:.2f} ms"
                for name, ms in result["e2e_cpu_ms_per_job"].items()
            ),
            f"floor          {low['ceiling_jobs_per_s']:>8} jobs/s  "
            f"(ratio {low['ceiling_ratio']}): the kernel work alone, the node's "
            f"{low['node_cpu_ms_per_job']:.2f} ms and the job's "
            f"{low['job_cpu_ms_per_job']:.2f} ms of CPU a job ({low['cgroups']})",
        ]
    )
