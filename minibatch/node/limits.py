"""The limits the node enforces by sampling a job's processes, and its warning.

Walltime has its own timer (the tracker); these are checked at every sample:
the job's memory (``mem``), any one process's memory (``pmem``), the CPU time of
the whole job (``cput``, Torque's and PBS's limit, enforced like walltime), and
the ``--signal`` warning sent a set time before the time limit. ``vmem`` is the
kernel's (RLIMIT_AS, set when the job starts). A job the system ends finds why
at the end of its error file, as Torque and Slurm write it (:func:`kill_line`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from minibatch.core.job import JobResult
from minibatch.node.identity import LaunchError, effective_identity, resolve_identity
from minibatch.node.launcher import Launcher
from minibatch.node.ownership import Run
from minibatch.node.procfs import Proc


def exceeded(
    run: Run, live: Sequence[Proc], kernel_memory: bool = False
) -> tuple[JobResult, str] | None:
    """The result and comment of a job past one of its limits, or None
    (``kernel_memory``: its cgroup enforces ``mem``, sampling need not)."""
    spec, opts = run.spec, run.spec.options
    rss = run.rss_now_kb
    if spec.mem_kb and rss > spec.mem_kb and not kernel_memory:
        return (
            JobResult.OUT_OF_MEMORY,
            f"memory limit of {spec.mem_kb} kb exceeded ({rss} kb used)",
        )
    if opts.pmem_kb:
        big = max(live, key=lambda p: p.rss_kb, default=None)
        if big is not None and big.rss_kb > opts.pmem_kb:
            return (
                JobResult.OUT_OF_MEMORY,
                f"pmem limit of {opts.pmem_kb} kb exceeded by pid {big.pid} "
                f"({big.rss_kb} kb)",
            )
    if opts.cput and run.cpu_now_s > opts.cput:
        return (
            JobResult.TIMEOUT,
            f"cput limit of {opts.cput} s exceeded ({run.cpu_now_s:.0f} s used)",
        )
    return None


def warning_due(run: Run, now: float) -> bool:
    """Whether the ``--signal`` warning is due (once, ``warn_seconds`` before
    the job's time limit, or at once when the limit is shorter than that)."""
    opts = run.spec.options
    if not opts.warn_signal or run.warned or run.limit <= 0:
        return False
    return now >= run.start + run.limit - opts.warn_seconds


def kill_line(run: Run, node: str, now: float) -> str:
    """What the job's own error file says when the system ends it, in the words
    of the tool it came from (Slurm's slurmstepd, Torque's mom); "" for nothing
    (a node going down, and a qdel, which Torque does not write about)."""
    spec, result = run.spec, run.kill_reason
    if result is JobResult.NODE_FAIL or result is None:
        return ""
    if not spec.options.slurm:
        if result is JobResult.CANCELLED:
            return ""
        return f"=>> PBS: job killed: {run.comment or result.value}\n"
    if result is JobResult.OUT_OF_MEMORY:
        return (
            f"slurmstepd: error: Detected 1 oom_kill event in StepId={spec.job}.batch. "
            "Some of the step tasks have been OOM Killed.\n"
        )
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
    due = " DUE TO TIME LIMIT" if result is JobResult.TIMEOUT else ""
    return (
        f"slurmstepd: error: *** JOB {spec.job} ON {node} CANCELLED AT {at}{due} ***\n"
    )


def tell_job(run: Run, launcher: Launcher, line: str) -> None:
    """Append ``line`` to the job's error file (its output file when joined),
    as its user; best effort: a job may have removed its file."""
    spec = run.spec
    path = spec.stdout_path if spec.join else spec.stderr_path
    path = os.path.join(spec.workdir, path.replace("%N", launcher.node))
    try:
        ident = resolve_identity(spec, os.geteuid())
        with effective_identity(ident):
            # Never waiting: a job may have put a FIFO where its file was.
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(path, flags | os.O_CLOEXEC)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except (OSError, LaunchError):
        pass
