"""What a submission becomes before it is queued: queues, walltime defaults and
limits, features, GPUs, start times, array limits and output names."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from minibatch.config import Config, QueueConfig
from minibatch.core.job import (
    Dependency,
    DependKind,
    JobOptions,
    JobRequest,
    JobSpec,
    JobState,
)
from minibatch.errors import InfeasibleRequest, InvalidArgument, PermissionDenied
from minibatch.server.nodes import Node
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller
from minibatch.server.views import snapshot
from tests.conftest import Clock

ME = Caller(uid=1000, gid=1000, pid=1)

CONFIG = Config(
    queue=[
        QueueConfig(name="batch"),
        QueueConfig(name="short", default_walltime="00:05:00", max_walltime=600),
        QueueConfig(name="vip", priority=10.0, users=["boss"]),
        QueueConfig(name="shut", enabled=False),
        QueueConfig(name="paused", started=False),
    ],
    features={"n0": ["bigmem"]},
    gpus={"n1": 2},
)


@pytest.fixture
def state(tmp_path: Path) -> ServerState:
    return make_state(tmp_path, CONFIG)


def make_state(tmp_path: Path, config: Config) -> ServerState:
    store = Store(tmp_path / "db.sqlite")
    for i in range(2):
        store.put_node(Node(name=f"n{i}", cpus=[2 * i, 2 * i + 1], pid=100 + i))
    store.commit()
    state = ServerState(store, clock=Clock(), config=config)
    for node in state.nodes.nodes.values():
        node.up, node.route = True, f"route-{node.name}".encode()
    return state


def spec(**kw) -> JobSpec:
    options = kw.pop("options", JobOptions())
    request = kw.pop("request", JobRequest())
    return JobSpec(
        name="j", workdir="/w", request=request, argv=["true"], options=options, **kw
    )


def test_queue_resolution_and_notes(state: ServerState):
    notes: list[str] = []
    (job,) = state.submit(spec(queue="nowhere"), ME, notes)
    assert job.queue == "batch" and "queue nowhere does not exist" in notes[0]
    (job,) = state.submit(spec(queue="gpu,short", walltime_given=False), ME, notes)
    assert job.queue == "short"
    with pytest.raises(InvalidArgument, match="closed to new jobs"):
        state.submit(spec(queue="shut"), ME)
    with pytest.raises(PermissionDenied, match="may not submit to queue 'vip'"):
        state.submit(spec(queue="vip"), ME)


def test_queue_walltime_default_and_limit(state: ServerState):
    (job,) = state.submit(spec(queue="short", walltime_given=False), ME)
    assert job.request.walltime == 300
    (job,) = state.submit(spec(queue="batch", walltime_given=False), ME)
    assert job.request.walltime == JobRequest().walltime
    with pytest.raises(InvalidArgument, match="exceeds queue 'short'"):
        state.submit(spec(queue="short", request=JobRequest(walltime=700)), ME)


def test_strict_refuses_unknown_queue_and_feature(tmp_path: Path):
    state = make_state(tmp_path, msgspec.structs.replace(CONFIG, strict=True))
    with pytest.raises(InvalidArgument, match="unknown queue 'nowhere'"):
        state.submit(spec(queue="nowhere"), ME)
    with pytest.raises(InvalidArgument, match="no node has feature fast"):
        state.submit(spec(options=JobOptions(features=["fast"])), ME)
    assert not state.jobs


def test_features_and_gpus(state: ServerState):
    notes: list[str] = []
    (job,) = state.submit(
        spec(options=JobOptions(features=["fast", "bigmem"])), ME, notes
    )
    assert job.options.features == ["bigmem"] and "feature fast" in notes[0]
    assert state.start(job.id, ("n1",)) == "node n1 lacks feature bigmem"
    assert state.start(job.id, ("n0",)) is None
    (gpu,) = state.submit(spec(request=JobRequest(gpus=2)), ME)
    assert state.start(gpu.id, ("n1",)) is None and gpu.alloc[0].gpus == [0, 1]
    with pytest.raises(InfeasibleRequest, match="3 gpus per node"):
        state.submit(spec(request=JobRequest(gpus=3)), ME)
    with pytest.raises(InfeasibleRequest, match="features bigmem"):
        state.submit(
            spec(request=JobRequest(nodes=2), options=JobOptions(features=["bigmem"])),
            ME,
        )


def test_begin_time_waits_then_queues(state: ServerState):
    now = state.clock()
    (job,) = state.submit(spec(options=JobOptions(begin=now + 60)), ME)
    assert job.state is JobState.WAITING and "not before" in job.reason
    state.begin_due()
    assert job.state is JobState.WAITING
    state.clock.t += 61  # type: ignore[attr-defined]
    state.begin_due()
    assert job.state is JobState.QUEUED


def test_queue_order_and_stopped_queues(state: ServerState):
    low = state.submit(spec(options=JobOptions(priority=-5)), ME)[0]
    high = state.submit(spec(options=JobOptions(priority=5)), ME)[0]
    boss = Caller(uid=0, gid=0, pid=1)  # root may use any queue
    vip = state.submit(spec(queue="vip"), boss)[0]
    paused = state.submit(spec(queue="paused"), ME)[0]
    order = [p.id for p in snapshot(state, state.clock()).pending]
    assert order == [vip.id, high.id, low.id]
    assert paused.id not in order


def test_array_slot_limit_in_snapshots(state: ServerState):
    tasks = state.submit(spec(array=[1, 2, 3], options=JobOptions(array_limit=1)), ME)
    assert [p.id for p in snapshot(state, 0).pending] == [tasks[0].id]
    assert state.start(tasks[0].id, ("n0",)) is None
    assert [p.id for p in snapshot(state, 0).pending] == []


def test_array_dependencies_expand_to_tasks(state: ServerState):
    tasks = state.submit(spec(array=[1, 2]), ME)
    first = tasks[0].id
    (job,) = state.submit(
        spec(depends=[Dependency(DependKind.AFTEROK, first, True)]), ME
    )
    assert [d.job for d in job.depends] == [t.id for t in tasks]
    assert not any(d.whole_array for d in job.depends)
    (one,) = state.submit(
        spec(depends=[Dependency(DependKind.AFTEROK, first, task=2)]), ME
    )
    assert [d.job for d in one.depends] == [tasks[1].id]
    # In Slurm an array's id stands for all its tasks.
    slurm = JobOptions(slurm=True)
    (s,) = state.submit(
        spec(depends=[Dependency(DependKind.AFTEROK, first)], options=slurm), ME
    )
    assert [d.job for d in s.depends] == [t.id for t in tasks]


def test_output_names_per_tool(state: ServerState):
    slurm = JobOptions(slurm=True)
    tasks = state.submit(
        spec(
            array=[3],
            stdout_path="/w/%x-%A_%a.%3a.out",
            stderr_path="/w/%u-%j-%N.err",
            options=slurm,
        ),
        ME,
    )
    t = tasks[0]
    assert t.stdout_path == f"/w/j-{t.id}_3.003.out"
    assert t.stderr_path == f"/w/{t.user}-{t.id}-%N.err"  # the node fills in %N
    (d,) = state.submit(spec(stdout_path="/w/logs/", options=slurm), ME)
    assert d.stdout_path == f"/w/logs/slurm-{d.id}.out"
    pbs = state.submit(
        spec(array=[7], stdout_path="/w/o.^array_index^", stderr_path="$PBS_JOBID.err"),
        ME,
    )[0]
    assert pbs.stdout_path == "/w/o.7"
    assert pbs.stderr_path == f"/w/{pbs.array_id}[7].err"
    (d,) = state.submit(spec(stdout_path="/w/logs/"), ME)
    assert d.stdout_path == f"/w/logs/j.o{d.id}"
    # One file named for a whole Torque array: "-<index>" per task, as Torque
    # does; a name that already differs per task is kept.
    tasks = state.submit(
        spec(array=[1, 2], stdout_path="/w/a.log", stderr_path="/w/$PBS_JOBNAME.e"),
        ME,
    )
    assert [t.stdout_path for t in tasks] == ["/w/a.log-1", "/w/a.log-2"]
    assert [t.stderr_path for t in tasks] == ["/w/j.e-1", "/w/j.e-2"]
    null = state.submit(spec(array=[1, 2], stdout_path="/dev/null"), ME)
    assert {t.stdout_path for t in null} == {"/dev/null"}
    keyed = state.submit(spec(array=[4], stdout_path="/w/$PBS_ARRAYID.o"), ME)
    assert keyed[0].stdout_path == "/w/4.o"
    # A directory: each task's default name has its index once, as in Torque.
    logs = state.submit(spec(array=[1, 2], stdout_path="/w/logs/"), ME)
    assert [t.stdout_path for t in logs] == [
        f"/w/logs/j.o{t.array_id}-{i}" for t, i in zip(logs, (1, 2), strict=True)
    ]
    shared = state.submit(spec(array=[1, 2], stdout_path="/w/s.out", options=slurm), ME)
    assert {t.stdout_path for t in shared} == {"/w/s.out"}  # Slurm shares it


def test_memory_no_node_has_is_refused_naming_it(state: ServerState):
    for node in state.nodes.nodes.values():
        node.mem_kb = 1024**2
    with pytest.raises(InfeasibleRequest, match="2048mb of memory .* has 1024mb"):
        state.submit(spec(request=JobRequest(mem_kb=2 * 1024**2)), ME)


def test_tasks_spread_over_nodes_when_no_node_holds_them(state: ServerState):
    notes: list[str] = []
    spread = JobOptions(spread=True, ntasks=4)
    (job,) = state.submit(spec(request=JobRequest(ppn=4), options=spread), ME, notes)
    assert (job.request.nodes, job.request.ppn) == (2, 2)
    assert "spread over 2 nodes of 2 CPUs" in notes[0]
    (fits,) = state.submit(spec(request=JobRequest(ppn=2), options=spread), ME)
    assert (fits.request.nodes, fits.request.ppn) == (1, 2)  # one node holds it
    with pytest.raises(InfeasibleRequest):
        state.submit(spec(request=JobRequest(ppn=4)), ME)  # -N 1 -n 4: no
    # sbatch -n 4 --mem=100M: Slurm's --mem is per node, on each of the two;
    # Torque's procs=4,mem=100mb is the whole job's, split over them.
    per_node = JobOptions(spread=True, ntasks=4, mem_per_node=True)
    mb100 = JobRequest(ppn=4, mem_kb=100 << 10)
    (slurm,) = state.submit(spec(request=mb100, options=per_node), ME)
    (torque,) = state.submit(spec(request=mb100, options=spread), ME)
    assert (slurm.request.nodes, slurm.request.mem_kb) == (2, 200 << 10)
    assert (torque.request.nodes, torque.request.mem_kb) == (2, 100 << 10)


@pytest.mark.parametrize("argv", [[], [""], ["", "x"], ["  "], ["\t"]])
def test_an_empty_command_is_refused_at_submission(state: ServerState, argv):
    """``qsub -- ''`` is refused in one line, not queued to fail at its start
    with 'Permission denied' (found by a new-user trial)."""
    with pytest.raises(InvalidArgument, match="empty command"):
        state.submit(msgspec.structs.replace(spec(), argv=argv), ME)
    assert not state.jobs


def test_array_tasks_over_the_limit_say_so(state: ServerState):
    """``-t 1-4%2``: the tasks the limit holds back name it (squeue:
    JobArrayTaskLimit), not "waiting for the scheduler" (found by a new-user
    trial); the first ones within it do not."""
    from minibatch.cli.slurmfmt import reason_code

    tasks = state.submit(
        spec(array=[1, 2, 3, 4], options=JobOptions(array_limit=2)), ME
    )
    assert state.start(tasks[0].id, ("n0",)) is None
    for task in tasks[1:]:
        state.explain(task)
    assert "array limit" not in tasks[1].reason
    for task in tasks[2:]:
        assert (
            task.reason
            == f"array limit: at most 2 tasks of {task.array_id}[] run at once"
        )
        assert reason_code(task) == "JobArrayTaskLimit"
