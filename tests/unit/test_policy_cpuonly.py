"""EASY's CPU-only plan (:mod:`minibatch.policy.cpuonly`) against the general one.

On random snapshots where only CPUs count (busy nodes, running jobs ending at
various times, some past their requested time, queues of one- and many-node
jobs, upcoming jobs asked for or not), the fast plan must be the general
path's plan field for field: starts on the same nodes, the reservation, every
reason, the default reason, upcoming and backfilled jobs. Where memory, GPUs,
features or reservations count, it must step aside. When the snapshot asks
for no reasons (the simulator's), it is the same plan without them; when it
lists the running jobs by end (the simulator's index), the same plan.
"""

from __future__ import annotations

from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.snapshot import ClusterSnapshot, Plan, ReservationView
from minibatch.policy import cpuonly, registry
from tests.unit.test_policy_snapshots import job, running, snap


def general(name: str, s: ClusterSnapshot, **params: object):
    """The plan of ``name`` without the CPU-only path."""
    with mock.patch.object(cpuonly, "plan", return_value=None):
        return registry.load(name, dict(params)).plan(s)


@st.composite
def cpu_clusters(draw: st.DrawFn) -> ClusterSnapshot:
    now = float(draw(st.integers(0, 100)))
    count = draw(st.integers(1, 5))
    caps, runs, jid = [], [], 1000
    spans = count > 1 and draw(st.booleans())  # a running job on two nodes
    if spans:
        runs.append(running(jid, {"n0": 1, "n1": 1}, now - 5, 30.0))
    for i in range(count):
        name, cpus = f"n{i}", draw(st.integers(1, 8))
        caps.append((name, cpus + (1 if spans and i < 2 else 0), None, 0))
        left = cpus
        while left > 0 and draw(st.integers(0, 3)):
            take = draw(st.integers(1, left))
            jid += 1
            start = now - draw(st.integers(0, 60))
            walltime = draw(st.sampled_from([10, 20, 40, 80, 150]))  # some past it
            runs.append(running(jid, {name: take}, start, walltime))
            left -= take
    pending = [
        job(
            k + 1,
            draw(st.integers(1, 8)),
            draw(st.sampled_from([5, 10, 20, 40, 80, 150])),  # ties with ends
            nodes=draw(st.integers(1, min(3, count))),
            submit=float(k),
        )
        for k in range(draw(st.integers(1, 25)))
    ]
    s = snap(caps, runs, pending, now=now)
    if draw(st.integers(0, 5)) == 0:
        # A node holding more than it has (a node back with fewer CPUs than
        # its jobs hold): free CPUs below zero.
        i = draw(st.integers(0, count - 1))
        nodes = list(s.nodes)
        over = nodes[i].free_cpus - draw(st.integers(1, 3))
        nodes[i] = msgspec.structs.replace(nodes[i], free_cpus=over)
        s = _with(s, nodes=tuple(nodes))
    upcoming = draw(st.sampled_from([0, 0, 3]))
    return s if not upcoming else _with(s, upcoming=upcoming)


def _with(s: ClusterSnapshot, **changes: object) -> ClusterSnapshot:
    return msgspec.structs.replace(s, **changes)


@settings(max_examples=500, deadline=None)
@given(cpu_clusters())
def test_the_cpu_only_plan_is_the_general_plan(s):
    fast = cpuonly.plan(s, s.pending, True)
    assert fast is not None
    assert fast == general("easy", s)
    assert registry.load("easy", {}).plan(s) == fast


@settings(max_examples=500, deadline=None)
@given(cpu_clusters())
def test_without_reasons_it_is_the_same_plan_less_the_reasons(s):
    said = cpuonly.plan(s, s.pending, True)
    quiet = cpuonly.plan(_with(s, reasons=False), s.pending, True)
    assert said is not None
    assert quiet == _unreasoned(said)


@settings(max_examples=500, deadline=None)
@given(cpu_clusters(), st.booleans())
def test_the_running_jobs_by_end_change_nothing(s, reasons):
    # The simulator's index (ClusterSnapshot.running_by_end) against none.
    s = _with(s, reasons=reasons)
    ordered = sorted(s.running, key=lambda r: (r.start_time + r.walltime, -r.id))
    indexed = cpuonly.plan(_with(s, running_by_end=ordered), s.pending, True)
    assert indexed == cpuonly.plan(s, s.pending, True)


def _unreasoned(plan: Plan) -> Plan:
    return msgspec.structs.replace(plan, reasons={}, default_reason="")


@settings(max_examples=300, deadline=None)
@given(cpu_clusters(), st.data())
def test_without_reasons_jobs_asking_for_more_still_take_the_general_path(s, data):
    # Without reasons the fast plan only looks at jobs that could start; any
    # such job that asks for memory, GPUs, a feature or a reservation must
    # still send the pass the general way.
    odd = {
        "mem": lambda j: _with(j, request=_with(j.request, mem_kb=8)),
        "gpus": lambda j: _with(j, request=_with(j.request, gpus=1)),
        "features": lambda j: _with(j, features=("big",)),
        "advres": lambda j: _with(j, advres="r"),
    }
    pending = [
        odd[data.draw(st.sampled_from(sorted(odd)))](j)
        if data.draw(st.integers(0, 5)) == 0
        else j
        for j in s.pending
    ]
    s = _with(s, pending=pending, reasons=False)
    assert _unreasoned(registry.load("easy", {}).plan(s)) == _unreasoned(
        general("easy", s)
    )


@settings(max_examples=200, deadline=None)
@given(cpu_clusters())
def test_in_another_priority_order_too(s):
    # Maui hands EASY the queue in its priority order.
    assert registry.load("maui", {}).plan(s) == general("maui", s)


def test_a_node_holding_more_than_it_has():
    # n0 has -1 CPU free, n1 one: no CPU free in all, and the general path
    # stops at job 2 though it would fit on n1.
    runs = [running(8, {"n0": 1}, 0.0, 10.0), running(9, {"n0": 1}, 0.0, 10.0)]
    s = snap([2, 1], runs, [job(1, 1, 5, nodes=2), job(2, 1, 5)])
    over = msgspec.structs.replace(s.nodes[0], free_cpus=-1)
    s = _with(s, nodes=(over, s.nodes[1]))
    said = cpuonly.plan(s, s.pending, True)
    assert said == general("easy", s) and not said.starts
    assert said.default_reason == "queued behind job 1 (no free CPUs)"
    quiet = cpuonly.plan(_with(s, reasons=False), s.pending, True)
    assert quiet == _unreasoned(said)


def test_memory_gpus_features_and_reservations_take_the_general_path():
    base = snap([4, 4], [running(9, {"n0": 4}, 0.0, 50.0)], [job(1, 4), job(2, 1)])
    assert cpuonly.plan(base, base.pending, True) is not None
    with_mem = snap([("n0", 4, 64, 0)], [], [job(1, 2)])
    with_gpus = snap([("n0", 4, None, 1)], [], [job(1, 2)])
    asks_mem = snap([4], [], [job(1, 2, mem_kb=8)])
    asks_gpu = snap([4], [], [job(1, 2, gpus=1)])
    in_resv = snap([4], [], [job(1, 2, advres="r")])
    resv = _with(
        base,
        reservations=(
            ReservationView(name="r", start=0.0, end=99.0, nodes=(("n1", 2),)),
        ),
    )
    for s in (with_mem, with_gpus, asks_mem, asks_gpu, in_resv, resv):
        assert cpuonly.plan(s, s.pending, True) is None
        assert registry.load("easy", {}).plan(s) == general("easy", s)
