"""Advance reservations, for every policy: other jobs keep off a reservation's
CPUs during its window, jobs inside one run only on its CPUs and in its window,
and a downtime reservation blocks everyone."""

from __future__ import annotations

import pytest

from minibatch.core.snapshot import ReservationView
from minibatch.policy import registry
from tests.unit.test_policy_snapshots import job, running, snap, started

POLICIES = ["fifo", "pbs-fifo", "easy", "conservative", "bb", "ibb"]

# n0 has 4 CPUs; alice holds 2 of them from 100 to 200.
ALICE = ReservationView(
    name="alice", start=100, end=200, nodes=(("n0", 2),), users=("alice",)
)
DOWN = ReservationView(name="maint", start=100, end=200, nodes=(("n0", 4),))


def plan(policy: str, *args, **kwargs):
    return registry.load(policy).plan(snap(*args, **kwargs))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_that_would_run_into_a_reservation_does_not_start(policy):
    p = plan(policy, [4], [], [job(1, 3, 150)], reservations=[ALICE])
    assert started(p) == []
    assert "reservation 'alice'" in p.reasons[1]


@pytest.mark.parametrize("policy", POLICIES)
def test_jobs_beside_or_before_a_reservation_start(policy):
    assert started(plan(policy, [4], [], [job(1, 4, 100)], reservations=[ALICE])) == [1]
    assert started(plan(policy, [4], [], [job(1, 2, 500)], reservations=[ALICE])) == [1]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_inside_a_reservation_waits_for_its_window(policy):
    early = plan(
        policy,
        [4],
        [],
        [job(1, 2, 50, user="alice", advres="alice")],
        reservations=[ALICE],
    )
    assert started(early) == []
    if policy in ("easy", "conservative", "bb", "ibb"):
        assert early.predicted == {1: 100.0}
    inside = plan(
        policy,
        [4],
        [],
        [job(1, 2, 50, user="alice", advres="alice")],
        now=120,
        reservations=[ALICE],
    )
    assert started(inside) == [1]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_inside_a_reservation_uses_only_its_cpus_and_window(policy):
    # 3 CPUs is more than alice holds; 150 s would end after the window.
    wide = job(1, 3, 10, user="alice", advres="alice")
    long = job(2, 1, 150, user="alice", advres="alice")
    p = plan(policy, [4], [], [wide, long], now=120, reservations=[ALICE])
    assert started(p) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_who_may_not_use_a_reservation_does_not(policy):
    p = plan(
        policy,
        [4],
        [],
        [
            job(1, 1, 10, user="bob", advres="alice"),
            job(2, 1, 10, advres="nope"),
            job(3, 1, 10, advres="maint"),
        ],
        now=120,
        reservations=[ALICE, DOWN],
    )
    assert started(p) == []
    assert p.reasons[1] == "bob may not use reservation 'alice'"
    assert p.reasons[2] == "reservation 'nope' does not exist or has ended"
    assert p.reasons[3] == "reservation 'maint' is a downtime: no job may use it"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_downtime_blocks_everyone(policy):
    p = plan(policy, [4, 4], [], [job(1, 1, 150)], reservations=[DOWN])
    assert p.starts[0].nodes == ("n1",)
    p = plan(policy, [4], [], [job(1, 1, 150)], reservations=[DOWN])
    assert started(p) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_jobs_running_inside_a_reservation_hold_its_cpus_not_others(policy):
    # At 120 a job of alice's holds 1 of her 2 CPUs: 1 is left for her, 2 for others.
    inside = running(9, {"n0": 1}, 110, 50, advres="alice", user="alice")
    p = plan(policy, [4], [inside], [job(1, 3, 10)], now=120, reservations=[ALICE])
    assert started(p) == []
    p = plan(policy, [4], [inside], [job(1, 2, 10)], now=120, reservations=[ALICE])
    assert started(p) == [1]
    p = plan(
        policy,
        [4],
        [inside],
        [job(1, 2, 10, user="alice", advres="alice")],
        now=120,
        reservations=[ALICE],
    )
    assert started(p) == []
    p = plan(
        policy,
        [4],
        [inside],
        [job(1, 1, 10, user="alice", advres="alice")],
        now=120,
        reservations=[ALICE],
    )
    assert started(p) == [1]


def test_easy_reserves_the_head_around_a_reservation():
    # 4 CPUs, alice takes 2 over [100, 200): a 3-CPU job of 150 s fits only
    # from 200; a 1-CPU job of 90 s backfills before the window.
    p = plan("easy", [4], [], [job(1, 3, 150), job(2, 1, 90)], reservations=[ALICE])
    assert p.predicted == {1: 200.0}
    assert started(p) == [2]


def test_a_reservation_over_a_job_that_already_runs_there():
    # The reservation was made while job 5 ran on all of n0 until 150 (the
    # server would not, but a policy must not trust that): alice's job waits.
    p = plan(
        "easy",
        [4],
        [running(5, {"n0": 4}, 0, 150)],
        [job(1, 2, 40, user="alice", advres="alice")],
        now=120,
        reservations=[ALICE],
    )
    assert started(p) == []
    assert p.predicted == {1: 150.0}
