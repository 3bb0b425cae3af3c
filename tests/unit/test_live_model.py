"""The live model: what the server says, then events, in the order they arrive."""

from __future__ import annotations

from typing import Any

from minibatch.core.job import Allocation, Job, JobRequest, JobState
from minibatch.live.model import LiveCluster, describe
from minibatch.protocol.messages import NodeInfo

T0 = 1_000_000.0


def job(
    id: int, state: JobState, alloc: dict[str, list[int]] | None = None, **kw: Any
) -> Job:
    return Job(
        id=id,
        name=f"j{id}",
        user="alice",
        uid=1000,
        gid=1000,
        group="alice",
        workdir="/tmp",
        request=JobRequest(ppn=2, walltime=600),
        submit_time=T0 + id,
        state=state,
        alloc=[Allocation(n, c) for n, c in (alloc or {}).items()],
        **kw,
    )


def node(name: str, cpus: list[int], state: str = "free") -> NodeInfo:
    return NodeInfo(
        name=name, state=state, cpus=cpus, free_cpus=cpus, mem_kb=None, jobs={}
    )


def event(id: int, kind: str, state: str, at: float, **kw: Any) -> dict[str, Any]:
    return {"id": str(id), "event": kind, "state": state, "time": at, "name": f"j{id}",
            "user": "alice", "result": None, "exit_status": None, **kw}  # fmt: skip


def loaded() -> LiveCluster:
    m = LiveCluster(history=60.0)
    m.load(
        [
            job(1, JobState.RUNNING, {"n0": [0, 1]}, start_time=T0 + 5),
            job(2, JobState.QUEUED, reason="waiting for 2 CPUs"),
            job(3, JobState.QUEUED, predicted_start=T0 + 600),
        ],
        [node("n0", [0, 1, 2, 3]), node("n1", [0, 1])],
        at=T0 + 10,
        order=[3, 2],
        policy="easy",
    )
    return m


def test_load_gives_cells_and_the_policys_order() -> None:
    m = loaded()
    assert m.cells("n0") == [(0, "1"), (1, "1"), (2, None), (3, None)]
    assert [j.id for j in m.queue()] == ["3", "2"]
    assert m.queue()[1].reason == "waiting for 2 CPUs"
    assert m.queue()[0].predicted_start == T0 + 600
    assert [j.id for j in m.running()] == ["1"] and m.busy_cpus() == 2
    assert m.policy == "easy" and not m.stale


def test_events_the_load_already_covers_are_ignored() -> None:
    m = loaded()
    # Published before the load was asked for: the load shows it, or later.
    m.apply("jobs/2/submitted", event(2, "submitted", "queued", T0 + 2), T0 + 11)
    m.apply("jobs/9/started", event(9, "started", "running", T0 + 9), T0 + 11)
    assert "9" not in m.jobs  # ended since, else the load would list it
    m.apply("jobs/8/finished", event(8, "finished", "finished", T0 + 9), T0 + 11)
    assert [j.id for j in m.ended()] == ["8"]
    # Newer: applied.
    m.apply(
        "jobs/2/started",
        event(2, "started", "running", T0 + 12, alloc={"n0": [2, 3]}),
        T0 + 12,
    )
    assert m.cells("n0") == [(0, "1"), (1, "1"), (2, "2"), (3, "2")]
    assert [j.id for j in m.queue()] == ["3"]


def test_a_resize_moves_cells_and_an_end_frees_them() -> None:
    m = loaded()
    m.apply(
        "jobs/1/resized",
        event(1, "resized", "running", T0 + 20, alloc={"n0": [0, 1, 2]}),
        T0 + 20,
    )
    assert [owner for _, owner in m.cells("n0")] == ["1", "1", "1", None]
    m.apply(
        "jobs/1/finished",
        event(1, "finished", "finished", T0 + 30, result="completed", exit_status=0,
              alloc={"n0": [0, 1, 2]}, end_time=T0 + 30),
        T0 + 30,
    )  # fmt: skip
    assert all(owner is None for _, owner in m.cells("n0"))
    assert m.ended()[0].result == "completed"


