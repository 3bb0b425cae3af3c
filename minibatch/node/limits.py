"""The limits the node enforces by sampling a job's processes, and its warning.

Walltime has its own timer (the tracker); these are checked at every sample:
the job's memory (``mem``), any one process's memory (``pmem``), the CPU time of
the whole job (``cput``, Torque's and PBS's limit, enforced like walltime), and
the ``--signal`` warning sent a set time before the time limit. ``vmem`` is the
kernel's (RLIMIT_AS, set when the job starts).
"""

from __future__ import annotations

from collections.abc import Sequence

from minibatch.core.job import JobResult
from minibatch.node.ownership import Run
from minibatch.node.procfs import Proc


def exceeded(run: Run, live: Sequence[Proc]) -> tuple[JobResult, str] | None:
    """The result and comment of a job past one of its limits, or None."""
    spec, opts = run.spec, run.spec.options
    rss = run.rss_now_kb
    if spec.mem_kb and rss > spec.mem_kb:
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
