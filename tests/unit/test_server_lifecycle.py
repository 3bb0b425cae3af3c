"""The server's job state machine, event by event (no sockets): what each
transition records and sends, its boundaries, and what a restart rebuilds.
Written to kill mutants that survived the older tests (docs/mutation.md)."""

from __future__ import annotations

import time

import pytest

from minibatch.core.job import (
    Dependency,
    DependKind,
    JobOptions,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
)
from minibatch.protocol.messages import Kill, Launch
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller
from tests.conftest import validate

ME = Caller(uid=1000, gid=1000, pid=1)


def spec(cpus: int = 1, **kw) -> JobSpec:
    return JobSpec(
        name="j", workdir="/tmp", request=JobRequest(ppn=cpus), argv=["true"], **kw
    )


def events(state: ServerState, job) -> list[tuple[str, str]]:
    """(event, detail) published for ``job``, oldest first."""
    prefix = f"jobs/{job.display_id}/"
    return [
        (topic.removeprefix(prefix), body["detail"])
        for topic, body in state.events
        if topic.startswith(prefix)
    ]


def run(state: ServerState, node: str = "n0", **kw):
    (job,) = state.submit(spec(**kw), ME)
    assert state.start(job.id, (node,)) is None
    return job


def test_every_transition_is_recorded_with_its_detail(server_state: ServerState):
    first = run(server_state, "n1")
    (job,) = server_state.submit(
        spec(
            hold=True,
            submit_args="-h -W depend=afterok:1",
            depends=[Dependency(DependKind.AFTEROK, first.id)],
        ),
        ME,
    )
    server_state.release(job)
    server_state.job_ended(first, JobResult.COMPLETED, exit_status=0)
    assert server_state.start(job.id, ("n0",)) is None
    server_state.cancel(job, comment="cancelled by qdel (alice)")
    server_state.job_ended(job, JobResult.CANCELLED, exit_status=271)
    # The arguments stay in the job's own log (tracejob), not in the event
    # anyone may subscribe to.
    logged = server_state.store.events_of(job.id)
    assert (logged[0][1], logged[0][2]) == ("submitted", "-h -W depend=afterok:1")
    assert events(server_state, job) == [
        ("submitted", ""),
        ("released", ""),
        ("eligible", "dependencies satisfied"),
        ("started", "n0/0"),
        ("exiting", "cancelled by qdel (alice)"),
        ("finished", "cancelled"),
    ]
    assert job.comment == "cancelled by qdel (alice)"
    (pending,) = server_state.submit(spec(), ME)
    server_state.cancel(pending)
    assert events(server_state, pending)[-1] == (
        "finished",
        "cancelled: cancelled by qdel",
    )
    assert [e for e, _ in events(server_state, first)][-1] == "finished"
    assert events(server_state, first)[-1] == ("finished", "completed")
    assert first.comment == ""
    stored = [(e, d) for _, e, d in server_state.store.events_of(job.id)]
    assert stored[1:] == events(server_state, job)[1:]


def test_start_sends_the_launch_to_the_node_and_bumps_the_generation(
    server_state: ServerState,
):
    (job,) = server_state.submit(spec(cpus=2), ME)
    job.reason = "waiting for the scheduler"
    before = server_state.generation
    assert server_state.start(job.id, ("n1",)) is None
    assert server_state.generation == before + 1
    assert job.reason == "" and job.predicted_start is None
    ((route, msg),) = server_state.outbox
    assert route == b"route-n1" and isinstance(msg, Launch)
    assert msg.spec.job == job.id and msg.spec.cpus == [2, 3]


def test_a_second_qdel_of_an_exiting_job_kills_again(server_state: ServerState):
    job = run(server_state, "n1")
    server_state.cancel(job)
    server_state.cancel(job)
    assert job.state is JobState.EXITING
    kill = (b"route-n1", Kill(job=job.id, result=JobResult.CANCELLED))
    assert server_state.outbox[1:] == [kill, kill]


def test_the_end_time_the_node_reports_is_kept(server_state: ServerState, clock):
    job = run(server_state)
    clock.t += 50
    server_state.job_ended(job, JobResult.COMPLETED, exit_status=0, end_time=1020.5)
    assert job.end_time == 1020.5 and job.reason == ""
    other = run(server_state)
    server_state.job_ended(other, JobResult.FAILED, exit_status=1)
    assert other.end_time == clock.t and other.comment == ""


