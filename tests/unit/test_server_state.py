"""The resource manager's state machine, driven directly (no sockets)."""

from __future__ import annotations

import msgspec
import pytest

from minibatch.core.job import (
    Dependency,
    DependKind,
    Job,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
    eligible_time,
)
from minibatch.errors import (
    InfeasibleRequest,
    InvalidArgument,
    InvalidTransition,
    NotFound,
)
from minibatch.protocol.messages import Heartbeat, Kill, Launch, NodeHello
from minibatch.server import liveness
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller, parse_peer

ME = Caller(uid=1000, gid=1000, pid=1)


def spec(cpus: int = 1, **kw) -> JobSpec:
    return JobSpec(
        name="j", workdir="/tmp", request=JobRequest(ppn=cpus), argv=["true"], **kw
    )


def test_peer_credentials_are_parsed_from_libzmq_peer_address():
    assert parse_peer("localhost:1000:100:4242") == Caller(1000, 100, 4242)
    assert parse_peer("127.0.0.1") is None
    assert parse_peer(None) is None


def test_submit_assigns_ids_and_default_output_paths(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    assert job.id == 1 and job.state is JobState.QUEUED
    assert job.stdout_path == "/tmp/j.o1" and job.stderr_path == "/tmp/j.e1"
    tasks = server_state.submit(spec(array=[1, 2, 3]), ME)
    assert [t.display_id for t in tasks] == ["2[1]", "2[2]", "2[3]"]
    assert tasks[2].stdout_path == "/tmp/j.o2-3"
    assert [j.id for j in server_state.select("2[]")] == [2, 3, 4]
    assert server_state.select("2[2]")[0].id == 3


def test_infeasible_and_malformed_requests_change_nothing(server_state: ServerState):
    before = dict(server_state.jobs)
    with pytest.raises(InfeasibleRequest, match="largest node has 2"):
        server_state.submit(spec(cpus=3), ME)
    with pytest.raises(InvalidArgument, match="walltime"):
        server_state.submit(
            JobSpec(
                name="j", workdir="/tmp", request=JobRequest(walltime=0), argv=["x"]
            ),
            ME,
        )
    with pytest.raises(NotFound, match="unknown job 99"):
        server_state.submit(spec(depends=[Dependency(DependKind.AFTEROK, 99)]), ME)
    assert server_state.jobs == before and server_state.next_id == 1


def test_start_validates_against_current_state(server_state: ServerState):
    a, b = (server_state.submit(spec(cpus=2), ME)[0] for _ in range(2))
    assert server_state.start(a.id, ("n0",)) is None
    assert a.alloc[0].cpus == [0, 1]
    assert "fewer than 2 free CPUs" in server_state.start(b.id, ("n0",))
    assert server_state.start(a.id, ("n1",)) == f"job {a.id} is not queued"
    launches = [m for _, m in server_state.outbox if isinstance(m, Launch)]
    assert [m.spec.cpus for m in launches] == [[0, 1]]


def test_dependencies_release_or_cancel(server_state: ServerState):
    (first,) = server_state.submit(spec(), ME)
    ok = server_state.submit(
        spec(depends=[Dependency(DependKind.AFTEROK, first.id)]), ME
    )[0]
    notok = server_state.submit(
        spec(depends=[Dependency(DependKind.AFTERNOTOK, first.id)]), ME
    )[0]
    assert ok.state is JobState.WAITING and ok.reason == f"dependency on {first.id}"
    server_state.start(first.id, ("n0",))
    server_state.job_ended(first, JobResult.COMPLETED, exit_status=0)
    assert ok.state is JobState.QUEUED
    assert notok.state is JobState.FINISHED and notok.result is JobResult.CANCELLED
    assert "can never be satisfied" in notok.comment


def test_hold_release_and_cancel(server_state: ServerState):
    (job,) = server_state.submit(spec(hold=True), ME)
    assert job.state is JobState.HELD and job.reason == "held (user hold)"
    server_state.release(job)
    assert job.state is JobState.QUEUED
    server_state.hold(job)
    server_state.cancel(job)
    assert job.result is JobResult.CANCELLED and job.id not in server_state.jobs
    with pytest.raises(InvalidTransition):
        server_state.hold(job)


def test_cancel_running_job_sends_kill(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    server_state.start(job.id, ("n1",))
    server_state.cancel(job)
    assert job.state is JobState.EXITING
    assert (
        b"route-n1",
        Kill(job=job.id, result=JobResult.CANCELLED),
    ) in server_state.outbox


def test_state_survives_reload_from_the_database(server_state: ServerState, clock):
    (queued,) = server_state.submit(spec(), ME)
    (running,) = server_state.submit(spec(cpus=2), ME)
    server_state.start(running.id, ("n1",))
    server_state.store.commit()
    again = ServerState(server_state.store, clock=clock)
    assert again.jobs[queued.id].state is JobState.QUEUED
    assert again.jobs[running.id].alloc[0].cpus == [2, 3]
    assert again.nodes.nodes["n1"].used == {2: running.id, 3: running.id}
    assert again.next_id == 3


def test_silent_node_is_down_and_its_jobs_wait_for_its_daemon(
    server_state: ServerState, clock
):
    (job,) = server_state.submit(spec(), ME)
    server_state.start(job.id, ("n0",))
    for node in server_state.nodes.nodes.values():
        node.last_heartbeat = clock.t
    clock.t += 30
    liveness.check_nodes(server_state, timeout=10)
    assert server_state.nodes.nodes["n0"].state == "down"
    # Only its daemon can say the job's processes are gone.
    assert job.state is JobState.RUNNING
    with pytest.raises(NotFound):
        liveness.heartbeat(server_state, Heartbeat(name="n0", running=[]), b"r0")
    server_state.cancel(job)  # nobody could answer a Kill: it ends at once
    assert job.result is JobResult.CANCELLED and "n0 is down" in job.comment


def _ran(job: Job, rerunnable: bool = True) -> Job:
    job.session_id = 4242  # its node said it started
    job.options = msgspec.structs.replace(job.options, rerunnable=rerunnable)
    return job


def test_restarted_node_daemon_requeues_the_jobs_it_did_not_keep(
    server_state: ServerState,
):
    (kept,) = server_state.submit(spec(), ME)
    (lost,) = server_state.submit(spec(), ME)
    (once,) = server_state.submit(spec(), ME)
    server_state.start(kept.id, ("n0",))
    server_state.start(lost.id, ("n1",))
    server_state.start(once.id, ("n1",))
    _ran(lost)
    _ran(once, rerunnable=False)
    liveness.hello(
        server_state,
        NodeHello(name="n0", cpus=[0, 1], mem_kb=None, pid=100, running=[kept.id]),
        b"r0",
    )
    liveness.hello(
        server_state,
        NodeHello(name="n1", cpus=[2, 3], mem_kb=None, pid=999, running=[]),
        b"r1",
    )
    assert kept.state is JobState.RUNNING
    assert lost.state is JobState.QUEUED and lost.reruns == 1
    assert once.result is JobResult.NODE_FAIL and "restarted" in once.comment


def test_heartbeats_that_omit_a_job_mark_it_lost(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    (once,) = server_state.submit(spec(), ME)
    server_state.start(job.id, ("n0",))
    server_state.start(once.id, ("n0",))
    _ran(job)
    _ran(once, rerunnable=False)
    for _ in range(3):
        liveness.heartbeat(server_state, Heartbeat(name="n0", running=[]), b"r0")
    assert job.state is JobState.QUEUED and job.reruns == 1
    assert once.result is JobResult.NODE_FAIL and "lost" in once.comment


def test_store_rejects_unknown_synchronous_mode(tmp_path):
    with pytest.raises(ValueError, match="normal or full"):
        Store(tmp_path / "x.db", synchronous="sometimes")


def test_eligible_time_accrues_only_while_queued(server_state: ServerState, clock):
    (job,) = server_state.submit(spec(), ME)  # queued at t0
    t0 = clock.t
    clock.t += 10
    server_state.hold(job)
    clock.t += 1000  # held: not eligible
    server_state.release(job)
    clock.t += 5
    assert eligible_time(job, clock.t) == 15
    view = server_state.snapshot().pending[0]
    assert view.eligible_since == t0 + 1000 and view.eligible_from == t0 + 1000
    assert server_state.start(job.id, ("n0",)) is None
    clock.t += 50  # running: the eligible time stays what it was
    assert (job.queued_since, eligible_time(job, clock.t)) == (None, 15)


def test_a_kill_lost_with_a_dead_daemon_is_sent_again(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    server_state.start(job.id, ("n0",))
    _ran(job)
    server_state.cancel(job)  # the Kill goes to a daemon that has just died
    assert job.state is JobState.EXITING
    server_state.outbox.clear()
    liveness.hello(
        server_state,
        NodeHello(name="n0", cpus=[0, 1], mem_kb=None, pid=777, running=[job.id]),
        b"new-route",
    )
    assert (b"new-route", Kill(job=job.id, result=JobResult.CANCELLED)) in (
        server_state.outbox
    )
    assert job.state is JobState.EXITING  # re-adopted: it ends when its node says
