"""The keeper mb up runs each node daemon under (minibatch/node/keeper.py), run
for real with a stand-in daemon: a program that starts a "job", writes its
record as a node daemon does, and dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minibatch.node import keeper, reaper, records
from minibatch.node.records import RunRecord
from tests.unit.test_node_parts import spec

pytestmark = pytest.mark.timeout(60)


def _record(spool: Path, job: int) -> None:
    rec = RunRecord(node="n1", spec=spec(job=job), pid=0, start=time.time())
    records.begin(spool, rec)


def _keep(tmp_path: Path, daemon: str) -> subprocess.Popen[str]:
    command = keeper.command(tmp_path / "node.pid", tmp_path, [sys.executable, "-c"])
    return subprocess.Popen(
        [*command, daemon], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_killed_daemon_s_jobs_end_under_the_keeper_which_writes_how(
    tmp_path: Path,
) -> None:
    _record(tmp_path, 5)
    # The "job" (job 5's top) outlives its daemon, which SIGKILLs itself.
    daemon = f"""
import os, signal, time
pid = os.fork()
if pid == 0:
    time.sleep(0.3)
    os._exit(4)
with open("{tmp_path}/5.run", "ab") as f:
    f.write(b"\\n%d" % pid)
print(os.getpid(), pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = _keep(tmp_path, daemon)
    out, err = proc.communicate(timeout=30)
    # The daemon's own end, as a shell would give it.
    assert proc.returncode == 128 + signal.SIGKILL, err
    node, top = map(int, out.split())
    assert (tmp_path / "node.pid").read_text() == f"{node}\n"
    ended = reaper.read(tmp_path, 5, top)
    assert ended is not None and os.WEXITSTATUS(ended.status) == 4
    assert "was killed by SIGKILL; keeping the ends of the 1 job(s)" in err


def test_the_signals_that_stop_a_daemon_reach_it_through_its_keeper(
    tmp_path: Path,
) -> None:
    daemon = """
import signal, sys, time
signal.signal(signal.SIGUSR2, lambda *_: sys.exit(7))
print("ready", flush=True)
time.sleep(30)
"""
    with _keep(tmp_path, daemon) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=30) == 7
        assert proc.stderr is not None and "killed" not in proc.stderr.read()


def test_a_daemon_that_cannot_start_is_said_and_ends_the_keeper(
    tmp_path: Path,
) -> None:
    command = keeper.command(tmp_path / "node.pid", tmp_path, [str(tmp_path / "no")])
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "cannot run" in done.stderr and "No such file" in done.stderr
    assert not (tmp_path / "node.pid").exists()
