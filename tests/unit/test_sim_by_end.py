"""The running jobs by end (``ClusterSnapshot.running_by_end``), a derived index
the simulator keeps between passes: at every pass it must be the snapshot's
running jobs in order of start + requested time, and a policy must plan the
same with it as with the index rebuilt from scratch, or with none."""

from __future__ import annotations

from typing import ClassVar

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan, RunningView
from minibatch.policy.backfill import Conservative, Easy
from minibatch.sim import downtime
from minibatch.sim.backlog import Backlog
from minibatch.sim.downtime import Downtime
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.runner import SimConfig, load
from minibatch.sim.swf import find_trace
from tests.conftest import trace_job as tj
from tests.unit.test_sim_malleable import mall
from tests.unit.test_sim_properties import workloads


def end_of(r: RunningView) -> float:
    return r.start_time + r.walltime


class Checked:
    """EASY, checking the index at every pass; ``index`` says what it plans
    with: the simulator's index, one sorted from scratch, or none."""

    name: ClassVar[str] = "checked"
    needs = frozenset({"running_by_end"})

    def __init__(self, index: str = "kept") -> None:
        self.inner = Easy()
        self.index = index
        self.seen = 0

    def plan(self, snap: ClusterSnapshot) -> Plan:
        kept = snap.running_by_end
        if kept is not None:
            self.seen += 1
            assert [end_of(r) for r in kept] == sorted(map(end_of, snap.running))
            assert sorted(kept, key=lambda r: r.id) == sorted(
                snap.running, key=lambda r: r.id
            )
        if self.index == "rebuilt":
            rebuilt = sorted(snap.running, key=end_of)
            snap = msgspec.structs.replace(snap, running_by_end=rebuilt)
        elif self.index == "none":
            snap = msgspec.structs.replace(snap, running_by_end=None)
        return self.inner.plan(snap)


@settings(max_examples=100, deadline=None)
@given(
    workloads(),
    st.booleans(),
    st.one_of(st.none(), st.tuples(st.integers(0, 150), st.integers(1, 60))),
)
def test_the_index_is_the_running_jobs_by_end_and_changes_no_plan(work, kill, window):
    machine, jobs = work
    resv = () if window is None else downtime.place([Downtime(*window)], machine, 0.0)
    kw = {"kill_at_walltime": kill, "reservations": resv}
    runs = []
    for index in ("kept", "rebuilt", "none"):
        policy = Checked(index)
        runs.append(Simulator(policy, machine, jobs, **kw).run())
        assert policy.seen > 0
    assert runs[0] == runs[1] == runs[2]
    # The same as EASY's own run, with quiet passes skipped.
    assert runs[0] == Simulator(Easy(), machine, jobs, **kw).run()


def test_a_backlog_starts_in_the_index():
    machine = Machine.pool(8)
    running = tuple(
        RunningView(
            id=10 + k,
            user="u",
            nodes=(("pool", 2),),
            mem_kb_per_node=None,
            start_time=0.0,
            walltime=w,
        )
        for k, w in enumerate((300.0, 100.0, 200.0))
    )
    late = tj(1, 50.0, 10.0, 4, machine=machine)
    queued = PendingView(
        id=1, user="u", group="g", request=late.request, submit_time=50.0
    )
    backlog = Backlog(50.0, running, ((queued, late),))
    seen: list[list[int]] = []

    class First(Checked):
        def plan(self, snap: ClusterSnapshot) -> Plan:
            assert snap.running_by_end is not None
            seen.append([r.id for r in snap.running_by_end])
            return super().plan(snap)

    arrival = tj(2, 50.0, 10.0, 1, machine=machine)  # a pass at the backlog's now
    Simulator(First(), machine, [arrival], backlog=backlog).run()
    assert seen[0] == [11, 12, 10]


def test_only_a_policy_that_asks_gets_the_index():
    assert "running_by_end" in Easy().needs
    assert "running_by_end" not in Conservative().needs
    m = Machine.pool(4)
    seen: list[object] = []

    class Indifferent(Checked):
        needs = frozenset()

        def plan(self, snap: ClusterSnapshot) -> Plan:
            seen.append(snap.running_by_end)
            return super().plan(snap)

    Simulator(Indifferent(), m, [tj(1, 0, 10, 2, machine=m), tj(2, 1, 5, 4)]).run()
    assert seen and seen == [None] * len(seen)


def test_no_index_when_limits_move():
    # A malleable job's limit stretches as it is resized: no index to keep.
    m = Machine.pool(4)
    policy = Checked()
    Simulator(policy, m, [mall(1, 0, 10, 2, 1, 2, machine=m), tj(2, 1, 5, 4)]).run()
    assert policy.seen == 0


def test_sdsc_slice_plans_the_same_with_the_index_rebuilt():
    work = load(SimConfig(trace=find_trace("SDSC-SP2-1998-4.2-cln.swf.gz"), limit=3000))
    kept = Simulator(Checked(), work.machine, work.jobs).run()
    rebuilt = Simulator(Checked("none"), work.machine, work.jobs).run()
    assert kept == rebuilt
