"""Limits in the kernel: each job in cgroups of its own (this machine offers v1).

What the OS says is checked: the job's /proc/PID/cgroup and affinity, the
kernel's OOM kill, the cgroup's task count, files left in /dev/shm, and which
processes are still alive after the job ended or its node daemon was killed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import BIN, EXAMPLES, Cluster, ClusterFactory, procs_with

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PY = sys.executable


def script(c: Cluster, name: str, body: str) -> str:
    path = c.work / name
    path.write_text("#!/bin/sh\n" + body)
    return str(path)


def alive_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if marker in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_job_is_in_its_own_cgroups_and_cannot_widen_its_cpus(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    status = c.run("mb", "status").stdout
    assert "limits by cgroup v1" in status, status
    body = (
        "grep -E 'cpuset|memory|pids' /proc/self/cgroup\n"
        "taskset -pc 0,1 $$ >/dev/null 2>&1\n"
        "grep Cpus_allowed_list /proc/self/status\n"
        "echo nofile $(ulimit -n)\n"
    )
    jid = c.qsub("-o", "out.txt", "-j", "oe", script(c, "where.sh", body))
    record = c.wait_state(jid, "completed")
    out = (c.work / "out.txt").read_text()
    assert out.count(f"/job_{jid}") == 3, out
    # The node's CPU only, though the job asked the kernel for both.
    cpus = c.layout[[n.name for n in c.layout].index(record["node"])].cpus
    assert f"Cpus_allowed_list:\t{cpus[0]}" in out, (out, cpus)
    # The daemon raised its own open file limit; the job gets the usual one.
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert f"nofile {soft}\n" in out, (out, soft)


def test_a_job_on_two_nodes_runs_with_both_cores_and_srun_uses_them(
    cluster: ClusterFactory,
) -> None:
    """The nodes are cores of one machine: a job given a CPU on each of two
    1-CPU nodes runs its script with both, so ``srun -n 2`` of an ordinary
    Slurm script runs (it refused: 'the job holds 1'; found by a new-user
    trial), each task on a core of its own, and the memory of both nodes is the
    job's limit here."""
    c = cluster(nodes=2, cpus_per_node=1)
    cores = sorted(n.cpus[0] for n in c.layout)
    body = (
        "#SBATCH -n 2 --mem=64M\n"
        "grep Cpus_allowed_list /proc/self/status\n"
        "echo mem $SLURM_MEM_PER_NODE\n"
        "cat /sys/fs/cgroup/memory$(grep -E ':memory:' /proc/self/cgroup"
        " | cut -d: -f3)/memory.limit_in_bytes\n"
        f"{BIN / 'srun'} -l grep Cpus_allowed_list /proc/self/status\n"
    )
    path = c.work / "two.sh"
    path.write_text("#!/bin/sh\n" + body)
    jid = c.run("sbatch", "--parsable", "-o", "two.out", str(path)).stdout.strip()
    record = c.wait_state(jid, "completed")
    out = (c.work / "two.out").read_text()
    assert sorted(a["node"] for a in record["alloc"]) == ["node0", "node1"], record
    both = ",".join(str(core) for core in cores)
    assert f"Cpus_allowed_list:\t{both}" in out.replace("-", ","), out
    # --mem spread with the tasks: half on each node, the whole of it here.
    assert f"mem {record['mem_kb'] // 2 // 1024}\n" in out, out
    assert f"\n{record['mem_kb'] * 1024}\n" in out, out
    tasks = sorted(
        line.split("\t")[-1] for line in out.splitlines() if ": Cpus" in line
    )
    assert tasks == [str(core) for core in cores], out


