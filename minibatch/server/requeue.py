"""Queueing a job again under the same id: ``qrerun``, and a node that stops.

``qrerun`` kills a running job and queues it again.
Two steps, because killing takes the node its grace period: :func:`request`
marks the job (``rerun_pending``, stored, so a server restart in between still
requeues it), moves it to exiting and sends the node a ``Kill``; when the
node's end report comes, :func:`back_to_queue` (called by
``ServerState.job_ended`` instead of finishing the job) frees what the run held
and puts the job back in the queue, ``reruns`` counting the runs it lost.

A node daemon that stops (``mb down``) first says so in a heartbeat (the
server then starts nothing more there), then ends its jobs with ``requeue``
set in their end reports: :func:`stopped_node` queues them again, unless one
that had started may not be rerun (``qsub -r n``).

The killed run leaves no accounting record (the job has not ended); its end is
in the job's event log (``tracejob``). It is not charged to fairshare either,
and teaches PSP nothing: it was stopped, not finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibatch.core.job import Job, JobResult, JobState
from minibatch.errors import InvalidArgument
from minibatch.protocol.messages import JobEnded, Kill
from minibatch.server import malleable

if TYPE_CHECKING:
    from minibatch.server.state import ServerState


def check(job: Job) -> None:
    """Raise unless ``job`` may be rerun now (nothing changes)."""
    if job.state is not JobState.RUNNING:
        raise InvalidArgument(
            f"job {job.display_id} is {job.state}; only running jobs can be rerun"
        )
    if not job.options.rerunnable:
        raise InvalidArgument(
            f"job {job.display_id} is not rerunnable (submitted with -r n)"
        )


def request(state: ServerState, job: Job, by: str) -> None:
    """Kill the running ``job``; its end report will requeue it."""
    check(job)
    # The private move keeps the queue and active set in step (see state.py).
    state._move(job, JobState.EXITING)
    job.rerun_pending = True
    job.comment = f"rerun by {by}"
    state.store.put_job(job)
    state.record(job, "exiting", job.comment)
    node = job.alloc[0].node
    state.outbox.append(
        (state.route(node), Kill(job=job.id, result=JobResult.CANCELLED))
    )


def back_to_queue(
    state: ServerState,
    job: Job,
    result: JobResult,
    exit_status: int | None,
    comment: str = "",
) -> None:
    """The killed run ended: release what it held and queue the job again."""
    if state.qos.ended(job):
        state.queue.unblocked()
    state.nodes.release(job.id, job.alloc)
    if job.borrowed:
        malleable.give_back(state, job)
    ended = f"run {job.reruns + 1} ended {result.value}"
    if exit_status is not None:
        ended += f", exit status {exit_status}"
    if comment:
        ended += f": {comment}"
    job.reruns += 1
    job.rerun_pending = False
    job.alloc, job.borrowed = [], {}
    job.start_time = job.end_time = job.session_id = None
    job.cputime_s = job.maxrss_kb = None
    job.used_cputime_s = job.used_rss_kb = None
    job.exit_status = job.signal = job.result = None
    job.resizes, job.resizing, job.time_limit = [], [], 0.0
    job.reason, job.predicted_start = "waiting for the scheduler", None
    state._move(job, JobState.QUEUED)
    state.freed = True
    state.store.put_job(job)
    state.record(job, "requeued", ended)
    state.changed()


def lost(state: ServerState, job: Job, comment: str) -> None:
    """The job's node lost it (its daemon restarted and its processes are gone,
    or its daemon stopped listing it): queued again when it never started or may
    be rerun, else it ends ``node_fail``."""
    if _deleted(job):
        state.job_ended(job, JobResult.CANCELLED, comment=f"{job.comment}; {comment}")
    elif job.session_id is None or job.options.rerunnable:
        back_to_queue(state, job, JobResult.NODE_FAIL, None, comment)
    else:
        state.job_ended(job, JobResult.NODE_FAIL, comment=comment)


def _deleted(job: Job) -> bool:
    """Whether a qdel was ending ``job`` (exiting, and not to run again):
    its node stopping or losing it does not queue it again."""
    return job.state is JobState.EXITING and not job.rerun_pending


def end_as_reported(
    state: ServerState,
    job: Job,
    ended: JobEnded,
    result: JobResult | None = None,
    comment: str | None = None,
) -> None:
    """End ``job`` as its node reported, with another result or comment when
    the server knows better. A job the server was ending (``qdel``) keeps why,
    with what its node adds ("cancelled by qdel; 2 leftover process(es)
    killed")."""
    if comment is None and job.state is JobState.EXITING and job.comment:
        comment = "; ".join(c for c in (job.comment, ended.comment) if c)
    state.job_ended(
        job,
        ended.result if result is None else result,
        exit_status=ended.exit_status,
        signal=ended.signal,
        end_time=ended.end_time,
        cputime_s=ended.cputime_s,
        maxrss_kb=ended.maxrss_kb,
        comment=ended.comment if comment is None else comment,
    )


def stopped_node(state: ServerState, job: Job, ended: JobEnded) -> None:
    """The job's node stopped (``mb down``) under it or refused to start it: it
    goes back to the queue when it never started or may be rerun (PBS's ``-r
    y``, the default); a ``-r n`` job that ran ends cancelled, saying why, and
    so does one a qdel was ending."""
    if _deleted(job):
        end_as_reported(state, job, ended, JobResult.CANCELLED)
        return
    if job.session_id is None or job.options.rerunnable:
        back_to_queue(state, job, ended.result, ended.exit_status, ended.comment)
        return
    end_as_reported(
        state,
        job,
        ended,
        JobResult.CANCELLED,
        "its node stopped, and it is not rerunnable (qsub -r n)",
    )
