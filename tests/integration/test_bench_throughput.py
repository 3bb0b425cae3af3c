"""`mb bench throughput` runs end to end and reports every measure issue 2 asks for.

Small counts keep it short; the numbers are not judged here (speed is measured
by the benchmark itself, never asserted in tests), only that each one was taken.
"""

from __future__ import annotations

import psutil
import pytest

from minibatch.bench import throughput

# Serial: it measures times, and looks for processes left over anywhere.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]


def test_the_benchmark_measures_everything_and_leaves_nothing() -> None:
    before = {p.pid for p in psutil.process_iter()}
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
    # What each daemon spent per job in the end-to-end runs.
    cpu = result["e2e_cpu_ms_per_job"]
    assert set(cpu) == daemons and cpu["server"] > 0
    assert "daemon CPU per job" in throughput.render(result)
    # The cluster it started is gone: no process of a bench home (mb-bench-*;
    # clusters other tests run meanwhile have homes of their own).
    left = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.info["pid"] not in before
        and any("mb-" in part for part in (p.info["cmdline"] or []))
        and "mb-bench-" in bench_home(p)
    ]
    assert not left, left


def bench_home(proc: psutil.Process) -> str:
    try:
        return str(proc.environ().get("MB_HOME", ""))
    except psutil.Error:
        return ""  # gone meanwhile
