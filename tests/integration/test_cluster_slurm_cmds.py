"""Slurm's everyday commands on a real cluster: jobs submitted with sbatch, then
squeue, scancel, sacct and scontrol checked against the states the server
holds (and the processes the node runs)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from conftest import BIN, Cluster, ClusterFactory

pytestmark = [pytest.mark.integration]

HEADER = (
    "             JOBID PARTITION     NAME     USER ST       TIME  NODES"
    " NODELIST(REASON)"
)
ME = pwd.getpwuid(os.getuid()).pw_name


def sbatch(c: Cluster, *args: str) -> str:
    """Submit with ``sbatch --parsable ARGS``; the job's (or array's) id."""
    return c.run("sbatch", "--parsable", *args).stdout.strip()


def squeue(c: Cluster, *args: str) -> dict[str, tuple[str, str]]:
    """``squeue -h -o '%i %t %R' ARGS`` as id -> (state code, reason/nodes)."""
    out = c.run("squeue", "-h", "-o", "%i %t %R", *args).stdout
    return {i: (t, r) for i, t, r in (line.split() for line in out.splitlines())}


def keys(text: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


@pytest.mark.timeout(90)
def test_squeue_shows_the_real_states_and_reasons(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    run = sbatch(c, "-J", "runner", "--wrap", "sleep 60")
    c.wait_state(run, "running")
    waits = sbatch(c, "--wrap", "true")
    held = sbatch(c, "-H", "--wrap", "true")
    after = sbatch(c, "-d", f"afterok:{run}", "--wrap", "true")
    later = sbatch(c, "--begin", "now+3600", "--wrap", "true")
    array = sbatch(c, "-a", "1-3", "--wrap", "true")
    c.wait_for(lambda: "scheduler" not in c.job(waits)["reason"], what="a reason")
    rows = squeue(c)
    assert rows == {
        held: ("PD", "(JobHeldUser)"),
        after: ("PD", "(Dependency)"),
        later: ("PD", "(BeginTime)"),
        waits: ("PD", rows[waits][1]),
        f"{array}_[1-3]": ("PD", rows[f"{array}_[1-3]"][1]),
        run: ("R", "node0"),
    }
    assert rows[waits][1] in ("(Resources)", "(Priority)")
    # The default layout, as Slurm prints it, and the array task by task.
    lines = c.run("squeue").stdout.splitlines()
    assert lines[0] == HEADER
    assert lines[-1].split()[:5] == [run, "batch", "runner", ME[:8], "R"]
    assert list(squeue(c, "-r", "-j", array)) == [f"{array}_{i}" for i in (1, 2, 3)]
    assert list(squeue(c, "-j", f"{array}_2")) == [f"{array}_2"]
    # Filters.
    assert list(squeue(c, "-t", "R")) == [run]
    assert list(squeue(c, "--states=running", "-u", ME)) == [run]
    assert squeue(c, "-u", "nobody-here") == {}
    assert list(squeue(c, "--me", "-n", "runner")) == [run]
    assert squeue(c, "-p", "elsewhere") == {}
    out = c.run("squeue", "-j", run, "-O", "JobID:6,State:.10,NumCPUs:4").stdout
    assert out.splitlines() == [
        "JOBID      STATECPUS",
        f"{run:<6}   RUNNING1   ",
    ]
    proc = c.run("squeue", "-j", "999", check=False)
    assert proc.returncode == 1
    assert proc.stderr == "slurm_load_jobs error: Invalid job id specified\n"
    proc = c.run("squeue", "-t", "XX", check=False)
    assert proc.returncode == 2  # a usage error, caught before asking
    assert proc.stderr == "squeue: error: Invalid job state specified: XX\n"


@pytest.mark.timeout(90)
def test_scancel_cancels_signals_and_names_what_it_could_not(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    c = cluster(nodes=1)
    script = c.work / "trap.sh"
    script.write_text(
        "#!/bin/sh\n"
        "trap 'echo got USR1 >> signals.txt' USR1\n"
        "echo ready > ready.txt\n"
        "while true; do sleep 0.1; done\n"
    )
    run = sbatch(c, str(script))
    c.wait_state(run, "running")
    c.wait_for(lambda: (c.work / "ready.txt").exists(), what="the trap set")
    c.run("scancel", "--signal=USR1", run)
    c.wait_for(lambda: (c.work / "signals.txt").exists(), what="the signal")
    assert c.job(run)["state"] == "running"  # a signal is not a cancel
    array = sbatch(c, "-a", "1-3", "--wrap", "true")
    single = sbatch(c, "-J", "victim", "--wrap", "true")
    other = sbatch(c, "-J", "bystander", "--wrap", "sleep 60")

    # One task, then the whole array by its id; a bad id does not stop the rest.
    proc = c.run("scancel", f"{array}_2", "999", "13x", check=False)
    assert proc.returncode == 2  # a malformed id is a usage error
    assert proc.stderr.splitlines() == [
        "scancel: error: Invalid job id 13x",
        "scancel: error: Kill job error on job id 999: Invalid job id specified",
    ]
    assert c.job(f"{array}[2]")["result"] == "cancelled"
    assert c.job(f"{array}[1]")["state"] == "queued"
    c.run("scancel", array)
    for i in (1, 3):
        assert c.job(f"{array}[{i}]")["result"] == "cancelled"
    # Filters: pending jobs of mine with that name only.
    c.run("scancel", "--me", "-t", "PENDING", "-n", "victim")
    assert c.job(single)["result"] == "cancelled"
    assert c.job(other)["state"] == "queued"
    # The running job, then again: already done.
    c.run("scancel", run)
    c.wait_state(run, "cancelled")
    assert not c.job_procs(run)
    proc = c.run("scancel", run, check=False)
    assert (proc.returncode, proc.stderr) == (
        1,
        f"scancel: error: Kill job error on job id {run}: "
        "Job/step already completing or completed\n",
    )
    assert c.run("scancel", "-Q", run).stderr == ""
    proc = c.run("scancel", check=False)
    assert proc.returncode == 2
    assert proc.stderr == "scancel: error: No job identification provided\n"
    c.run("scancel", "-u", ME)  # the bystander, which took the CPU meanwhile
    c.wait_state(other, "cancelled")
    # squeue -t all still shows them as Slurm does while they are recent.
    rows = squeue(c, "-t", "all")
    assert rows[run][0] == "CA" and rows[f"{array}_2"][0] == "CA"


@pytest.mark.timeout(90)
def test_sacct_reports_the_jobs_as_they_ended(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    ok = sbatch(c, "-J", "fine", "--wrap", "true")
    bad = sbatch(c, "-J", "broken", "--wrap", "exit 3")
    array = sbatch(c, "-a", "1-2", "-A", "chem", "--wrap", "true")
    c.wait_state(ok, "completed")
    c.wait_state(bad, "failed")
    c.wait_state(array, "completed")
    c.wait_state(f"{array}[2]", "completed")
    lines = c.run("sacct").stdout.splitlines()
    assert lines[0].split() == (
        ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]
    )
    assert set(lines[1]) == {"-", " "}
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows[ok] == ["fine", "batch", "1", "COMPLETED", "0:0"]
    assert rows[bad] == ["broken", "batch", "1", "FAILED", "3:0"]
    assert rows[f"{array}_2"] == ["wrap", "batch", "chem", "1", "COMPLETED", "0:0"]
    out = c.run("sacct", "-X", "-n", "-P", "-j", array, "-o", "JobID,State,Account")
    assert out.stdout == (f"{array}_1|COMPLETED|chem\n{array}_2|COMPLETED|chem\n")
    out = c.run("sacct", "-p", "-s", "F", "--format=jobid,exitcode").stdout
    assert out == f"JobID|ExitCode|\n{bad}|3:0|\n"
    records = json.loads(c.run("sacct", "-j", ok, "--json").stdout)
    assert [(r["id"], r["result"]) for r in records] == [(ok, "completed")]
    proc = c.run("sacct", "-o", "JobID,Colour", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("sacct: error: unknown format field 'Colour'")


@pytest.mark.timeout(90)
def test_scontrol_shows_and_controls_jobs(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2)
    script = c.work / "hosts.sh"
    script.write_text(f"#!/bin/sh\n{BIN / 'scontrol'} show hostnames > hosts.txt\n")
    both = sbatch(c, "-N", "2", str(script))
    c.wait_state(both, "completed")
    assert sorted((c.work / "hosts.txt").read_text().split("\n")) == [
        "",
        "node0",
        "node1",
    ]
    got = keys(c.run("scontrol", "show", "job", both).stdout)
    assert (got["JobState"], got["NodeList"], got["NumNodes"]) == (
        "COMPLETED",
        "node[0-1]",
        "2",
    )
    assert (got["ExitCode"], got["Command"]) == ("0:0", str(script))

    run = sbatch(c, "-J", "long", "-t", "5", "--wrap", "sleep 60")
    c.wait_state(run, "running")
    text = c.run("scontrol", "show", "job", run).stdout
    assert text.startswith(f"JobId={run} JobName=long\n   UserId={ME}(")
    got = keys(text)
    assert (got["JobState"], got["Reason"], got["TimeLimit"]) == (
        "RUNNING",
        "None",
        "00:05:00",
    )
    assert got["NodeList"] == c.job(run)["node"]
    one = c.run("scontrol", "-o", "show", "job", run).stdout
    assert one.count("\n") == 1
    assert {k: v for k, v in keys(one).items() if k != "RunTime"} == {
        k: v for k, v in got.items() if k != "RunTime"
    }

    pending = sbatch(c, "--begin", "now+3600", "--wrap", "true")
    c.run("scontrol", "hold", pending)
    assert c.job(pending)["state"] == "held"
    assert keys(c.run("scontrol", "show", "job", pending).stdout)["Reason"] == (
        "JobHeldUser"
    )
    c.run("scontrol", "release", f"jobid={pending}")
    assert c.job(pending)["state"] == "waiting"
    proc = c.run("scontrol", "hold", run, "999", check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"Job is no longer pending execution for job {run}",
        "Invalid job id specified for job 999",
    ]

    c.run("scontrol", "requeue", run)
    c.wait_for(
        lambda: c.job(run)["reruns"] == 1 and c.job(run)["state"] == "running",
        timeout=15,
        what="the job running again",
    )
    assert keys(c.run("scontrol", "show", "job", run).stdout)["Restarts"] == "1"

    part = c.run("scontrol", "show", "partition").stdout
    got = keys(part)
    assert part.startswith("PartitionName=batch\n")
    assert (got["State"], got["Default"], got["Nodes"], got["TotalNodes"]) == (
        "UP",
        "YES",
        "node[0-1]",
        "2",
    )
    proc = c.run("scontrol", "show", "partition", "nope", check=False)
    assert (proc.returncode, proc.stderr) == (1, "Partition nope not found\n")
    proc = c.run("scontrol", "update", "JobId=1", "TimeLimit=5", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("scontrol: error: 'update' is not supported here")
    assert "show job" in proc.stderr and "requeue" in proc.stderr


@pytest.mark.timeout(90)
def test_sinfo_shows_the_nodes_as_the_server_sees_them(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    gate = c.work / "go"
    jid = sbatch(c, "--wrap", f"while [ ! -e {gate} ]; do sleep 0.1; done")
    c.wait_state(jid, "running")
    node = c.job(jid)["node"]
    other = ({"node0", "node1"} - {node}).pop()
    lines = c.run("sinfo").stdout.splitlines()
    assert lines[0] == "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
    assert f"batch*       up   infinite      1   idle {other}" in lines, lines
    assert f"batch*       up   infinite      1  alloc {node}" in lines, lines
    c.run("pbsnodes", "-o", "-N", "maintenance", other)
    # What scripts ask (sinfo -h -o %N...), in Slurm's letters.
    assert c.run("sinfo", "-h", "-t", "drain", "-o", "%N").stdout == f"{other}\n"
    summary = c.run("sinfo", "-o", "%P|%.5a|%C|%F|%E").stdout.splitlines()
    assert summary[0] == "PARTITION|AVAIL|CPUS(A/I/O/T)|NODES(A/I/O/T)|REASON"
    assert "batch*|   up|1/0/0/1|1/0/0/1|none" in summary, summary
    assert "batch*|   up|0/0/1/1|0/0/1/1|maintenance" in summary, summary
    bad = c.run("sinfo", "-o", "%Q", check=False)
    assert "Invalid node format specification: %Q" in bad.stderr, bad.stderr
    reasons = c.run("sinfo", "-R").stdout.splitlines()
    assert reasons[1].startswith("maintenance") and reasons[1].endswith(other)
    assert c.run("sinfo", "-p", "nosuch", check=False).returncode == 2
    gate.touch()
    c.wait_state(jid, "completed")
