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

import psutil
import pytest

from minibatch.node import keeper, reaper, records
from minibatch.node.records import RunRecord
from tests.unit.test_node_parts import spec

pytestmark = pytest.mark.timeout(60)


def _record(spool: Path, job: int, start: float | None = None) -> None:
    when = time.time() if start is None else start
    records.begin(spool, RunRecord(node="n1", spec=spec(job=job), pid=0, start=when))


def _keep(
    tmp_path: Path, daemon: str, pidfile: Path | None = None
) -> subprocess.Popen[str]:
    command = keeper.command(
        pidfile or tmp_path / "node.pid", tmp_path, "n1", [sys.executable, "-c"]
    )
    return subprocess.Popen(
        [*command, daemon], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


#: A stand-in daemon: its "job" (job 5's top, recorded as the daemon records
#: it) outlives it, and it dies by the signal given.
_DYING = """
import os, signal, time
pid = os.fork()
if pid == 0:
    time.sleep(0.3)
    os._exit(4)
with open("{spool}/5.run", "ab") as f:
    f.write(b"\\n%d" % pid)
print(os.getpid(), pid, flush=True)
os.kill(os.getpid(), {sig})
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGRTMIN + 6])
def test_a_killed_daemon_s_jobs_end_under_the_keeper_which_writes_how(
    tmp_path: Path, sig: int
) -> None:
    _record(tmp_path, 5)
    proc = _keep(tmp_path, _DYING.format(spool=tmp_path, sig=int(sig)))
    out, err = proc.communicate(timeout=30)
    # The daemon's own end, as a shell would give it.
    assert proc.returncode == 128 + sig, err
    node, top = map(int, out.split())
    assert (tmp_path / "node.pid").read_text() == f"{node}\n"
    ended = reaper.read(tmp_path, 5, top)
    assert ended is not None and os.WEXITSTATUS(ended.status) == 4
    name = "SIGKILL" if sig == signal.SIGKILL else f"signal {int(sig)}"
    assert f"was killed by {name}; keeping the ends of the 1 job(s)" in err


def test_a_pid_that_is_not_the_recorded_job_s_top_gets_no_end(tmp_path: Path) -> None:
    """A record's pid is believed only for a process that started when the
    record says: the daemon may have reaped that job, and its pid be reused."""
    _record(tmp_path, 5, start=time.time() - 3600)
    proc = _keep(tmp_path, _DYING.format(spool=tmp_path, sig=int(signal.SIGKILL)))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert not (tmp_path / "5.exit").exists()


def test_a_daemon_whose_pid_cannot_be_written_is_stopped(tmp_path: Path) -> None:
    """Nothing could find a daemon with no pid file to stop it."""
    daemon = f"import time; time.sleep(30)  # {tmp_path}"
    with _keep(tmp_path, daemon, pidfile=tmp_path / "no" / "node.pid") as proc:
        assert proc.wait(timeout=30) == 1
        # Stopped, and reaped by the keeper before it returned (looked at
        # before reading the keeper's stderr, which the daemon shares).
        running = psutil.process_iter(["cmdline"])
        assert not [p for p in running if daemon in (p.info["cmdline"] or [])]
        assert proc.stderr is not None and "stopping mb-node" in proc.stderr.read()


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
    command = keeper.command(
        tmp_path / "node.pid", tmp_path, "n1", [str(tmp_path / "no")]
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "cannot run" in done.stderr and "No such file" in done.stderr
    assert not (tmp_path / "node.pid").exists()
