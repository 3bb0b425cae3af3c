"""The kernel work a node does for each job, alone: the floor of a job's cost.

What a node daemon asks of the kernel for a ``/bin/true`` job, with the node's
own code where it is one call (:class:`~minibatch.node.cgroup.Cgroups`,
:mod:`~minibatch.node.records`), in a loop with nothing else: the job's record
written before the spawn and its pid appended after, its ``$TMPDIR``, its
cgroups created and limited, the spawning thread moved into them and back
around a ``posix_spawn`` in a new session, the accounting read at the end, and
everything removed. No message, no SQLite, no event, no policy: no
implementation of the same guarantees, in any language, spends less CPU per
job on this machine. It is a lower bound (the real launch also writes the
node file and opens the job's output files).

``ceiling_jobs_per_s`` is what the CPUs could finish if they did nothing but
this and the jobs themselves: the end-to-end rate cannot pass it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import tempfile
from pathlib import Path
from typing import Any

from minibatch.node import cgroup, records
from minibatch.node.cgroup import Cgroups
from minibatch.node.records import RunRecord
from minibatch.protocol.messages import LaunchSpec


def _spec(job: int, cpu: int) -> LaunchSpec:
    return LaunchSpec(
        job=job,
        display_id=str(job),
        name="floor",
        user="bench",
        uid=os.geteuid(),
        gid=os.getegid(),
        workdir="/",
        script="",
        argv=["/bin/true"],
        env={},
        stdout_path="/dev/null",
        stderr_path="/dev/null",
        join=True,
        cpus=[cpu],
        hosts=["floor"],
        walltime=60,
        mem_kb=None,
    )


def _cpu_seconds() -> tuple[float, float]:
    """CPU time of this process and of its waited-for children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _round(spool: Path, cgroups: Cgroups, count: int, cpu: int) -> tuple[float, float]:
    """CPU ms per job: the node's side, the job's own."""
    self0, kids0 = _cpu_seconds()
    for job in range(1, count + 1):
        spec = _spec(job, cpu)
        records.begin(spool, RunRecord(node="floor", spec=spec, pid=0, start=0.0))
        tmpdir = spool / f"{job}.tmp"
        tmpdir.mkdir()
        cg = cgroups.create(job, [cpu], None) if cgroups.enabled else None
        with cgroups.inside(cg) if cg is not None else contextlib.nullcontext():
            pid = os.posix_spawn("/bin/true", ["/bin/true"], {}, setsid=True)
        try:
            records.started(spool, job, pid)
        finally:
            os.waitpid(pid, 0)
        if cg is not None:
            cg.procs()
            cg.cpu_seconds()
            cg.peak_kb()
            cg.shmem_bytes()
            cg.oom_kills()
            cg.remove()
        records.path(spool, job).unlink()
        tmpdir.rmdir()
    self1, kids1 = _cpu_seconds()
    return 1000 * (self1 - self0) / count, 1000 * (kids1 - kids0) / count


def per_job(
    cpus: int, count: int = 500, repeat: int = 3, cgroups: bool = True
) -> dict[str, Any]:
    """Median over ``repeat`` rounds of ``count`` jobs; the ceiling on ``cpus`` CPUs."""
    cpu = min(os.sched_getaffinity(0))
    node: list[float] = []
    job: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mb-bench-floor-") as where:
        groups = Cgroups(f"floor{os.getpid()}", where, wanted=cgroups)
        try:
            for _ in range(repeat):
                n, j = _round(Path(where), groups, count, cpu)
                node.append(n)
                job.append(j)
        finally:
            groups.close()
            cgroup.remove_empty(where)  # a round that failed half-way leaves some
    node_ms, job_ms = statistics.median(node), statistics.median(job)
    return {
        "cgroups": groups.describe(),
        "node_cpu_ms_per_job": round(node_ms, 3),
        "job_cpu_ms_per_job": round(job_ms, 3),
        "ceiling_jobs_per_s": round(cpus * 1000 / (node_ms + job_ms), 1),
    }
