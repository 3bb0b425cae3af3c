"""Malleable jobs in the simulator: SD-Policy's schedules, by hand and at random."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch.core.resize import RuntimeModel
from minibatch.core.snapshot import (
    ClusterSnapshot,
    Plan,
    ReservationView,
    Resize,
    Start,
)
from minibatch.errors import InvalidArgument
from minibatch.policy.backfill import Easy
from minibatch.policy.sd import SlowdownDriven
from minibatch.sim.engine import PlanRejected, Simulator
from minibatch.sim.experiments import describe_all
from minibatch.sim.machine import Machine
from minibatch.sim.malleable import make_malleable, parse_fraction, parse_range
from minibatch.sim.paper_sd import synthetic
from tests.conftest import trace_job


def mall(id, submit, run, procs, low=None, high=None, req=None, machine=None):
    job = trace_job(id, submit, run, procs, req=req, machine=machine)
    rng = (low or procs, high or procs)
    return msgspec.structs.replace(
        job, request=msgspec.structs.replace(job.request, malleable=rng)
    )


def by_id(outcomes):
    return {o.job.id: o for o in outcomes}


def test_a_guest_runs_on_a_lent_cpu_and_its_mate_grows_back():
    m = Machine.pool(4)
    jobs = [
        mall(1, 0, 100, 2, 1, 2, machine=m),
        mall(2, 0, 100, 2, 1, 2, machine=m),
        mall(3, 1, 10, 2, 1, 2, machine=m),
    ]
    easy = by_id(Simulator(Easy(), m, jobs).run())
    assert (easy[3].start, easy[3].end) == (100, 110)
    sd = by_id(Simulator(SlowdownDriven(), m, jobs).run())
    # Job 3 starts at once on one CPU: 10 s of work at half speed ends at 21.
    assert (sd[3].start, sd[3].end, sd[3].guest) == (1, 21, True)
    # Its mate lost 10 s of work at half speed, then grew back: ends at 110.
    mate, other = (sd[1], sd[2]) if sd[1].resizes else (sd[2], sd[1])
    assert (mate.end, mate.resizes) == (110, 2)
    assert (other.end, other.resizes) == (100, 0)
    ideal = Simulator(SlowdownDriven(), m, jobs, runtime_model=RuntimeModel.WORST)
    assert [o.end for o in ideal.run()] == [o.end for o in sd.values()]


def test_idle_cpus_make_a_malleable_job_faster():
    m = Machine.pool(4)
    jobs = [mall(1, 0, 100, 2, 1, 4, machine=m)]
    (grown,) = Simulator(SlowdownDriven(), m, jobs).run()
    assert (grown.end, grown.resizes) == (50, 0)  # started on all four CPUs
    (rigid,) = Simulator(SlowdownDriven(expand=False), m, jobs).run()
    assert (rigid.end, rigid.resizes) == (100, 0)
    # It grows when a job ends, even with nothing waiting: 10 s on two CPUs,
    # then 90 s of work on four.
    jobs = [trace_job(1, 0, 10, 2, machine=m), mall(2, 0, 100, 2, 1, 4, machine=m)]
    later = by_id(Simulator(SlowdownDriven(), m, jobs).run())[2]
    assert (later.end, later.resizes) == (55, 1)


class Cheat:
    """Proposes what the resource manager would refuse."""

    name = "cheat"

    def __init__(self, plan) -> None:
        self.make = plan

    def plan(self, snap: ClusterSnapshot) -> Plan:
        return self.make(snap) if snap.pending else Plan(generation=snap.generation)


@pytest.mark.parametrize(
    ("decide", "message"),
    [
        (lambda s: [Resize(1, 5)], "more than 2"),
        (lambda s: [Resize(1, 0)], "fewer than 1"),
        (lambda s: [Resize(9, 1)], "not running"),
    ],
)
def test_resizes_the_server_would_refuse_are_policy_bugs(decide, message):
    m = Machine.pool(4)
    jobs = [mall(1, 0, 100, 2, 1, 2, machine=m), mall(2, 5, 10, 4, machine=m)]

    def plan(snap: ClusterSnapshot) -> Plan:
        if snap.now == 0:
            return Easy().plan(snap)
        return Plan(generation=snap.generation, resizes=decide(snap))

    with pytest.raises(PlanRejected, match=message):
        Simulator(Cheat(plan), m, jobs).run()


def test_a_guest_below_its_minimum_is_a_policy_bug():
    m = Machine.pool(2)
    jobs = [mall(1, 0, 100, 2, 1, 2, machine=m), mall(2, 5, 10, 2, 2, 2, machine=m)]

    def plan(snap: ClusterSnapshot) -> Plan:
        if snap.now < 5:
            return Plan(generation=snap.generation, starts=[Start(1, ("pool",))])
        return Plan(
            generation=snap.generation,
            resizes=[Resize(1, 1, guest=2)],
            starts=[Start(2, ("pool",), ppn=1)],
        )

    with pytest.raises(PlanRejected, match="fewer than 2"):
        Simulator(Cheat(plan), m, jobs).run()


def test_choosing_malleable_jobs_is_deterministic():
    m = Machine.pool(64)
    jobs = [trace_job(i, i, 10, 1 + i % 16, machine=m) for i in range(1000)]
    half = make_malleable(jobs, m, 0.5)
    chosen = [j.id for j in half if j.request.malleable]
    assert chosen == [j.id for j in make_malleable(jobs, m, 0.5) if j.request.malleable]
    assert 400 < len(chosen) < 600
    assert all(
        j.request.malleable == (math.ceil(j.request.ppn / 2), j.request.ppn)
        for j in half
        if j.request.malleable
    )
    wide = make_malleable(jobs, m, 1.0, (0.5, 2.0))
    assert all(j.request.malleable[1] == 2 * j.request.ppn for j in wide)
    assert make_malleable(jobs, m, 0.0) == jobs
    assert parse_fraction("all") == 1.0 and parse_fraction("0.25") == 0.25
    with pytest.raises(InvalidArgument):
        parse_fraction("2")
    assert parse_range("0.5,2") == (0.5, 2.0)
    with pytest.raises(InvalidArgument):
        parse_range("1.5,1")


workloads = st.lists(
    st.tuples(
        st.integers(0, 50),  # submit
        st.integers(1, 60),  # run
        st.integers(1, 8),  # procs
        st.integers(0, 30),  # requested time beyond the run
        st.booleans(),  # malleable
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, st.sampled_from([1, 2]), st.booleans())
def test_sd_schedules_are_valid_and_complete(specs, mates, expand):
    m = Machine.pool(8)
    jobs = []
    for i, (submit, run, procs, extra, malleable) in enumerate(specs, start=1):
        if malleable:
            job = mall(i, submit, run, procs, 1, 8, req=run + extra, machine=m)
        else:
            job = trace_job(i, submit, run, procs, req=run + extra, machine=m)
        jobs.append(job)
    outcomes = Simulator(SlowdownDriven(mates=mates, expand=expand), m, jobs).run()
    # The engine checked every start and resize against free CPUs; every job
    # ran; a rigid one for exactly its trace run time, a malleable one between
    # its work on its most CPUs and on its fewest.
    for o in outcomes:
        assert o.start >= o.job.submit
        req, took = o.job.request, o.end - o.start
        if req.malleable is None:
            assert took == pytest.approx(o.job.run_time)
        else:
            low, high = req.malleable
            assert took <= o.job.run_time * req.ppn / low + 1e-6
            assert took >= o.job.run_time * req.ppn / high - 1e-6


def test_the_synthetic_workload_of_the_sd_experiment():
    jobs = synthetic(7, jobs=2000)
    assert jobs == synthetic(7, jobs=2000)
    assert {j.procs for j in jobs} <= {1, 2, 4, 8, 16, 32, 64}
    assert all(j.req_time >= j.run_time for j in jobs)
    offered = sum(j.procs * j.run_time for j in jobs) / (128 * jobs[-1].submit)
    assert 0.8 < offered < 1.25
    assert all(j.req_time == j.run_time for j in synthetic(7, 100, exact=True))
    assert "sd" in describe_all()


def lend_at_one(mate_cpus: int):
    """Start job 1 at 0; at 1, start job 2 on CPUs job 1 lends, down to
    ``mate_cpus``."""

    def plan(snap: ClusterSnapshot) -> Plan:
        if snap.now == 0:
            return Plan(generation=snap.generation, starts=[Start(1, ("pool",))])
        return Plan(
            generation=snap.generation,
            resizes=[Resize(1, mate_cpus, guest=2)],
            starts=[Start(2, ("pool",))],
        )

    return plan


def test_growth_keeps_out_of_downtimes_as_the_server_does():
    m = Machine.pool(4)
    jobs = [
        mall(1, 0, 100, 4, 2, 4, req=100, machine=m),
        mall(2, 1, 25, 2, 1, 2, req=50, machine=m),
    ]
    down = ReservationView(name="down", start=105, end=400, nodes=(("pool", 2),))

    plan = lend_at_one(mate_cpus=2)
    out = by_id(Simulator(Cheat(plan), m, jobs, reservations=[down]).run())
    # When job 2 ends, job 1 does not grow back: on four CPUs it would still
    # run at 105, where the downtime leaves two.
    assert out[1].resizes == 1 and out[2].guest
    assert out[1].end == 1 + 99 * 2  # its work at half speed from t=1


def test_a_shrink_into_a_downtime_is_a_policy_bug():
    m = Machine.pool(4)
    jobs = [
        mall(1, 0, 100, 4, 1, 4, req=100, machine=m),
        mall(2, 1, 25, 3, 1, 3, req=50, machine=m),
    ]
    down = ReservationView(name="down", start=120, end=400, nodes=(("pool", 4),))

    with pytest.raises(PlanRejected, match="run into a downtime"):
        Simulator(Cheat(lend_at_one(mate_cpus=1)), m, jobs, reservations=[down]).run()
