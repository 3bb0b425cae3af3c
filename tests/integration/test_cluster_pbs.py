"""PBS's everyday commands on a real cluster: qdel/qhold/qrls id by id, arrays
as PBS addresses them, qstat's flags and layouts, qselect, qsig, qrerun, qmove,
tracejob, live resources_used, and one exit status for a cancelled job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, Cluster, ClusterFactory

pytestmark = [pytest.mark.integration]


def table_ids(out: str) -> list[str]:
    """Job ids of a qstat table (the rows after the dashes, not the extras)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line.split()[0] for line in lines[start:] if not line.startswith(" ")]


def words(text: str) -> list[str]:
    return text.split()


def full_attrs(c: Cluster, job: str) -> dict[str, str]:
    out = c.run("qstat", "-f", job).stdout
    return dict(line.strip().split(" = ", 1) for line in out.splitlines()[1:] if line)


# ------------------------------------------------------ ids one by one


@pytest.mark.timeout(60)
def test_qdel_qhold_qrls_act_on_each_id_and_name_the_rest(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    a = c.qsub("-h", "--", "true")
    b = c.qsub("-h", "--", "true")
    proc = c.run("qrls", a, "999", check=False)
    assert proc.returncode == 1
    assert proc.stderr == "qrls: Unknown Job Id 999\n"
    c.wait_state(a, "completed")
    proc = c.run("qhold", "998.server", b, check=False)
    assert (proc.returncode, proc.stderr) == (1, "qhold: Unknown Job Id 998.server\n")
    assert c.job(b)["state"] == "held"  # already held: nothing else changed
    proc = c.run("qdel", b, "13x", "999", a, check=False)
    assert proc.returncode == 2  # a malformed id is a usage error...
    assert c.job(b)["result"] == "cancelled"  # ...and the others were done
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("qdel: malformed job id '13x'")
    assert lines[1:] == [
        "qdel: Unknown Job Id 999",
        f"qdel: job {a} has finished (completed)",
    ]


@pytest.mark.timeout(60)
def test_arrays_are_addressed_as_pbs_does(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    shown = c.qsub("-t", "1-3", "-h", "--", "sleep", "30")
    first = shown.removesuffix("[]")
    tasks = [f"{first}[{i}]" for i in (1, 2, 3)]
    other = c.qsub("-h", "--", "true")

    def rows(*args: str) -> dict[str, str]:
        out = c.run("qstat", *args).stdout
        return {cells[0]: cells[4] for cells in map(str.split, out.splitlines()[2:])}

    # One line for the array, as PBS shows it; -t lists its tasks.
    assert rows() == {shown: "H", other: "H"}
    assert rows("-t") == {**{t: "H" for t in tasks}, other: "H"}
    assert rows(shown) == {shown: "H"}
    assert rows("-t", shown) == {t: "H" for t in tasks}
    assert rows(f"{first}[2]") == {f"{first}[2]": "H"}
    # qrls of one task, qhold of the array holds what is pending of it.
    c.run("qrls", f"{first}[1]")
    c.wait_state(f"{first}[1]", "running")
    assert rows() == {shown: "R", other: "H"}
    c.run("qrls", shown)
    c.run("qhold", shown)  # the running task is left running
    states = {t: c.job(t)["state"] for t in tasks}
    assert states == {tasks[0]: "running", tasks[1]: "held", tasks[2]: "held"}
    # qdel of the array ends every task, then says it has finished.
    c.run("qdel", shown)
    for t in tasks:
        assert c.wait_state(t, "finished")["result"] == "cancelled"
    proc = c.run("qdel", shown, check=False)
    assert (proc.returncode, proc.stderr) == (1, f"qdel: job {shown} has finished\n")
    assert rows("-x", shown) == {shown: "F"}


# --------------------------------------------------------------- qstat


@pytest.mark.timeout(60)
def test_qstat_flags_and_layouts(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    run = c.qsub("-N", "busy", "-l", "walltime=120", "--", "sleep", "60")
    c.wait_state(run, "running")
    queued = c.qsub("--", "true")
    held = c.qsub("-h", "--", "true")

    assert table_ids(c.run("qstat", "-r").stdout) == [run]
    assert table_ids(c.run("qstat", "-i").stdout) == [queued, held]
    node = c.job(run)["node"]
    out = c.run("qstat", "-n", "-s").stdout.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith(f"{run} "))
    assert out[at + 1].startswith(f"   {node}/")
    at = next(i for i, line in enumerate(out) if line.startswith(f"{queued} "))
    assert out[at + 1] == "   --"
    assert out[at + 2].startswith("   ")  # why it waits (the CPU is busy)
    one = c.run("qstat", "-n1").stdout.splitlines()
    line = next(line for line in one if line.startswith(f"{run} "))
    assert f"   {node}/" in line

    queues = c.run("qstat", "-Q").stdout.splitlines()
    assert queues[0].split() == (
        words("Queue Max Tot Ena Str Que Run Hld Wat Trn Ext T Cpt")
    )
    assert queues[2].split() == words("batch 0 3 yes yes 1 1 1 0 0 0 E 0")
    limits = c.run("qstat", "-q").stdout.splitlines()
    assert limits[3].split()[:5] == ["Queue", "Memory", "CPU", "Time", "Walltime"]
    assert limits[5].split() == words("batch -- -- -- -- 1 1 -- E R")
    assert limits[-1].split() == ["1", "1"]
    server = c.run("qstat", "-B").stdout.splitlines()
    assert server[2].split()[1:] == words("0 3 1 1 1 0 0 0 0 Active")
    full = c.run("qstat", "-B", "-f").stdout
    assert "    default_queue = batch\n" in full and "scheduling = True" in full
    proc = c.run("qstat", "-Q", "nope", check=False)
    assert proc.returncode == 1 and "unknown queue 'nope'" in proc.stderr


@pytest.mark.timeout(60)
def test_resources_used_are_live_while_the_job_runs(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    jid = c.qsub(
        "-l", "walltime=120", "-v", "BURN_SECONDS=60", str(EXAMPLES / "burn.sh")
    )
    c.wait_state(jid, "running")

    def busy() -> dict[str, str] | None:
        attrs = full_attrs(c, jid)
        cput = attrs.get("resources_used.cput", "00:00:00")
        return attrs if cput >= "00:00:02" else None

    attrs = c.wait_for(busy, timeout=20, interval=0.5, what="2 s of CPU time")
    assert attrs["job_state"] == "R"
    assert attrs["resources_used.mem"].endswith("kb")
    assert attrs["resources_used.walltime"] >= "00:00:02"
    row = next(
        line.split()
        for line in c.run("qstat").stdout.splitlines()
        if line.startswith(f"{jid} ")
    )
    assert row[3] >= "00:00:02" and row[4] == "R"  # Time Use
    [record] = json.loads(c.run("qstat", "-f", "--json", jid).stdout)
    # At least what qstat -f showed (rounded to the second) a moment ago.
    assert record["resources_used"]["cput_s"] >= 1.5
    assert record["resources_used"]["mem_kb"] > 0
    c.run("qdel", jid)
    c.wait_state(jid, "finished")


# --------------------------------------------- exit status of a cancel


@pytest.mark.timeout(60)
def test_a_cancelled_job_has_one_exit_status_everywhere(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    ran = c.qsub("-l", "walltime=120", "--", "sleep", "60")
    c.launched_procs(ran)
    never = c.qsub("--", "true")  # waits behind it
    c.run("qdel", ran, never)
    c.wait_state(ran, "cancelled")
    c.wait_state(never, "cancelled")
    # Killed by SIGTERM: 256 + 15, as Torque writes it.
    assert full_attrs(c, ran)["exit_status"] == "271"
    assert "exit_status" not in full_attrs(c, never)  # it never ran
    table = c.run("mb", "acct", "-j", f"{ran},{never}", "-o", "JobID,State,ExitCode")
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert rows == [[ran, "CANCELLED", "0:15"], [never, "CANCELLED", "0:0"]]
    records = json.loads(c.run("mb", "acct", "-j", ran, "--json").stdout)
    assert (records[0]["exit_status"], records[0]["signal"]) == (271, 15)
    fields = c.run("mb", "acct", "-j", ran, "--format", "JobID,ExitCode", "--json")
    assert json.loads(fields.stdout) == [{"JobID": ran, "ExitCode": "0:15"}]


# ------------------------------------------------------ qselect, qsig


@pytest.mark.timeout(60)
def test_qselect_feeds_qdel(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    run = c.qsub("-N", "keep", "-l", "walltime=120", "--", "sleep", "60")
    c.wait_state(run, "running")
    waiting = [c.qsub("-N", "sweep", "--", "true") for _ in range(2)]
    held = c.qsub("-h", "-N", "sweep", "--", "true")
    assert c.run("qselect").stdout.split() == [run, *waiting, held]
    assert c.run("qselect", "-s", "Q").stdout.split() == waiting
    assert c.run("qselect", "-s", "RH", "-u", "root").stdout.split() == [run, held]
    assert c.run("qselect", "-N", "sweep", "-q", "batch").stdout.split() == [
        *waiting,
        held,
    ]
    c.run("qdel", *c.run("qselect", "-N", "sweep").stdout.split())
    assert c.run("qselect").stdout.split() == [run]


@pytest.mark.timeout(60)
def test_qsig_signals_every_process_of_the_job(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    script = c.work / "traps.sh"
    script.write_text(
        "#!/bin/sh\n"
        "trap 'echo top >> sig.out' USR1\n"
        "sh -c \"trap 'echo child >> sig.out' USR1; "
        'while :; do sleep 0.1; done" &\n'
        "while :; do sleep 0.1; done\n"
    )
    jid = c.qsub("-l", "walltime=120", str(script))
    queued = c.qsub("--", "true")
    c.wait_for(lambda: len(c.job_procs(jid)) >= 2, what="the job's two shells")
    proc = c.run("qsig", "-s", "USR1", jid, queued, check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"qsig: job {queued} is queued; only running jobs can be signalled\n"
    )
    out = Path(c.work / "sig.out")
    c.wait_for(
        lambda: out.exists() and sorted(out.read_text().split()) == ["child", "top"],
        what="both shells trapping SIGUSR1",
    )
    assert c.job(jid)["state"] == "running"  # caught: the job goes on
    proc = c.run("qsig", "-s", "NOPE", jid, check=False)
    assert proc.returncode == 2 and "unknown signal" in proc.stderr
    c.run("qsig", "-s", "KILL", jid)
    record = c.wait_state(jid, "finished")
    assert (record["result"], record["signal"]) == ("failed", 9)
    assert c.job_procs(jid) == []
    log = c.run("tracejob", jid).stdout
    assert "signalled: SIGUSR1 by root" in log and "signalled: SIGKILL" in log


# -------------------------------------------------------------- qrerun


@pytest.mark.timeout(90)
def test_qrerun_runs_the_job_again_under_its_id(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    script = c.work / "again.sh"
    script.write_text("#!/bin/sh\necho run >> runs.txt\nsleep 60\n")
    jid = c.qsub("-l", "walltime=120", str(script))
    pinned = c.qsub("-r", "n", "-l", "walltime=120", "--", "sleep", "60")
    c.launched_procs(jid)
    runs = c.work / "runs.txt"
    c.wait_for(lambda: runs.exists() and runs.read_text() == "run\n")
    first = c.job(jid)["start_time"]

    c.run("qrerun", jid)

    # Killed, queued again, and (once the CPU is free) run again, same id.
    def second_run() -> bool:
        return runs.exists() and runs.read_text() == "run\nrun\n"

    c.wait_for(second_run, timeout=20, what="the second run")
    record = c.wait_state(jid, "running")
    assert record["reruns"] == 1 and record["start_time"] > first
    assert full_attrs(c, jid)["run_count"] == "2"
    events = c.run("tracejob", jid).stdout
    assert "exiting: rerun by root" in events
    assert "requeued: run 1 ended cancelled" in events

    c.run("qdel", jid)
    c.wait_state(jid, "cancelled")
    c.wait_state(pinned, "running")
    proc = c.run("qrerun", pinned, check=False)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"qrerun: job {pinned} is not rerunnable (submitted with -r n)\n"
    )
    assert c.job(pinned)["state"] == "running"
    c.run("qdel", pinned)
    c.wait_state(pinned, "cancelled")


# --------------------------------------------------------------- qmove


@pytest.mark.timeout(60)
def test_qmove_between_queues(cluster: ClusterFactory) -> None:
    c = cluster(
        nodes=1,
        queue=[
            {"name": "batch"},
            {"name": "short", "max_walltime": "00:10:00", "priority": 10},
        ],
        default_queue="batch",
    )
    held = c.qsub("-h", "-l", "walltime=300", "--", "true")
    long = c.qsub("-h", "-l", "walltime=3600", "--", "true")
    assert c.job(held)["queue"] == "batch"
    proc = c.run("qmove", "short", held, long, check=False)
    assert proc.returncode == 1
    assert "exceeds queue 'short'" in proc.stderr
    assert (c.job(held)["queue"], c.job(long)["queue"]) == ("short", "batch")
    rows = {
        cells[0]: cells[1:]
        for cells in map(str.split, c.run("qstat", "-Q").stdout.splitlines()[2:])
    }
    assert rows["short"][1] == "1" and rows["batch"][1] == "1"  # Tot
    proc = c.run("qmove", "nowhere", held, check=False)
    assert proc.returncode == 1 and "unknown queue 'nowhere'" in proc.stderr
    c.run("qrls", held)
    c.wait_state(held, "completed")
    assert "moved: from batch to short" in c.run("tracejob", held).stdout


# ------------------------------------------------------------ tracejob


@pytest.mark.timeout(60)
def test_tracejob_prints_the_event_log_with_times(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    jid = c.qsub("-h", "--", "sh", "-c", "exit 3")
    c.run("qrls", jid)
    c.wait_state(jid, "failed")
    out = c.run("tracejob", jid).stdout.splitlines()
    assert out[:2] == [f"Job: {jid}", ""]
    events = [line[21:].split(None, 1) for line in out[2:]]
    kinds = [(src, text.split(":")[0]) for src, text in events]
    assert kinds[:3] == [("S", "submitted"), ("S", "released"), ("S", "started")]
    assert ("M", "launched") in kinds and ("S", "finished") in kinds
    assert kinds[-1] == ("A", "Exit_status=3 result=failed resources_used.cput=00")
    assert f" end={int(c.job(jid)['end_time'])}" in out[-1], out[-1]
    stamps = [time.strptime(line[:19], "%m/%d/%Y %H:%M:%S") for line in out[2:]]
    assert stamps == sorted(stamps), out  # oldest first, the A line too
    for line in out[2:]:
        month, day, rest = line[:2], line[3:5], line[5:]
        assert month.isdigit() and day.isdigit() and rest.startswith("/")
    proc = c.run("tracejob", "999", check=False)
    assert proc.returncode == 1 and "unknown job id 999" in proc.stderr