def test_memory_limit_is_hard_and_counts_shm_and_memfd(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    limit_kb = 64 * 1024
    jobs = {
        "anon": f"{PY} -c 'b = bytearray(300 << 20)'\n",
        "shm": "dd if=/dev/zero of=/dev/shm/mb-test-$PBS_JOBID bs=1M count=300\n",
        "memfd": (
            f'{PY} -c \'import os; fd = os.memfd_create("x"); '
            "[os.write(fd, bytes(1 << 20)) for _ in range(300)]'\n"
        ),
    }
    ids = {
        kind: c.qsub("-l", "mem=64mb", script(c, f"{kind}.sh", body))
        for kind, body in jobs.items()
    }
    for kind, jid in ids.items():
        record = c.wait_state(jid, "finished", timeout=30)
        assert record["result"] == "out_of_memory", (kind, record)
        # By the kernel's OOM killer (a bytearray is one allocation: no
        # code runs to thrash on), or by the node if the kernel let the job
        # thrash at the limit first.
        why = (
            "the kernel killed" if kind == "anon" else f"memory limit of {limit_kb} kb"
        )
        assert why in record["comment"], (kind, record)
        # The cgroup's own peak: never past the limit, unlike a sampled one.
        assert 0 < record["maxrss_kb"] <= limit_kb, (kind, record)
        # Where its user looks, as Torque's mom writes it.
        err = (c.work / f"{kind}.sh.e{jid}").read_text()
        assert "=>> PBS: job killed: memory limit" in err, (kind, err)
    # What the shm job wrote was removed when it ended.
    assert not list(Path("/dev/shm").glob(f"mb-test-{ids['shm']}*"))


def test_a_memory_limit_too_small_to_start_in_ends_the_job_not_its_node(
    cluster: ClusterFactory,
) -> None:
    """The daemon's spawning thread is in the job's cgroups around the fork:
    were the limit set then, the kernel's OOM killer would take the daemon,
    the cgroup's largest task (a user's qsub -l mem=512 did, every time)."""
    c = cluster(nodes=1, cpus_per_node=2)
    node = c.pids()["node-node0"]
    tiny = c.qsub("-l", "mem=512", "--", "sleep", "30")  # bytes, as Torque reads it
    small = c.qsub("-l", "mem=64kb", "--", "sleep", "30")
    for jid in (tiny, small):
        record = c.wait_state(jid, "finished", timeout=30)
        assert record["result"] == "out_of_memory", record
        assert record["signal"] == 9, record
    assert "is below the" in c.job(tiny)["comment"]
    assert c.pids()["node-node0"] == node
    assert c.nodes()["node0"].state == "free"


def test_a_job_thrashing_at_its_memory_limit_ends_out_of_memory(
    cluster: ClusterFactory,
) -> None:
    """Its memory full, the kernel keeps evicting and reading back its files
    rather than OOM-kill it (jobs/examples/thrash.py); a job that only
    streams a file larger than its limit through its cache runs on."""
    c = cluster(nodes=2, cpus_per_node=1)
    stream = (
        "dd if=/dev/urandom of=$TMPDIR/f bs=1M count=96 status=none\n"
        "cat $TMPDIR/f > /dev/null && cat $TMPDIR/f > /dev/null && echo read\n"
    )
    streamer = c.qsub("-l", "mem=64mb", script(c, "stream.sh", stream))
    thrasher = c.qsub(str(EXAMPLES / "thrash.py"))
    record = c.wait_state(thrasher, "finished", timeout=50)
    # Long before its walltime (60 s), which it would otherwise run out.
    assert (record["result"], record["signal"]) == ("out_of_memory", 9), record
    assert "(thrashing)" in record["comment"], record
    out = (c.work / f"thrash.e{thrasher}").read_text()
    assert "=>> PBS: job killed: memory limit" in out, out
    assert c.job_procs(thrasher) == []
    record = c.wait_state(streamer, "finished", timeout=50)
    assert record["result"] == "completed", record
    assert (c.work / f"stream.sh.o{streamer}").read_text() == "read\n"


# Serial: the end of any job of this user, in any cluster, would take ``keep``
# as its own (written after that job started, open nowhere) and remove it.
@pytest.mark.serial
def test_files_a_job_leaves_in_dev_shm_are_removed(cluster: ClusterFactory) -> None:
    keep = Path("/dev/shm") / f"mb-not-a-job-{os.getpid()}"
    keep.write_bytes(b"x")  # the user's own file, older than the job: kept
    try:
        c = cluster(nodes=1, cpus_per_node=1)
        body = "dd if=/dev/zero of=/dev/shm/mb-left-$PBS_JOBID bs=1M count=8\n"
        jid = c.qsub("-l", "mem=64mb", script(c, "left.sh", body))
        c.wait_state(jid, "completed")
        assert not (Path("/dev/shm") / f"mb-left-{jid}").exists()
        assert keep.exists()
    finally:
        keep.unlink()


def test_pids_max_bounds_a_fork_bomb(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1, node={"pids_max": 12})
    marker = f"{os.getpid() % 1000 + 2000}.5"
    body = f"for i in $(seq 40); do sleep {marker} & done\nwait\n"
    jid = c.qsub("-e", "err.txt", script(c, "bomb.sh", body))
    c.wait_state(jid, "finished")
    assert "fork" in (c.work / "err.txt").read_text().lower()
    assert not alive_with(f"sleep {marker}")  # the 11 it got died with it


def test_a_setsid_env_i_escapee_dies_with_its_job(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    marker = f"{os.getpid() % 1000 + 3000}.5"
    body = f"setsid env -i sleep {marker} &\nsleep 0.5\n"
    jid = c.qsub(script(c, "escape.sh", body))
    c.wait_state(jid, "completed")
    c.wait_for(lambda: not alive_with(f"sleep {marker}"), what="escapee gone")


def test_a_killed_node_daemon_s_job_is_readopted(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1, server={"node_timeout": 2.0})
    marker = f"{os.getpid() % 1000 + 4000}.5"
    flag = c.work / "go"
    body = (
        f"setsid env -i sleep {marker} &\n"
        f"while [ ! -e {flag} ]; do sleep 0.1; done\necho finished\nexit 3\n"
    )
    jid = c.qsub("-o", "out.txt", "-j", "oe", script(c, "long.sh", body))
    c.wait_state(jid, "running")
    c.wait_for(lambda: alive_with(f"sleep {marker}"), what="escapee started")
    node = c.pids()["node-node0"]
    # Held before the kill: its keeper reaps it at once.
    victim = psutil.Process(node)
    victim.kill()
    victim.wait(5)
    c.wait_for(lambda: c.nodes()["node0"].state == "down", what="node down")
    # Down, but its job runs on: nobody has seen its processes end.
    assert c.job(jid)["state"] == "running"
    assert alive_with(f"sleep {marker}")

    report = c.up()
    assert report.started == ["node-node0"], report
    c.wait_for(lambda: "re-adopted" in c.log("node-node0"), what="re-adoption")
    assert c.job(jid)["state"] == "running"
    flag.touch()
    # Not its parent, the new daemon still learns how it ended: the kernel's
    # process events give the top process's wait status (root only).
    record = c.wait_state(jid, "failed")
    assert record["exit_status"] == 3, record
    assert "unknown" not in record["comment"], record
    assert "finished" in (c.work / "out.txt").read_text()
    c.wait_for(lambda: not alive_with(f"sleep {marker}"), what="escapee gone")
    accounting = [j for j in c.jobs() if j["id"] == record["id"]]
    assert len(accounting) == 1 and record["reruns"] == 0, record


def test_a_job_that_ends_while_its_killed_node_daemon_is_down_keeps_its_status(
    cluster: ClusterFactory,
) -> None:
    """A node daemon killed with SIGKILL: its keeper (mb up started the daemon
    under it) is the jobs' parent now and keeps how they end for the next one."""
    c = cluster(nodes=1, cpus_per_node=2, server={"node_timeout": 2.0})
    flag, later = c.work / "go", c.work / "later"
    wait = f"while [ ! -e {flag} ]; do sleep 0.05; done\n"
    early = c.qsub(script(c, "early.sh", wait + "exit 3\n"))
    late = c.qsub(
        script(c, "late.sh", wait.replace(str(flag), str(later)) + "exit 4\n")
    )
    after = c.qsub("-W", f"depend=afternotok:{early}", "--", "true")
    tops = {
        jid: psutil.Process(c.wait_for(lambda j=jid: c.job(j)["session_id"]))
        for jid in (early, late)
    }
    node = psutil.Process(c.pids()["node-node0"])
    keeper = node.parent()
    assert keeper is not None and "minibatch.node.keeper" in keeper.cmdline()
    node.kill()
    node.wait(5)
    # Orphaned to the keeper, the nearest subreaper, not to init.
    assert {top.ppid() for top in tops.values()} == {keeper.pid}
    flag.touch()
    tops[early].wait(10)
    c.wait_for(lambda: (c.paths.spool / f"{early}.exit").exists(), what="kept end")
    assert "was killed by SIGKILL; keeping the ends of the 2 job(s)" in c.log(
        "node-node0"
    )

    c.up()
    record = c.wait_state(early, "failed", timeout=30)
    assert record["exit_status"] == 3 and record["reruns"] == 0, record
    assert "ended while its node daemon was down" in record["comment"], record
    c.wait_state(after, "completed", timeout=30)
    assert c.job(late)["state"] == "running"
    later.touch()
    record = c.wait_state(late, "failed", timeout=30)
    assert record["exit_status"] == 4 and "unknown" not in record["comment"], record
    # Its last job gone, the old keeper is too; mb down leaves nothing behind.
    keeper.wait(10)
    c.down()
    assert procs_with(c.home) == []


def test_keep_running_and_drain(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    flag = c.work / "go"
    body = f"while [ ! -e {flag} ]; do sleep 0.1; done\n"
    jobs = [c.qsub(script(c, "kept.sh", body)) for _ in range(2)]
    on = {c.wait_state(j, "running")["node"]: j for j in jobs}
    assert set(on) == {"node0", "node1"}
    # The start report (the pid) may follow the launch by a few ms.
    started = [c.wait_for(lambda j=j: c.job(j)["session_id"]) for j in jobs]
    tops = [psutil.Process(pid) for pid in started]
    out = c.run("mb", "down", "--keep-running").stdout
    assert "stopped" in out and not c.pids(), out
    assert all(top.is_running() for top in tops)

    c.up()
    for node, jid in on.items():
        # Each by its own node: the nodes share the spool, not their jobs.
        c.wait_for(lambda n=node: "re-adopted" in c.log(f"node-{n}"), what=node)
        log = c.log(f"node-{node}")
        assert f"job {jid}: re-adopted" in log, log
        assert log.count(": re-adopted") == 1, log
    queued = c.qsub("--", "/bin/true")  # both CPUs are busy: it waits
    drain = subprocess.Popen(
        [str(BIN / "mb"), "down", "--drain"],
        env=c.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        c.wait_for(lambda: "scheduler" not in c.pids(), what="scheduler stopped")
        assert drain.poll() is None
        assert all(c.job(j)["state"] == "running" for j in jobs)
        flag.touch()
        out, err = drain.communicate(timeout=60)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    assert drain.returncode == 0 and "draining: 2 job(s)" in err, (out, err)
    assert not c.pids()
    c.up()
    for jid in jobs:
        record = c.wait_state(jid, "completed")
        assert record["reruns"] == 0, record
    c.wait_state(queued, "completed")


def test_jobs_that_end_while_no_node_daemon_runs_keep_their_exit_status(
    cluster: ClusterFactory,
) -> None:
    """mb down --keep-running (an upgrade): the daemon becomes its jobs'
    reaper, so a job that ends before the next mb up is reported as it ended,
    and its afterok dependent runs."""
    c = cluster(nodes=3, cpus_per_node=1)
    flag, later = c.work / "go", c.work / "later"
    wait = f"while [ ! -e {flag} ]; do sleep 0.05; done\n"
    ok = c.qsub(script(c, "ok.sh", wait + "exit 0\n"))
    bad = c.qsub(script(c, "bad.sh", wait + "exit 3\n"))
    # Ends once re-adopted: its reaper's child still, the new daemon's job.
    late = c.qsub(script(c, "late.sh", wait.replace(str(flag), str(later))))
    after = c.qsub("-W", f"depend=afterok:{ok}", "--", "true")
    for jid in (ok, bad, late):
        c.wait_state(jid, "running")
    tops = {
        jid: psutil.Process(c.wait_for(lambda j=jid: c.job(j)["session_id"]))
        for jid in (ok, bad)
    }
    nodes = {n: p for n, p in c.pids().items() if n.startswith("node-")}
    late_top = psutil.Process(c.wait_for(lambda: c.job(late)["session_id"]))
    out = c.run("mb", "down", "--keep-running").stdout
    assert "stopped" in out and not c.pids(), out
    # Same pids, another program: each node daemon now waits for its jobs.
    reaper_of = {jid: top.ppid() for jid, top in tops.items()}
    parents = {*reaper_of.values(), late_top.ppid()}
    assert parents == set(nodes.values()), (parents, nodes)
    reapers = {pid: psutil.Process(pid) for pid in parents}
    for reaper in reapers.values():
        assert "minibatch.node.reaper" in reaper.cmdline(), reaper.cmdline()
        # Under the keeper mb up started it with, which waits for it.
        assert "minibatch.node.keeper" in reaper.parent().cmdline()

    flag.touch()
    for top in tops.values():
        top.wait(10)
    for jid in (ok, bad):
        c.wait_for(lambda j=jid: (c.paths.spool / f"{j}.exit").exists(), what="end")
    status = c.run("mb", "status", check=False).stdout
    assert "3 job(s) left running in their cgroups" in status, status
    done = [reapers.pop(pid) for pid in reaper_of.values()]
    psutil.wait_procs(done, timeout=10)  # no child left: they are gone
    assert not any(r.is_running() for r in done)

    c.up()
    record = c.wait_state(ok, "completed", timeout=30)
    assert record["exit_status"] == 0 and record["reruns"] == 0, record
    record = c.wait_state(bad, "failed", timeout=30)
    assert record["exit_status"] == 3 and "unknown" not in record["comment"], record
    assert "ended while its node daemon was down" in record["comment"], record
    c.wait_state(after, "completed", timeout=30)
    assert c.job(late)["state"] == "running"
    later.touch()
    record = c.wait_state(late, "completed", timeout=30)
    assert record["exit_status"] == 0 and record["reruns"] == 0, record
    psutil.wait_procs(list(reapers.values()), timeout=10)
    assert not any(r.is_running() for r in reapers.values())
    assert not list(c.paths.spool.glob("*.exit")) and not list(
        c.paths.spool.glob("*.run")
    )


def test_kept_jobs_killed_by_a_later_mb_down_end_as_mb_down_ends_jobs(
    cluster: ClusterFactory,
) -> None:
    """mb down --keep-running, then a plain mb down: the kept jobs are killed
    (nothing outlives mb down) and, at the next mb up, requeued or, -r n,
    cancelled, as a running cluster's mb down would have; one that had ended
    by itself in between is reported as it ended."""
    c = cluster(nodes=1, cpus_per_node=3)
    flag, early = c.work / "go", c.work / "early"
    body = f"while [ ! -e {flag} ]; do sleep 0.05; done\n"
    again = c.qsub(script(c, "again.sh", body))
    once = c.qsub("-r", "n", script(c, "once.sh", body))
    done = c.qsub(
        script(c, "done.sh", body.replace(str(flag), str(early)) + "exit 5\n")
    )
    tops = {
        j: psutil.Process(c.wait_for(lambda j=j: c.job(j)["session_id"]))
        for j in (again, once, done)
    }
    out = c.run("mb", "down", "--keep-running").stdout
    assert all(top.is_running() for top in tops.values()), out
    early.touch()
    tops[done].wait(10)
    c.wait_for(lambda: (c.paths.spool / f"{done}.exit").exists(), what="kept end")
    out = c.run("mb", "down").stdout
    assert "2 job(s) left running without a node daemon" in out, out
    psutil.wait_procs(list(tops.values()), timeout=10)
    assert not any(top.is_running() for top in tops.values())

    c.up()
    record = c.wait_state(done, "failed", timeout=30)
    assert record["exit_status"] == 5 and record["reruns"] == 0, record
    assert "ended while its node daemon was down" in record["comment"], record
    record = c.wait_state(once, "cancelled", timeout=30)
    assert "not rerunnable" in record["comment"], record
    c.wait_for(lambda: c.job(again)["reruns"] == 1, what="requeued")
    c.wait_state(again, "running", timeout=30)
    flag.touch()
    record = c.wait_state(again, "completed", timeout=30)
    assert record["reruns"] == 1, record
    assert not list(c.paths.spool.glob("*.swept"))


def test_without_cgroups_limits_are_sampled_and_jobs_cannot_be_kept(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1, cpus_per_node=1, node={"cgroups": False})
    status = c.run("mb", "status").stdout
    assert "affinity and sampling: turned off" in status, status
    jid = c.qsub("--", "/bin/sleep", "30")
    procs = c.launched_procs(jid)
    refused = c.run("mb", "down", "--keep-running", check=False)
    assert refused.returncode != 0 and "needs cgroups" in refused.stderr, refused
    assert c.pids().get("server") and all(p.is_running() for p in procs)


def test_a_full_spool_takes_the_node_offline_not_the_jobs(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    spool = c.paths.spool
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(spool)], check=True
    )
    try:
        filler = spool / "filler"
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=30"],
            capture_output=True,
        )
        jid = c.qsub("--", "/bin/true")  # argv: the node file is what fails
        c.wait_for(lambda: c.nodes()["node0"].state == "offline", what="offline")
        node = c.nodes()["node0"]
        assert "No space left on device" in node.comment, node
        assert c.job(jid)["state"] == "queued"  # not failed: it waits
        filler.unlink()
        record = c.wait_state(jid, "completed", timeout=30)
        assert record["reruns"] >= 1, record
        assert c.nodes()["node0"].state == "free"
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=False)


def test_mb_down_kills_the_jobs_of_a_dead_node_daemon(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    marker = f"{os.getpid() % 1000 + 5000}.5"
    jid = c.qsub(script(c, "orphan.sh", f"setsid env -i sleep {marker} &\nwait\n"))
    c.wait_state(jid, "running")
    c.wait_for(lambda: alive_with(f"sleep {marker}"), what="job started")
    node = c.pids()["node-node0"]
    # Held before the kill: its keeper reaps it at once.
    victim = psutil.Process(node)
    victim.kill()
    victim.wait(5)
    out = c.run("mb", "down").stdout
    assert "node-node0" not in out, out  # it was not running
    assert "1 job(s) left running without a node daemon" in out, out
    assert not alive_with(f"sleep {marker}")
    assert not list(c.paths.spool.glob("*.run"))
