"""The presets by name: entry points, construction, and the scheduler bench."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

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
