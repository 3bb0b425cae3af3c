"""Dependencies and holds on the server's state machine (no sockets).

A job with several dependencies (``afterok:A:B``) waits for *all* of them; a held
job with a pending dependency stays waiting after ``qrls``; and both rules hold
across a restart of the server (the state reloaded from its database).
"""

from __future__ import annotations

import pytest

from minibatch.core.job import (
    TRANSITIONS,
    Dependency,
    DependKind,
    Job,
    JobOptions,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
    dependency_outcome,
    transition,
)
from minibatch.errors import InvalidArgument, InvalidTransition
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

ME = Caller(uid=1000, gid=1000, pid=1)


def spec(*depends: Dependency, **kw) -> JobSpec:
    return JobSpec(
        name="j",
        workdir="/tmp",
        request=JobRequest(ppn=1),
        argv=["true"],
        depends=list(depends),
        **kw,
    )


def afterok(*jobs: Job) -> list[Dependency]:
    return [Dependency(DependKind.AFTEROK, j.id) for j in jobs]


def running(state: ServerState, node: str) -> Job:
    (job,) = state.submit(spec(), ME)
    assert state.start(job.id, (node,)) is None
    return job


def end(state: ServerState, job: Job, result: JobResult = JobResult.COMPLETED):
    state.job_ended(job, result, exit_status=0 if result is JobResult.COMPLETED else 1)
    assert job.state is JobState.FINISHED


def reload(state: ServerState, clock) -> ServerState:
    """The server restarted: a new state from what its database holds."""
    state.store.commit()
    return ServerState(state.store, clock=clock)


# --------------------------------------------------------- afterok:A:B = all


def test_afterok_on_two_jobs_waits_for_both(server_state: ServerState):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    assert dep.state is JobState.WAITING
    assert dep.reason == f"dependency on {a.id}, {b.id}"

    end(server_state, a)  # A done, B still running
    assert dep.state is JobState.WAITING, "queued with one dependency pending"
    assert dep.reason == f"dependency on {b.id}"
    assert dep.id not in server_state.queue
    assert dep.id not in {p.id for p in server_state.snapshot().pending}

    end(server_state, b)
    assert dep.state is JobState.QUEUED
    assert dep.reason == "waiting for the scheduler"
    assert dep.id in {p.id for p in server_state.snapshot().pending}
    assert server_state.start(dep.id, ("n0",)) is None


def test_the_order_in_which_dependencies_end_does_not_matter(
    server_state: ServerState,
):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    end(server_state, b)  # the second one first
    assert dep.state is JobState.WAITING and dep.reason == f"dependency on {a.id}"
    end(server_state, a)
    assert dep.state is JobState.QUEUED


def test_a_submission_after_one_dependency_ended_still_waits_for_the_other(
    server_state: ServerState,
):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    end(server_state, a)
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    assert dep.state is JobState.WAITING and dep.reason == f"dependency on {b.id}"
    end(server_state, b)
    assert dep.state is JobState.QUEUED
    # Both ended well before the submission: queued at once.
    (later,) = server_state.submit(spec(*afterok(a, b)), ME)
    assert later.state is JobState.QUEUED


def test_mixed_kinds_wait_for_all_and_one_failure_cancels(server_state: ServerState):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    mixed = [
        Dependency(DependKind.AFTEROK, a.id),
        Dependency(DependKind.AFTERANY, b.id),
    ]
    (dep,) = server_state.submit(spec(*mixed), ME)
    (doomed,) = server_state.submit(spec(*afterok(a, b)), ME)
    end(server_state, b, JobResult.FAILED)  # afterany: satisfied; afterok: never
    assert dep.state is JobState.WAITING and dep.reason == f"dependency on {a.id}"
    assert doomed.state is JobState.FINISHED
    assert doomed.result is JobResult.CANCELLED
    assert doomed.comment == f"dependency can never be satisfied (afterok:{b.id})"
    end(server_state, a)
    assert dep.state is JobState.QUEUED


def test_a_failed_dependency_cancels_even_while_another_is_pending(
    server_state: ServerState,
):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    end(server_state, a, JobResult.FAILED)
    assert dep.result is JobResult.CANCELLED and dep.start_time is None
    assert f"afterok:{a.id}" in dep.comment and f"afterok:{b.id}" not in dep.comment
    assert dep.id not in server_state.jobs


def test_waiting_for_both_survives_a_restart(server_state: ServerState, clock):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    end(server_state, a)
    again = reload(server_state, clock)
    assert again.jobs[dep.id].state is JobState.WAITING
    assert again.dependents[b.id] == {dep.id}
    end(again, again.jobs[b.id])
    assert again.jobs[dep.id].state is JobState.QUEUED
    assert dep.id in again.queue


