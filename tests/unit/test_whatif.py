"""``whatif`` on hand-built snapshots: exact predicted starts under two policies,
what is left out and why, reservations, and the read-only snapshot it is fed."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from minibatch.cli.whatif import render
from minibatch.core.job import JobRequest
from minibatch.core.snapshot import (
    ClusterSnapshot,
    NodeView,
    PendingView,
    ReservationView,
    RunningView,
)
from minibatch.errors import InvalidArgument, PermissionDenied
from minibatch.protocol.scheduling import GetSnapshot, SnapshotReply
from minibatch.server.access import Context
from minibatch.server.handlers import HANDLERS
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller
from minibatch.sim.whatif import WhatIf, whatif

NOW = 1000.0


def node(name: str, cpus: int, free: int | None = None) -> NodeView:
    return NodeView(name=name, cpus=cpus, free_cpus=cpus if free is None else free)


def run(
    id: int, on: dict[str, int], start: float, walltime: float, **kw: Any
) -> RunningView:
    kw.setdefault("user", "u")
    return RunningView(
        id=id,
        nodes=tuple(on.items()),
        mem_kb_per_node=None,
        start_time=start,
        walltime=walltime,
        **kw,
    )


def wait(
    id: int,
    cpus: int,
    walltime: int,
    submit: float,
    nodes: int = 1,
    gpus: int = 0,
    **kw: Any,
) -> PendingView:
    kw.setdefault("user", "u")
    return PendingView(
        id=id,
        group="g",
        request=JobRequest(nodes=nodes, ppn=cpus, walltime=walltime, gpus=gpus),
        submit_time=submit,
        **kw,
    )


def snap(
    nodes: list[NodeView],
    running: list[RunningView] = (),  # type: ignore[assignment]
    pending: list[PendingView] = (),  # type: ignore[assignment]
    reservations: list[ReservationView] = (),  # type: ignore[assignment]
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=NOW,
        generation=1,
        nodes=tuple(nodes),
        running=tuple(running),
        pending=tuple(pending),
        reservations=tuple(reservations),
    )


def starts(result: WhatIf) -> tuple[dict[int, float], dict[int, float]]:
    """(current, other) predicted start by job."""
    return (
        {r.job: r.current for r in result.rows},
        {r.job: r.other for r in result.rows},
    )


def test_easy_backfills_the_small_job_fifo_keeps_behind_the_wide_one() -> None:
    # 4 CPUs, 2 held until 1100; the wide job waits for them, the small one
    # fits in the hole and ends (1050) before the wide one could start.
    s = snap(
        [node("n0", 4, free=2)],
        running=[run(1, {"n0": 2}, start=900.0, walltime=200.0)],
        pending=[wait(2, 4, 100, submit=950.0), wait(3, 2, 50, submit=960.0)],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    assert starts(result) == ({2: 1100.0, 3: 1200.0}, {2: 1100.0, 3: 1000.0})
    assert [(r.job, r.delta) for r in result.rows] == [(2, 0.0), (3, -200.0)]
    # Waits from submission: fifo (150 + 240) / 2, easy (150 + 40) / 2.
    assert result.current_mean_wait == 195.0
    assert result.mean_wait == 95.0
    assert (result.current, result.policy, result.skipped) == ("fifo", "easy", {})


def test_params_reach_the_policy_and_the_current_one_too() -> None:
    s = snap(
        [node("n0", 4, free=2)],
        running=[run(1, {"n0": 2}, start=900.0, walltime=200.0)],
        pending=[wait(2, 4, 100, submit=950.0), wait(3, 2, 50, submit=960.0)],
    )
    result = whatif(s, "backfill", {"depth": "all"}, "backfill", {"depth": 1})
    assert starts(result) == ({2: 1100.0, 3: 1000.0}, {2: 1100.0, 3: 1000.0})
    assert result.params == {"depth": "all"} and result.current_params == {"depth": 1}


def test_a_running_job_past_its_walltime_counts_as_ending_now() -> None:
    s = snap(
        [node("n0", 4, free=0)],
        running=[run(1, {"n0": 4}, start=500.0, walltime=200.0)],
        pending=[wait(2, 4, 100, submit=990.0), wait(3, 4, 100, submit=995.0)],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    assert starts(result) == ({2: 1000.0, 3: 1100.0}, {2: 1000.0, 3: 1100.0})
    assert result.current_mean_wait == result.mean_wait == (10.0 + 105.0) / 2


def test_the_queue_keeps_the_snapshot_order_not_the_id_order() -> None:
    # Job 5 was queued later but ranks first (its queue's priority).
    s = snap(
        [node("n0", 2)],
        pending=[
            wait(5, 2, 100, submit=20.0, queue_priority=10.0),
            wait(3, 2, 100, submit=10.0),
        ],
    )
    result = whatif(s, "fifo", {}, "fifo", {})
    assert [r.job for r in result.rows] == [5, 3]
    assert starts(result)[0] == {5: 1000.0, 3: 1100.0}


def test_jobs_the_simulator_cannot_place_are_left_out_with_the_reason() -> None:
    s = snap(
        [node("n0", 2)],  # n1 is down: not in the snapshot
        running=[run(1, {"n1": 2}, start=900.0, walltime=1000.0)],
        pending=[
            wait(2, 2, 100, submit=900.0, nodes=2),
            wait(3, 1, 100, submit=901.0, gpus=1),
            wait(4, 1, 100, submit=902.0, features=("bigmem",)),
            wait(5, 1, 100, submit=903.0, advres="r1"),
            wait(6, 2, 100, submit=904.0),
        ],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    # The job on the down node holds nothing: job 6 starts now.
    assert starts(result) == ({6: 1000.0}, {6: 1000.0})
    assert set(result.skipped) == {2, 3, 4, 5}
    assert "no set of the nodes up now" in result.skipped[2]
    assert "GPUs or node features" in result.skipped[3]
    assert "GPUs or node features" in result.skipped[4]
    assert "reservation 'r1'" in result.skipped[5]


def test_a_downtime_is_planned_around_and_one_begun_before_now_counts() -> None:
    maint = ReservationView(name="maint", start=1050.0, end=1150.0, nodes=(("n0", 4),))
    s = snap(
        [node("n0", 4)],
        pending=[wait(2, 4, 100, submit=990.0), wait(3, 2, 40, submit=995.0)],
        reservations=[maint],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    assert starts(result) == ({2: 1150.0, 3: 1250.0}, {2: 1150.0, 3: 1000.0})
    begun = ReservationView(name="old", start=900.0, end=1050.0, nodes=(("n0", 4),))
    over = ReservationView(name="gone", start=100.0, end=200.0, nodes=(("n0", 4),))
    s = snap([node("n0", 4)], pending=[wait(2, 4, 100, submit=990.0)])
    s = msgspec.structs.replace(s, reservations=(begun, over))
    assert starts(whatif(s, "easy", {}, "fifo", {}))[0] == {2: 1050.0}


def test_a_user_reservation_keeps_its_cpus_less_what_its_jobs_hold() -> None:
    # 2 of n0's 4 CPUs are alice's until 2000; her job inside holds 1 until
    # 1050. Bob's jobs may use the other 2 only.
    resv = ReservationView(
        name="r", start=900.0, end=2000.0, nodes=(("n0", 2),), users=("alice",)
    )
    s = snap(
        [node("n0", 4, free=3)],
        running=[
            run(1, {"n0": 1}, start=950.0, walltime=100.0, user="alice", advres="r")
        ],
        pending=[
            wait(2, 3, 100, submit=960.0, user="bob"),
            wait(3, 2, 100, submit=970.0, user="bob"),
            wait(4, 1, 100, submit=980.0, user="alice", advres="r"),
        ],
        reservations=[resv],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    assert starts(result) == ({2: 2000.0, 3: 2100.0}, {2: 2000.0, 3: 1000.0})
    assert list(result.skipped) == [4]


def test_usage_aware_policies_plan_a_backlog() -> None:
    s = snap(
        [node("n0", 4, free=1), node("n1", 4, free=4)],
        running=[
            run(1, {"n0": 3}, start=900.0, walltime=300.0, user="a", group="g"),
        ],
        pending=[
            wait(2, 4, 100, submit=950.0, user="a"),
            wait(3, 4, 100, submit=960.0, user="b"),
            wait(4, 1, 100, submit=970.0, user="b"),
        ],
    )
    result = whatif(s, "fairshare", {}, "maui", {})
    assert [r.job for r in result.rows] == [2, 3, 4]
    for r in result.rows:
        assert r.current >= NOW and r.other >= NOW


def test_nothing_waiting() -> None:
    s = snap([node("n0", 2, free=0)], running=[run(1, {"n0": 2}, 900.0, 100.0)])
    result = whatif(s, "easy", {}, "fifo", {})
    assert result.rows == [] and result.current_mean_wait is None
    assert render(result).splitlines() == ["fifo (current) vs easy: 0 waiting jobs"]


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nosuch", {}, "unknown policy 'nosuch'"),
        ("easy", {"bogus": 1}, "bad parameters for policy 'easy'"),
        ("os:system", {}, "policies are chosen by name"),
    ],
)
def test_bad_policy_or_parameters(name: str, params: dict, message: str) -> None:
    s = snap([node("n0", 2)], pending=[wait(2, 1, 10, submit=990.0)])
    with pytest.raises(InvalidArgument, match=message):
        whatif(s, name, params, "fifo", {})


def test_render_and_json() -> None:
    s = snap(
        [node("n0", 4, free=2)],
        running=[run(1, {"n0": 2}, start=900.0, walltime=200.0)],
        pending=[
            wait(2, 4, 100, submit=950.0),
            wait(3, 2, 50, submit=960.0, user="bob"),
            wait(7, 1, 50, submit=970.0, advres="r9"),
        ],
    )
    result = whatif(s, "easy", {}, "fifo", {})
    lines = render(result).splitlines()
    assert lines[0] == "fifo (current) vs easy: 2 waiting jobs"
    assert lines[1].split() == [
        "job", "user", "cpus", "start", "(fifo)", "start", "(easy)", "difference"
    ]  # fmt: skip
    assert lines[3].split() == [
        "2",
        "u",
        "4",
        "in",
        "00:01:40",
        "in",
        "00:01:40",
        "same",
    ]
    assert lines[4].split() == ["3", "bob", "2", "in", "00:03:20", "now", "-00:03:20"]
    assert lines[5].split() == ["mean", "wait", "fifo", "00:03:15"]
    assert lines[6].split() == ["mean", "wait", "easy", "00:01:35", "(-00:01:40)"]
    assert lines[7] == "left out: job 7: runs inside reservation 'r9'"
    data = json.loads(json.dumps(msgspec.to_builtins(result)))
    assert data["rows"][1] == {
        "job": 3,
        "user": "bob",
        "cpus": 2,
        "submit": 960.0,
        "current": 1200.0,
        "other": 1000.0,
        "delta": -200.0,
    }
    assert data["skipped"] == {"7": "runs inside reservation 'r9'"}


# ------------------------------------------------- the snapshot it is fed

ME = Caller(uid=1000, gid=1000, pid=1)
ROOT = Caller(uid=0, gid=0, pid=2)
CTX = Context(owner_uid=0)


def test_any_user_may_peek_and_nothing_changes(server_state: ServerState) -> None:
    state = server_state
    before = (state.plan_pending_since, state.snapshot_time, state.generation)
    reply = HANDLERS[GetSnapshot](state, CTX, ME, b"", GetSnapshot(peek=True))
    assert isinstance(reply, SnapshotReply)
    assert [n.name for n in reply.snapshot.nodes] == ["n0", "n1"]
    assert reply.policy == state.policy.name
    assert (state.plan_pending_since, state.snapshot_time, state.generation) == before


def test_only_the_scheduler_takes_the_snapshot_of_a_pass(
    server_state: ServerState,
) -> None:
    state = server_state
    with pytest.raises(PermissionDenied):
        HANDLERS[GetSnapshot](state, CTX, ME, b"", GetSnapshot())
    assert state.plan_pending_since is None
    HANDLERS[GetSnapshot](state, CTX, ROOT, b"", GetSnapshot())
    assert state.plan_pending_since is not None
