"""Starting the plan's upcoming jobs the moment a job ends, without a pass.

Every plan names its ``upcoming`` jobs: the head of the policy's priority order,
which the policy would start, in that order, as soon as each fits. When a job
ends, the server starts them itself, strictly in order, and stops at the first
that does not fit; the scheduler's next pass (woken as usual) does everything
else: backfill, reservations, reasons. This is how Slurm splits the work too:
slurmctld runs its main scheduler, priority order only, at each job end, and
backfill runs as its own periodic pass.

An in-order start of the head is what every priority policy's pass would do
with the same queue, so it takes no decision from the policy; it only saves the
round trip to the scheduler (two of the four messages between one job's end
and the next one's start). That holds only for the queue the plan saw, so a job
queued since (see :attr:`PendingQueue.unseen_min`) is never overtaken: under a
submission-ordered policy the walk stops at the first upcoming job submitted
after it, under any other order nothing starts until a pass has ranked it.
Placement is first fit over the nodes in their order, keeping off CPUs an
advance reservation holds (policies choose among equally good nodes the same
way, but ``select=bestfit`` may pick another).

Every start is validated by :meth:`ServerState.start` exactly like a planned one
(QOS limits, advance reservations, free CPUs and memory), so nothing here can
over-allocate; a refusal just ends the walk.
"""

from __future__ import annotations

from minibatch.core.job import JobState
from minibatch.server.reservations import JobCpus
from minibatch.server.state import ServerState


def start_upcoming(state: ServerState) -> list[int]:
    """Start the last plan's upcoming jobs while they fit; the ids started."""
    queue = state.queue
    upcoming = queue.upcoming
    # A job queued since the plan's snapshot (submitted, released, its
    # dependencies met or its QOS limit lifted) may outrank upcoming ones: in
    # submission order only those after it may still start; in any other order
    # none may, until a pass has ranked it.
    unseen = queue.unseen_min
    if unseen is not None and not queue.by_submission:
        return []
    started: list[int] = []
    while upcoming:
        job = state.jobs.get(upcoming[0])
        if job is None or job.state is not JobState.QUEUED:
            upcoming.popleft()  # started, held, cancelled or gone since the plan
            continue
        if unseen is not None and queue.rank(job.id) > unseen:
            break
        chooser = None
        if state.reservations.by_name:
            chooser = JobCpus(state.reservations, job, state.clock())
        names = state.nodes.first_fit(job.request, chooser, job.options.features)
        if names is None or state.start(job.id, names) is not None:
            break
        upcoming.popleft()
        started.append(job.id)
    return started
