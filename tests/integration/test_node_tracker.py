"""The launcher and tracker driven directly, with real processes and no server.

Reports are collected through the tracker's callback; every assertion is about what
the operating system says (affinity, files, pids, exit statuses, rusage).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from minibatch.core.job import JobResult
from minibatch.node.procfs import kill_leftovers
from minibatch.protocol.messages import JobEnded, JobStarted
from tests.integration.conftest import GRACE, Harness, gone, wait_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_whole_tree_bound_to_allocated_cpus(node: Harness) -> None:
    cpu = max(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    script = "sleep 30 &\necho $! > child.pid\nwait\n"
    node.tracker.launch(node.spec(1, script, cpus=[cpu]))
    started = await node.started(1)
    child = int(await wait_file(node.workdir / "child.pid"))
    assert psutil.Process(started.pid).cpu_affinity() == [cpu]
    assert psutil.Process(child).cpu_affinity() == [cpu]
    assert os.sched_getaffinity(0) == mine  # the daemon's own mask is restored

    node.tracker.kill(1, JobResult.CANCELLED)
    end = await node.ended(1, timeout=GRACE + 3)
    assert end.result is JobResult.CANCELLED
    assert (end.exit_status, end.signal) == (256 + signal.SIGTERM, signal.SIGTERM)
    assert gone(child) and gone(started.pid)


async def test_environment_and_output_files(node: Harness) -> None:
    script = "echo to-out\necho to-err >&2\nenv\necho NODEFILE; cat $PBS_NODEFILE\n"
    cpus = sorted(os.sched_getaffinity(0))
    spec = node.spec(
        7,
        script,
        display_id="5[2]",
        cpus=cpus,
        hosts=["hostA", "hostB"],
        array_id=5,
        array_index=2,
        env={"FOO": "bar", "PBS_JOBID": "stale", "PATH": os.environ["PATH"]},
    )
    node.tracker.launch(spec)
    end = await node.ended(7)
    assert end.result is JobResult.COMPLETED and end.exit_status == 0
    # The record goes before the end is reported (a restarted daemon must not
    # report the job again); the other files follow in the background.
    assert not (node.spool / "7.run").exists()
    out = (node.workdir / "job7.o").read_text()
    assert (node.workdir / "job7.e").read_text() == "to-err\n"
    lines = out.splitlines()
    assert lines[0] == "to-out"
    env = dict(line.split("=", 1) for line in lines[1 : lines.index("NODEFILE")])
    n = str(len(cpus))
    expected = {
        "FOO": "bar",
        "MB_JOBID": "5[2]",
        "MB_CPUS": n,
        "MB_CPU_LIST": ",".join(map(str, cpus)),
        "MB_NODE": node.name,
        "OMP_NUM_THREADS": n,
        "PBS_JOBID": "5[2]",
        "PBS_JOBNAME": "job7",
        "PBS_O_WORKDIR": str(node.workdir),
        "PBS_ARRAYID": "2",
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "SLURM_JOB_ID": "7",
        "SLURM_CPUS_ON_NODE": n,
        "SLURM_JOB_NAME": "job7",
        "SLURM_ARRAY_JOB_ID": "5",
        "SLURM_ARRAY_TASK_ID": "2",
    }
    assert {k: env.get(k) for k in expected} == expected
    for key in ("HOME", "USER", "LOGNAME", "SHELL", "PBS_NODEFILE"):
        assert env.get(key)
    assert "MB_CPUSET_FILE" not in env  # a rigid job's CPUs never change
    nodefile = lines[lines.index("NODEFILE") + 1 :]
    assert nodefile == ["hostA"] * len(cpus) + ["hostB"] * len(cpus)
    node.launcher.flush()  # the end's removals run in the background
    assert not list(node.spool.iterdir())  # spool files are removed at the end


async def test_join_puts_stderr_in_stdout(node: Harness) -> None:
    node.tracker.launch(node.spec(1, "echo a\necho b >&2\n", join=True))
    await node.ended(1)
    assert (node.workdir / "job1.o").read_text() == "a\nb\n"
    assert not (node.workdir / "job1.e").exists()


async def test_argv_job_and_shebang_script(node: Harness) -> None:
    node.tracker.launch(node.spec(1, argv=["/bin/echo", "direct"]))
    node.tracker.launch(node.spec(2, "#!/bin/sh\necho $0\n"))
    assert (await node.ended(1)).result is JobResult.COMPLETED
    assert (await node.ended(2)).result is JobResult.COMPLETED
    assert (node.workdir / "job1.o").read_text() == "direct\n"
    assert (node.workdir / "job2.o").read_text().strip().endswith("2.sh")


async def test_nonzero_exit_fails(node: Harness) -> None:
    node.tracker.launch(node.spec(3, "exit 3\n"))
    end = await node.ended(3)
    assert (end.result, end.exit_status, end.signal) == (JobResult.FAILED, 3, None)


async def test_spawn_failures_are_reported(node: Harness) -> None:
    node.tracker.launch(node.spec(1, "true\n", workdir="/nonexistent/dir"))
    node.tracker.launch(node.spec(2, argv=[str(node.workdir / "no-such-program")]))
    for job in (1, 2):
        end = await node.ended(job)
        assert end.result is JobResult.FAILED and end.exit_status is None
        assert "No such file or directory" in end.comment
    assert not [r for r in node.reports if isinstance(r, JobStarted)]


async def test_launch_is_idempotent(node: Harness) -> None:
    spec = node.spec(4, "sleep 0.2\n")
    node.tracker.launch(spec)
    node.tracker.launch(spec)
    await node.ended(4)
    node.tracker.launch(spec)
    await asyncio.sleep(0.1)
    assert [type(r) for r in node.reports] == [JobStarted, JobEnded]


async def test_kill_of_unknown_job_is_answered(node: Harness) -> None:
    node.tracker.kill(99, JobResult.CANCELLED)
    end = await node.ended(99)
    assert end.result is JobResult.CANCELLED and "not running" in end.comment


async def test_walltime_sigterm(node: Harness) -> None:
    node.tracker.launch(node.spec(1, "while :; do :; done\n", walltime=1))
    t0 = time.monotonic()
    end = await node.ended(1, timeout=5)
    assert time.monotonic() - t0 < 1 + GRACE + 1
    assert end.result is JobResult.TIMEOUT
    assert (end.exit_status, end.signal) == (271, signal.SIGTERM)
    assert "walltime" in end.comment


async def test_walltime_escalates_to_sigkill(node: Harness) -> None:
    node.tracker.launch(node.spec(1, "trap '' TERM\nwhile :; do :; done\n", walltime=1))
    t0 = time.monotonic()
    end = await node.ended(1, timeout=5)
    assert 1 + GRACE - 0.1 < time.monotonic() - t0 < 1 + GRACE + 1
    assert end.result is JobResult.TIMEOUT
    assert (end.exit_status, end.signal) == (256 + signal.SIGKILL, signal.SIGKILL)


async def test_memory_limit(node: Harness) -> None:
    hog = "import time\nx = b'x' * (300 << 20)\ntime.sleep(30)\n"
    spec = node.spec(1, argv=[sys.executable, "-c", hog], mem_kb=60 * 1024)
    node.tracker.launch(spec)
    end = await node.ended(1, timeout=10)
    assert end.result is JobResult.OUT_OF_MEMORY
    assert end.signal == signal.SIGKILL
    assert end.maxrss_kb > 60 * 1024


async def test_max_rss(node: Harness) -> None:
    # Too short-lived to be sampled: the peak comes from wait4's rusage. The
    # top process's rusage also holds the daemon's peak RSS from before exec,
    # so it counts only past that peak: here the test process's, which other
    # tests of this worker may have raised past 400 MB (it failed so in CI).
    own_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    size_kb = max(400 << 10, own_kb + (100 << 10))
    big = f"x = b'x' * ({size_kb} << 10)"
    node.tracker.launch(node.spec(1, argv=[sys.executable, "-c", big]))
    # A small job must not be charged for the daemon's peak.
    node.tracker.launch(node.spec(2, "sleep 0.3\n"))
    assert (await node.ended(1)).maxrss_kb >= size_kb
    assert 0 < (await node.ended(2)).maxrss_kb < 20 << 10


async def test_escaped_orphan_is_killed_when_job_ends(node: Harness) -> None:
    script = (
        "(setsid sh -c 'echo $$ > orphan.pid; exec sleep 1000' &)\n"
        "while [ ! -s orphan.pid ]; do sleep 0.01; done\n"
        "exit 0\n"
    )
    node.tracker.launch(node.spec(1, script))
    await node.started(1)
    orphan = int(await wait_file(node.workdir / "orphan.pid"))
    node.extra_pids.append(orphan)
    assert os.getsid(orphan) == orphan  # it left the job's session
    end = await node.ended(1, timeout=5)
    assert end.result is JobResult.COMPLETED
    assert "leftover" in end.comment
    assert not psutil.pid_exists(orphan)  # killed and reaped before the report


async def test_cputime_counts_reaped_orphans(node: Harness) -> None:
    # The busy loop is orphaned at once (its subshell exits), so its CPU time
    # reaches the job only through the daemon's own wait4 of it. Spinning on
    # process_time keeps the test meaningful on a loaded machine.
    busy = (
        "import time, pathlib\n"
        "while time.process_time() < 1.5: pass\n"
        "pathlib.Path('done').touch()\n"
    )
    script = (
        f'({sys.executable} -c "{busy}" &)\nwhile [ ! -e done ]; do sleep 0.02; done\n'
    )
    node.tracker.launch(node.spec(1, script))
    start = await node.started(1)
    end = await node.ended(1, timeout=10)
    elapsed = end.end_time - start.time
    assert end.result is JobResult.COMPLETED
    assert abs(end.cputime_s - 1.5) <= 0.25 * 1.5, end.cputime_s
    assert end.cputime_s <= elapsed * 1.05, (end.cputime_s, elapsed)
    assert end.maxrss_kb > 0


async def test_many_short_jobs(node: Harness) -> None:
    n = 100
    t0 = time.monotonic()
    for job in range(1, n + 1):
        node.tracker.launch(node.spec(job, argv=["/bin/true"]))
    for job in range(1, n + 1):
        assert (await node.ended(job)).result is JobResult.COMPLETED
    assert time.monotonic() - t0 < 10
    assert node.tracker.running() == []


async def test_stop_all_reports_node_fail(node: Harness) -> None:
    node.tracker.launch(node.spec(1, "sleep 30\n"))
    await node.started(1)
    await node.tracker.stop_all(JobResult.NODE_FAIL, "node daemon stopped")
    end = await node.ended(1, timeout=0.1)
    assert end.result is JobResult.NODE_FAIL
    # The shell's child may outlive it by an instant and be killed as a leftover.
    assert end.comment.startswith("node daemon stopped"), end.comment
    node.tracker.launch(node.spec(2, "true\n"))
    assert (await node.ended(2, timeout=0.1)).result is JobResult.NODE_FAIL


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
async def test_runs_as_the_submitting_user(node: Harness) -> None:
    pw = pwd.getpwnam("nobody")
    shared = Path(tempfile.mkdtemp(prefix="mbnode-"))
    private = Path(tempfile.mkdtemp(prefix="mbnode-private-"))  # 0700, root's
    try:
        shared.chmod(0o777)
        user = dict(uid=pw.pw_uid, gid=pw.pw_gid, user="nobody", workdir=str(shared))
        node.tracker.launch(node.spec(1, argv=["/usr/bin/id", "-u"], **user))
        node.tracker.launch(
            node.spec(2, argv=["/bin/true"], stdout_path=str(private / "x.o"), **user)
        )
        end = await node.ended(1)
        assert end.result is JobResult.COMPLETED, end.comment
        assert (shared / "job1.o").read_text().strip() == str(pw.pw_uid)
        assert (shared / "job1.o").stat().st_uid == pw.pw_uid
        end = await node.ended(2)
        assert end.result is JobResult.FAILED and "Permission denied" in end.comment
        assert not (private / "x.o").exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def test_leftovers_of_an_earlier_daemon_are_killed(tmp_path: Path) -> None:
    name = f"tnode-{uuid.uuid4().hex[:8]}"
    mine = {**os.environ, "MB_NODE": name, "MB_HOME": str(tmp_path)}
    other_home = {**mine, "MB_HOME": str(tmp_path / "other")}
    old = subprocess.Popen(["sleep", "60"], env=mine)
    bystander = subprocess.Popen(["sleep", "60"], env=other_home)
    try:
        assert kill_leftovers(name, str(tmp_path)) == [old.pid]
        assert old.wait(timeout=5) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (old, bystander):
            p.kill()
            p.wait()
