"""The server starting a plan's upcoming jobs itself when a job ends."""

from __future__ import annotations

from minibatch.core.job import (
    Dependency,
    DependKind,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
)
from minibatch.core.snapshot import Plan, Start
from minibatch.policy.base import NEVER
from minibatch.protocol.messages import Launch
from minibatch.protocol.scheduling import ApplyPlan
from minibatch.server import dispatch
from minibatch.server.handlers import Context, apply_plan
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

ME = Caller(uid=1000, gid=1000, pid=1)
ROOT = Caller(uid=0, gid=0, pid=2)


def submit(
    state: ServerState, cpus: int, *, nodes: int = 1, after: int | None = None
) -> int:
    spec = JobSpec(
        name="j",
        workdir="/tmp",
        request=JobRequest(nodes=nodes, ppn=cpus),
        argv=["true"],
        depends=[] if after is None else [Dependency(DependKind.AFTEROK, after)],
    )
    return state.submit(spec, ME)[0].id


def apply(
    state: ServerState,
    starts: list[Start],
    upcoming: list[int],
    by_submission: bool = True,
) -> None:
    """A pass: a snapshot, then what the ApplyPlan handler does with its plan."""
    snap = state.snapshot()
    for start in starts:
        assert state.start(start.job, start.nodes) is None
    plan = Plan(
        generation=snap.generation,
        upcoming=upcoming,
        upcoming_by_submission=by_submission,
    )
    state.queue.take_notes(plan, state.clock())


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
    assert server_state.nodes.first_fit(req) == ("n1",)
    server_state.nodes.nodes["n1"].up = False
    assert server_state.nodes.first_fit(req) is None
    assert server_state.nodes.any_free_cpu() is False


def test_a_job_queued_since_the_plan_is_never_overtaken(server_state: ServerState):
    # D waits on A; the plan (FIFO) saw D as waiting, so B is upcoming. When A
    # ends, D is queued and comes before B in submission order: B must wait for
    # the pass that ranks D, or D's CPUs would go to a later job.
    a, b = submit(server_state, 2), submit(server_state, 2)
    d = submit(server_state, 2, after=a)
    c = submit(server_state, 2)
    assert server_state.start(b, ("n1",)) is None
    apply(server_state, [Start(a, ("n0",))], upcoming=[c])
    end(server_state, a)
    assert server_state.jobs[d].state is JobState.QUEUED
    assert dispatch.start_upcoming(server_state) == []


def test_later_submissions_do_not_stop_a_submission_ordered_plan(
    server_state: ServerState,
):
    a, b, c = (submit(server_state, 2) for _ in range(3))
    apply(server_state, [Start(a, ("n0",)), Start(b, ("n1",))], upcoming=[c])
    submit(server_state, 1)  # after the plan, and after c in submission order
    end(server_state, a)
    assert dispatch.start_upcoming(server_state) == [c]


def test_any_unranked_job_stops_a_priority_ordered_plan(server_state: ServerState):
    a, b, c = (submit(server_state, 2) for _ in range(3))
    starts = [Start(a, ("n0",)), Start(b, ("n1",))]
    apply(server_state, starts, upcoming=[c], by_submission=False)
    late = submit(server_state, 1)  # its priority is unknown until a pass
    end(server_state, a)
    assert dispatch.start_upcoming(server_state) == []
    apply(server_state, [], upcoming=[late, c], by_submission=False)
    assert dispatch.start_upcoming(server_state) == [late]


def test_a_rejected_start_voids_the_plans_upcoming_jobs(server_state: ServerState):
    a, b, c, d = (submit(server_state, 2) for _ in range(4))
    snap = server_state.snapshot()
    assert server_state.start(a, ("n0",)) is None  # taken since the snapshot
    plan = Plan(
        generation=snap.generation,
        starts=[Start(b, ("n0",)), Start(c, ("n1",))],
        upcoming=[d],
        upcoming_by_submission=True,
    )
    result = apply_plan(server_state, Context(), ROOT, b"", ApplyPlan(plan=plan))
    assert result.started == [c] and list(result.rejected) == [b]
    assert not server_state.queue.upcoming  # b is in neither list: no shortcut


def test_a_job_no_node_of_the_layout_can_hold_says_so(server_state: ServerState):
    """Admitted for 2-CPU nodes; the cluster came back with 1-CPU ones (mb up
    with another layout): "no room now" would promise a start that never comes."""
    job = submit(server_state, 2)
    for node in server_state.nodes.nodes.values():
        node.cpus = node.cpus[:1]
    snap = server_state.snapshot()
    plan = Plan(generation=snap.generation, reasons={job: NEVER})
    server_state.queue.take_notes(plan, server_state.clock())
    server_state.explain(server_state.jobs[job])
    reason = server_state.jobs[job].reason
    assert reason.startswith("can never run on this cluster's nodes: "), reason
    # While a node could hold it, the plan's word stands.
    for node in server_state.nodes.nodes.values():
        node.cpus = [0, 1]
    server_state.explain(server_state.jobs[job])
    assert server_state.jobs[job].reason == NEVER
