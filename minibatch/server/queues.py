"""Queues (PBS queues, Maui classes, Slurm partitions): where a job goes, what it
may ask for there, and how queues rank.

A job naming a queue that does not exist goes to the default queue with a note,
as people bring scripts written for another cluster (``-q short``, ``-p gpu``);
``strict = true`` in the config refuses it instead. A closed queue (``enabled =
false``) or one the user may not use is always a refusal: the operator said no.
"""

from __future__ import annotations

from minibatch.config import Config, QueueConfig
from minibatch.core.job import JobSpec
from minibatch.errors import InvalidArgument, PermissionDenied


class QueueTable:
    def __init__(self, config: Config) -> None:
        queues = config.queue or [QueueConfig(name=config.default_queue)]
        self.by_name = {q.name: q for q in queues}
        self.default = config.default_queue
        self.strict = config.strict

    def priority(self, name: str) -> float:
        q = self.by_name.get(name)
        return q.priority if q is not None else 0.0

    def started(self, name: str) -> bool:
        q = self.by_name.get(name)
        return q is None or q.started

    @property
    def any_stopped(self) -> bool:
        return any(not q.started for q in self.by_name.values())

    def resolve(self, spec: JobSpec, user: str, notes: list[str]) -> QueueConfig:
        """The queue ``spec`` goes to (the first known of a Slurm list).

        Raises:
            InvalidArgument: an unknown queue under ``strict``, a closed queue.
            PermissionDenied: a queue ``user`` may not submit to.
        """
        asked = [q for q in spec.queue.split(",") if q]
        known = [q for q in asked if q in self.by_name]
        if asked and not known:
            names = ", ".join(self.by_name)
            if self.strict:
                where = f"{spec.queue_source}: " if spec.queue_source else ""
                raise InvalidArgument(
                    f"{where}unknown queue {spec.queue!r} (queues here: {names})"
                )
            notes.append(
                f"queue {spec.queue} does not exist here (queues: {names}); "
                f"the job goes to {self.default}"
            )
        queue = self.by_name[known[0] if known else self.default]
        where = f"{spec.queue_source}: " if spec.queue_source else ""
        if not queue.enabled:
            raise InvalidArgument(f"{where}queue {queue.name!r} is closed to new jobs")
        if queue.users and user not in queue.users and user != "root":
            raise PermissionDenied(
                f"{where}{user} may not submit to queue {queue.name!r}"
            )
        return queue

    @staticmethod
    def walltime(queue: QueueConfig, spec: JobSpec) -> int:
        """The job's walltime: its own, or the queue's default; within the limit."""
        walltime = spec.request.walltime
        default = queue.seconds(queue.default_walltime)
        limit = queue.seconds(queue.max_walltime)
        if not spec.walltime_given:
            # The queue's default, else no more than its limit (Slurm's
            # DefaultTime, else MaxTime).
            if default is not None:
                walltime = default
            elif limit is not None:
                walltime = min(walltime, limit)
        check_limits(queue, walltime, spec.request.cpus)
        return walltime


def check_limits(queue: QueueConfig, walltime: int, cpus: int, whose: str = "") -> None:
    """Refuse a job over ``queue``'s limits; ``whose`` names it ("job 7's ")."""
    limit = queue.seconds(queue.max_walltime)
    if limit is not None and walltime > limit:
        raise InvalidArgument(
            f"{whose}walltime {walltime} s exceeds queue {queue.name!r}'s limit "
            f"of {limit} s"
        )
    if queue.max_cpus is not None and cpus > queue.max_cpus:
        raise InvalidArgument(
            f"{whose}{cpus} CPUs exceed queue {queue.name!r}'s limit of "
            f"{queue.max_cpus}"
        )
