"""The start each live job was predicted at its queueing, kept for jobs.csv.

The first plan whose snapshot saw a queued job decides: its predicted start if
it made one; when the job was queued if that plan started it; none otherwise.
"""

from __future__ import annotations

from minibatch.core.job import JobRequest, JobResult, JobSpec
from minibatch.core.snapshot import Plan
from minibatch.metrics.records import from_jobs
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller
from tests.conftest import Clock

ME = Caller(uid=1000, gid=1000, pid=1)


def submit(state: ServerState, cpus: int) -> int:
    spec = JobSpec(
        name="j", workdir="/tmp", request=JobRequest(ppn=cpus), argv=["true"]
    )
    return state.submit(spec, ME)[0].id


def plan(
    state: ServerState,
    starts: dict[int, str] | None = None,
    predicted: dict[int, float] | None = None,
) -> None:
    """A pass: a snapshot, then what the ApplyPlan handler does with its plan."""
    snap = state.snapshot()
    for job, node in (starts or {}).items():
        assert state.start(job, (node,)) is None
    state.queue.take_notes(
        Plan(generation=snap.generation, predicted=predicted or {}), state.clock()
    )


def finish(state: ServerState, job_id: int) -> None:
    state.job_ended(state.jobs[job_id], JobResult.COMPLETED, exit_status=0)


def test_a_job_started_by_the_first_plan_that_saw_it_was_predicted_no_wait(
    server_state: ServerState, clock: Clock
):
    clock.t = 1000.0
    a = submit(server_state, 2)
    clock.t = 1003.0  # the plan comes a little later
    plan(server_state, starts={a: "n0"})
    job = server_state.jobs[a]
    assert job.first_predicted_start == 1000.0 and job.start_time == 1003.0
    finish(server_state, a)
    (record,) = from_jobs(server_state.store.finished_jobs())
    assert record.predicted_start == 1000.0  # kept through the end: jobs.csv


def test_the_first_plans_prediction_is_kept_not_a_later_ones(
    server_state: ServerState, clock: Clock
):
    a, b, c = (submit(server_state, 2) for _ in range(3))
    plan(server_state, starts={a: "n0", b: "n1"}, predicted={c: 1600.0})
    plan(server_state, predicted={c: 1500.0})  # a later estimate: not kept
    finish(server_state, a)
    clock.t = 1500.0
    plan(server_state, starts={c: "n0"})
    assert server_state.jobs[c].first_predicted_start == 1600.0


def test_a_job_the_first_plan_left_without_prediction_has_none(
    server_state: ServerState, clock: Clock
):
    a, b = submit(server_state, 2), submit(server_state, 2)
    waiting = submit(server_state, 2)
    plan(server_state, starts={a: "n0", b: "n1"})  # saw it, predicted nothing
    finish(server_state, a)
    clock.t = 1200.0
    plan(server_state, starts={waiting: "n0"})
    assert server_state.jobs[waiting].first_predicted_start is None


def test_a_job_queued_after_the_snapshot_is_judged_by_the_next_plan(
    server_state: ServerState, clock: Clock
):
    a = submit(server_state, 2)
    snap = server_state.snapshot()
    clock.t = 1001.0
    late = submit(server_state, 2)  # the plan of ``snap`` never saw it
    assert server_state.start(a, ("n0",)) is None
    server_state.queue.take_notes(
        Plan(generation=snap.generation, predicted={late: 9999.0}), clock()
    )
    clock.t = 1010.0
    plan(server_state, starts={late: "n1"})
    assert server_state.jobs[a].first_predicted_start == 1000.0
    assert server_state.jobs[late].first_predicted_start == 1001.0


def test_a_released_job_is_judged_again_from_its_release(
    server_state: ServerState, clock: Clock
):
    a = submit(server_state, 2)
    plan(server_state, predicted={a: 5000.0})
    server_state.hold(server_state.jobs[a])
    clock.t = 1100.0
    server_state.release(server_state.jobs[a])
    clock.t = 1105.0
    plan(server_state, starts={a: "n0"})
    assert server_state.jobs[a].first_predicted_start == 1100.0
