"""The presets by name: entry points, construction, and the scheduler bench."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from minibatch.bench import scheduler
from minibatch.policy import registry
from minibatch.policy.presets import PRESETS, describe
from tests.unit.test_policy_snapshots import job, running, snap


def test_every_preset_is_an_entry_point_to_the_same_class():
    eps = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    for name, preset in PRESETS.items():
        assert eps.get(name) == preset.target, f"pyproject.toml: {name}"
    assert describe().count("\n") == len(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_plans_with_its_defaults(name):
    policy = registry.load(name)
    assert policy.name == name
    s = snap(
        [4, 4], [running(1, {"n0": 4}, 0, 100)], [job(2, 4, 50, nodes=2), job(3, 2, 10)]
    )
    plan = policy.plan(s)
    assert {st.job for st in plan.starts} <= {2, 3}


def test_bench_scheduler_reports_the_median_pass():
    result = scheduler.run(
        pending=300, policy="conservative", nodes=8, cpus=8, repeat=2
    )
    assert result["pending"] == 300 and result["repeat"] == 2
    assert result["pass_ms_median"] > 0
    assert result["predicted"] + result["starts"] <= 300


def test_bench_scheduler_command_prints_json():
    app = typer.Typer()
    app.command()(scheduler.bench_scheduler)
    out = CliRunner().invoke(
        app, ["--pending", "200", "--nodes", "4", "--repeat", "1", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["policy"] == "easy"
    text = CliRunner().invoke(app, ["--pending", "50", "--nodes", "2", "--repeat", "1"])
    assert "one pass, median (ms)" in text.output


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_keeps_feature_jobs_on_nodes_with_the_features(name):
    """n0 is busy and has the feature; n1 is idle and lacks it. The job that
    needs the feature waits for n0 (reserved there), the other starts on n1."""
    nodes = tuple(
        msgspec.structs.replace(n, features=("bigmem",) if n.name == "n0" else ())
        for n in snap([4, 4], [], []).nodes
    )
    s = snap([4, 4], [running(1, {"n0": 4}, 0, 100)], [job(2, 2, 50), job(3, 2, 10)])
    pending = (
        msgspec.structs.replace(s.pending[0], features=("bigmem",)),
        s.pending[1],
    )
    s = msgspec.structs.replace(
        s,
        nodes=tuple(
            msgspec.structs.replace(n, features=m.features)
            for n, m in zip(s.nodes, nodes, strict=True)
        ),
        pending=pending,
    )
    plan = registry.load(name).plan(s)
    # Strict FIFO starts nothing behind its blocked head.
    want = [] if name == "fifo" else [(3, ("n1",))]
    assert [(st.job, st.nodes) for st in plan.starts] == want
    assert "bigmem" in plan.reasons[2] or 2 in plan.predicted
    if 2 in plan.predicted:
        assert plan.predicted[2] == 100
