"""PSP (seed 000): Table 1 bins, the accuracy history, the order and the policy."""

from __future__ import annotations

import pytest

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, NodeView, PendingView
from minibatch.core.usage import (
    HISTORY,
    AccuracyLedger,
    UsageRecord,
    accuracy,
    accuracy_history,
)
from minibatch.policy.psp import Psp, accuracy_bin, bins, psp_order, user_bin
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob


@pytest.mark.parametrize(
    ("acc", "prio"),
    [
        (0.0, 1),
        (0.1999999, 1),
        (0.2, 2),
        (0.35, 2),  # the paper's example: accuracy 0.35 -> priority 2
        (0.3999999, 2),
        (0.4, 3),
        (0.5999999, 3),
        (0.6, 4),
        (0.7999999, 4),
        (0.8, 5),
        (1.0, 5),  # the last interval is closed
    ],
)
def test_table_1_bins(acc, prio):
    assert accuracy_bin(acc) == prio


def test_accuracy_is_clamped():
    assert accuracy(50, 100) == 0.5
    assert accuracy(150, 100) == 1.0  # an overrun counts as a perfect estimate
    assert accuracy(10, 0) == 1.0
    assert accuracy_bin(1.3) == 5 and accuracy_bin(-1) == 1


def test_history_keeps_the_last_ten_by_end_time():
    records = [
        UsageRecord(id=i, user="u", rate=1, start=0, end=float(100 - i), walltime=100)
        for i in range(15)
    ]
    history = accuracy_history(records)["u"]
    assert len(history) == HISTORY
    # Ends at 100 - i: oldest first means the largest i first; the first 5 ended
    # last (i = 0..4 end at 100..96) and are the newest.
    assert history == tuple((100 - i) / 100 for i in range(9, -1, -1))
    running = UsageRecord(id=99, user="v", rate=1, start=0, end=None, walltime=10)
    assert "v" not in accuracy_history([running])


def test_ledger_view_changes_only_after_a_record():
    ledger = AccuracyLedger()
    first = ledger.view()
    assert first == {} and ledger.view() is first
    ledger.record("u", 30, 100)
    second = ledger.view()
    assert second == {"u": (0.3,)} and ledger.view() is second


def test_user_bin_mean_and_default():
    acc = {"good": (0.9, 0.7), "bad": (0.1,) * 10}
    assert user_bin(acc, "good") == (5, pytest.approx(0.8))
    assert user_bin(acc, "bad") == (1, pytest.approx(0.1))
    assert user_bin(acc, "new") == (3, None)  # no finished job yet: the middle
    assert user_bin(acc, "new", default_bin=1) == (1, None)


def pending(jid: int, user: str, cpus: int = 1) -> PendingView:
    return PendingView(
        id=jid,
        user=user,
        group="g",
        request=JobRequest(ppn=cpus, walltime=100),
        submit_time=float(jid),
    )


def test_order_and_plan():
    snap = ClusterSnapshot(
        now=10.0,
        generation=1,
        nodes=(NodeView(name="n0", cpus=2, free_cpus=1),),
        running=(),
        pending=(
            pending(1, "bad"),
            pending(2, "new"),
            pending(3, "good"),
            pending(4, "bad"),
            pending(5, "good"),
        ),
        accuracy={"good": (0.85,), "bad": (0.05, 0.1)},
    )
    assert bins(snap) == {"bad": 1, "new": 3, "good": 5}
    assert [j.id for j in psp_order(snap)] == [3, 5, 2, 1, 4]
    plan = Psp().plan(snap)
    assert [s.job for s in plan.starts] == [3]
    with pytest.raises(ValueError):
        Psp(default_bin=6)


def test_simulated_psp_learns_from_ended_jobs():
    # One CPU. "sloppy" asks 10x its run time, "exact" asks its run time. After
    # the first two jobs end, the two users queue at the same instant, sloppy
    # first: PSP starts exact's jobs first, plain order would not.
    def tj(jid, user, submit, run, req):
        return TraceJob(
            id=jid,
            user=user,
            group="g",
            queue="q",
            submit=submit,
            run_time=run,
            procs=1,
            req_time=req,
            mem_kb=None,
            request=JobRequest(ppn=1, walltime=req),
        )

    jobs = [tj(1, "sloppy", 0, 10, 100), tj(2, "exact", 0, 10, 10)]
    jobs += [tj(3, "sloppy", 30, 10, 100), tj(4, "exact", 30, 10, 10)]
    jobs += [tj(5, "blocker", 29, 20, 20)]
    starts = {o.job.id: o.start for o in Simulator(Psp(), Machine.pool(1), jobs).run()}
    assert starts[4] < starts[3]
    assert Psp.needs == frozenset({"accuracy"})
