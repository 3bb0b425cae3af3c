"""The server starting a plan's upcoming jobs itself when a job ends."""

from __future__ import annotations

from minibatch.core.job import JobRequest, JobResult, JobSpec, JobState
from minibatch.core.snapshot import Plan, Start
from minibatch.protocol.messages import Launch
from minibatch.server import dispatch
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

ME = Caller(uid=1000, gid=1000, pid=1)


def submit(state: ServerState, cpus: int, *, nodes: int = 1, hold: bool = False) -> int:
    spec = JobSpec(
        name="j",
        workdir="/tmp",
        request=JobRequest(nodes=nodes, ppn=cpus),
        argv=["true"],
        hold=hold,
    )
    return state.submit(spec, ME)[0].id


def apply(state: ServerState, starts: list[Start], upcoming: list[int]) -> None:
    """What the ApplyPlan handler does with a plan."""
    for start in starts:
        assert state.start(start.job, start.nodes) is None
    state.queue.take_notes(Plan(generation=0, upcoming=upcoming), state.clock())


def end(state: ServerState, job_id: int) -> None:
    state.job_ended(state.jobs[job_id], JobResult.COMPLETED, exit_status=0)


def launched(state: ServerState) -> dict[int, list[int]]:
    return {m.spec.job: m.spec.cpus for _, m in state.outbox if isinstance(m, Launch)}


def test_a_job_end_starts_the_upcoming_jobs_in_order(server_state: ServerState):
    a, b, c, d = (submit(server_state, 2) for _ in range(4))
    apply(server_state, [Start(a, ("n0",)), Start(b, ("n1",))], upcoming=[c, d])
    assert dispatch.start_upcoming(server_state) == []  # nothing free yet
    end(server_state, a)
    assert server_state.freed
    server_state.outbox.clear()
    assert dispatch.start_upcoming(server_state) == [c]
    assert server_state.jobs[c].state is JobState.RUNNING
    assert launched(server_state) == {c: [0, 1]}  # a's CPUs, on n0
    end(server_state, b)
    assert dispatch.start_upcoming(server_state) == [d]
    assert server_state.jobs[d].alloc[0].node == "n1"
    assert not server_state.queue.upcoming


def test_the_walk_stops_at_the_first_job_that_does_not_fit(
    server_state: ServerState,
):
    a, b = submit(server_state, 2), submit(server_state, 2)
    wide, small = submit(server_state, 2, nodes=2), submit(server_state, 1)
    apply(server_state, [Start(a, ("n0",)), Start(b, ("n1",))], upcoming=[wide, small])
    end(server_state, a)
    # Two CPUs are free, and `small` would fit: starting it would jump the
    # queue, which is a backfill decision, and those are the policy's.
    assert dispatch.start_upcoming(server_state) == []
    assert server_state.jobs[small].state is JobState.QUEUED
    end(server_state, b)
    assert dispatch.start_upcoming(server_state) == [wide]  # on both nodes
    assert [x.node for x in server_state.jobs[wide].alloc] == ["n0", "n1"]
    assert list(server_state.queue.upcoming) == [small]


def test_jobs_held_or_cancelled_since_the_plan_are_passed_over(
    server_state: ServerState,
):
    a, b = submit(server_state, 2), submit(server_state, 2)
    held, gone, c = (submit(server_state, 2) for _ in range(3))
    apply(server_state, [Start(a, ("n0",)), Start(b, ("n1",))], [held, gone, c])
    server_state.hold(server_state.jobs[held])
    server_state.cancel(server_state.jobs[gone])
    end(server_state, a)
    assert dispatch.start_upcoming(server_state) == [c]
    assert server_state.jobs[held].state is JobState.HELD


def test_a_newer_plan_replaces_the_upcoming_list(server_state: ServerState):
    a, b = submit(server_state, 2), submit(server_state, 2)
    c, d = submit(server_state, 2), submit(server_state, 2)
    apply(server_state, [Start(a, ("n0",)), Start(b, ("n1",))], upcoming=[c, d])
    apply(server_state, [], upcoming=[d])
    end(server_state, a)
    assert dispatch.start_upcoming(server_state) == [d]
    assert server_state.jobs[c].state is JobState.QUEUED


def test_first_fit_skips_full_and_down_nodes(server_state: ServerState):
    a = submit(server_state, 2)
    assert server_state.start(a, ("n0",)) is None
    req = JobRequest(ppn=2)
    assert dispatch.first_fit(server_state.nodes, req) == ("n1",)
    server_state.nodes.nodes["n1"].up = False
    assert dispatch.first_fit(server_state.nodes, req) is None
    assert server_state.nodes.any_free_cpu() is False
