"""``mb demo`` end to end, as ``make demo`` runs it: a cluster comes up in a fresh
``MB_HOME``, the workload runs, accounting says how each job ended, and the
cluster goes down leaving no process behind.

``mb demo`` has no shorter form; it takes ~15 s on an idle 2-CPU machine (its
longest job burns 4 s), so the limit below is generous for a loaded one.
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

from minibatch.cluster import lifecycle
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


def test_mb_demo_runs_its_workload_and_stops_clean(home: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MB_", "PBS_", "SLURM_"))
    }
    env["MB_HOME"] = str(home)
    proc = subprocess.Popen(
        [str(BIN / "mb"), "demo"],
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
    assert lifecycle.running_pid(Paths(home), lifecycle.Daemon("server")) is None
