"""Fairshare targets, Δ, caps, diagnose rows, and the ``fairshare`` policy."""

from __future__ import annotations

import pytest

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import (
    ClusterSnapshot,
    FairshareView,
    NodeView,
    PendingView,
    RunningView,
)
from minibatch.policy.fairshare import (
    Fairshare,
    FairshareTargets,
    FsTarget,
    TargetKind,
    delta,
    fairshare_rows,
    parse_target,
)
from minibatch.policy.priority import PriorityWeights, breakdown
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob


def job(jid: int, user: str, cpus: int = 1, wall: int = 100, **kw) -> PendingView:
    return PendingView(
        id=jid,
        user=user,
        group=kw.pop("group", "g"),
        request=JobRequest(ppn=cpus, walltime=wall),
        submit_time=float(kw.pop("submit", jid)),
        **kw,
    )


NO_USAGE = FairshareView()


def snap(pending, fairshare=NO_USAGE, free=1, cpus=4, running=()):
    return ClusterSnapshot(
        now=1000.0,
        generation=1,
        nodes=(NodeView(name="n0", cpus=cpus, free_cpus=free),),
        running=tuple(running),
        pending=tuple(pending),
        fairshare=fairshare,
    )


def test_parse_targets():
    assert parse_target("50") == FsTarget(50.0)
    assert parse_target("10+") == FsTarget(10.0, TargetKind.FLOOR)
    assert parse_target("20-") == FsTarget(20.0, TargetKind.CEILING)
    assert parse_target("1e6^") == FsTarget(1e6, TargetKind.CAP)
    assert parse_target("30%") == FsTarget(30.0, TargetKind.PERCENT_CAP)
    assert parse_target("equal") == FsTarget(None)
    assert str(parse_target("10+")) == "10+"
    for bad in ("x", "-5", "equal^"):
        with pytest.raises(ValueError):
            parse_target(bad)


def test_delta_floor_ceiling_cap():
    assert delta(parse_target("50"), 45, 0) == 5
    assert delta(parse_target("50"), 60, 0) == -10
    assert delta(parse_target("10+"), 25, 0) == 0  # a floor only boosts
    assert delta(parse_target("10+"), 5, 0) == 5
    assert delta(parse_target("20-"), 5, 0) == 0  # a ceiling only penalises
    assert delta(parse_target("20-"), 35, 0) == -15
    assert delta(parse_target("5^"), 0, 0) == 0  # caps never touch priority
    assert delta(None, 70, 0) == 0  # no target: no effect
    assert delta(parse_target("equal"), 10, 25.0) == 15


def test_maui_guide_worked_example():
    # 5.1.2.2: FSWEIGHT 100, user 10, group 20, account 30; user 50 vs 45 %,
    # no group target, account 25 vs 35 %  ->  100 * (10*5 + 30*(-10)) = -25,000.
    fs = FairshareView(
        users={"john": 45.0, "rest": 55.0},
        groups={"staff": 100.0},
        accounts={"chem": 35.0, "phys": 65.0},
    )
    weights = PriorityWeights(
        fspolicy="DEDICATEDPS",
        fsweight=100,
        fsuserweight=10,
        fsgroupweight=20,
        fsaccountweight=30,
        queuetimeweight=0,
        enable_neg_priority=True,
        fstargets=FairshareTargets(users={"john": "50"}, accounts={"chem": "25"}),
    )
    j = job(1, "john", group="staff", account="chem")
    parts = breakdown(j, snap([j], fs), weights)
    assert parts["fs.user"] == pytest.approx(100 * 10 * 5)
    assert parts["fs.group"] == 0
    assert parts["fs.account"] == pytest.approx(100 * 30 * -10)
    assert parts["fs"] == pytest.approx(-25_000)
    assert parts["total"] == pytest.approx(-25_000)
    # FSPOLICY NONE (Maui's default): fairshare is not even computed.
    off = PriorityWeights(fsweight=100, fsuserweight=10, queuetimeweight=0)
    assert breakdown(j, snap([j], fs), off)["fs"] == 0


