"""``mb bench sim``: the speed report and the pass cost by queue depth."""

from __future__ import annotations

import json
import random

import typer
from typer.testing import CliRunner

from minibatch.cli import sim as cli
from minibatch.sim import bench
from minibatch.sim.engine import Simulator
from minibatch.sim.runner import MachineSpec, SimConfig, load
from minibatch.sim.swf import find_trace

CONFIG = SimConfig(
    trace=str(find_trace("SDSC-SP2-1998-4.2-cln.swf.gz")),
    policy="easy",
    machine=MachineSpec(procs=128),
    limit=1500,
)


def test_the_depth_curve_groups_every_pass_by_powers_of_two():
    work = load(CONFIG)
    rows = bench.depth_curve(CONFIG, work)
    sim = Simulator(bench.registry.load("easy"), work.machine, work.jobs)
    sim.run()
    assert sum(r["passes"] for r in rows) == sim.stats.passes
    for row in rows:
        assert row["depth_from"] <= row["mean_depth"] <= row["depth_to"]
        assert row["depth_to"] == 2 * row["depth_from"] - 1
        assert row["us_per_queued_job"] == row["mean_us"] / row["mean_depth"]
    lows = [r["depth_from"] for r in rows]
    assert lows == sorted(lows) and lows[0] == 1
    assert bench.render_curve(rows).splitlines()[2].startswith("1-1")


def test_bench_sim_alternates_with_the_bare_loop_and_prints_the_curve(tmp_path):
    rnd = random.Random(3)
    lines, t = ["; MaxProcs: 16"], 0
    for i in range(1, 401):  # a busy 16-processor machine
        t += rnd.randint(0, 30)
        run, procs = rnd.randint(1, 400), rnd.choice([1, 2, 4, 8, 16])
        fields = f"{i} {t} -1 {run} {procs} -1 -1 {procs} {run * 2} -1 1 1 1"
        lines.append(fields + " -1 1 -1 -1 -1")
    trace = tmp_path / "busy.swf"
    trace.write_text("\n".join(lines) + "\n")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("bench-sim")(cli.bench_sim)
    app.command("other")(lambda: None)  # more than one: commands by name
    args = ["bench-sim", str(trace), "--repeat", "2", "--depth-curve"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["jobs"] == 400 and len(data["walls_s"]) == 2
    assert data["bare_same_schedule"] is True and data["cpu_vs_bare"] > 0
    assert data["quiet_passes"] > 0
    assert sum(r["passes"] for r in data["depth_curve"]) == data["passes"]
    text = CliRunner().invoke(app, args).output
    assert "policy time per pass, by jobs queued" in text
    assert "simulator / bare loop, by CPU time" in text