def test_a_submission_a_pass_or_a_new_node_asks_for_a_load() -> None:
    m = loaded()
    m.apply("jobs/7/submitted", event(7, "submitted", "queued", T0 + 20), T0 + 20)
    assert m.stale and m.queue()[-1].id == "7"  # unranked: last until the load
    m.stale = False
    m.apply("sched/pass", {"time": T0 + 21, "policy": "easy", "started": 1,
            "backfilled": 1, "reserved": 2, "pending": 3, "duration_ms": 0.5,
            "generation": 4, "resized": 0, "rejected": 0}, T0 + 21)  # fmt: skip
    assert m.stale and m.last_pass() is not None
    assert (m.last_pass().started, m.last_pass().backfilled) == (1, 1)  # type: ignore[union-attr]
    m.stale = False
    m.apply("nodes/n2/state", {"name": "n2", "state": "free", "time": T0}, T0 + 22)
    assert m.stale and m.nodes["n2"].cpus == []
    m.apply("nodes/n1/state", {"name": "n1", "state": "offline", "time": T0}, T0 + 22)
    assert m.nodes["n1"].state == "offline"


def test_samples_count_usable_cpus_and_forget_the_old() -> None:
    m = loaded()
    m.sample(T0 + 10)
    assert m.samples[-1] == (T0 + 10, 2, 6)
    m.apply("nodes/n1/state", {"name": "n1", "state": "down", "time": T0}, T0 + 11)
    m.apply(
        "jobs/8/finished",
        event(8, "finished", "finished", T0 + 12, end_time=T0 + 12),
        T0 + 12,
    )
    m.sample(T0 + 12)
    assert m.samples[-1] == (T0 + 12, 2, 4)
    m.sample(T0 + 100)  # 60 s of history
    assert [s[0] for s in m.samples] == [T0 + 100]
    assert m.ended() == []


def test_a_policy_switch_and_reservations() -> None:
    m = loaded()
    m.apply("sched/policy", {"name": "maui", "params": {"x": 1}, "set_by": "root"}, 1)
    assert (m.policy, m.params) == ("maui", {"x": 1})
    resv = {"name": "r1", "start": T0, "end": T0 + 60, "nodes": {"n0": [0]}}
    m.apply("reservations/r1/created", resv, T0)
    assert m.reservations["r1"]["end"] == T0 + 60
    m.apply("reservations/r1/ended", resv, T0 + 60)
    assert m.reservations == {}
    assert [line.kind for line in m.log] == ["sched", "resv", "resv"]


def test_describe_reads_like_a_log() -> None:
    assert describe(
        "jobs/7/started",
        event(7, "started", "running", T0, alloc={"n0": [0, 1, 2, 5]}, detail="x"),
    ) == ("job", "job 7 (j7, alice) started on n0:0-2,5")
    assert describe(
        "jobs/7/finished",
        event(7, "finished", "finished", T0, result="failed", exit_status=3,
              detail="failed"),
    ) == ("job", "job 7 (j7, alice) finished, failed, exit 3")  # fmt: skip
    passed = {"policy": "easy", "started": 2, "backfilled": 1, "reserved": 1,
              "pending": 5, "duration_ms": 1.234}  # fmt: skip
    assert describe("sched/pass", passed) == (
        "sched",
        "pass easy: 2 started (1 backfilled), 1 reserved, 5 pending, 1.2 ms",
    )
    assert describe("sched/policy", {"name": "fifo", "set_by": "bob"}) == (
        "sched",
        "policy fifo by bob",
    )
    assert describe("nodes/n0/state", {"name": "n0", "state": "down"}) == (
        "node",
        "node n0 is down",
    )
