"""What the policies learn from the past: fairshare usage and PSP accuracy.

Both are computed by :mod:`minibatch.core.usage` (the simulator uses the same
functions) from accounting records; this module feeds it and caches the result.

* **Fairshare** (Maui FSINTERVAL/FSDEPTH/FSDECAY/FSPOLICY, ``[fairshare]`` in the
  config): what finished jobs used is summed per user, group, account and window
  as they end (:class:`~minibatch.core.usage.FinishedUsage`; at start-up from
  the accounting of the ``depth`` windows); the :class:`FairshareView` is
  recomputed from those sums and the running jobs when a job has ended (at most
  once a second) and every ``refresh`` seconds while jobs run, never on every
  snapshot. A recomputation costs the entities and running jobs, not the jobs
  of the last days.
* **PSP accuracy**: each user's last 10 finished jobs' run time / requested time,
  updated as each job ends (loaded from accounting at start-up).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import msgspec

from minibatch.config import FairshareConfig
from minibatch.core import usage
from minibatch.core.job import Job
from minibatch.core.snapshot import FairshareView
from minibatch.server.store import Store

#: Seconds between recomputations caused by job ends (a burst costs one).
MIN_GAP = 1.0

#: (total CPUs, total memory in KB or None) of the cluster, for DEDICATEDPES.
Totals = Callable[[], tuple[int, int | None]]


class UsageHistory:
    def __init__(
        self, store: Store, config: FairshareConfig, now: float, totals: Totals
    ) -> None:
        self.config = config.usage_config()
        self.refresh = config.refresh
        self._totals = totals
        self._finished = usage.FinishedUsage(self.config)
        self._view = FairshareView()
        self._computed = -math.inf
        self._dirty = True
        self._accuracy = usage.AccuracyLedger()
        if self.config.enabled:
            for job in store.finished_jobs(since=self._oldest(now)):
                self._keep(job)
        for job in store.latest_per_user(usage.HISTORY):
            self._learn(job)

    def _oldest(self, now: float) -> float:
        """The start of the oldest window still counted."""
        cfg = self.config
        return (math.floor(now / cfg.interval) - cfg.depth + 1) * cfg.interval

    def _record(self, job: Job) -> usage.UsageRecord | None:
        policy = self.config.policy
        record = usage.record_from_job(job, policy)
        if record is None or policy is not usage.FsPolicy.DEDICATEDPES:
            return record
        total_cpus, total_mem = self._totals()
        rate = usage.processor_equivalent(
            int(record.rate), job.request.mem_kb, total_cpus, total_mem
        )
        return msgspec.structs.replace(record, rate=rate)

    def _keep(self, job: Job) -> None:
        record = self._record(job)
        if record is not None:
            self._finished.add(record)

    def _learn(self, job: Job) -> None:
        if job.start_time is not None and job.end_time is not None:
            run = job.end_time - job.start_time
            self._accuracy.record(job.user, run, float(job.request.walltime))

    def job_ended(self, job: Job) -> None:
        """Account a job that has just finished."""
        self._learn(job)
        if self.config.enabled and job.start_time is not None:
            self._keep(job)
            self._dirty = True

    def accuracy(self) -> dict[str, tuple[float, ...]]:
        """User -> latest accuracies, oldest first (shared, read-only)."""
        return self._accuracy.view()

    def fairshare(self, now: float, running: Iterable[Job]) -> FairshareView:
        """The decayed usage at ``now`` (cached; see the module docstring)."""
        if not self.config.enabled:
            return self._view
        age = now - self._computed
        if not (self._dirty and age >= MIN_GAP) and age < self.refresh:
            return self._view
        records = (self._record(job) for job in running)
        self._view = self._finished.view(now, (r for r in records if r is not None))
        self._computed, self._dirty = now, False
        return self._view
