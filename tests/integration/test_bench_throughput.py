"""`mb bench throughput` runs end to end and reports every measure issue 2 asks
for, and side by side with task-spooler the rates and the ratio issue 12 asks for.

Small counts keep it short; the numbers are not judged here (speed is measured
by the benchmark itself, never asserted in tests), only that each one was taken.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from minibatch.bench import spooler, throughput

# Serial: it measures times, and looks for processes left over anywhere.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The cluster homes and task-spooler directories the bench makes: what it
    must leave nothing of (other engineers' benches may run meanwhile)."""
    made: list[str] = []
    cluster, spool = throughput.fresh_cluster, spooler.private_spooler

    @contextlib.contextmanager
    def recorded_cluster(*args: Any) -> Iterator[Any]:
        with cluster(*args) as (paths, report):
            made.append(str(paths.home))
            yield paths, report

    @contextlib.contextmanager
    def recorded_spooler(slots: int) -> Iterator[dict[str, str]]:
        with spool(slots) as env:
            made.append(env["TMPDIR"])
            yield env

    monkeypatch.setattr(throughput, "fresh_cluster", recorded_cluster)
    monkeypatch.setattr(spooler, "private_spooler", recorded_spooler)
    return made


def left_of(made: list[str]) -> list[psutil.Process]:
    """Live processes whose environment names one of ``made``."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue  # gone meanwhile, or not ours to read
        if {env.get("MB_HOME"), env.get("TMPDIR")} & set(made):
            found.append(proc)
    return found


def test_the_benchmark_measures_everything_and_leaves_nothing(
    started: list[str],
) -> None:
    result = throughput.run(jobs=40, submits=40, repeat=1, idle_s=0.5)
    for key in (
        "submit_per_s",
        "e2e_jobs_per_s",
        "latency_p50_ms",
        "latency_p95_ms",
        "qsub_wall_ms",
        "array1000_wall_ms",
        "python_startup_ms",
    ):
        assert result[key] > 0, key
    assert result["latency_p50_ms"] <= result["latency_p95_ms"]
    daemons = {"broker", "server", "scheduler"} | {
        f"node-node{i}" for i in range(result["nodes"])
    }
    assert set(result["idle"]) == daemons
    assert all(u["rss_mb"] > 0 for u in result["idle"].values())
    # What each daemon spent per job in the end-to-end runs (the broker's
    # mosquitto child included).
    cpu = result["e2e_cpu_ms_per_job"]
    assert set(cpu) == daemons and cpu["server"] > 0
    assert "daemon CPU per job" in throughput.render(result)
    # The cluster it started is gone, and its home with it.
    assert len(started) == 1
    assert not left_of(started)
    assert not any(os.path.exists(home) for home in started)


def test_side_by_side_with_task_spooler_reports_both_rates_and_the_ratio(
    started: list[str],
) -> None:
    if shutil.which(spooler.PROGRAM) is None:
        pytest.fail("task-spooler is not installed (make test installs it)")
    result = spooler.side_by_side(jobs=20, repeat=2)
    assert result["e2e_jobs_per_s"] > 0 and result["tsp_jobs_per_s"] > 0
    assert len(result["e2e_runs"]) == len(result["tsp_runs"]) == 2
    expected = result["e2e_jobs_per_s"] / result["tsp_jobs_per_s"]
    assert result["ratio"] == pytest.approx(expected, rel=0.01)
    assert result["e2e_cpu_ms_per_job"]["server"] > 0
    # The kernel work of a job alone, in cgroups (root here): a ceiling above
    # what the whole cluster reaches.
    low = result["floor"]
    assert low["cgroups"].startswith("cgroup v"), low
    assert low["node_cpu_ms_per_job"] > 0 and low["job_cpu_ms_per_job"] > 0
    assert low["ceiling_jobs_per_s"] > result["e2e_jobs_per_s"], result
    assert "floor" in spooler.render(result)
    assert "task-spooler" in spooler.render(result)
    # The cluster, the task-spooler server and their directories are gone.
    assert len(started) == 2
    assert not left_of(started)
    assert not any(os.path.exists(where) for where in started)
