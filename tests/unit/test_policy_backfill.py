"""Backfill on hand-made snapshots: EASY's exact semantics, conservative, any
depth between, best fit, a priority order, and parameters."""

from __future__ import annotations

import pytest

from minibatch.errors import InvalidArgument
from minibatch.policy import registry
from minibatch.policy.backfill import Backfill, Conservative, Easy
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from tests.conftest import trace_job
from tests.unit.test_policy_snapshots import GB, Like, job, node, running, snap, started

# ----------------------------------------------------------------- EASY, exactly


def test_easy_head_is_the_first_job_that_does_not_fit():
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100)],
        [job(2, 1, 50), job(3, 4, 50), job(4, 1, 50)],
    )
    plan = Easy().plan(s)
    assert plan.starts == [Like(job=2), Like(job=4)]  # 4 ends at 50 <= 100
    assert plan.predicted == {3: 100.0}
    assert plan.reasons[3] == "waiting for 4 CPUs (1 free); reserved to start in 2 min"


def test_easy_overrunning_job_ends_now():
    # Job 1 should have ended at 10; at 50 the head is reserved for now, and a
    # job that fits now must not take the CPUs the head is promised.
    s = snap([3], [running(1, {"n0": 2}, 0, 10)], [job(2, 3, 10), job(3, 1, 5)], now=50)
    plan = Easy().plan(s)
    assert plan.predicted == {2: 50.0}
    assert started(plan) == []
    assert plan.reasons[3] == "would delay job 2's reservation (walltime too long)"


def test_easy_releases_at_one_instant_are_applied_together():
    # Jobs 1 and 2 both end at 100; the head needs 3 of the 4 CPUs then, so one
    # CPU is extra at the shadow time only if both releases count together.
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100), running(2, {"n0": 1}, 0, 100)],
        [job(3, 4, 10), job(4, 1, 500)],
    )
    # 1 CPU free now; head needs 4 at 100 -> no extra: job 4 (long) must wait.
    assert started(Easy().plan(s)) == []
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100), running(2, {"n0": 1}, 0, 100)],
        [job(3, 3, 10), job(4, 1, 500)],
    )
    # Head needs 3 of 4 at 100: one CPU is extra, job 4 takes it for 500 s.
    plan = Easy().plan(s)
    assert plan.predicted == {3: 100.0}
    assert started(plan) == [4]


def test_easy_backfills_on_extra_resources_of_other_nodes():
    s = snap([4, 2], [running(1, {"n0": 4}, 0, 100)], [job(2, 4, 50), job(3, 2, 1000)])
    plan = Easy().plan(s)
    assert plan.starts == [Like(job=3, nodes=("n1",))]
    assert plan.predicted == {2: 100.0}


def test_easy_reservation_is_recomputed_every_pass():
    # Job 1 asks for 100 s and runs 30: the head's reservation, 100 when it
    # arrives, moves to 30 when job 1 ends; nothing is remembered between passes.
    machine = Machine.pool(4)
    jobs = [trace_job(1, 0, 30, 4, req=100), trace_job(2, 1, 10, 4, req=10)]
    out = {o.job.id: o for o in Simulator(Easy(), machine, jobs).run()}
    assert out[2].predicted == 100.0
    assert out[2].start == 30.0


def test_easy_protects_only_the_head():
    # 1 CPU free; head 2 gets 2 of the 3 CPUs free at 100, so 1 is extra and the
    # long job 4 backfills on it. That delays job 3 (3 CPUs) to 300 under EASY;
    # conservative backfilling reserves job 3 at 200 and keeps job 4 waiting.
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100), running(5, {"n0": 1}, 0, 300)],
        [job(2, 2, 100), job(3, 3, 100), job(4, 1, 500)],
    )
    easy, cons = Easy().plan(s), Conservative().plan(s)
    assert easy.predicted == {2: 100.0}
    assert started(easy) == [4]
    assert cons.predicted == {2: 100.0, 3: 200.0, 4: 300.0}
    assert started(cons) == []


def test_a_job_that_can_never_fit_gets_no_reservation_and_no_depth():
    s = snap(
        [4],
        [running(1, {"n0": 4}, 0, 100)],
        [job(2, 8, 10), job(3, 4, 10), job(4, 1, 200)],
    )
    plan = Easy().plan(s)
    assert 2 not in plan.predicted
    assert plan.reasons[2].endswith("no usable node has room for it now")
    assert plan.predicted == {3: 100.0}  # the reservation went to job 3
    assert plan.default_reason == "queued behind job 3 (no free CPUs)"