def test_a_rerun_job_goes_back_to_the_queue_saying_how_the_run_ended(
    server_state: ServerState,
):
    job = run(server_state)
    job.rerun_pending = True
    server_state.job_ended(
        job, JobResult.CANCELLED, exit_status=271, comment="qrerun by root"
    )
    assert job.state is JobState.QUEUED and job.reruns == 1
    assert events(server_state, job)[-1] == (
        "requeued",
        "run 1 ended cancelled, exit status 271: qrerun by root",
    )


def test_eligible_time_counts_fractions_of_a_second(server_state: ServerState, clock):
    (job,) = server_state.submit(spec(), ME)
    clock.t += 0.25
    server_state.hold(job)
    assert job.eligible_s == 0.25


# ------------------------------------------------------------ submission


def test_dependencies_on_finished_jobs_are_judged_at_submission(
    server_state: ServerState,
):
    ok, bad = run(server_state, "n0"), run(server_state, "n1")
    server_state.job_ended(ok, JobResult.COMPLETED, exit_status=0)
    server_state.job_ended(bad, JobResult.FAILED, exit_status=1)
    after_ok = [Dependency(DependKind.AFTEROK, ok.id)]
    (queued,) = server_state.submit(spec(depends=after_ok), ME)
    assert queued.state is JobState.QUEUED
    cleanup = [Dependency(DependKind.AFTERNOTOK, bad.id)]
    (queued,) = server_state.submit(spec(depends=cleanup), ME)
    assert queued.state is JobState.QUEUED
    still = run(server_state, "n0")
    both = [
        Dependency(DependKind.AFTEROK, still.id),  # pending: judged later
        Dependency(DependKind.AFTEROK, bad.id),
        Dependency(DependKind.AFTEROK, ok.id),
    ]
    (doomed,) = server_state.submit(spec(depends=both), ME)
    assert doomed.result is JobResult.CANCELLED
    assert doomed.comment == f"dependency can never be satisfied (afterok:{bad.id})"


def test_every_unsatisfiable_dependency_is_named(server_state: ServerState):
    a, b = run(server_state, "n0"), run(server_state, "n1")
    for job in (a, b):
        server_state.job_ended(job, JobResult.FAILED, exit_status=1)
    deps = [Dependency(DependKind.AFTEROK, j.id) for j in (a, b)]
    (doomed,) = server_state.submit(spec(depends=deps), ME)
    assert doomed.comment == (
        f"dependency can never be satisfied (afterok:{a.id}, afterok:{b.id})"
    )


def test_an_unknown_queue_becomes_the_default_without_a_notes_list(
    server_state: ServerState,
):
    (job,) = server_state.submit(spec(queue="nope"), ME)
    assert job.queue == "batch"
    notes: list[str] = []
    server_state.submit(spec(queue="nope"), ME, notes)
    assert notes and "nope" in notes[0]


# --------------------------------------------------- a start time (qsub -a)


def test_a_start_time_of_now_is_not_later(server_state: ServerState, clock):
    (now,) = server_state.submit(spec(options=JobOptions(begin=clock.t)), ME)
    assert now.state is JobState.QUEUED
    (held,) = server_state.submit(
        spec(hold=True, options=JobOptions(begin=clock.t)), ME
    )
    server_state.release(held)
    assert held.state is JobState.QUEUED


def test_begin_due_queues_on_the_second_and_forgets_the_job(
    server_state: ServerState, clock
):
    at = clock.t + 10
    (job,) = server_state.submit(spec(options=JobOptions(begin=at)), ME)
    (gone,) = server_state.submit(spec(options=JobOptions(begin=at)), ME)
    server_state.cancel(gone)
    assert job.state is JobState.WAITING
    clock.t = at
    server_state.begin_due()
    assert job.state is JobState.QUEUED
    assert server_state.begin_waiting == set()


def test_a_dependency_met_at_the_start_time_queues_it(server_state: ServerState, clock):
    first = run(server_state)
    at = clock.t + 10
    (job,) = server_state.submit(
        spec(
            options=JobOptions(begin=at),
            depends=[Dependency(DependKind.AFTERANY, first.id)],
        ),
        ME,
    )
    clock.t = at
    server_state.job_ended(first, JobResult.FAILED, exit_status=2)
    assert job.state is JobState.QUEUED


# --------------------------------------------------------------- restart


