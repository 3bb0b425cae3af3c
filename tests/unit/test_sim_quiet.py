"""Quiet passes (minibatch.sim.quiet): skipping them changes nothing at all."""

from __future__ import annotations

from typing import ClassVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.policy import registry
from minibatch.policy.backfill import Backfill, Conservative, Easy
from minibatch.policy.base import Policy
from minibatch.policy.fifo import Fifo
from minibatch.sim import downtime
from minibatch.sim.downtime import Downtime
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.quiet import prediction_reach
from minibatch.sim.runner import MachineSpec, SimConfig, load
from minibatch.sim.swf import MemoryUnit, TraceJob, find_trace
from tests.conftest import trace_job as tj
from tests.unit.test_sim_properties import workloads


def smallest_first(snap: ClusterSnapshot) -> list[PendingView]:
    return sorted(snap.pending, key=lambda p: (p.request.cpus, p.submit_time, p.id))


#: Policies whose predictions the engine knows, and some it must not guess.
POLICIES: dict[str, Policy] = {
    "fifo": Fifo(),
    "easy": Easy(),
    "depth 2": Backfill(depth=2),
    "conservative": Conservative(),
    "easy, smallest first": Easy(order=smallest_first),
    "easy, best fit": Easy(select="bestfit"),
    "pbs-fifo": registry.load("pbs-fifo"),
    "maui": registry.load("maui"),
    "psp": registry.load("psp"),
}


@st.composite
def with_memory(draw: st.DrawFn) -> tuple[Machine, list[TraceJob]]:
    """Jobs on nodes with memory: CPUs free may not be enough to start."""
    machine = Machine.uniform(draw(st.integers(1, 3)), draw(st.integers(1, 6)), 1000)
    jobs = []
    for i in range(draw(st.integers(1, 30))):
        procs = draw(st.integers(1, machine.procs))
        run = draw(st.integers(1, 60))
        mem = draw(st.sampled_from([None, 100, 400, 900]))
        req = max(1, run * draw(st.integers(1, 8)) // 4)
        request = machine.request(procs, mem, req)
        if request is not None:
            job = tj(i + 1, draw(st.integers(0, 120)), run, procs, req=req)
            jobs.append(msgspec.structs.replace(job, request=request, mem_kb=mem))
    return machine, jobs


def both(policy: Policy, machine: Machine, jobs: list[TraceJob], **kw):
    """The same simulation with quiet passes skipped, then with every pass."""
    skipping = Simulator(policy, machine, jobs, **kw)
    every = Simulator(policy, machine, jobs, skip_quiet=False, **kw)
    return skipping, skipping.run(), every, every.run()


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(workloads(), with_memory()),
    st.sampled_from(sorted(POLICIES)),
    st.booleans(),
    st.one_of(st.none(), st.tuples(st.integers(0, 150), st.integers(1, 60))),
)
def test_skipping_quiet_passes_changes_no_start_end_or_prediction(
    work, name, kill, window
):
    machine, jobs = work
    resv = () if window is None else downtime.place([Downtime(*window)], machine, 0.0)
    kw = {"kill_at_walltime": kill, "reservations": resv}
    skipping, fast, every, slow = both(POLICIES[name], machine, jobs, **kw)
    assert fast == slow  # every Outcome: start, end, nodes, predicted start
    assert every.stats.quiet == 0
    assert skipping.stats.passes + skipping.stats.quiet == every.stats.passes


class Spy:
    """EASY, remembering the instants it planned at (the engine cannot know
    whom it predicts for)."""

    name: ClassVar[str] = "spy"

    def __init__(self) -> None:
        self.inner = Easy()
        self.times: list[float] = []

    def plan(self, snap: ClusterSnapshot) -> Plan:
        self.times.append(snap.now)
        return self.inner.plan(snap)


def test_a_pass_that_can_start_nothing_and_predicts_nothing_new_is_skipped():
    machine = Machine.pool(4)
    jobs = [
        tj(1, 0, 100, 3, machine=machine),
        tj(2, 10, 50, 4, machine=machine),  # the head: planned for its prediction
        tj(3, 20, 10, 2, machine=machine),  # 1 CPU free: no start, not the head
        tj(4, 30, 10, 1, machine=machine),  # fits the free CPU: backfilled
    ]
    sim = Simulator(Easy(), machine, jobs)
    out = sim.run()
    # Quiet: t=20 (job 3 arrives behind the head) and t=40 (job 4's end
    # frees 1 CPU, and every queued job needs more).
    assert (sim.stats.passes, sim.stats.quiet) == (5, 2)
    assert out == Simulator(Easy(), machine, jobs, skip_quiet=False).run()
    # Under a policy the engine knows nothing of, an arrival's pass runs (it
    # may predict its start); the end at t=40 is still skipped.
    spy = Spy()
    sim = Simulator(spy, machine, jobs)
    sim.run()
    assert spy.times == [0, 10, 20, 30, 100, 150] and sim.stats.quiet == 1


def test_malleable_jobs_turn_quiet_passes_off():
    machine = Machine.pool(4)
    job = tj(2, 10, 10, 2, machine=machine)
    flexible = msgspec.structs.replace(
        job, request=msgspec.structs.replace(job.request, malleable=(1, 2))
    )
    sim = Simulator(Easy(), machine, [tj(1, 0, 100, 4, machine=machine), flexible])
    sim.run()
    assert sim.stats.quiet == 0


def test_prediction_reach_of_the_built_in_policies():
    assert prediction_reach(Fifo()) == 0
    assert prediction_reach(Easy()) == 1
    assert prediction_reach(Backfill(depth=3)) == 3
    assert prediction_reach(Backfill(depth=0)) == 0
    for unknown in (
        Conservative(),  # predicts for every job
        Easy(order=smallest_first),  # its head may be a new arrival
        Easy(select="bestfit"),
        Fifo(order=smallest_first),
        registry.load("pbs-fifo"),
        Spy(),
    ):
        assert prediction_reach(unknown) is None


@pytest.mark.parametrize(
    ("trace", "machines", "policy", "limit"),
    [
        ("SDSC-SP2-1998-4.2-cln.swf.gz", None, "easy", 5000),
        ("SDSC-SP2-1998-4.2-cln.swf.gz", None, "fifo", 5000),
        ("SDSC-SP2-1998-4.2-cln.swf.gz", None, "conservative", 1500),
        ("MetaCentrum-wagap-2013.alea.swf.gz", "alea", "easy", 3000),
    ],
)
def test_real_traces_give_the_same_outcomes_with_quiet_passes_skipped(
    trace, machines, policy, limit
):
    path = find_trace(trace)
    spec = MachineSpec()
    unit = MemoryUnit.KB_PER_PROC
    if machines:  # 68 nodes with memory: nodes and memory decide what fits
        spec = MachineSpec(machines_file=str(path).replace(".swf.gz", ".swf.machines"))
        unit = MemoryUnit.BYTES_PER_JOB
    work = load(SimConfig(trace=str(path), machine=spec, limit=limit, mem_unit=unit))
    skipping, fast, _, slow = both(registry.load(policy), work.machine, work.jobs)
    assert fast == slow
    assert skipping.stats.quiet > 0
