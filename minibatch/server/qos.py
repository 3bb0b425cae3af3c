"""Quality of service: named classes of jobs with a priority and limits.

QOS come from ``[[qos]]`` in ``minibatch.toml``; ``default_qos`` is given to jobs
submitted without ``-l qos=``. At submission a job's QOS must exist and its
walltime must not exceed the QOS's ``max_walltime`` (a refused job leaves no
trace). ``max_jobs_per_user`` is Maui's MAXJOB throttle: while a user runs that
many jobs of a QOS, their other jobs of that QOS are *blocked* (left out of the
scheduler's snapshot, shown in ``showq``'s blocked section) and the server refuses
any start beyond the limit. The QOS priority reaches the priority policies
through ``snap.qos``.
"""

from __future__ import annotations

from minibatch.config import Config
from minibatch.core.job import Job
from minibatch.core.snapshot import QosView
from minibatch.core.units import format_duration
from minibatch.errors import InvalidArgument


class QosTable:
    def __init__(self, config: Config) -> None:
        self.views: dict[str, QosView] = {
            q.name: QosView(
                name=q.name,
                priority=q.priority,
                max_walltime=q.walltime_limit(),
                max_jobs_per_user=q.max_jobs_per_user,
            )
            for q in config.qos
        }
        self.default = config.default_qos
        #: (user, qos) -> running jobs, only for QOS with a per-user limit.
        self._running: dict[tuple[str, str], int] = {}
        #: (user, qos) pairs at their limit right now.
        self._full: set[tuple[str, str]] = set()

    def resolve(
        self, name: str, notes: list[str] | None = None, strict: bool = True
    ) -> str:
        """The QOS a submission gets: ``name``, or the default. An unknown one
        is an error under ``strict``; otherwise the default, with a note (a
        script from another cluster asks for its ``--qos=normal``)."""
        if not name:
            return self.default
        if name not in self.views:
            known = ", ".join(sorted(self.views)) or "none are configured"
            if strict or notes is None:
                raise InvalidArgument(f"unknown QOS {name!r} (defined: {known})")
            default = repr(self.default) if self.default else "none"
            notes.append(
                f"QOS {name} does not exist here (defined: {known}); "
                f"the job gets {default}"
            )
            return self.default
        return name

    def check_walltime(self, qos: str, walltime: int) -> None:
        view = self.views.get(qos)
        if view is None or view.max_walltime is None:
            return
        if walltime > view.max_walltime:
            raise InvalidArgument(
                f"walltime {format_duration(walltime)} exceeds the maximum of QOS "
                f"{qos!r} ({format_duration(view.max_walltime)})"
            )

    def _limit(self, qos: str) -> int | None:
        view = self.views.get(qos)
        return None if view is None else view.max_jobs_per_user

    def started(self, job: Job) -> None:
        limit = self._limit(job.qos)
        if limit is None:
            return
        key = (job.user, job.qos)
        count = self._running[key] = self._running.get(key, 0) + 1
        if count >= limit:
            self._full.add(key)

    def ended(self, job: Job) -> bool:
        """Count the job's end; True when it lifted a block (its user's queued
        jobs of that QOS may start again)."""
        limit = self._limit(job.qos)
        key = (job.user, job.qos)
        if limit is None or key not in self._running:
            return False
        count = self._running[key] - 1
        if count > 0:
            self._running[key] = count
        else:
            del self._running[key]
        if count < limit and key in self._full:
            self._full.discard(key)
            return True
        return False

    @property
    def any_blocked(self) -> bool:
        return bool(self._full)

    def blocks(self, user: str, qos: str) -> bool:
        """Whether ``user`` may not start another job of ``qos`` now."""
        return (user, qos) in self._full

    def reason(self, user: str, qos: str) -> str:
        """Why such a job is blocked (empty when it is not)."""
        if (user, qos) not in self._full:
            return ""
        limit = self._limit(qos)
        jobs = "job" if limit == 1 else "jobs"
        return (
            f"blocked by QOS {qos!r}: {limit} running {jobs} per user "
            f"and {user} has {self._running[(user, qos)]}"
        )