def test_a_restart_rebuilds_the_indexes(server_state: ServerState, clock):
    running = run(server_state, "n1")
    (queued,) = server_state.submit(spec(), ME)
    waiting_dep = [Dependency(DependKind.AFTEROK, running.id)]
    (held,) = server_state.submit(spec(hold=True, depends=waiting_dep), ME)
    server_state.store.commit()
    again = ServerState(server_state.store, clock=clock)
    validate(again)
    assert again.active == {running.id}
    assert set(again.queue) == {queued.id}
    assert again.dependents[running.id] == {held.id}
    # The held job's dependency fails after the restart: it can never run.
    again.job_ended(again.jobs[running.id], JobResult.FAILED, exit_status=1)
    assert held.id not in again.jobs
    assert again.store.is_finished(held.id).result is JobResult.CANCELLED


def test_an_array_keeps_its_running_limit_until_its_last_task_ends(
    server_state: ServerState,
):
    tasks = server_state.submit(
        spec(array=[1, 2, 3], options=JobOptions(array_limit=1)), ME
    )
    array = tasks[0].array_id
    assert server_state.array_limits == {array: 1}
    server_state.cancel(tasks[0])
    assert server_state.array_limits == {array: 1}
    assert [j.id for j in server_state.select(f"{array}[]", finished=False)] == [
        t.id for t in tasks[1:]
    ]
    for task in tasks[1:]:
        server_state.cancel(task)
    assert server_state.array_limits == {} and array not in server_state.arrays


@pytest.mark.parametrize("ppn", [3, 0])
def test_a_start_on_other_cpus_needs_a_malleable_job(server_state: ServerState, ppn):
    (job,) = server_state.submit(spec(cpus=2), ME)
    if ppn:
        assert str(job.id) in (server_state.start(job.id, ("n0",), ppn=ppn) or "")
        assert job.state is JobState.QUEUED
    else:
        assert server_state.start(job.id, ("n0",), ppn=ppn) is None


def test_a_job_not_before_its_start_time_says_when(server_state: ServerState, clock):
    at = clock.t + 3600
    (job,) = server_state.submit(spec(options=JobOptions(begin=at)), ME)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    assert job.reason == f"not before {when} (qsub -a / --begin)"


def test_a_job_on_two_nodes_records_both(server_state: ServerState):
    (job,) = server_state.submit(
        JobSpec(
            name="j",
            workdir="/tmp",
            request=JobRequest(nodes=2, ppn=1),
            argv=["true"],
        ),
        ME,
    )
    assert server_state.start(job.id, ("n0", "n1")) is None
    assert events(server_state, job)[-1] == ("started", "n0/0 n1/2")


@pytest.mark.parametrize(
    ("remote", "lends"), [(False, True), (True, True), (False, False)]
)
def test_a_job_on_two_nodes_of_this_machine_launches_with_both(
    server_state: ServerState, remote: bool, lends: bool
):
    """Its first node gets the other node's real cores and both nodes'
    memory; a job reaching a node on another host (tcp) gets its first node's
    alone (those cores are not this machine's), and so does a first node too
    old to read ``other_cores`` (it would take the memory, not the cores)."""
    server_state.nodes.nodes["n0"].lends = lends
    server_state.nodes.nodes["n1"].real_cpus = {2: 0, 3: 1}  # virtual CPUs
    server_state.nodes.nodes["n1"].remote = remote
    remote = remote or not lends
    request = JobRequest(nodes=2, ppn=1, mem_kb=4096)
    (job,) = server_state.submit(
        JobSpec(name="j", workdir="/tmp", request=request, argv=["true"]), ME
    )
    assert server_state.start(job.id, ("n0", "n1")) is None
    (launch,) = [m for _, m in server_state.outbox if isinstance(m, Launch)]
    # 4096 kb for the job: 2048 on each node, both here when both are local.
    assert launch.spec.other_cores == ([] if remote else [0])
    assert launch.spec.mem_kb == (2048 if remote else 4096)


def test_a_lending_node_that_restarts_leaves_the_job_running(server_state):
    """A job on n0 and n1 runs on n0; n1's daemon restarting (it never ran
    the job's processes) does not take the job for lost (found by review)."""
    from minibatch.protocol.messages import NodeHello
    from minibatch.server import liveness

    request = JobRequest(nodes=2, ppn=1)
    (job,) = server_state.submit(
        JobSpec(name="j", workdir="/tmp", request=request, argv=["true"]), ME
    )
    assert server_state.start(job.id, ("n0", "n1")) is None
    again = NodeHello(name="n1", cpus=[2, 3], mem_kb=None, pid=999, running=[])
    liveness.hello(server_state, again, b"route-n1")
    assert job.state is JobState.RUNNING
