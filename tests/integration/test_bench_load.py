"""`mb bench load` runs end to end, tiny, and reports every measure with no error.

The numbers are not judged here (speed is measured by the benchmark itself,
never asserted in tests), only that each one was taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile

import psutil
import pytest
from conftest import BIN

from minibatch.bench import load

# Serial: it measures times, and looks for processes left over anywhere.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]


def test_the_benchmark_measures_everything_and_leaves_nothing() -> None:
    before = {p.pid for p in psutil.process_iter()}
    env = {k: v for k, v in os.environ.items() if k != "MB_HOME"}
    args = ["--jobs", "500", "--clients", "5", "--seconds", "3", "--json"]
    proc = subprocess.run(
        [str(BIN / "mb"), "bench", "load", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
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
    bench_home = os.path.join(tempfile.gettempdir(), "mb-bench-")
    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            home = p.environ().get("MB_HOME", "")
            if p.pid not in before and home.startswith(bench_home):
                left.append(p)
    assert not left, left
