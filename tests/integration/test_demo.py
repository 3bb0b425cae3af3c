"""``mb demo`` end to end, as ``make demo`` runs it: a cluster comes up in a fresh
``MB_HOME``, the workload runs, the result is shown, and the cluster goes down
leaving no process behind.

``mb demo --quick`` (``make demo QUICK=1``) runs seed 004's 76 jobs on 4 x 16
virtual CPUs under two policies, ~50 s on an idle 2-CPU machine; ``mb demo
--tour`` shows the commands on a small workload in ~15 s (its longest job burns
4 s). The limit below is generous for a loaded machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import BIN, make_home, procs_with

from minibatch.cluster import lifecycle, probe
from minibatch.config import Paths

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path, temporary = make_home(tmp_path)
    try:
        yield path
    finally:
        with contextlib.suppress(Exception):
            lifecycle.down(Paths(path))
        left = procs_with(path)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


def acct_states(out: str) -> dict[str, str]:
    """``mb acct`` rows of the demo's output: job name -> state, per job id."""
    states = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 4 and re.fullmatch(r"\d+(\[\d+\])?", cells[0]):
            states[f"{cells[0]} {cells[1]}"] = cells[2]
    return states


def run_demo(home: Path, *args: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MB_", "PBS_", "SLURM_"))
    }
    env["MB_HOME"] = str(home)
    proc = subprocess.Popen(
        [str(BIN / "mb"), "demo", *args],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    return out


def test_mb_demo_runs_two_policies_side_by_side(home: Path) -> None:
    out = run_demo(home, "--quick", "--out", str(home / "result"))
    table = out[out.index("76 jobs on 64 CPUs") :]
    assert "PBS FIFO" in table and "Maui: backfill + fairshare" in table, out
    for row in ("makespan", "mean wait", "small jobs' wait", "utilization"):
        assert re.search(rf"^{re.escape(row)} .*\d", table, re.MULTILINE), table
    assert "76/76 submitted, 0 queued, 0 running, 76 finished" in out, out
    for policy in ("pbs-fifo", "fairshare"):
        run = home / "result" / policy
        rows = (run / "jobs.csv").read_text().splitlines()
        assert len(rows) == 77, rows[:3]  # a header and the 76 jobs
        # What the server recorded: every job started after its submission and
        # ended after its start, on real nodes of the virtual cluster.
        for row in rows[1:]:
            cells = row.split(",")
            submit, start, end = map(float, cells[2:5])
            assert submit <= start <= end, row
        for plot in ("gantt.png", "utilization.png"):
            assert (run / plot).stat().st_size > 0
    assert (home / "result" / "demo.txt").read_text() in out
    assert procs_with(home) == [], "mb demo left processes behind"
    assert probe.running_pid(Paths(home), probe.Daemon("server")) is None


def test_mb_demo_tour_runs_its_workload_and_stops_clean(home: Path) -> None:
    out = run_demo(home, "--tour")

    # Every kind of end the demo shows, as accounting reports it.
    states = acct_states(out)
    burns = [s for name, s in states.items() if name.endswith(" burn")]
    assert burns == ["COMPLETED"] * 3, states
    sweep = [s for name, s in states.items() if name.endswith(" sweep")]
    assert sweep == ["COMPLETED"] * 4, states
    ends = {name.split()[1]: s for name, s in states.items()}
    assert ends["fail"] == "FAILED", states
    assert ends["cleanup"] == "COMPLETED", states  # afternotok ran
    assert ends["report"] == "CANCELLED", states  # afterok could never run
    assert ends["overtime"] == "TIMEOUT", states
    assert ends["memhog"].startswith("OUT_OF_ME"), states
    # The request no node can satisfy is refused at submission.
    assert "qsub: job can never run:" in out, out
    assert re.search(r"burned \d+ s", out), out
    assert re.search(r"\$ mb down\nstopped .*broker", out), out

    assert procs_with(home) == [], "mb demo left processes behind"
    assert probe.running_pid(Paths(home), probe.Daemon("server")) is None
