"""Advance reservations in the server: placement, enforcement, lifetime."""

from __future__ import annotations

import pytest

from minibatch.core.job import JobRequest, JobResult, JobSpec, JobState
from minibatch.errors import (
    InfeasibleRequest,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from minibatch.protocol.messages import SetReservation
from minibatch.server import booking
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller
from tests.conftest import Clock

ME = Caller(uid=0, gid=0, pid=1)  # root: a user that exists on every machine


def spec(cpus: int = 1, walltime: int = 60, **kw) -> JobSpec:
    return JobSpec(
        name="j",
        workdir="/tmp",
        request=JobRequest(ppn=cpus, walltime=walltime),
        argv=["true"],
        **kw,
    )


def setres(state: ServerState, **kw) -> str:
    kw.setdefault("start", state.clock())
    kw.setdefault("duration", 600.0)
    return booking.create(state, SetReservation(**kw), "root").name


def test_cpus_go_to_the_node_they_fit_most_tightly(server_state, clock):
    (job,) = server_state.submit(spec(), ME)
    assert server_state.start(job.id, ("n1",)) is None
    name = setres(server_state, cpus=1, start=clock.t + 100, users=["root"])
    (alloc,) = server_state.reservations.get(name).alloc
    # Both nodes fit; the job on n1 ends (60 s) before the start, so its CPU is
    # taken and the idle CPUs stay free for long jobs.
    assert (alloc.node, alloc.cpus) == ("n1", job.alloc[0].cpus)
    assert name == "root.1"


def test_running_jobs_that_overlap_the_window_make_setres_fail(server_state, clock):
    (job,) = server_state.submit(spec(cpus=2, walltime=3600), ME)
    assert server_state.start(job.id, ("n0",)) is None
    with pytest.raises(InfeasibleRequest, match=rf"n0 CPUs 0-1 held by job {job.id}"):
        setres(server_state, nodes=["n0"], start=clock.t + 60)
    # Starting after the job's walltime is fine.
    setres(server_state, nodes=["n0"], start=clock.t + 3600)
    with pytest.raises(InfeasibleRequest, match="reserved by 'system.1'"):
        setres(server_state, nodes=["n0"], start=clock.t + 3700)


def test_reservations_stack_on_the_same_cpus(server_state, clock):
    first = setres(server_state, cpus=1, start=clock.t + 100, duration=100)
    second = setres(server_state, cpus=1, start=clock.t + 300, duration=100)
    book = server_state.reservations
    assert book.get(first).alloc == book.get(second).alloc


def test_whole_nodes_by_count_and_names_are_checked(server_state, clock):
    with pytest.raises(NotFound, match="unknown node n9"):
        setres(server_state, nodes=["n9"])
    with pytest.raises(InvalidArgument, match="exactly one"):
        setres(server_state, nodes=["n0"], cpus=1)
    with pytest.raises(InvalidArgument, match="unknown user"):
        setres(server_state, cpus=1, users=["no-such-user-here"])
    with pytest.raises(InvalidArgument, match="in the past"):
        setres(server_state, cpus=1, start=clock.t - 3600)
    name = setres(server_state, node_count=2, name="maint")
    assert {a.node for a in server_state.reservations.get(name).alloc} == {"n0", "n1"}
    with pytest.raises(InvalidArgument, match="already exists"):
        setres(server_state, cpus=1, name="maint", start=clock.t + 10_000)


def test_downtime_keeps_long_jobs_off_and_lets_short_jobs_run(server_state, clock):
    setres(server_state, nodes=["n0"], start=clock.t + 100, duration=600)
    long_job = server_state.submit(spec(walltime=3600), ME)[0]
    why = server_state.start(long_job.id, ("n0",))
    assert "outside reservations 'system.1'" in why
    assert long_job.state is JobState.QUEUED
    short = server_state.submit(spec(walltime=50), ME)[0]
    assert server_state.start(short.id, ("n0",)) is None
    # On a node with a reserved and a free CPU, a long job gets the free one.
    setres(server_state, cpus=1, start=clock.t + 100, duration=600, name="half")
    half = server_state.reservations.get("half").alloc[0]
    assert half.node == "n1"
    assert server_state.start(long_job.id, ("n1",)) is None
    assert set(long_job.alloc[0].cpus).isdisjoint(half.cpus)


def test_jobs_inside_a_reservation_use_its_cpus_in_its_window(server_state, clock):
    setres(server_state, cpus=1, users=["root"], start=clock.t + 100, name="mine")
    cpus = server_state.reservations.get("mine").alloc[0]
    with pytest.raises(NotFound, match="unknown reservation"):
        server_state.submit(spec(advres="other"), ME)
    with pytest.raises(InfeasibleRequest, match="longer than"):
        server_state.submit(spec(walltime=3600, advres="mine"), ME)
    with pytest.raises(InfeasibleRequest, match="do not fit"):
        server_state.submit(spec(cpus=2, advres="mine"), ME)
    (job,) = server_state.submit(spec(advres="mine"), ME)
    assert "starts at" in server_state.start(job.id, (cpus.node,))
    clock.t += 100
    other = "n0" if cpus.node == "n1" else "n1"
    assert "of reservation 'mine'" in server_state.start(job.id, (other,))
    assert server_state.start(job.id, (cpus.node,)) is None
    assert job.alloc[0].cpus == cpus.cpus
    snap = server_state.snapshot()
    assert snap.running[0].advres == "mine"
    assert snap.reservations[0].users == ("root",)


def test_only_listed_users_and_no_one_for_downtime(server_state, clock):
    setres(server_state, cpus=1, name="down")
    with pytest.raises(PermissionDenied, match="downtime"):
        server_state.submit(spec(advres="down"), ME)
    setres(server_state, cpus=1, users=["root"], name="roots")
    nobody = Caller(uid=65534, gid=65534, pid=2)
    with pytest.raises(PermissionDenied, match="is for root"):
        server_state.submit(spec(advres="roots"), nobody)


def test_boundaries_announce_start_and_end_and_cancel_orphans(server_state, clock):
    setres(server_state, cpus=1, users=["root"], start=clock.t + 10, duration=100)
    (job,) = server_state.submit(spec(walltime=50, advres="root.1"), ME)
    assert server_state.reservations.next_boundary(clock.t) == clock.t + 10
    server_state.events.clear()
    clock.t += 10
    booking.tick(server_state)
    assert [t for t, _ in server_state.events] == ["reservations/root.1/started"]
    clock.t += 100
    booking.tick(server_state)
    assert server_state.reservations.get("root.1") is None
    assert job.result is JobResult.CANCELLED and "ended" in job.comment
    assert "reservations/root.1/ended" in [t for t, _ in server_state.events]


def test_release_cancels_pending_jobs_and_survives_reload(server_state, clock):
    setres(server_state, cpus=1, users=["root"], name="keep")
    setres(server_state, cpus=1, users=["root"], name="drop", start=clock.t + 5)
    (job,) = server_state.submit(spec(advres="drop"), ME)
    released = booking.release(server_state, ["drop"])
    assert released[0][1] == [job.id] and job.result is JobResult.CANCELLED
    with pytest.raises(NotFound):
        booking.release(server_state, ["drop"])
    server_state.store.commit()
    again = ServerState(server_state.store, clock=clock)
    assert [r.name for r in again.reservations] == ["keep"]
    assert again.reservations.get("keep").alloc == (
        server_state.reservations.get("keep").alloc
    )


def test_policy_choice_is_validated_stored_and_sent_with_wakes(tmp_path):
    clock = Clock()
    store = Store(tmp_path / "db.sqlite")
    state = ServerState(store, clock=clock)
    assert state.policy.name == "easy"
    with pytest.raises(InvalidArgument, match="unknown policy 'nope'"):
        booking.set_policy(state, "nope", {}, "root")
    with pytest.raises(InvalidArgument, match="bad parameters"):
        booking.set_policy(state, "fifo", {"depth": 3}, "root")
    booking.set_policy(state, "FIFO", {}, "root")
    assert state.policy.name == "fifo" and state.policy.set_by == "root"
    assert ("sched/policy", state.events[-1][1]) == state.events[-1]
    state.scheduler = b"sched"
    wake = state.take_wake()
    assert wake is not None and wake.policy == "fifo"
    store.commit()
    assert ServerState(store, clock=clock).policy.name == "fifo"
    store.close()
