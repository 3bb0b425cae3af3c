"""Downtimes in the simulator: parsed, placed, planned around and enforced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.snapshot import ClusterSnapshot, Plan, Start
from minibatch.errors import InvalidArgument
from minibatch.policy import registry
from minibatch.sim import downtime
from minibatch.sim.downtime import Downtime
from minibatch.sim.engine import PlanRejected, Simulator
from minibatch.sim.machine import Machine
from tests.conftest import trace_job
from tests.unit.test_sim_properties import workloads


def test_parse_accepts_seconds_and_clock_times_and_names_errors():
    assert downtime.parse("86400,4:00:00") == Downtime(86400.0, 14400.0, None)
    assert downtime.parse("0, 60, 8") == Downtime(0.0, 60.0, 8)
    assert downtime.parse("0:00,1:00") == Downtime(0.0, 60.0, None)
    for bad, words in (
        ("86400", "expected START,LENGTH"),
        ("1,2,3,4", "expected START,LENGTH"),
        ("x,60", "malformed duration"),
        ("10,0", "must be positive"),
        ("10,60,0", "CPUS must be a positive integer"),
    ):
        with pytest.raises(InvalidArgument, match=words):
            downtime.parse(bad)


def test_place_takes_cpus_node_by_node_from_the_first_submission():
    machine = Machine.uniform(3, 4)
    (whole,) = downtime.place([Downtime(10, 5)], machine, origin=1000.0)
    assert (whole.name, whole.start, whole.end) == ("down.1", 1010.0, 1015.0)
    assert whole.nodes == (("n0", 4), ("n1", 4), ("n2", 4)) and whole.users == ()
    _, part = downtime.place([Downtime(0, 1), Downtime(1, 1, 6)], machine, 0.0)
    assert part.nodes == (("n0", 4), ("n1", 2))
    with pytest.raises(InvalidArgument, match="machine has 12"):
        downtime.place([Downtime(0, 1, 13)], machine, 0.0)
    with pytest.raises(InvalidArgument, match="down.1 and down.2 overlap"):
        downtime.place([Downtime(0, 10, 4), Downtime(5, 10, 2)], machine, 0.0)
    after = downtime.place([Downtime(0, 10, 4), Downtime(10, 10, 4)], machine, 0.0)
    assert [r.start for r in after] == [0.0, 10.0]  # back to back is fine


@pytest.mark.parametrize("policy", ["fifo", "easy", "conservative", "pbs-fifo"])
def test_policies_plan_around_a_downtime(policy):
    # 4 CPUs, all down over [100, 150). Job 1 (walltime 200) would run into it,
    # so it starts when it ends; job 2 (walltime 50) fits before it.
    machine = Machine.pool(4)
    jobs = [
        trace_job(1, 0, 200, 4, machine=machine),
        trace_job(2, 0, 50, 2, machine=machine),
    ]
    resv = downtime.place([Downtime(100, 50)], machine, 0.0)
    sim = Simulator(registry.load(policy, {}), machine, jobs, reservations=resv)
    starts = {o.job.id: o.start for o in sim.run()}
    assert starts[1] == 150.0
    assert starts[2] == (0.0 if policy != "fifo" else 350.0)


class _Greedy:
    """Starts the queue's head whenever its CPUs are free: blind to downtimes."""

    name = "greedy"

    def plan(self, snap: ClusterSnapshot) -> Plan:
        head = snap.pending[0]
        node = snap.nodes[0]
        if node.free_cpus >= head.request.ppn:
            return Plan(generation=0, starts=[Start(head.id, (node.name,))])
        return Plan(generation=0)


def test_a_start_into_a_downtime_is_a_policy_bug():
    machine = Machine.pool(4)
    jobs = [trace_job(1, 0, 200, 1, machine=machine)]
    resv = downtime.place([Downtime(100, 50, 4)], machine, 0.0)
    with pytest.raises(PlanRejected, match="downtime"):
        Simulator(_Greedy(), machine, jobs, reservations=resv).run()
    # Outside the window, on CPUs it does not hold, the same start is fine.
    resv = downtime.place([Downtime(100, 50, 3)], machine, 0.0)
    (out,) = Simulator(_Greedy(), machine, jobs, reservations=resv).run()
    assert out.start == 0.0


@settings(max_examples=60, deadline=None)
@given(
    workloads(exact=True),
    st.sampled_from(["fifo", "easy", "conservative"]),
    st.integers(0, 150),
    st.integers(1, 100),
    st.floats(0.1, 1.0),
)
def test_no_job_runs_on_cpus_a_downtime_holds(work, policy, start, length, share):
    machine, jobs = work
    cpus = max(1, int(machine.procs * share))
    resv = downtime.place([Downtime(start, length, cpus)], machine, 0.0)
    sim = Simulator(registry.load(policy, {}), machine, jobs, reservations=resv)
    out = sim.run()
    (down,) = resv
    held = dict(down.nodes)
    for node in machine.nodes:
        # At every instant of the window, the node's jobs plus the downtime fit.
        for t in {down.start, *(o.start for o in out)}:
            if not down.start <= t < down.end:
                continue
            busy = sum(
                o.job.request.ppn
                for o in out
                if node.name in o.nodes and o.start <= t < o.end
            )
            assert busy + held.get(node.name, 0) <= node.cpus, (node.name, t)
