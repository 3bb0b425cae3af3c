"""The synthetic workloads of the paper experiments (seeds 000 and 004), tiny runs."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from minibatch.policy.psp import accuracy_bin
from minibatch.sim import experiments, paper_bode, paper_psp
from minibatch.sim.experiments import Experiment, WorkloadSpec, run_experiment
from minibatch.sim.machine import Machine
from minibatch.sim.runner import MachineSpec, SimConfig, in_memory, policy_ref, simulate


def user_levels(w: paper_psp.PspWorkload) -> dict[str, list[float]]:
    accs: dict[str, list[float]] = {}
    for j in w.jobs:
        accs.setdefault(j.user, []).append(j.run_time / j.req_time)
    return accs


def test_psp_static_scenarios_stay_in_their_groups():
    be = paper_psp.psp_workload("BE", 1, 128, 1.0)
    ge = paper_psp.psp_workload("GE", 1, 128, 1.0)
    assert len(be.jobs) == paper_psp.PSP_JOBS
    assert {j.user for j in be.jobs} == {f"user{i:02d}" for i in range(20)}
    # Same seed, same jobs: only the requested times differ between scenarios.
    assert [(j.submit, j.run_time, j.procs) for j in be.jobs] == [
        (j.submit, j.run_time, j.procs) for j in ge.jobs
    ]
    assert all(accuracy_bin(a) == 1 for v in user_levels(be).values() for a in v)
    assert all(accuracy_bin(a) == 5 for v in user_levels(ge).values() for a in v)
    assert {j.procs for j in be.jobs} <= {1, 2, 4, 8, 16}
    assert max(j.run_time for j in be.jobs) <= 10 * 86400
    cf = paper_psp.psp_workload("CF", 1, 128, 1.0)
    groups = Counter(
        next(g for g, (lo, hi) in enumerate(paper_psp.FING_GROUPS) if lo <= a <= hi)
        for a in cf.start_level.values()
    )
    assert [groups[g] for g in range(6)] == [4, 4, 4, 3, 4, 1]


def test_psp_learning_scenarios_improve():
    users = [f"user{i:02d}" for i in range(20)]
    for scenario, learners in (("DI", set(users)), ("HDI", set(users[::2]))):
        w = paper_psp.psp_workload(scenario, 2, 128, 1.0)
        for user, accs in user_levels(w).items():
            first, last = statistics.fmean(accs[:5]), statistics.fmean(accs[-5:])
            if user in learners:
                assert last > first * 1.05 or w.start_level[user] > 0.85
            else:  # a user who does not learn stays at their level (±10 %)
                assert max(accs) <= min(accs) * 1.25


def test_psp_class_waits_on_a_small_run():
    w = paper_psp.psp_workload("CF", 3, 128, 1.0)
    jobs = w.jobs[:150]
    run = simulate(
        SimConfig(trace="t", policy=policy_ref("psp")),
        in_memory("t", jobs, Machine.pool(32)),
    )
    waits = paper_psp.class_waits(run)
    assert set(waits) == {"a1", "a2", "a3", "a4", "a5"}
    assert sum(len(v) for v in waits.values()) == len({j.user for j in jobs})


def test_bode_mix_follows_the_paper():
    jobs = paper_bode.bode_mix(1)
    counts = Counter(j.queue for j in jobs)
    assert dict(counts) == paper_bode.BODE_QUOTAS
    assert sum(j.run_time for j in jobs) / 3600 == pytest.approx(90.2, abs=0.05)
    for j in jobs:
        assert paper_bode.bode_class(j.procs, j.run_time, j.req_time) in (j.queue, None)
        assert 0 <= j.submit <= 180 * 60
        assert j.run_time <= j.req_time
    assert paper_bode.bode_mix(1) == jobs  # deterministic per seed
    assert paper_bode.bode_class(40, 80, 100) == "large"
    assert paper_bode.bode_class(20, 80, 100) == "medium"
    assert paper_bode.bode_class(5, 80, 100) == "small"
    assert paper_bode.bode_class(1, 80, 100) == "debug"
    assert paper_bode.bode_class(40, 10, 100) == "failed"
    assert paper_bode.bode_class(40, 30, 100) is None


def test_bode_and_labelled_trace_experiments(tmp_path, monkeypatch):
    result, text = paper_bode.run_bode(tmp_path / "bode", (1, 2))
    spans = result["hours"]
    assert all(
        m <= s
        for m, s in zip(
            spans["Theoretical Minimum"], spans["Maui Scheduler"], strict=True
        )
    )
    assert "76 jobs on 64 CPUs, 2 mixes" in text
    assert (tmp_path / "bode" / "bode-mix-1.swf").read_text().count("\n") > 76
    small = Experiment(
        name="tiny-fs",
        title="tiny",
        description="labels",
        workloads=(
            WorkloadSpec("sdsc", experiments.SDSC, MachineSpec(procs=128), limit=300),
        ),
        policies=("fifo", "fairshare-easy"),
        variants={"fairshare-easy": ("fairshare", {})},
        extra=experiments._veet_text,
    )
    monkeypatch.setitem(experiments.EXPERIMENTS, "tiny-fs", small)
    run_experiment("tiny-fs", tmp_path / "fs", plots=False, say=lambda s: None)
    out = (tmp_path / "fs" / "results.md").read_text()
    assert "fairshare-easy" in out and "users <= 35 %" in out
    assert (tmp_path / "fs" / "sdsc" / "fairshare-easy" / "jobs.csv").exists()
