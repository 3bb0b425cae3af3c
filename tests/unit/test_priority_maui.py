"""Maui's priority formula: defaults = FIFO, every component, caps, QOS limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import (
    ClusterSnapshot,
    FairshareView,
    NodeView,
    PendingView,
    QosView,
    RunningView,
)
from minibatch.policy.fairshare import Fairshare, FairshareTargets
from minibatch.policy.ordered import PRESETS, qos_blocked
from minibatch.policy.priority import (
    MAX_PRIO,
    Maui,
    PriorityWeights,
    breakdown,
    factors,
    priority_order,
    weights_of,
)
from minibatch.policy.psp import Psp
from minibatch.policy.registry import load

NOW = 100_000.0


def job(jid: int, submit: float, cpus: int = 1, wall: int = 600, **kw) -> PendingView:
    return PendingView(
        id=jid,
        user=kw.pop("user", "u"),
        group=kw.pop("group", "g"),
        request=JobRequest(
            nodes=kw.pop("nodes", 1),
            ppn=cpus,
            walltime=wall,
            mem_kb=kw.pop("mem", None),
        ),
        submit_time=submit,
        **kw,
    )


def snap(pending, **kw) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=kw.pop("now", NOW),
        generation=1,
        nodes=kw.pop("nodes", (NodeView(name="n0", cpus=8, free_cpus=8, mem_kb=8192),)),
        running=kw.pop("running", ()),
        pending=tuple(pending),
        **kw,
    )


def test_defaults_are_fifo_by_queue_time():
    w = PriorityWeights()
    j = job(1, NOW - 600)
    parts = breakdown(j, snap([j]), w)
    assert parts["serv.queuetime"] == 10.0  # minutes queued
    assert parts["serv"] == 10.0 and parts["total"] == 10.0
    assert {k for k, v in parts.items() if v} == {"serv.queuetime", "serv", "total"}
    jobs = [job(3, NOW - 50), job(1, NOW - 900), job(2, NOW - 300)]
    assert [p.id for p in priority_order(snap(jobs), w)] == [1, 2, 3]
    # Under a minute every job is floored to 1: ties keep the snapshot's order.
    fresh = [job(5, NOW - 2), job(4, NOW - 30)]
    assert [p.id for p in priority_order(snap(fresh), w)] == [5, 4]


def test_queue_time_accrues_only_while_eligible():
    # Maui's default JOBPRIOACCRUALPOLICY: held time earns no priority.
    w = PriorityWeights()
    held = job(1, NOW - 3600, eligible_since=NOW - 600)
    assert breakdown(held, snap([held]), w)["serv.queuetime"] == 10.0
    fresh = job(2, NOW - 1200)
    assert [p.id for p in priority_order(snap([held, fresh]), w)] == [2, 1]


def test_every_subfactor():
    w = PriorityWeights(
        userweight=1,
        groupweight=1,
        accountweight=1,
        qosweight=1,
        xfactorweight=1,
        nodeweight=1,
        procweight=1,
        memweight=1,
        walltimeweight=1,
        psweight=1,
        peweight=1,
        pspbinweight=1,
        user_priority={"ann": 7},
        group_priority={"lab": -2},
        account_priority={"proj": 3},
    )
    j = job(
        1,
        NOW - 1200,
        cpus=2,
        wall=600,
        mem=4096,
        user="ann",
        group="lab",
        account="proj",
        qos="high",
        nodes=2,
    )
    s = snap(
        [j],
        qos={"high": QosView(name="high", priority=50)},
        accuracy={"ann": (0.9,)},
        nodes=(NodeView(name="n0", cpus=8, free_cpus=8, mem_kb=8192),),
    )
    raw = factors(j, s, w)
    assert raw["cred.user"] == 7 and raw["cred.group"] == -2
    assert raw["cred.account"] == 3 and raw["cred.qos"] == 50
    assert raw["serv.queuetime"] == 20.0
    assert raw["serv.xfactor"] == (1200 + 600) / 600
    assert raw["res.node"] == 2 and raw["res.proc"] == 4
    assert raw["res.mem"] == 4.0  # MB
    assert raw["res.walltime"] == 600 and raw["res.ps"] == 2400
    assert raw["res.pe"] == 4.0  # 4/8 CPUs, 4096/8192 memory -> half of 8
    assert raw["psp.bin"] == 5
    assert raw["targ.queuetime"] == 0 and raw["fs.user"] == 0
    parts = breakdown(j, s, w)
    assert parts["cred"] == 7 - 2 + 3 + 50
    assert parts["res"] == 2 + 4 + 4 + 600 + 2400 + 4
    assert parts["total"] == pytest.approx(
        parts["cred"] + parts["serv"] + parts["res"] + parts["psp"]
    )
    # XFMINWCLIMIT: a 10 s job counts as 120 s.
    short = job(2, NOW - 120, wall=10)
    assert factors(short, s, w)["serv.xfactor"] == (120 + 10) / 120


def test_weights_and_caps_follow_the_formula():
    # Priority = SERVWEIGHT * min(SERVCAP, QTW * min(QTCAP, QT) + XFW * XF)
    w = PriorityWeights(
        servweight=3,
        queuetimeweight=2,
        xfactorweight=10,
        caps={"QUEUETIMECAP": 15, "servcap": 100},
    )
    j = job(1, NOW - 1200, wall=1200)  # QT 20 min, XF 2
    parts = breakdown(j, snap([j]), w)
    assert parts["serv.queuetime"] == 3 * 2 * 15  # capped at 15 minutes
    assert parts["serv.xfactor"] == 3 * 10 * 2
    assert parts["serv"] == 3 * min(100, 2 * 15 + 10 * 2)
    w = PriorityWeights(
        servweight=3, queuetimeweight=2, xfactorweight=10, caps={"serv": 40}
    )
    assert breakdown(j, snap([j]), w)["total"] == 3 * 40
    with pytest.raises(ValueError):
        PriorityWeights(caps={"nonsense": 1})


def test_targets_per_qos():
    w = PriorityWeights(
        queuetimeweight=0,
        targetqueuetimeweight=1,
        targetxfactorweight=1,
        qos_qttarget={"fast": 1800},
        qos_xftarget={"fast": 3},
    )
    j = job(1, NOW - 600, wall=600, qos="fast")  # QT 10 of 30 min; XF 2 of 3
    raw = factors(j, snap([j]), w)
    assert raw["targ.queuetime"] == pytest.approx(1 / 20**2)
    assert raw["targ.xfactor"] == pytest.approx(1.0)
    late = job(2, NOW - 3600, wall=600, qos="fast")  # past its target
    assert factors(late, snap([late]), w)["targ.queuetime"] == pytest.approx(1e8)
    other = job(3, NOW - 600, qos="")
    assert factors(other, snap([other]), w)["targ.queuetime"] == 0


def test_qos_weights_add_to_service_weights():
    w = PriorityWeights(qos_qtweight={"high": 4})
    a, b = job(1, NOW - 600, qos="high"), job(2, NOW - 600)
    assert breakdown(a, snap([a, b]), w)["serv.queuetime"] == 50.0
    assert breakdown(b, snap([a, b]), w)["serv.queuetime"] == 10.0


def test_bounds_and_system_priority():
    neg = PriorityWeights(queuetimeweight=0, userweight=1, user_priority={"u": -50})
    j = job(1, NOW - 600)
    assert breakdown(j, snap([j]), neg)["total"] == 1.0  # floored at 1
    allow = PriorityWeights(
        queuetimeweight=0,
        userweight=1,
        user_priority={"u": -50},
        enable_neg_priority=True,
    )
    assert breakdown(j, snap([j]), allow)["total"] == -50.0
    huge = PriorityWeights(queuetimeweight=1e12)
    assert breakdown(j, snap([j]), huge)["total"] == MAX_PRIO
    pinned = job(2, NOW, priority=5)
    parts = breakdown(pinned, snap([pinned]), PriorityWeights())
    assert parts["system"] == parts["total"] == MAX_PRIO + 5
    order = priority_order(snap([j, pinned]), PriorityWeights())
    assert [p.id for p in order] == [2, 1]


def test_qos_max_jobs_per_user_blocks():
    qos = {"q": QosView(name="q", max_jobs_per_user=2)}
    running = (
        RunningView(
            id=10,
            user="ann",
            nodes=(("n0", 1),),
            mem_kb_per_node=None,
            start_time=0,
            walltime=NOW * 2,
        ),
    )
    jobs = [job(i, float(i), user="ann", qos="q") for i in (1, 2, 3)] + [
        job(4, 4.0, user="bob", qos="q"),
        job(5, 5.0, user="ann"),
    ]
    # Running jobs count under the default QOS "" while the snapshot has no qos
    # for them, so ann has 0 running under q: 2 of her q jobs may start.
    s = snap(jobs, qos=qos, running=running)
    blocked = qos_blocked(s, jobs)
    assert set(blocked) == {3}
    assert blocked[3] == "blocked: QOS q allows ann 2 jobs at once"
    plan = Maui().plan(s)
    assert [x.job for x in plan.starts] == [1, 2, 4, 5]
    assert plan.reasons[3] == blocked[3]


def test_needs_declared():
    assert Maui().needs == frozenset()
    assert Maui(fspolicy="DEDICATEDPS", fsuserweight=1).needs == {"fairshare"}
    assert Maui(pspbinweight=1).needs == {"accuracy"}
    assert Fairshare().needs == {"fairshare"}


def test_presets_load_through_the_registry():
    for path in PRESETS.values():
        policy = load(path)
        assert policy.plan(snap([job(1, NOW)])).starts
    assert (
        load(PRESETS["maui"], {"backfill": False, "xfactorweight": 2}).backfill is False
    )


@st.composite
def queues(draw: st.DrawFn):
    users = ["a", "b", "c", "d"]
    jobs = [
        job(
            i,
            float(draw(st.integers(0, 100_000))),
            cpus=draw(st.integers(1, 8)),
            wall=draw(st.integers(1, 86_400)),
            user=draw(st.sampled_from(users)),
            qos=draw(st.sampled_from(["", "high"])),
        )
        for i in range(draw(st.integers(0, 25)))
    ]
    fs = FairshareView(users={u: float(draw(st.integers(0, 1000))) for u in users})
    acc = {u: tuple(draw(st.lists(st.floats(0, 1), max_size=10))) for u in users}
    return snap(
        jobs,
        fairshare=fs,
        accuracy=acc,
        qos={"high": QosView(name="high", priority=draw(st.integers(-5, 5)))},
    )


MIXED = PriorityWeights(
    xfactorweight=1.0,
    qosweight=100,
    fspolicy="DEDICATEDPS",
    fsuserweight=5,
    pspbinweight=30,
    procweight=-1,
    fstargets=FairshareTargets(default_user="equal"),
    caps={"serv": 5000},
)


@settings(max_examples=100, deadline=None)
@given(queues())
def test_orders_are_deterministic_permutations(s):
    orders = [
        lambda x: priority_order(x, PriorityWeights()),
        lambda x: priority_order(x, MIXED),
        Fairshare().order,
        Psp().order,
    ]
    for order in orders:
        first = order(s)
        assert sorted(j.id for j in first) == sorted(j.id for j in s.pending)
        assert [j.id for j in order(s)] == [j.id for j in first]
    # diagnose -p explains each preset's order with the weights it reports.
    for policy in (Fairshare(), Psp(), Maui(xfactorweight=3)):
        explained = priority_order(s, weights_of(policy))
        assert [j.id for j in explained] == [j.id for j in policy.order(s)]
    # Default weights are FIFO: by submission, once queued a minute or more
    # (Maui floors priorities at 1); equal submissions keep snapshot order.
    fifo = priority_order(s, PriorityWeights())
    old = [j.id for j in fifo if NOW - j.submit_time >= 60]
    by_submit = sorted(s.pending, key=lambda j: j.submit_time)
    assert old == [j.id for j in by_submit if NOW - j.submit_time >= 60]


def test_class_weight_ranks_queues():
    """CLASSWEIGHT (0 by default, as in Maui) counts the job's queue priority."""
    jobs = [job(1, NOW - 600), job(2, NOW - 60, queue="vip", queue_priority=100.0)]
    assert [p.id for p in priority_order(snap(jobs), PriorityWeights())] == [1, 2]
    weighted = PriorityWeights(classweight=1.0)
    assert [p.id for p in priority_order(snap(jobs), weighted)] == [2, 1]
