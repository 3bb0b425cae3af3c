"""FIFO and EASY on hand-made snapshots: what starts, what waits, and why, and
what the plan says starts next."""

from __future__ import annotations

import msgspec

from minibatch.core.snapshot import Start
from minibatch.policy.backfill import Backfill, Easy
from minibatch.policy.fifo import Fifo
from minibatch.policy.pbsfifo import PbsFifo
from tests.conftest import snapshot


def started(plan) -> list[int]:
    return [s.job for s in plan.starts]


def test_fifo_starts_in_order_and_stops_at_first_blocked():
    snap = snapshot(
        [4], running=[(1, 2, 0, 100)], pending=[(2, 2, 10), (3, 4, 10), (4, 1, 10)]
    )
    plan = Fifo().plan(snap)
    assert plan.starts == [Start(2, ("n0",))]
    assert plan.reasons[3].startswith("waiting for 4 CPUs")
    assert 4 not in plan.reasons
    assert plan.default_reason == "queued behind job 3 (fifo)"


def test_easy_backfills_short_job_that_ends_before_shadow():
    # 4 CPUs; job 1 holds 2 until t=100. Head (job 2) needs 4 -> shadow 100.
    snap = snapshot(
        [4], running=[(1, 2, 0, 100)], pending=[(2, 4, 50), (3, 1, 50), (4, 1, 200)]
    )
    plan = Easy().plan(snap)
    assert started(plan) == [3]  # ends at 50 <= 100; job 4 would delay the head
    assert plan.predicted[2] == 100
    assert "reserved to start in" in plan.reasons[2]
    assert "would delay job 2" in plan.reasons[4]


def test_easy_backfills_long_job_on_extra_cpus():
    # Two nodes of 4; job 1 holds all of n0 until 100. Head needs 4 -> n0 at 100.
    # n1 is idle: a long job fits on extra CPUs the head will not use.
    snap = snapshot(
        [4, 4], running=[(1, 4, 0, 100), (5, 4, 0, 500)], pending=[(2, 4, 50)]
    )
    assert started(Easy().plan(snap)) == []
    snap = snapshot(
        [4, 2], running=[(1, 4, 0, 100)], pending=[(2, 4, 50), (3, 2, 1000)]
    )
    plan = Easy().plan(snap)
    assert plan.starts == [Start(3, ("n1",))]
    assert plan.predicted[2] == 100


def test_easy_overrunning_job_counts_as_ending_now():
    snap = snapshot([2], running=[(1, 2, 0, 10)], pending=[(2, 2, 10)], now=50)
    plan = Easy().plan(snap)
    assert plan.predicted[2] == 50


def test_easy_is_fifo_when_nothing_can_backfill():
    snap = snapshot([2], pending=[(1, 1, 10), (2, 1, 10), (3, 1, 10)])
    assert started(Easy().plan(snap)) == [1, 2]


def test_plans_name_the_head_of_the_queue_as_upcoming():
    # 2 CPUs free: jobs 1 and 2 start; the rest, in order, are what starts next.
    snap = snapshot([2], pending=[(1, 1, 10), (2, 1, 10), (3, 2, 10), (4, 1, 10)])
    assert Easy().plan(snap).upcoming == []  # not asked for (the simulator)
    snap = msgspec.structs.replace(snap, upcoming=8)
    for policy in (Fifo(), Easy(), Backfill(depth="all"), PbsFifo()):
        plan = policy.plan(snap)
        assert started(plan) == [1, 2], policy.name
        assert plan.upcoming == [3, 4], policy.name


def test_upcoming_is_bounded_and_leaves_out_reservation_jobs():
    pending = [(i, 1, 10) for i in range(1, 101)]
    snap = snapshot([1], running=[(0, 1, 0, 100)], pending=pending)
    snap = msgspec.structs.replace(snap, upcoming=32)
    plan = Easy().plan(snap)
    assert plan.upcoming == list(range(1, 33))
    inside = msgspec.structs.replace(snap.pending[0], advres="r1")
    snap = msgspec.structs.replace(snap, pending=(inside, *snap.pending[1:3]))
    assert Fifo().plan(snap).upcoming == [2, 3]
