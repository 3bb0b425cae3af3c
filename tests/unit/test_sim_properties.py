"""Properties of every simulated schedule, checked on random workloads.

Each run goes through ``jobs.csv`` (written and read back), so the file itself is
what is checked: no node ever holds more CPUs than it has, no job starts before it
is submitted, every job runs exactly as long as the trace says.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from tempfile import TemporaryDirectory

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.metrics.records import JobRecord, from_outcomes, read_csv, write_csv
from minibatch.policy.backfill import Easy
from minibatch.policy.fifo import Fifo
from minibatch.sim.baseline import bare_schedule
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    if draw(st.booleans()):
        return Machine.pool(draw(st.integers(1, 16)))
    return Machine.uniform(draw(st.integers(1, 3)), draw(st.integers(1, 6)))


@st.composite
def workloads(draw: st.DrawFn, exact: bool = False) -> tuple[Machine, list[TraceJob]]:
    machine = draw(machines())
    count = draw(st.integers(1, 30))
    jobs = []
    for i in range(count):
        procs = draw(st.integers(1, machine.procs))
        run = draw(st.integers(1, 60))
        # Requests from a fifth of the run (overruns) to four times it.
        req = run if exact else max(1, run * draw(st.integers(1, 20)) // 5)
        request = machine.request(procs, None, req)
        if request is None:
            continue
        jobs.append(
            TraceJob(
                id=i + 1,
                user=f"u{draw(st.integers(0, 3))}",
                group="g",
                queue="1",
                submit=float(draw(st.integers(0, 120))),
                run_time=float(run),
                procs=procs,
                req_time=float(req),
                mem_kb=None,
                request=request,
            )
        )
    return machine, jobs


def through_csv(records: list[JobRecord]) -> list[JobRecord]:
    with TemporaryDirectory() as d:
        path = Path(d) / "jobs.csv"
        write_csv(path, records)
        return read_csv(path)


def assert_valid(
    machine: Machine, jobs: list[TraceJob], rows: list[JobRecord], kill: bool
):
    by_id = {j.id: j for j in jobs}
    assert sorted(r.job for r in rows) == sorted(by_id)
    capacity = {n.name: n.cpus for n in machine.nodes}
    steps: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        job = by_id[r.job]
        assert r.start >= r.submit == job.submit
        expected = min(job.run_time, job.request.walltime) if kill else job.run_time
        assert r.run_time == expected
        assert len(r.nodes) == job.request.nodes == len(set(r.nodes))
        for name in r.nodes:
            steps[name][r.start] += job.request.ppn
            steps[name][r.end] -= job.request.ppn
    for name, changes in steps.items():
        held = 0
        # Ends sort before starts at one instant (negative steps first).
        for when in sorted(changes):
            held += changes[when]
            assert 0 <= held <= capacity[name], f"{name} over-allocated at {when}"


@SETTINGS
@given(workloads(), st.sampled_from(["fifo", "easy"]), st.booleans())
def test_no_over_allocation_no_early_start_exact_run_times(work, policy, kill):
    machine, jobs = work
    pol = Fifo() if policy == "fifo" else Easy()
    outcomes = Simulator(pol, machine, jobs, kill_at_walltime=kill).run()
    assert_valid(machine, jobs, through_csv(from_outcomes(outcomes)), kill)


@SETTINGS
@given(workloads())
def test_fifo_starts_jobs_in_queue_order(work):
    machine, jobs = work
    out = Simulator(Fifo(), machine, jobs).run()
    in_order = sorted(out, key=lambda o: (o.job.submit, o.job.id))
    starts = [o.start for o in in_order]
    assert starts == sorted(starts)


@SETTINGS
@given(workloads(exact=True))
def test_easy_with_exact_estimates_keeps_every_prediction(work):
    # Exact estimates: running jobs end when the policy expects, and a backfilled
    # job never delays the head, so the head starts exactly at its shadow time.
    machine, jobs = work
    out = Simulator(Easy(), machine, jobs).run()
    for o in out:
        if o.predicted is not None:
            assert o.start == o.predicted


@SETTINGS
@given(workloads(), st.booleans())
def test_flat_pool_schedule_equals_the_bare_loop(work, easy):
    machine, jobs = work
    if len(machine.nodes) != 1:
        # The same jobs on one pool of as many processors.
        machine = Machine.pool(machine.procs)
        jobs = [
            msgspec.structs.replace(
                j, request=machine.request(j.procs, None, int(j.req_time))
            )
            for j in jobs
        ]
    policy = Easy() if easy else Fifo()
    starts = {o.job.id: o.start for o in Simulator(policy, machine, jobs).run()}
    assert starts == bare_schedule(jobs, machine.procs, easy)


@SETTINGS
@given(workloads())
def test_a_run_is_deterministic(work):
    machine, jobs = work
    first = Simulator(Easy(), machine, jobs).run()
    again = Simulator(Easy(), machine, list(reversed(jobs))).run()
    assert first == again
