"""Job workflows on a real cluster: arrays, dependencies, holds, and bad input.

Every command is the real console script; states come from ``qstat``/the server,
and "nothing changed" means ``qstat -x --json`` prints the same before and after.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def qstat_rows(c: Cluster, *args: str) -> dict[str, str]:
    """``qstat`` default layout -> {job id: state letter}."""
    rows = {}
    for line in c.run("qstat", *args).stdout.splitlines()[2:]:
        cells = line.split()
        rows[cells[0]] = cells[4]
    return rows


# ------------------------------------------------------------------ arrays


def test_array_runs_every_task_with_its_index(cluster: ClusterFactory) -> None:
    c = cluster()
    shown = c.qsub(
        "-t", "1-4", "-h", "-N", "sweep", "--", "sh", "-c", 'echo "task $PBS_ARRAYID"'
    )
    m = re.fullmatch(r"(\d+)\[\]", shown)
    assert m, shown
    first = int(m.group(1))
    tasks = [f"{first}[{i}]" for i in range(1, 5)]
    # Held, so qstat -t shows every task before any has run; without -t the
    # array is one line, as PBS shows it.
    assert qstat_rows(c, "-t") == {t: "H" for t in tasks}
    assert qstat_rows(c) == {shown: "H"}
    assert [r["id"] for r in c.qstat_json(shown)] == tasks
    assert [r["array_index"] for r in c.qstat_json(shown)] == [1, 2, 3, 4]

    c.run("qrls", shown)
    for task in tasks:
        assert c.wait_state(task, "finished")["result"] == "completed"
    assert qstat_rows(c, "-x", "-t") == {t: "C" for t in tasks}
    for i, task in enumerate(tasks, start=1):
        record = c.job(task)
        out = record["output_path"]
        assert out.endswith(f"sweep.o{first}-{i}"), out
        assert Path(out).read_text() == f"task {i}\n"
    # The next submission does not reuse a task's number.
    nxt = int(c.qsub("-h", "--", "true"))
    assert nxt > max(r["job_id"] for r in c.qstat_json(shown))


def test_qstat_t_lists_array_tasks(cluster: ClusterFactory) -> None:
    """Torque scripts call ``qstat -t`` to expand arrays into their tasks."""
    c = cluster(nodes=1)
    shown = c.qsub("-t", "1-2", "-h", "--", "true")
    first = shown.removesuffix("[]")
    proc = c.run("qstat", "-t", check=False)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()[2:]] == [
        f"{first}[1]",
        f"{first}[2]",
    ]


def test_qdel_of_a_whole_array_cancels_the_remaining_tasks(
    cluster: ClusterFactory,
) -> None:
    c = cluster()  # two 1-CPU nodes: two tasks run, two wait
    shown = c.qsub("-t", "1-4", "-l", "walltime=120", "--", "sleep", "60")
    first = shown.removesuffix("[]")
    tasks = [f"{first}[{i}]" for i in range(1, 5)]
    c.wait_for(
        lambda: (
            sorted(r["state"] for r in c.qstat_json(shown))
            == ["queued", "queued", "running", "running"]
        ),
        what="two tasks running, two queued",
    )
    running = [r["id"] for r in c.qstat_json(shown) if r["state"] == "running"]
    assert all(c.launched_procs(t) for t in running)

    c.run("qdel", shown)
    for task in tasks:
        record = c.wait_state(task, "finished")
        assert record["result"] == "cancelled", record
    assert qstat_rows(c) == {}
    assert c.all_job_procs() == []


def test_qdel_of_one_task(cluster: ClusterFactory) -> None:
    c = cluster()
    shown = c.qsub("-t", "1-3", "-h", "--", "true")
    first = shown.removesuffix("[]")
    c.run("qdel", f"{first}[2]")
    assert c.job(f"{first}[2]")["result"] == "cancelled"
    c.run("qrls", shown)
    for i in (1, 3):
        assert c.wait_state(f"{first}[{i}]", "finished")["result"] == "completed"


# ------------------------------------------------------------ dependencies


def until(gate: Path, then: str = "") -> list[str]:
    """A job's command: wait for the test to create ``gate``, then ``then``.
    The test decides when it ends, however busy the machine is."""
    return ["--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; {then}"]


def test_afterok_chain_runs_in_order(cluster: ClusterFactory) -> None:
    c = cluster()  # two nodes: without the dependencies all would start at once
    gate = c.work / "go"
    a = c.qsub(*until(gate))
    b = c.qsub("-W", f"depend=afterok:{a}", *until(gate))
    d = c.qsub("-W", f"depend=afterok:{b}", "--", "true")
    assert c.job(b)["state"] == "waiting" and c.job(d)["state"] == "waiting"
    assert qstat_rows(c)[b] == "H"  # a system hold, as Torque shows it
    assert str(a) in c.job(b)["reason"]
    gate.touch()
    ra, rb, rd = (c.wait_state(j, "completed") for j in (a, b, d))
    assert ra["end_time"] <= rb["start_time"]
    assert rb["end_time"] <= rd["start_time"]


def test_afternotok_runs_and_afterok_is_cancelled_after_a_failure(
    cluster: ClusterFactory,
) -> None:
    c = cluster()
    gate = c.work / "go"
    bad = c.qsub(*until(gate, "exit 3"))
    cleanup = c.qsub("-W", f"depend=afternotok:{bad}", "--", "true")
    report = c.qsub("-W", f"depend=afterok:{bad}", "--", "true")
    anyway = c.qsub("-W", f"depend=afterany:{bad}", "--", "true")
    assert c.job(report)["state"] == "waiting"
    gate.touch()
    assert c.wait_state(bad, "finished")["result"] == "failed"
    assert c.wait_state(cleanup, "finished")["result"] == "completed"
    assert c.wait_state(anyway, "finished")["result"] == "completed"
    r = c.wait_state(report, "finished")
    assert r["result"] == "cancelled" and r["start_time"] is None
    assert "dependency" in r["comment"] and f"afterok:{bad}" in r["comment"]
    # A dependent submitted after the failure is cancelled at once, too.
    late = c.qsub("-W", f"depend=afterok:{bad}", "--", "true")
    r = c.wait_state(late, "finished")
    assert r["result"] == "cancelled" and f"afterok:{bad}" in r["comment"]


def test_dependency_on_an_unknown_job_is_rejected(cluster: ClusterFactory) -> None:
    c = cluster()
    before = c.run("qstat", "-x", "--json").stdout
    proc = c.run("qsub", "-W", "depend=afterok:999", "--", "true", check=False)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("qsub: ")
    assert "999" in proc.stderr
    assert c.run("qstat", "-x", "--json").stdout == before


# ------------------------------------------------------------ hold/release


def passes_happened(c: Cluster) -> None:
    """A job with nothing in its way runs to completion: the scheduler has
    planned (at least once) since now, with the CPUs it found free."""
    probe = c.qsub("-N", "probe", "--", "true")
    assert c.wait_state(probe, "finished", timeout=30)["result"] == "completed"


def test_held_job_waits_until_released(cluster: ClusterFactory) -> None:
    c = cluster()
    jid = c.qsub("-h", "--", "true")
    assert qstat_rows(c) == {jid: "H"}
    passes_happened(c)  # they would have started it
    record = c.job(jid)
    assert record["state"] == "held" and record["start_time"] is None
    c.run("qrls", jid)
    assert c.wait_state(jid, "finished")["result"] == "completed"


def test_qhold_of_a_queued_job_behind_a_busy_node(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    busy = c.qsub("--", "sleep", "60")
    c.wait_state(busy, "running")
    queued = c.qsub("--", "true")
    assert c.job(queued)["state"] == "queued"
    c.run("qhold", queued)
    assert qstat_rows(c) == {busy: "R", queued: "H"}
    c.run("qdel", busy)
    c.wait_state(busy, "cancelled")
    passes_happened(c)  # the node is free, but the job is held
    assert c.job(queued)["state"] == "held"
    c.run("qrls", queued)
    assert c.wait_state(queued, "finished")["result"] == "completed"


# ------------------------------------------------------------- bad input


def check_refused(
    c: Cluster, before: str, *args: str, says: str, code: int | None = None
) -> None:
    """The command fails with one clear line naming the problem; nothing changes."""
    proc = c.run(*args, check=False)
    assert proc.returncode != 0, (args, proc.stdout, proc.stderr)
    if code is not None:
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
    err = proc.stderr
    assert err.endswith("\n") and err.count("\n") == 1, (args, err)
    assert err.startswith(f"{args[0]}: "), (args, err)
    assert says.lower() in err.lower(), (args, err)
    assert "Traceback" not in err and proc.stdout == "", (args, proc.stdout)
    assert c.run("qstat", "-x", "--json").stdout == before, args


def test_bad_input_is_refused_with_one_clear_line(cluster: ClusterFactory) -> None:
    c = cluster()
    running = c.qsub("-l", "walltime=120", "--", "sleep", "60")
    c.wait_state(running, "running")
    held = c.qsub("-h", "--", "true")
    before = c.run("qstat", "-x", "--json").stdout

    bad_directive = c.work / "bad.sh"
    bad_directive.write_text("#!/bin/sh\n#PBS -l ncpus=abc\necho hi\n")
    check_refused(c, before, "qsub", str(bad_directive), says="line 2", code=2)
    check_refused(c, before, "qsub", "-Z", "--", "true", says="unknown option -Z")
    check_refused(c, before, "qsub", "-l", "ncpus=0", "--", "true", says="ncpus")
    check_refused(
        c, before, "qsub", "-l", "walltime=abc", "--", "true", says="duration"
    )
    # Feasibility is checked at submission: no node has 99 CPUs.
    check_refused(
        c, before, "qsub", "-l", "ncpus=99", "--", "true", says="99 CPUs", code=1
    )
    check_refused(
        c, before, "qsub", str(c.work / "missing.sh"), says="cannot read script"
    )
    check_refused(c, before, "qsub", says="STDIN")  # no script and empty stdin
    check_refused(c, before, "qsub", "-t", "5-1", "--", "true", says="array")
    check_refused(c, before, "qsub", "-j", "xy", "--", "true", says="-j")
    check_refused(
        c,
        before,
        "qsub",
        "-J",
        "1-3",
        "-t",
        "1-3",
        "--",
        "true",
        says="both give an array",
    )
    check_refused(
        c, before, "qsub", "-o", "/nonexistent/o", "--", "true", says="does not exist"
    )
    check_refused(c, before, "qsub", "-l", "gpus=1", "--", "true", says="gpus", code=1)
    check_refused(c, before, "qdel", "999", says="unknown job id 999", code=1)
    check_refused(c, before, "qdel", "abc", says="malformed job id")
    check_refused(
        c,
        before,
        "qalter",
        "-l",
        "walltime=10",
        running,
        says="only pending jobs can be altered",
    )
    check_refused(c, before, "qhold", running, says="only pending jobs")
    check_refused(c, before, "qrls", running, says="not held")
    check_refused(c, before, "qalter", "-l", "ncpus=99", held, says="99 CPUs")
    # And a good alteration goes through.
    c.run("qalter", "-N", "renamed", "-l", "walltime=30", held)
    record = c.job(held)
    assert (record["name"], record["walltime"]) == ("renamed", 30)


def test_a_script_whose_interpreter_is_missing_says_which(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    job = c.work / "gsi.sh"
    job.write_text("#!/opt/nowhere/ksh --login\n#PBS -N gsi\necho hi\n")
    jid = c.qsub(str(job))
    record = c.wait_state(jid, "failed")
    why = "/opt/nowhere/ksh: bad interpreter: No such file or directory"
    assert why in record["comment"], record
    # Where the user looks first, as slurmstepd writes it there.
    assert why in (c.work / f"gsi.e{jid}").read_text()


def test_qdel_all_cancels_every_job_of_the_caller(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    held = [c.qsub("-h", "--", "true") for _ in range(2)]
    array = c.qsub("-h", "-t", "1-3", "--", "true")
    c.run("qdel", "-W", "force", "all")
    for jid in held:
        assert c.wait_state(jid, "finished")["result"] == "cancelled"
    assert c.run("qstat").stdout == "", array  # the array's tasks too
    assert c.run("qdel", "all").returncode == 0  # nothing left: silent
    bad = c.run("qdel", "-W", "30", "all", check=False)
    assert bad.returncode == 2 and "only force and suppress_email" in bad.stderr


def test_a_fifo_for_output_fails_the_job_not_the_node(cluster: ClusterFactory) -> None:
    # Nobody reads it: opening it would wait for ever, and with it the node.
    c = cluster(nodes=1, cpus_per_node=1)
    fifo = c.work / "out.fifo"
    os.mkfifo(fifo)
    jid = c.qsub("-o", str(fifo), "-j", "oe", "--", "true")
    record = c.wait_state(jid, "failed")
    assert "No such device or address" in record["comment"], record
    after = c.qsub("--", "true")
    c.wait_state(after, "completed")
