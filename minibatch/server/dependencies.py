"""Dependencies between jobs (``-W depend=``, ``--dependency``): what a job's
dependencies say now, and what becomes of a job when one of them ends.

An outcome per dependency: None while its job is still known to the server
(queued or running), else whether its end satisfies the dependency
(:func:`~minibatch.core.job.dependency_outcome`). A job waits while any is
None, is queued once all are True, and is cancelled once one is False: it can
never run (Torque and Slurm cancel such a job too; Slurm with
``kill_invalid_depend``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from minibatch.core.job import Dependency, Job, JobResult, JobState, dependency_outcome
from minibatch.errors import NotFound

if TYPE_CHECKING:
    from minibatch.server.state import ServerState


def outcomes(state: ServerState, depends: Iterable[Dependency]) -> list[bool | None]:
    """Each dependency's outcome; NotFound names a job the server never had."""
    out: list[bool | None] = []
    for dep in depends:
        if dep.job in state.jobs:
            out.append(None)
            continue
        done = state.store.is_finished(dep.job)
        if done is None:
            raise NotFound(f"dependency on unknown job {dep.job}")
        out.append(dependency_outcome(dep, done.result))
    return out


def update(state: ServerState, job: Job) -> None:
    """One of ``job``'s dependencies ended, or its start time came: queue it,
    cancel it, or keep it waiting with a fresh reason."""
    now = outcomes(state, job.depends)
    if False in now:
        cancel_unsatisfiable(state, job)
        return
    due = (job.options.begin or 0.0) <= state.clock()
    if all(o is True for o in now) and job.state is JobState.WAITING and due:
        state._move(job, JobState.QUEUED)
        state.store.put_job(job)
        state.record(job, "eligible", "dependencies satisfied")
    state._set_pending_reason(job)


def cancel_unsatisfiable(state: ServerState, job: Job) -> None:
    """End ``job``: a dependency of it can never be satisfied (it names which)."""
    failed = [
        f"{d.kind}:{d.job}"
        for d, outcome in zip(job.depends, outcomes(state, job.depends), strict=True)
        if outcome is False
    ]
    state._finish(
        job,
        JobResult.CANCELLED,
        comment=f"dependency can never be satisfied ({', '.join(failed)})",
    )
