"""`mb bench commands` times every command issue 12 names and leaves nothing behind.

Small counts keep it short; the numbers are not judged here (speed is measured
by the benchmark itself, never asserted in tests), only that each was taken.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from conftest import bench_leftovers

from minibatch.bench import commands

# Serial: it measures times, and looks for processes left over.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A short directory of its own for the bench's home (other benches may
    run meanwhile; an ipc socket's path is limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="mbc-")
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_every_command_is_measured_and_nothing_is_left(tmp: str) -> None:
    result = commands.run(jobs=12, runs=2)
    measured = result["commands"]
    assert set(measured) == {
        "qstat",
        "qstat -a",
        "qstat -f ID",
        "qstat -u USER",
        "qstat ID",
        "qsub",
        "qdel",
        "showq",
        "pbsnodes -a",
        "checkjob ID",
        "mb status",
        "mb acct",
        commands.YARDSTICK,
    }
    for label, m in measured.items():
        assert 0 < m["min_ms"] <= m["median_ms"] <= m["max_ms"], label
        assert m["ratio"] > 0, label
        # A new interpreter costs some CPU, which the children's usage shows.
        assert m["cpu_ms"] > 0, label
    assert measured[commands.YARDSTICK]["ratio"] == 1.0
    assert result["runs"] == 2 and result["python_startup_ms"] > 0
    table = commands.render(result)
    assert all(label in table for label in measured)
    # The cluster it started is gone: no process has its home as MB_HOME.
    left = bench_leftovers(tmp)
    assert not left, left
