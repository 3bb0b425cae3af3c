"""mb sweep's grid and table, and runs in parallel giving what they give one
after the other (minibatch.sim.parallel, minibatch.sim.sweep, mb sweep)."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from minibatch.cli import sim as sim_cli
from minibatch.cli import sweep as sweep_cli
from minibatch.errors import InvalidArgument
from minibatch.sim import sweep
from minibatch.sim.parallel import Pool, SimTask
from minibatch.sim.runner import SimConfig, SimRun
from minibatch.sim.swf import find_trace

pytestmark = pytest.mark.timeout(120)

SDSC = str(find_trace("SDSC-SP2-1998-4.2-cln.swf.gz").resolve())
#: Summary keys that measure the run, not its schedule.
TIMINGS = {"wall_s", "jobs_per_s", "read_s"}


def app() -> typer.Typer:
    a = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    a.command("sweep")(sweep_cli.sweep_command)
    a.command("compare")(sim_cli.compare_command)
    return a


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app(), list(args))


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (undefined metrics, e.g. fifo's predictions)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def assert_same_runs(left: list[SimRun], right: list[SimRun]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.config == b.config
        assert a.machine == b.machine
        assert a.records == b.records
        assert a.eet == b.eet
        assert a.stats == b.stats
        assert a.summary.keys() == b.summary.keys()
        for key in a.summary.keys() - TIMINGS:
            assert same(a.summary[key], b.summary[key]), key


# ------------------------------------------------------------------ the grid


def test_grid_varies_the_load_fastest_and_crosses_every_parameter() -> None:
    points = sweep.grid_points(
        ["a.swf", "b.swf"], ["easy", "backfill"], [0.5, 1.0], {"depth": [1, 2]}
    )
    assert len(points) == 2 * 2 * 2 * 2
    assert points[0] == sweep.Point("a.swf", "easy", (("depth", 1),), 0.5)
    assert points[1] == sweep.Point("a.swf", "easy", (("depth", 1),), 1.0)
    assert points[2].params == (("depth", 2),) and points[2].load == 0.5
    assert points[4].policy == "backfill" and points[8].trace == "b.swf"
    assert points[3].line == "easy depth=2"
    assert sweep.grid_points(["a"], ["fifo"], [1.0], {})[0].line == "fifo"


@pytest.mark.parametrize(
    ("traces", "policies", "loads"),
    [([], ["easy"], [1.0]), (["a"], [], [1.0]), (["a"], ["easy"], [0.0])],
)
def test_grid_refuses_an_empty_dimension_or_a_load_of_zero(
    traces: list[str], policies: list[str], loads: list[float]
) -> None:
    with pytest.raises(InvalidArgument):
        sweep.grid_points(traces, policies, loads, {})


def test_parameter_values_are_typed_and_malformed_ones_refused() -> None:
    assert sweep_cli.parse_grid(["depth=1,2", "rescan=true,false", "x=a"]) == {
        "depth": [1, 2],
        "rescan": [True, False],
        "x": ["a"],
    }
    assert sweep_cli.parse_loads("0.7, 1,1.25") == [0.7, 1.0, 1.25]
    for bad in ("depth", "=1", "depth="):
        with pytest.raises(InvalidArgument):
            sweep_cli.parse_grid([bad])
    with pytest.raises(InvalidArgument):
        sweep_cli.parse_loads("1,high")
    with pytest.raises(InvalidArgument, match="unknown metric nope"):
        sweep.check_metrics(["mean_wait_s", "nope"])


def test_table_and_csv_have_a_row_per_run_in_grid_order(tmp_path: Path) -> None:
    points = sweep.grid_points(
        ["/x/a.swf"], ["easy"], [0.5, 1.0], {"depth": [1, "deep"]}
    )
    summaries = [
        {"mean_wait_s": 1234.5 * (i + 1), "utilization": 0.5, "jobs": 10}
        for i in range(len(points))
    ]
    metrics = ["mean_wait_s", "utilization"]
    lines = sweep.text_table(points, summaries, metrics).splitlines()
    assert lines[0].split() == ["trace", "policy", "depth", "load", *metrics]
    assert lines[2].split() == ["a.swf", "easy", "1", "0.5", "1,234.5", "0.500"]
    assert lines[5].split() == ["a.swf", "easy", "deep", "1", "4,938", "0.500"]
    sweep.write_csv(tmp_path / "sweep.csv", points, summaries, metrics)
    with (tmp_path / "sweep.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["trace", "policy", "depth", "load", *metrics]
    assert rows[1] == ["a.swf", "easy", "1", "0.5", "1234.5", "0.5"]
    assert len(rows) == 1 + len(points)


# ------------------------------------------------------------- parallel runs


def test_a_process_pool_gives_the_sequential_results_in_order() -> None:
    points = sweep.grid_points([SDSC], ["fifo", "easy"], [0.8, 1.2], {})
    tasks = sweep.tasks(points, SimConfig(trace=SDSC, limit=300))
    here = Pool(workers=1).all(tasks)
    heard: list[tuple[int, int]] = []
    with Pool(workers=2, progress=lambda done, n: heard.append((done, n))) as pool:
        spread = pool.all(tasks)
    assert_same_runs(here, spread)
    assert [r.config.policy for r in spread] == ["fifo", "fifo", "easy", "easy"]
    # A higher load is a busier machine: the load reached the worker.
    assert spread[1].summary["utilization"] > spread[0].summary["utilization"]
    assert sorted(heard) == [(i, 4) for i in range(1, 5)]


def test_a_failing_run_fails_the_batch_with_its_error() -> None:
    good = SimTask(SimConfig(trace=SDSC, policy="fifo", limit=50))
    bad = SimTask(replace(good.config, policy="no-such-policy"))
    with Pool(workers=2) as pool, pytest.raises(InvalidArgument, match="no-such"):
        pool.all([good, bad])


def test_pool_options_are_checked_and_dask_is_named_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InvalidArgument, match="at least 1"):
        Pool(workers=0)
    with pytest.raises(InvalidArgument, match="not both"):
        Pool(workers=2, cluster="tcp://127.0.0.1:1")
    monkeypatch.setitem(sys.modules, "distributed", None)
    task = SimTask(SimConfig(trace=SDSC, limit=10))
    with (
        Pool(cluster="tcp://127.0.0.1:1") as pool,
        pytest.raises(InvalidArgument, match=r"pip install 'minibatch\[dask\]'"),
    ):
        pool.all([task])


def test_mb_compare_on_two_workers_writes_what_one_writes(tmp_path: Path) -> None:
    outs = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        result = invoke(
            "compare", SDSC, "--limit", "300", "--policies", "fifo,easy",
            "--workers", workers, "--out", str(out), "--no-plots",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert result.output.startswith("300 jobs on ")
        outs[workers] = out
    for policy in ("fifo", "easy"):
        one, two = (outs[w] / policy for w in ("1", "2"))
        assert (one / "jobs.csv").read_bytes() == (two / "jobs.csv").read_bytes()
        a, b = (json.loads((d / "summary.json").read_text()) for d in (one, two))
        assert {k: v for k, v in a.items() if k not in TIMINGS} == {
            k: v for k, v in b.items() if k not in TIMINGS
        }


def test_mb_sweep_writes_a_table_and_a_plot_per_metric(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    result = invoke(
        "sweep", SDSC, "--policies", "backfill", "--param", "depth=1,2",
        "--loads", "0.8,1.2", "--limit", "300", "--metrics",
        "mean_wait_s,utilization", "--workers", "2", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == [
        "trace", "policy", "depth", "load", "mean_wait_s", "utilization"
    ]  # fmt: skip
    assert [line.split()[2:4] for line in lines[2:6]] == [
        ["1", "0.8"], ["1", "1.2"], ["2", "0.8"], ["2", "1.2"]
    ]  # fmt: skip
    with (out / "sweep.csv").open(newline="") as f:
        assert len(list(csv.reader(f))) == 5
    for metric in ("mean_wait_s", "utilization"):
        assert (out / f"{metric}.png").stat().st_size > 0
        assert (out / f"{metric}.svg").stat().st_size > 0
    refused = invoke("sweep", SDSC, "--metrics", "nope", "--out", str(out))
    assert refused.exit_code == 2 and "unknown metric nope" in refused.output