def test_easy_plans_memory_and_gpus_too():
    s = snap(
        [node("a", 8, 16 * GB, 1)],
        [running(1, {"a": 1}, 0, 100, mem_kb=12 * GB)],
        [
            job(2, 1, 50, mem_kb=8 * GB),
            job(3, 1, 500, mem_kb=2 * GB),
            job(4, 1, 500, gpus=1),
        ],
    )
    plan = Easy().plan(s)
    # Job 2 waits for memory until 100; job 3's 2 GB are extra then (16-8-2);
    # job 4 needs the node's only GPU, which the head does not: it starts too.
    assert plan.predicted == {2: 100.0}
    assert started(plan) == [3, 4]


def test_no_free_cpu_stops_the_pass_with_one_reason():
    s = snap(
        [2],
        [running(1, {"n0": 2}, 0, 100)],
        [job(2, 2, 10), job(3, 1, 10), job(4, 1, 10)],
    )
    plan = Easy().plan(s)
    assert plan.default_reason == "queued behind job 2 (no free CPUs)"
    assert set(plan.reasons) == {2}


# --------------------------------------------------------------- other depths


def test_conservative_reserves_every_job_and_starts_what_delays_none():
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100)],
        [job(2, 4, 50), job(3, 2, 300), job(4, 1, 100), job(5, 2, 10)],
    )
    plan = Conservative().plan(s)
    # Job 4 fits now and ends by 100; job 3 (300 s) would delay job 2.
    assert started(plan) == [4]
    assert plan.predicted == {2: 100.0, 3: 150.0, 5: 150.0}
    assert plan.reasons[5].endswith("reserved to start in 2 min")


def test_the_reason_names_the_reservation_in_the_way():
    # 8 CPUs, 4 free until 100. Job 2 is reserved on 6 CPUs over [100, 150) and
    # job 3 on all 8 over [150, 200): job 4 (2 CPUs, 160 s) clears job 2 but
    # not job 3.
    s = snap(
        [8],
        [running(1, {"n0": 4}, 0, 100)],
        [job(2, 6, 50), job(3, 8, 50), job(4, 2, 160)],
    )
    plan = Conservative().plan(s)
    assert plan.predicted == {2: 100.0, 3: 150.0, 4: 200.0}
    assert plan.reasons[4].startswith("would delay job 3's reservation")


def test_depth_two_reserves_two_then_backfills():
    s = snap(
        [4],
        [running(1, {"n0": 3}, 0, 100)],
        [job(2, 4, 50), job(3, 4, 50), job(4, 4, 50), job(5, 1, 500)],
    )
    plan = Backfill(depth=2).plan(s)
    assert plan.predicted == {2: 100.0, 3: 150.0}
    assert plan.reasons[4].startswith("waiting for 4 CPUs")
    assert started(plan) == []  # job 5 would delay job 2
    assert Backfill(depth=0).plan(s).starts == [Like(job=5)]  # no reservation


def test_bestfit_starts_the_biggest_candidate_first():
    s = snap(
        [6],
        [running(1, {"n0": 3}, 0, 100)],
        [job(2, 6, 10), job(3, 1, 50), job(4, 2, 50), job(5, 3, 20)],
    )
    assert started(Easy().plan(s)) == [3, 4]
    assert started(Easy(select="bestfit").plan(s)) == [5]  # 3 CPUs, then none fit
    seconds = Backfill(select="bestfit", metric="seconds").plan(s)
    assert started(seconds) == [3, 4]  # 50 s first (job 3 wins the tie), then job 4


def test_order_is_a_priority_function():
    s = snap([2], [], [job(1, 2, 10), job(2, 1, 10), job(3, 1, 10)])

    def newest_first(snapshot):
        return sorted(snapshot.pending, key=lambda j: -j.submit_time)

    plan = Backfill(order=newest_first).plan(s)
    assert started(plan) == [3, 2]
    assert plan.predicted == {1: 10.0}


# ----------------------------------------------------------------- parameters


def test_parameters_accept_strings_and_numbers():
    assert Backfill(depth="3").depth == 3
    assert Backfill(depth="all").depth is None
    assert Backfill(depth=2.0).depth == 2
    assert (
        registry.load("backfill", {"depth": "all", "select": "BestFit"}).depth is None
    )


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({"depth": "deep"}, "depth"),
        ({"depth": -1}, "depth"),
        ({"depth": 1.5}, "depth"),
        ({"select": "random"}, "select"),
        ({"metric": "joy"}, "metric"),
        ({"order": 3}, "order"),
    ],
)
def test_bad_parameters_are_named(params, word):
    with pytest.raises(InvalidArgument, match=f"parameter {word}"):
        Backfill(**params)


def test_unknown_parameter_is_refused_by_the_registry():
    with pytest.raises(InvalidArgument, match="bad parameters for policy 'easy'"):
        registry.load("easy", {"depth": 3})
