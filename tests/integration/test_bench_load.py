"""`mb bench load` runs end to end, tiny, and reports every measure with no error.

The numbers are not judged here (speed is measured by the benchmark itself,
never asserted in tests), only that each one was taken.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BIN, bench_leftovers

from minibatch.bench import curve, load

# Serial: it measures times, and looks for processes left over anywhere.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]


def bench_load(tmp: str, *args: str) -> dict[str, Any]:
    """``mb bench load ARGS --json``'s result, outside any cluster's home; the
    bench makes its home in ``tmp`` (other benches may run meanwhile)."""
    env = {k: v for k, v in os.environ.items() if k != "MB_HOME"}
    env["TMPDIR"] = tmp
    proc = subprocess.run(
        [str(BIN / "mb"), "bench", "load", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture
def tmp() -> Iterator[str]:
    """A short directory for the bench's home (its ipc socket's path is
    limited to 107 bytes, so not pytest's tmp_path)."""
    path = tempfile.mkdtemp(prefix="mbl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_benchmark_measures_everything_and_leaves_nothing(tmp: str) -> None:
    result = bench_load(tmp, "--jobs", "500", "--clients", "5", "--seconds", "3")
    assert (result["jobs"], result["clients"], result["seconds"]) == (500, 5, 3.0)
    assert result["full_every"] == 50
    assert result["errors"] == 0 and result["error_messages"] == [], result
    assert 1 <= result["processes"] <= 5
    assert result["queue_per_s"] > 0 and result["server_cpu_s_queuing"] >= 0
    assert 0 < result["server_rss_mb_before"] <= result["server_rss_mb_queued"]
    assert result["kb_per_queued_job"] > 0
    listing = result["full_listing"]
    assert listing["reply_ms"] > 0 and listing["decode_ms"] > 0 and listing["mb"] > 0
    latency = result["latency_ms"]
    assert set(latency) == {"submit", "qstat", "qstat_all"}
    for kind in ("submit", "qstat"):  # qstat_all comes every 50 rounds only
        s = latency[kind]
        assert s["count"] > 0 and 0 < s["p50"] <= s["p95"] <= s["p99"], (kind, s)
    # Each round submits one job and asks for it.
    assert latency["submit"]["count"] == latency["qstat"]["count"]
    assert result["requests"] == sum(s["count"] for s in latency.values())
    assert result["requests_per_s"] > 0 and result["server_cpu_s_load"] > 0
    assert result["jobs_after"] == 500 + latency["submit"]["count"]
    assert result["server_rss_mb_after"] > 0
    assert "p99 ms" in load.render(result)
    # The cluster and the client processes (all in the bench's MB_HOME) are gone.
    assert not bench_leftovers(tmp)


def test_the_curve_measures_each_depth_and_leaves_nothing(tmp: str) -> None:
    result = bench_load(tmp, "--curve", "20,60", "--runs", "1")
    assert result["runs"] == 1
    points = result["curve"]
    assert [p["depth"] for p in points] == [20, 60]
    assert [p["drained"] for p in points] == [10, 30]
    assert points[0]["drain_ratio"] == 1.0
    for p in points:
        assert p["drain_per_s"] > 0 and p["queue_s"] > 0, p
        labels = {"qstat", "qstat -u USER", "qstat ID", "python -c pass"}
        assert set(p["ms"]) == set(p["cpu_ms"]) == labels, p
        assert all(v > 0 for v in p["ms"].values()), p
    assert "drain/s" in curve.render(result)
    assert not bench_leftovers(tmp)
