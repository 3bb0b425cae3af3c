"""The reaper a node daemon becomes when it leaves its jobs running
(minibatch/node/reaper.py), run for real: a process starts the "jobs", then
replaces itself with the reaper, as the daemon does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minibatch.node import reaper

pytestmark = pytest.mark.timeout(60)


def test_the_reaper_keeps_how_each_job_with_a_record_ended(tmp_path: Path) -> None:
    spool = tmp_path
    for job in (7, 9):
        (spool / f"{job}.run").write_text("{}")
    # 7 exits 4, 8 has no record (reported already), 9 is killed by SIGTERM;
    # a child that is no job's top is reaped too. (Not a shell: it would reap
    # its background jobs itself before the exec.)
    code = f"""
import os, signal, sys, time
def child(how):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)  # still running when the reaper starts
        how()
    return pid
a = child(lambda: os._exit(4))
b = child(lambda: os._exit(5))
c = child(lambda: os.kill(os.getpid(), signal.SIGTERM))
child(lambda: os._exit(0))
print(a, b, c, flush=True)
os.execv(sys.executable, [sys.executable, "-m", "{reaper.PROGRAM}", "{spool}",
         f"{{a}}:7", f"{{b}}:8", f"{{c}}:9"])
"""
    done = subprocess.run([sys.executable, "-c", code], timeout=30, capture_output=True)
    assert done.returncode == 0, done.stderr
    a, b, c = map(int, done.stdout.split())
    seven, nine = reaper.read(spool, 7, a), reaper.read(spool, 9, c)
    assert seven is not None and os.WEXITSTATUS(seven.status) == 4
    assert nine is not None and os.WTERMSIG(nine.status) == signal.SIGTERM
    assert reaper.read(spool, 8, b) is None and not (spool / "8.exit").exists()
    # Another run of job 7 (another top process) does not take this end.
    assert reaper.read(spool, 7, a + 100000) is None
    assert oct((spool / "7.exit").stat().st_mode & 0o777) == "0o600"
    # Once the job's record is gone (reported), its end file goes too.
    (spool / "7.run").unlink()
    reaper.remove_stale(spool)
    assert not (spool / "7.exit").exists() and (spool / "9.exit").exists()