def test_dependency_outcomes():
    ok, notok, any_ = (Dependency(k, 1) for k in DependKind)
    for result in JobResult:
        good = result is JobResult.COMPLETED
        assert dependency_outcome(ok, result) is good
        assert dependency_outcome(notok, result) is (not good)
        assert dependency_outcome(any_, result) is True
    for dep in (ok, notok, any_):
        assert dependency_outcome(dep, None) is None


# ------------------------------------------------------ -h with a dependency


def test_qrls_of_a_held_job_with_a_pending_dependency_leaves_it_waiting(
    server_state: ServerState,
):
    x = running(server_state, "n0")
    (held,) = server_state.submit(spec(*afterok(x), hold=True), ME)
    assert held.state is JobState.HELD and held.reason == "held (user hold)"
    server_state.release(held)
    assert held.state is JobState.WAITING, "released past a pending dependency"
    assert held.reason == f"dependency on {x.id}"
    assert held.id not in {p.id for p in server_state.snapshot().pending}
    assert server_state.start(held.id, ("n1",)) == f"job {held.id} is not queued"
    end(server_state, x)
    assert held.state is JobState.QUEUED
    assert server_state.start(held.id, ("n1",)) is None


def test_a_dependency_that_ends_while_held_leaves_it_held(server_state: ServerState):
    x = running(server_state, "n0")
    (held,) = server_state.submit(spec(*afterok(x), hold=True), ME)
    end(server_state, x)
    assert held.state is JobState.HELD and held.reason == "held (user hold)"
    server_state.release(held)
    assert held.state is JobState.QUEUED


def test_a_dependency_that_fails_while_held_cancels_it(server_state: ServerState):
    x = running(server_state, "n0")
    (held,) = server_state.submit(spec(*afterok(x), hold=True), ME)
    end(server_state, x, JobResult.FAILED)
    assert held.result is JobResult.CANCELLED


def test_qhold_then_qrls_of_a_waiting_job_waits_again(server_state: ServerState):
    a, b = running(server_state, "n0"), running(server_state, "n1")
    (dep,) = server_state.submit(spec(*afterok(a, b)), ME)
    server_state.hold(dep)
    assert dep.state is JobState.HELD
    end(server_state, a)
    server_state.release(dep)
    assert dep.state is JobState.WAITING and dep.reason == f"dependency on {b.id}"
    end(server_state, b)
    assert dep.state is JobState.QUEUED


def test_held_with_a_dependency_survives_a_restart(server_state: ServerState, clock):
    x = running(server_state, "n0")
    (held,) = server_state.submit(spec(*afterok(x), hold=True), ME)
    again = reload(server_state, clock)
    job = again.jobs[held.id]
    again.release(job)
    assert job.state is JobState.WAITING
    end(again, again.jobs[x.id])
    assert job.state is JobState.QUEUED


def test_qrls_of_a_job_not_before_its_begin_time_waits(
    server_state: ServerState, clock
):
    later = JobOptions(begin=clock.t + 60)
    (held,) = server_state.submit(spec(hold=True, options=later), ME)
    server_state.release(held)
    assert held.state is JobState.WAITING
    clock.t += 61
    server_state.begin_due()
    assert held.state is JobState.QUEUED


def test_only_held_jobs_can_be_released(server_state: ServerState):
    (queued,) = server_state.submit(spec(), ME)
    with pytest.raises(InvalidArgument, match="not held"):
        server_state.release(queued)
    assert queued.state is JobState.QUEUED


# ---------------------------------------------------------- the table itself


def test_the_transition_table_is_exactly_the_documented_one():
    q, h, w, r, e, f = (
        JobState.QUEUED,
        JobState.HELD,
        JobState.WAITING,
        JobState.RUNNING,
        JobState.EXITING,
        JobState.FINISHED,
    )
    documented = {
        (q, h): "hold",
        (w, h): "hold",
        (h, q): "release",
        (h, w): "release",
        (w, q): "dependency satisfied",
        (q, r): "start",
        (r, e): "kill",
        (r, f): "end",
        (e, f): "end",
        (e, q): "requeue",
        (r, q): "requeue",
        (q, f): "cancel",
        (h, f): "cancel",
        (w, f): "cancel",
    }
    assert documented == TRANSITIONS


@pytest.mark.parametrize("before", list(JobState))
@pytest.mark.parametrize("after", list(JobState))
def test_transition_allows_the_table_and_refuses_the_rest(before, after):
    job = Job(
        id=7,
        name="j",
        user="u",
        uid=1,
        gid=1,
        group="g",
        workdir="/tmp",
        request=JobRequest(),
        submit_time=0.0,
        state=before,
    )
    if (before, after) in TRANSITIONS:
        assert transition(job, after) == TRANSITIONS[(before, after)]
        assert job.state is after
    else:
        with pytest.raises(InvalidTransition) as info:
            transition(job, after)
        assert str(info.value) == f"job 7 is {before}; it cannot become {after}"
        assert job.state is before
