"""QOS validation and limits, fairshare usage and PSP accuracy in the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from minibatch.config import Config, FairshareConfig, QosConfig
from minibatch.core.job import JobRequest, JobResult, JobSpec, JobState
from minibatch.core.snapshot import Plan
from minibatch.errors import InvalidArgument
from minibatch.server import dispatch
from minibatch.server.nodes import Node
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller
from tests.conftest import Clock, validate

ALICE = Caller(uid=0, gid=0, pid=1)
CONFIG = Config(
    default_qos="normal",
    qos=[
        QosConfig(name="normal"),
        QosConfig(name="high", priority=100.0),
        QosConfig(name="debug", max_walltime="00:10:00", max_jobs_per_user=1),
    ],
    fairshare=FairshareConfig(interval=3600.0, depth=2, decay=0.5),
)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[ServerState]:
    store = Store(tmp_path / "db.sqlite")
    store.put_node(Node(name="n0", cpus=[0, 1, 2, 3], pid=1))
    store.commit()
    s = ServerState(store, clock=Clock(7200.0), config=CONFIG)
    for node in s.nodes.nodes.values():
        node.up, node.route = True, b"r"
    yield s
    validate(s)
    store.close()


def spec(walltime: int = 60, **kw) -> JobSpec:
    request = JobRequest(walltime=walltime)
    return JobSpec(name="j", workdir="/tmp", request=request, argv=["x"], **kw)


def test_qos_is_validated_at_submission_and_defaults(state: ServerState):
    # Unknown: the default QOS, with a note (a refusal under strict = true).
    notes: list[str] = []
    (gold,) = state.submit(spec(qos="gold"), ALICE, notes)
    assert gold.qos == "normal" and "QOS gold does not exist here" in notes[0]
    assert "debug, high" in notes[0]
    state.cancel(gold)
    state.queues.strict = True
    with pytest.raises(InvalidArgument, match="unknown QOS 'gold'.*debug, high"):
        state.submit(spec(qos="gold"), ALICE)
    state.queues.strict = False
    with pytest.raises(InvalidArgument, match="exceeds the maximum of QOS 'debug'"):
        state.submit(spec(walltime=3600, qos="debug"), ALICE)
    assert list(state.jobs) == []
    (job,) = state.submit(spec(), ALICE)
    assert job.qos == "normal"
    assert state.snapshot().qos["high"].priority == 100.0
    with pytest.raises(InvalidArgument, match="exceeds"):
        state.alter(state.submit(spec(qos="debug"), ALICE)[0], None, 3600, None)


def test_max_jobs_per_user_blocks_the_rest(state: ServerState):
    first, second = (state.submit(spec(qos="debug"), ALICE)[0] for _ in range(2))
    assert state.start(first.id, ("n0",)) is None
    assert [p.id for p in state.snapshot().pending] == []
    assert "blocked by QOS 'debug'" in state.start(second.id, ("n0",))
    state.explain(second)
    assert second.reason.startswith("blocked by QOS 'debug': 1 running job per user")
    state.job_ended(first, JobResult.COMPLETED, end_time=7300.0)
    assert [p.id for p in state.snapshot().pending] == [second.id]


def test_a_lifted_qos_limit_stops_the_servers_shortcut(state: ServerState):
    # Alice's second debug job was left out of the plan (blocked); when her
    # first ends it may outrank the plan's upcoming job, so only a pass decides.
    first, second = (state.submit(spec(qos="debug"), ALICE)[0] for _ in range(2))
    (other,) = state.submit(spec(), ALICE)
    snap = state.snapshot()
    assert state.start(first.id, ("n0",)) is None
    plan = Plan(
        generation=snap.generation, upcoming=[other.id], upcoming_by_submission=True
    )
    state.queue.take_notes(plan, snap.now)
    state.job_ended(first, JobResult.COMPLETED, end_time=7300.0)
    assert dispatch.start_upcoming(state) == []
    assert second.state is other.state is JobState.QUEUED


def test_fairshare_and_accuracy_follow_finished_jobs(state: ServerState):
    clock = state.clock
    assert isinstance(clock, Clock)
    (job,) = state.submit(spec(walltime=400), ALICE)
    state.start(job.id, ("n0",))
    clock.t += 100
    state.job_ended(job, JobResult.COMPLETED, end_time=clock.t)
    snap = state.snapshot()
    assert snap.fairshare.users == {"root": pytest.approx(100.0)}
    assert snap.accuracy == {"root": (0.25,)}
    # A later window halves it (decay 0.5); recomputed when the window rolls.
    clock.t += 3600
    assert state.snapshot().fairshare.users["root"] == pytest.approx(50.0)
    state.store.commit()
    again = ServerState(state.store, clock=clock, config=CONFIG)
    assert again.snapshot().fairshare.users["root"] == pytest.approx(50.0)
    assert again.snapshot().accuracy == {"root": (0.25,)}


def test_bad_qos_and_fairshare_config_are_refused():
    with pytest.raises(InvalidArgument, match="default_qos"):
        Config(default_qos="x").check()
    with pytest.raises(InvalidArgument, match="unique"):
        Config(qos=[QosConfig(name="a"), QosConfig(name="a")]).check()
    with pytest.raises(InvalidArgument, match="FSDEPTH"):
        Config(fairshare=FairshareConfig(depth=30)).check()
    with pytest.raises(InvalidArgument, match="policy must be one of"):
        msgspec.convert({"fairshare": {"policy": "bogus"}}, Config).check()
