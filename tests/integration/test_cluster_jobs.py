"""One job on a real cluster: what the operating system says about it.

CPU binding, walltime and memory enforcement, exit codes and signals, output files,
the environment a job sees, killing a whole process tree, and CPU-time accounting,
each checked with psutil, the files on disk, or the job's own report of itself.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from conftest import EXAMPLES, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: Seconds of slack on top of the enforced limits (scheduling, sampling, reaping).
SLACK = 1.0


def affinity(proc: psutil.Process) -> list[int] | None:
    try:
        return sorted(proc.cpu_affinity())
    except psutil.Error:
        return None  # gone meanwhile


def test_job_processes_run_on_exactly_their_cpus(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=2)
    script = c.work / "pair.sh"
    script.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\nwait\n")
    a = c.qsub("-l", "ncpus=1,walltime=60", str(script))
    b = c.qsub("-l", "ncpus=1,walltime=60", str(script))
    ja, jb = c.wait_state(a, "running"), c.wait_state(b, "running")
    # Both at once, on one CPU each, and not the same one.
    assert c.job(a)["state"] == c.job(b)["state"] == "running"
    assert len(ja["cpus"]) == len(jb["cpus"]) == 1
    assert set(ja["cpus"]).isdisjoint(jb["cpus"])
    assert set(ja["cpus"]) | set(jb["cpus"]) == {n for n in c.layout[0].cpus}
    for jid, record in ((a, ja), (b, jb)):
        # qstat -f --json says the same as the server record.
        [full] = json.loads(c.run("qstat", "-f", "--json", jid).stdout)
        assert full["cpus"] == record["cpus"]
        # The shell, its background sleep and its foreground sleep.
        procs = c.wait_for(
            lambda jid=jid: (p := c.job_procs(jid)) and len(p) >= 3 and p,
            what=f"job {jid}'s 3 processes",
        )
        names = sorted(p.name() for p in procs)
        assert names.count("sleep") == 2, names
        # Its session id (qstat -a SessID) is the pid of the shell, which
        # leads the session every process of the job is in.
        session = c.wait_for(lambda jid=jid: c.job(jid)["session_id"])
        assert session in {p.pid for p in procs}
        assert {os.getsid(p.pid) for p in procs} == {session}
        for proc in procs:
            got = affinity(proc)
            assert got in (None, record["cpus"]), (proc, got, record["cpus"])
    c.run("qdel", a, b)
    c.wait_state(a, "cancelled")
    c.wait_state(b, "cancelled")

    # A job of two CPUs gets both.
    both = c.qsub("-l", "ncpus=2,walltime=60", str(script))
    record = c.wait_state(both, "running")
    assert record["cpus"] == sorted(c.layout[0].cpus)
    procs = c.wait_for(lambda: (p := c.job_procs(both)) and len(p) >= 3 and p)
    assert {tuple(affinity(p) or record["cpus"]) for p in procs} == {
        tuple(record["cpus"])
    }


def test_walltime_ends_the_job_and_its_processes(cluster: ClusterFactory) -> None:
    c = cluster()
    grace = c.config.node.kill_grace
    polite = c.qsub("-l", "walltime=00:00:02", "--", "sleep", "60")
    # This one ignores SIGTERM: SIGKILL after the grace period ends it.
    stubborn = c.qsub(
        "-l", "walltime=00:00:02", "--", "sh", "-c", "trap '' TERM; sleep 60; exit 0"
    )
    p = c.wait_state(polite, "finished", timeout=2 + grace + 10)
    s = c.wait_state(stubborn, "finished", timeout=2 + grace + 10)

    assert (p["result"], p["exit_status"], p["signal"]) == ("timeout", 256 + 15, 15)
    assert p["letter"] == "F"
    assert "walltime" in p["comment"]
    ran = p["end_time"] - p["start_time"]
    assert 2.0 <= ran <= 2 + grace + SLACK, ran

    assert (s["result"], s["exit_status"], s["signal"]) == ("timeout", 256 + 9, 9)
    ran = s["end_time"] - s["start_time"]
    assert 2.0 + grace <= ran <= 2 + grace + SLACK, ran

    assert c.job_procs(polite) == [] and c.job_procs(stubborn) == []


def test_memory_limit_kills_the_job(cluster: ClusterFactory) -> None:
    c = cluster()
    jid = c.qsub(str(EXAMPLES / "memhog.py"))
    record = c.wait_state(jid, "finished", timeout=30)
    assert record["name"] == "memhog"
    assert record["mem_kb"] == 64 * 1024
    assert record["result"] == "out_of_memory", record
    assert "memory" in record["comment"]
    assert record["signal"] == 9
    # It was stopped near its limit, not after allocating its 256 MB.
    assert 64 * 1024 <= record["maxrss_kb"] < 200 * 1024, record["maxrss_kb"]
    out = Path(record["output_path"]).read_text()
    assert "without being stopped" not in out
    assert c.job_procs(jid) == []


def test_exit_codes_and_signals(cluster: ClusterFactory) -> None:
    c = cluster()
    seven = c.qsub("--", "sh", "-c", "exit 7")
    segv = c.qsub("--", "sh", "-c", "kill -SEGV $$")
    ok = c.qsub("--", "true")
    for jid in (seven, segv, ok):
        c.wait_state(jid, "finished")
    records = {r["id"]: r for r in c.qstat_json("-f", seven, segv, ok)}

    r = records[seven]
    assert (r["result"], r["exit_status"], r["signal"], r["letter"]) == (
        "failed",
        7,
        None,
        "F",
    )
    # Torque: a job killed by signal N has exit status 256 + N.
    r = records[segv]
    assert (r["result"], r["exit_status"], r["signal"]) == ("failed", 256 + 11, 11)
    assert "SIGSEGV" in r["comment"]
    r = records[ok]
    assert (r["result"], r["exit_status"], r["signal"], r["letter"]) == (
        "completed",
        0,
        None,
        "C",
    )


def test_acct_exit_code_is_slurm_code_colon_signal(cluster: ClusterFactory) -> None:
    """sacct's ExitCode is ``code:signal``: a job killed by SIGSEGV shows ``0:11``
    (no exit code, signal 11), not the Torque-style 267 in the code field."""
    c = cluster()
    seven = c.qsub("--", "sh", "-c", "exit 7")
    segv = c.qsub("--", "sh", "-c", "kill -SEGV $$")
    for jid in (seven, segv):
        c.wait_state(jid, "finished")
    acct = c.run("mb", "acct", "-j", f"{seven},{segv}", "-o", "JobID,ExitCode")
    rows = dict(line.split() for line in acct.stdout.splitlines()[2:])
    assert rows == {seven: "7:0", segv: "0:11"}


def test_output_files(cluster: ClusterFactory) -> None:
    c = cluster()
    both = "echo out; echo err >&2"
    # Defaults: NAME.oID and NAME.eID in the submission directory.
    plain = c.qsub("--", "sh", "-c", both)
    # Submitted from another directory: the files go there.
    sub = c.work / "sub"
    sub.mkdir()
    elsewhere = c.qsub("-N", "away", "--", "sh", "-c", both, cwd=sub)
    # -o relative to the submission directory, -e absolute.
    (c.work / "logs").mkdir()
    err_abs = c.work / "logs" / "abs.err"
    paths = c.qsub("-o", "logs/rel.out", "-e", str(err_abs), "--", "sh", "-c", both)
    # -j oe: one file, stderr in it.
    joined = c.qsub("-N", "joined", "-j", "oe", "--", "sh", "-c", both)
    for jid in (plain, elsewhere, paths, joined):
        assert c.wait_state(jid, "finished")["result"] == "completed"

    assert (c.work / f"sh.o{plain}").read_text() == "out\n"
    assert (c.work / f"sh.e{plain}").read_text() == "err\n"
    assert (sub / f"away.o{elsewhere}").read_text() == "out\n"
    assert (sub / f"away.e{elsewhere}").read_text() == "err\n"
    assert not (c.work / f"away.o{elsewhere}").exists()
    assert (c.work / "logs" / "rel.out").read_text() == "out\n"
    assert err_abs.read_text() == "err\n"
    assert not list(c.work.glob(f"*.[oe]{paths}"))
    assert (c.work / f"joined.o{joined}").read_text() == "out\nerr\n"
    assert not (c.work / f"joined.e{joined}").exists()
    record = c.job(joined)
    assert record["join"] is True
    assert record["output_path"] == str(c.work / f"joined.o{joined}")


def test_directives_are_honoured_and_options_override_them(
    cluster: ClusterFactory,
) -> None:
    c = cluster()
    script = c.work / "directed.sh"
    script.write_text(
        "#!/bin/sh\n"
        "#PBS -N fromscript\n"
        "#PBS -l walltime=00:00:07\n"
        "#PBS -j oe\n"
        "echo out; echo err >&2\n"
    )
    as_written = c.qsub(str(script))
    overridden = c.qsub("-N", "fromcli", "-l", "walltime=00:00:09", str(script))
    a = c.wait_state(as_written, "completed")
    b = c.wait_state(overridden, "completed")
    assert (a["name"], a["walltime"], a["join"]) == ("fromscript", 7, True)
    assert (b["name"], b["walltime"], b["join"]) == ("fromcli", 9, True)
    assert (c.work / f"fromscript.o{as_written}").read_text() == "out\nerr\n"
    assert (c.work / f"fromcli.o{overridden}").read_text() == "out\nerr\n"
    assert not (c.work / f"fromscript.o{overridden}").exists()


def test_job_environment(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=2)
    names = [
        "PBS_JOBID",
        "PBS_JOBNAME",
        "PBS_O_WORKDIR",
        "MB_CPU_LIST",
        "OMP_NUM_THREADS",
        "SLURM_JOB_ID",
        "SLURM_CPUS_ON_NODE",
        "MB_NODE",
        "FROM_V",
        "ONLY_WITH_BIG_V",
    ]
    script = c.work / "env.sh"
    script.write_text(
        "#!/bin/sh\n"
        + "".join(f'echo "{n}=${n}"\n' for n in names)
        + 'echo "PWD=$(pwd)"\n'
        + 'echo "NODEFILE_EXISTS=$(test -f "$PBS_NODEFILE" && echo yes)"\n'
        + 'sed "s/^/NODEFILE:/" "$PBS_NODEFILE"\n'
    )
    env = {**c.env, "ONLY_WITH_BIG_V": "leaked"}
    jid = c.qsub(
        "-N", "envjob", "-l", "ncpus=2", "-v", "FROM_V=given", str(script), env=env
    )
    exported = c.qsub("-N", "envall", "-V", str(script), env=env)
    record = c.wait_state(jid, "completed")
    c.wait_state(exported, "completed")

    lines = (c.work / f"envjob.o{jid}").read_text().splitlines()
    seen = dict(line.split("=", 1) for line in lines if "=" in line)
    nodefile = [
        line.removeprefix("NODEFILE:") for line in lines if line.startswith("NODEFILE:")
    ]
    cpus = ",".join(map(str, record["cpus"]))
    assert seen == {
        "PBS_JOBID": jid,
        "PBS_JOBNAME": "envjob",
        "PBS_O_WORKDIR": str(c.work),
        "MB_CPU_LIST": cpus,
        "OMP_NUM_THREADS": "2",
        "SLURM_JOB_ID": jid,
        "SLURM_CPUS_ON_NODE": "2",
        "MB_NODE": "node0",
        "FROM_V": "given",
        "ONLY_WITH_BIG_V": "",
        "PWD": str(c.work),
        "NODEFILE_EXISTS": "yes",
    }
    # One line per CPU, as PBS writes it.
    assert nodefile == ["node0", "node0"]

    lines = (c.work / f"envall.o{exported}").read_text().splitlines()
    seen = dict(line.split("=", 1) for line in lines if "=" in line)
    assert seen["ONLY_WITH_BIG_V"] == "leaked"
    # -V passes the environment, but never another job's or cluster's identity.
    assert seen["PBS_JOBID"] == exported and seen["OMP_NUM_THREADS"] == "1"


def test_qdel_kills_the_whole_process_tree(cluster: ClusterFactory) -> None:
    c = cluster()
    script = c.work / "tree.sh"
    script.write_text(
        "#!/bin/sh\n"
        "sleep 300 &\n"
        "setsid sleep 301 &\n"  # its own session: not in the job's group
        "( sleep 302 & )\n"  # double fork: orphaned at once
        "sh -c 'sleep 303 & wait' &\n"
        "wait\n"
    )
    jid = c.qsub("-l", "walltime=600", str(script))
    c.wait_state(jid, "running")
    procs = c.wait_for(
        lambda: (
            (p := c.job_procs(jid)) and sum(x.name() == "sleep" for x in p) >= 4 and p
        ),
        what="the job's four sleeps",
    )
    top = min(procs, key=lambda p: p.create_time())
    escapee = [p for p in procs if p.cmdline()[-1:] == ["301"]]
    assert escapee and os.getsid(escapee[0].pid) != os.getsid(top.pid)
    node_pid = c.pids()["node-" + c.job(jid)["node"]]

    started = time.monotonic()
    c.run("qdel", jid)
    record = c.wait_state(jid, "finished", timeout=15)
    assert record["result"] == "cancelled"
    assert record["comment"]
    # Everything is gone, the escapee included, within the kill grace.
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert alive == [], alive
    assert c.job_procs(jid) == []
    assert time.monotonic() - started < c.config.node.kill_grace + 5
    assert psutil.pid_exists(node_pid)  # the node daemon is fine


def test_accounting_of_a_busy_job(cluster: ClusterFactory) -> None:
    c = cluster()
    jid = c.qsub("-v", "BURN_SECONDS=3", str(EXAMPLES / "burn.sh"))
    c.wait_state(jid, "finished", timeout=20)
    [record] = json.loads(c.run("mb", "acct", "-j", jid, "--json").stdout)
    assert record["result"] == "completed", record
    elapsed = record["end_time"] - record["start_time"]
    assert 3.0 <= elapsed < 5.0, elapsed
    out = (c.work / f"burn.o{jid}").read_text()
    assert out.endswith("burned 3 s\n")
    # What the kernel counted for the job's processes, as its shell saw it
    # (`times`: the children's user and system time), however busy the machine.
    children = out.splitlines()[-2].split()
    seen = sum(
        int(t.split("m")[0]) * 60 + float(t.split("m")[1][:-1]) for t in children
    )
    assert seen > 0.1, out
    assert 0.95 * seen <= record["cputime_s"] <= 1.05 * elapsed, (record, seen)
    assert record["maxrss_kb"] > 0
    table = c.run("mb", "acct", "-j", jid, "-o", "JobID,JobName,State").stdout
    assert table.splitlines()[2].split() == [jid, "burn", "COMPLETED"]
