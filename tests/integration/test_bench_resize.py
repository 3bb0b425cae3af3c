"""`mb bench resize` runs both measures and checks every thread's mask.

Small counts keep it short; the latencies are not judged here (speed is measured
by the benchmark itself, never asserted in tests), only that each was taken.
"""

from __future__ import annotations

import os

import psutil
import pytest

from minibatch.bench import resize

# Serial: it measures times, and looks for processes left over anywhere.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(90)]


def test_the_benchmark_measures_both_ways_and_leaves_nothing() -> None:
    assert len(os.sched_getaffinity(0)) >= 2, "resizing 1 <-> 2 CPUs needs two"
    before = {p.pid for p in psutil.process_iter()}
    result = resize.run(resizes=10, threads=16)
    assert result["threads"] == 16 and result["resizes"] == 10
    for key in ("e2e_p50_ms", "e2e_p95_ms", "node_p50_ms", "node_p95_ms"):
        assert result[key] > 0, key
    assert result["e2e_p50_ms"] <= result["e2e_p95_ms"]
    assert result["node_p50_ms"] <= result["node_p95_ms"]
    # Every thread had its new mask whenever the job was told.
    assert result["mismatches"] == result["e2e_mismatches"] == 0
    assert result["node_mismatches"] == 0
    assert result["e2e_recorded"] == 10
    assert "node only (Tracker)" in resize.render(result)
    # The cluster (our children) and both jobs (named by the bench's temporary
    # directory) are gone; other tests' clusters may come and go meanwhile.
    left = [
        p
        for p in psutil.process_iter(["pid", "cmdline", "ppid", "status"])
        if p.info["pid"] not in before
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and (
            p.info["ppid"] == os.getpid()
            or any("mb-resize-" in part for part in p.info["cmdline"] or [])
        )
    ]
    assert not left, left