def test_light_user_goes_before_heavy_user():
    fs = FairshareView(users={"heavy": 9000.0, "light": 1000.0})
    pending = [job(1, "heavy"), job(2, "heavy"), job(3, "light"), job(4, "new")]
    order = [j.id for j in Fairshare().order(snap(pending, fs))]
    assert order == [4, 3, 1, 2]  # never-seen user first, heavy last, stable ties
    plan = Fairshare().plan(snap(pending, fs, free=1))
    assert [s.job for s in plan.starts] == [4]
    fifo = Fairshare(backfill=False).plan(snap(pending, fs, free=2))
    assert [s.job for s in fifo.starts] == [4, 3]


def test_caps_block_with_a_reason():
    fs = FairshareView(users={"a": 900.0, "b": 100.0})
    pending = [job(1, "a", wall=200), job(2, "b", wall=50)]
    policy = Fairshare(fstargets={"users": {"a": "1000^", "b": "50%"}})
    plan = policy.plan(snap(pending, fs, free=4))
    assert [s.job for s in plan.starts] == [2]  # b: 10 % used, under its 50 % cap
    assert "900 used + 200 requested > 1,000" in plan.reasons[1]
    assert plan.reasons[1].startswith("blocked: fairshare cap of user a")
    policy = Fairshare(fstargets={"users": {"a": "1000^", "b": "5%"}})
    plan = policy.plan(snap(pending, fs, free=4))
    assert plan.starts == []
    assert "10.0 % used >= 5 %" in plan.reasons[2]


def test_diagnose_rows():
    fs = FairshareView(users={"a": 300.0, "b": 100.0}, groups={"g": 400.0})
    targets = FairshareTargets(users={"a": "50-"}, default_user="equal")
    rows = fairshare_rows(snap([job(1, "c")], fs), targets)
    by = {(r.kind, r.name): r for r in rows}
    assert by["user", "a"].percent == 75.0
    assert by["user", "a"].target == "50-"
    assert by["user", "a"].delta == -25.0
    assert by["user", "b"].target == "33.33 (equal)"  # a, b and c (pending)
    assert by["user", "c"].delta == pytest.approx(100 / 3)
    assert by["group", "g"].target == "" and by["group", "g"].delta == 0


def test_simulated_fairshare_serves_the_light_user_first():
    # One CPU. "heavy" ran a long job; afterwards heavy and light each queue two
    # jobs at the same instant, heavy's first. Fairshare runs light's first.
    def tj(jid, user, submit, run):
        return TraceJob(
            id=jid,
            user=user,
            group=user,
            queue="q",
            submit=submit,
            run_time=run,
            procs=1,
            req_time=run,
            mem_kb=None,
            request=JobRequest(ppn=1, walltime=int(run)),
        )

    jobs = [tj(1, "heavy", 0, 1000)] + [
        tj(jid, user, 10, 10)
        for jid, user in ((2, "heavy"), (3, "heavy"), (4, "light"), (5, "light"))
    ]
    outs = Simulator(Fairshare(), Machine.pool(1), jobs).run()
    starts = {o.job.id: o.start for o in outs}
    assert starts[4] < starts[5] < starts[2] < starts[3]
    plain = {
        o.job.id: o.start
        for o in Simulator(Fairshare(fsuserweight=0), Machine.pool(1), jobs).run()
    }
    assert plain[2] < plain[3] < plain[4] < plain[5]


def test_running_jobs_count_in_usage_live_view():
    run = RunningView(
        id=9,
        user="x",
        nodes=(("n0", 1),),
        mem_kb_per_node=None,
        start_time=0.0,
        walltime=10,
    )
    plan = Fairshare().plan(snap([job(1, "x")], running=[run], free=3))
    assert [s.job for s in plan.starts] == [1]
