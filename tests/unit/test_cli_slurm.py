"""What squeue, scancel, sacct and scontrol print and parse, from hand-built
records: state and reason codes, times, host lists, job ids, squeue's formats,
scontrol's blocks and sacct's fields."""

from __future__ import annotations

import json
import time

import pytest

from minibatch.cli import acct, render, slurmfmt, slurmshow, squeuefmt
from minibatch.cli.slurmacct import SACCT_DEFAULT, SACCT_FIELDS, parse_time
from minibatch.core.job import (
    Allocation,
    Dependency,
    DependKind,
    Job,
    JobOptions,
    JobRequest,
    JobResult,
    JobState,
)
from minibatch.errors import InvalidArgument
from minibatch.protocol.messages import NodeInfo, QueueInfo

T0 = 1_700_000_000.0


def job(**kw) -> Job:
    fields = {
        "id": 7,
        "name": "sleep",
        "user": "alice",
        "uid": 1000,
        "gid": 100,
        "group": "users",
        "workdir": "/home/alice",
        "request": JobRequest(),
        "submit_time": T0,
        "state": JobState.QUEUED,
        "queue": "batch",
        "reason": "waiting for the scheduler",
    }
    fields.update(kw)
    return Job(**fields)


def running(**kw) -> Job:
    base = {
        "state": JobState.RUNNING,
        "start_time": T0 + 10,
        "alloc": [Allocation("node0", [2, 3])],
        "request": JobRequest(ppn=2, walltime=600),
        "reason": "",
    }
    return job(**{**base, **kw})


def finished(result: JobResult = JobResult.COMPLETED, **kw) -> Job:
    base = {
        "state": JobState.FINISHED,
        "result": result,
        "exit_status": 0,
        "start_time": T0 + 10,
        "end_time": T0 + 100,
        "alloc": [Allocation("node0", [0])],
        "reason": "",
    }
    return job(**{**base, **kw})


# ---------------------------------------------------------- states, reasons


def test_state_codes_are_slurms():
    cases = [
        (job(), "PD", "PENDING"),
        (job(state=JobState.HELD), "PD", "PENDING"),
        (job(state=JobState.WAITING), "PD", "PENDING"),
        (running(), "R", "RUNNING"),
        (running(state=JobState.EXITING), "CG", "COMPLETING"),
        (finished(), "CD", "COMPLETED"),
        (finished(JobResult.FAILED), "F", "FAILED"),
        (finished(JobResult.CANCELLED), "CA", "CANCELLED"),
        (finished(JobResult.TIMEOUT), "TO", "TIMEOUT"),
        (finished(JobResult.OUT_OF_MEMORY), "OOM", "OUT_OF_MEMORY"),
        (finished(JobResult.NODE_FAIL), "NF", "NODE_FAIL"),
    ]
    for record, code, name in cases:
        assert (slurmfmt.state_code(record), slurmfmt.state_name(record)) == (
            code,
            name,
        )


@pytest.mark.parametrize(
    ("state", "reason", "code"),
    [
        (JobState.HELD, "held (user hold)", "JobHeldUser"),
        (JobState.WAITING, "dependency on 3, 4", "Dependency"),
        (JobState.WAITING, "dependency", "Dependency"),
        (
            JobState.WAITING,
            "not before 2026-01-01 10:00:00 (qsub -a / --begin)",
            "BeginTime",
        ),
        (JobState.QUEUED, "waiting for the scheduler", "None"),
        (JobState.QUEUED, "waiting for 2 CPUs (1 free)", "Resources"),
        (
            JobState.QUEUED,
            "waiting for 1 CPU (0 free); reserved to start in 60 s",
            "Resources",
        ),
        (JobState.QUEUED, "waiting for 2 nodes with 4 CPUs each", "Resources"),
        (JobState.QUEUED, "queued behind job 3 (fifo)", "Priority"),
        (
            JobState.QUEUED,
            "would delay job 5's reservation (walltime too long)",
            "Priority",
        ),
        (
            JobState.QUEUED,
            "not backfilled: would unbalance the machine (ibb)",
            "Priority",
        ),
        (JobState.QUEUED, "waiting for room in reservation 'r.1'", "Reservation"),
        (JobState.QUEUED, "bob may not use reservation 'r.1'", "Reservation"),
        (JobState.QUEUED, "queue short is stopped (started = false)", "PartitionDown"),
        (
            JobState.QUEUED,
            "blocked by QOS 'low': 1 running job per user and alice has 1",
            "QOSMaxJobsPerUserLimit",
        ),
        (JobState.QUEUED, "something new", "None"),
    ],
)
def test_reason_codes(state: JobState, reason: str, code: str):
    assert slurmfmt.reason_code(job(state=state, reason=reason)) == code


def test_finished_jobs_have_slurms_end_reasons():
    assert slurmfmt.reason_code(finished(JobResult.TIMEOUT)) == "TimeLimit"
    assert slurmfmt.reason_code(finished(JobResult.FAILED)) == "NonZeroExitCode"
    assert slurmfmt.reason_code(finished()) == "None"
    assert slurmfmt.reason_code(running()) == "None"


def test_parse_states_takes_codes_and_names():
    assert slurmfmt.parse_states("PD,running") == {"PENDING", "RUNNING"}
    assert slurmfmt.parse_states("cd ca oom") == {
        "COMPLETED",
        "CANCELLED",
        "OUT_OF_MEMORY",
    }
    assert slurmfmt.parse_states("all") == frozenset(slurmfmt.STATE_CODES)
    with pytest.raises(InvalidArgument, match="Invalid job state specified: XX"):
        slurmfmt.parse_states("R,XX")


def test_clock_is_squeues():
    assert [slurmfmt.clock(s) for s in (0, 5, 65, 3600, 3661, 86400 + 61, None)] == [
        "0:00",
        "0:05",
        "1:05",
        "1:00:00",
        "1:01:01",
        "1-00:01:01",
        "0:00",
    ]


# --------------------------------------------------------------- host lists


def test_expand_hostlist():
    assert slurmfmt.expand_hostlist("node[0-3,7],gpu1") == [
        "node0",
        "node1",
        "node2",
        "node3",
        "node7",
        "gpu1",
    ]
    assert slurmfmt.expand_hostlist("node0,node1") == ["node0", "node1"]
    assert slurmfmt.expand_hostlist("n[01-03]") == ["n01", "n02", "n03"]
    assert slurmfmt.expand_hostlist("r[1-2]n[5,7]") == ["r1n5", "r1n7", "r2n5", "r2n7"]
    assert slurmfmt.expand_hostlist("solo") == ["solo"]


@pytest.mark.parametrize("bad", ["node[0-", "node]0", "node[3-1]", "node[a]", "x[1-2"])
def test_expand_hostlist_refuses_malformed_lists(bad: str):
    with pytest.raises(InvalidArgument, match="Invalid hostlist"):
        slurmfmt.expand_hostlist(bad)


def test_compress_hostlist_round_trips():
    assert slurmfmt.compress_hostlist(["node0", "node1", "node3", "gpu1"]) == (
        "node[0-1,3],gpu1"
    )
    assert slurmfmt.compress_hostlist(["node0"]) == "node0"
    assert slurmfmt.compress_hostlist(["n01", "n02", "n10"]) == "n[01-02,10]"
    assert slurmfmt.compress_hostlist(["login", "node2", "node2"]) == "login,node2"
    # Unpadded numbers run on across a digit; padded ones keep their width.
    assert slurmfmt.compress_hostlist(["node8", "node9", "node10"]) == "node[8-10]"
    assert slurmfmt.compress_hostlist(["n08", "n09", "n10"]) == "n[08-10]"
    assert slurmfmt.index_ranges([str(i) for i in range(1, 301)]) == "1-300"
    names = slurmfmt.expand_hostlist("a[1-4,9],b[07-09],c")
    assert slurmfmt.expand_hostlist(slurmfmt.compress_hostlist(names)) == names


# ------------------------------------------------------------------ job ids


def test_parse_job_id():
    assert slurmfmt.parse_job_id("7") == ["7"]
    assert slurmfmt.parse_job_id("7_2") == ["7[2]"]
    assert slurmfmt.parse_job_id("7_[1-3,5]") == ["7[1]", "7[2]", "7[3]", "7[5]"]
    assert slurmfmt.parse_job_id("7_[1-2%1]") == ["7[1]", "7[2]"]
    assert slurmfmt.parse_job_id("7.batch") == ["7"]
    for bad in ("13x", "7_", "_2", "7[2]", ""):
        with pytest.raises(InvalidArgument, match="Invalid job id"):
            slurmfmt.parse_job_id(bad)


def test_job_id_and_dependency():
    assert slurmfmt.job_id(job()) == "7"
    assert slurmfmt.job_id(job(id=9, array_id=7, array_index=3)) == "7_3"
    waiting = job(
        state=JobState.WAITING,
        depends=[Dependency(DependKind.AFTEROK, 3), Dependency(DependKind.AFTERANY, 4)],
    )
    assert (
        slurmfmt.dependency(waiting) == "afterok:3(unfulfilled),afterany:4(unfulfilled)"
    )
    assert slurmfmt.dependency(job()) == "(null)"


# -------------------------------------------------------------------- squeue


def table(jobs: list[Job], spec: str = squeuefmt.DEFAULT_FORMAT, **kw) -> str:
    rows = squeuefmt.rows(jobs, one_per_task=kw.pop("one_per_task", False))
    return squeuefmt.render_rows(rows, squeuefmt.parse_format(spec), T0 + 75, **kw)


def test_squeue_default_layout():
    out = table(
        [
            running(name="a-rather-long-name", user="someone-long"),
            job(id=8, state=JobState.HELD, reason="held (user hold)"),
            job(id=9, reason="waiting for 1 CPU (0 free)"),
        ]
    )
    assert out == (
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES"
        " NODELIST(REASON)\n"
        "                 8     batch    sleep    alice PD       0:00      1"
        " (JobHeldUser)\n"
        "                 9     batch    sleep    alice PD       0:00      1"
        " (Resources)\n"
        "                 7     batch a-rather someone-  R       1:05      1 node0\n"
    )


def test_squeue_groups_an_arrays_pending_tasks_unless_r():
    opts = JobOptions(array_limit=2)
    tasks = [
        running(id=10, array_id=10, array_index=1, options=opts),
        *(
            job(id=10 + i, array_id=10, array_index=i + 1, options=opts)
            for i in (1, 2, 4)
        ),
    ]
    ids = [line.split()[0] for line in table(tasks, header=False).splitlines()]
    assert ids == ["10_[2-3,5%2]", "10_1"]
    every = table(tasks, header=False, one_per_task=True).splitlines()
    assert [line.split()[0] for line in every] == ["10_2", "10_3", "10_5", "10_1"]


def test_squeue_format_letters():
    out = table(
        [running(account="chem", qos="high")],
        "%i|%A|%j|%u|%t|%T|%M|%l|%L|%D|%C|%N|%R|%r|%a|%q|%P|%K|%F|%E|%%",
        header=False,
    )
    assert out == (
        "7|7|sleep|alice|R|RUNNING|1:05|10:00|8:55|1|2|node0|node0|None|chem|high"
        "|batch|N/A|7|(null)|%\n"
    )


def test_squeue_widths_cut_and_pad():
    out = table([job(name="abcdefghij")], "%5j|%.5j|%j|%3i.", header=True)
    assert out.splitlines() == [
        "NAME | NAME|NAME|JOB.",
        "abcde|abcde|abcdefghij|7  .",
    ]


def test_squeue_long_format_fields():
    items = squeuefmt.parse_long_format("JobArrayID:.6,Name:5|,StateCompact")
    out = squeuefmt.render_rows(squeuefmt.rows([job()], False), items, T0)
    assert out.splitlines() == [
        " JOBIDNAME |ST                  ",
        "     7sleep|PD                  ",
    ]


def test_squeue_formats_refuse_unknown_fields():
    with pytest.raises(InvalidArgument, match="Invalid job format specification"):
        squeuefmt.parse_format("%i %!")
    with pytest.raises(InvalidArgument, match="Invalid job format field"):
        squeuefmt.parse_long_format("JobID,Colour")


def test_squeue_long_header_is_cut_to_its_width():
    header = table([], squeuefmt.LONG_FORMAT).splitlines()[0]
    assert header.split() == words(
        "JOBID PARTITION NAME USER STATE TIME TIME_LIMI NODES NODELIST(REASON)"
    )


def words(text: str) -> list[str]:
    return text.split()


# ------------------------------------------------------------------ scontrol


def show(record: Job, one_line: bool = False) -> str:
    return slurmshow.block_text(slurmshow.job_block(record, T0 + 75), one_line)


def pairs(text: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def test_scontrol_show_job_block():
    record = running(
        id=9,
        array_id=8,
        array_index=2,
        argv=["sleep", "60"],
        account="chem",
        stdout_path="/home/alice/slurm-8_2.out",
        join=True,
        request=JobRequest(ppn=2, walltime=600, mem_kb=400 * 1024),
        options=JobOptions(ntasks=2, rerunnable=False),
    )
    text = show(record)
    lines = text.splitlines()
    assert lines[0] == "JobId=9 ArrayJobId=8 ArrayTaskId=2 JobName=sleep"
    assert all(line.startswith("   ") for line in lines[1:])
    got = pairs(text)
    assert got["UserId"] == "alice(1000)" and got["GroupId"] == "users(100)"
    assert (got["Account"], got["QOS"]) == ("chem", "(null)")
    assert (got["JobState"], got["Reason"]) == ("RUNNING", "None")
    assert (got["Requeue"], got["Restarts"], got["ExitCode"]) == ("0", "0", "0:0")
    assert (got["RunTime"], got["TimeLimit"]) == ("00:01:05", "00:10:00")
    assert got["StartTime"] == slurmfmt.iso(T0 + 10)
    assert got["EndTime"] == slurmfmt.iso(T0 + 610)
    assert (got["Partition"], got["NodeList"], got["BatchHost"]) == (
        "batch",
        "node0",
        "node0",
    )
    assert (got["NumNodes"], got["NumCPUs"], got["NumTasks"]) == ("1", "2", "2")
    assert got["CPUs/Task"] == "1"
    assert got["TRES"] == "cpu=2,mem=400M,node=1,billing=2"
    assert got["Command"] == "sleep"  # the first word of "sleep 60"
    assert got["StdErr"] == got["StdOut"] == "/home/alice/slurm-8_2.out"
    one = show(record, one_line=True)
    assert "\n" not in one.rstrip("\n") and pairs(one) == got


def test_scontrol_show_job_of_a_pending_job():
    got = pairs(show(job(state=JobState.HELD, reason="held (user hold)")))
    assert (got["JobState"], got["Reason"]) == ("PENDING", "JobHeldUser")
    assert (got["StartTime"], got["EndTime"], got["NodeList"]) == (
        "Unknown",
        "Unknown",
        "(null)",
    )
    assert "BatchHost" not in got


def test_command_is_the_script_as_submitted():
    sbatch = job(
        options=JobOptions(slurm=True),
        submit_args="-J x --time 10 job.sh arg",
        env={"PWD": "/home/alice/run"},
        script="#!/bin/sh\n",
    )
    assert slurmshow.command_of(sbatch) == "/home/alice/run/job.sh"
    wrap = job(options=JobOptions(slurm=True), submit_args="--wrap 'echo hi'")
    assert slurmshow.command_of(wrap) == "(null)"
    qsub = job(submit_args="-N x /abs/job.pbs", script="#!/bin/sh\n")
    assert slurmshow.command_of(qsub) == "/abs/job.pbs"
    assert slurmshow.command_of(job(argv=["echo", "a b"])) == "echo 'a b'"


def test_scontrol_show_partition_block():
    queue = QueueInfo(
        name="short",
        priority=10.0,
        enabled=True,
        started=False,
        default=False,
        max_walltime=1800,
        users=["alice", "bob"],
        max_cpus=4,
    )
    nodes = [
        NodeInfo(
            name=f"node{i}", state="up", cpus=[i], free_cpus=[], mem_kb=None, jobs={}
        )
        for i in range(3)
    ]
    text = slurmshow.block_text(slurmshow.partition_block(queue, nodes))
    assert text.splitlines()[0] == "PartitionName=short"
    got = pairs(text)
    assert got["Default"] == "NO" and got["State"] == "DOWN"
    assert (got["DefaultTime"], got["MaxTime"]) == ("NONE", "00:30:00")
    assert (got["Nodes"], got["TotalCPUs"], got["TotalNodes"]) == (
        "node[0-2]",
        "3",
        "3",
    )
    assert (got["PriorityTier"], got["AllowUsers"], got["MaxCPUsPerJob"]) == (
        "10",
        "alice,bob",
        "4",
    )
    states = [
        slurmshow.partition_state(QueueInfo(name="q", priority=0, enabled=e, started=s))
        for e, s in ((True, True), (True, False), (False, True), (False, False))
    ]
    assert states == ["UP", "DOWN", "DRAIN", "INACTIVE"]


# --------------------------------------------------------------------- sacct


def test_sacct_default_columns_and_slurm_ids():
    columns = acct.parse_acct_format(SACCT_DEFAULT, SACCT_FIELDS)
    records = [
        finished(id=12, array_id=10, array_index=3, account="chem"),
        finished(JobResult.CANCELLED, id=13, signal=15),
    ]
    lines = render.acct_table(records, columns, T0 + 200, SACCT_FIELDS).splitlines()
    assert lines[0].split() == words(
        "JobID JobName Partition Account AllocCPUS State ExitCode"
    )
    assert lines[2].split() == words("10_3 sleep batch chem 1 COMPLETED 0:0")
    assert lines[3].split() == words("13 sleep batch 1 CANCELLED 0:15")


def test_mb_acct_and_sacct_differ_only_in_job_ids():
    assert acct.parse_acct_format("JobID,Partition,Account,QOS")
    record = finished(id=12, array_id=10, array_index=3)
    columns = acct.parse_acct_format("JobID,State")
    assert json.loads(acct.json_text([record], columns, T0)) == [
        {"JobID": "10[3]", "State": "COMPLETED"}
    ]
    sacct = json.loads(acct.json_text([record], columns, T0, SACCT_FIELDS))
    assert sacct == [{"JobID": "10_3", "State": "COMPLETED"}]


def test_sacct_times():
    now = time.mktime((2026, 5, 4, 12, 30, 0, 0, 0, -1))
    assert parse_time("now", now) == now
    assert parse_time("now-2hours", now) == now - 7200
    assert parse_time("now-90", now) == now - 90
    assert parse_time("now-1day", now) == now - 86400
    assert parse_time("08:15", now) == time.mktime((2026, 5, 4, 8, 15, 0, 0, 0, -1))
    assert parse_time("2026-05-01", now) == time.mktime((2026, 5, 1, 0, 0, 0, 0, 0, -1))
    assert parse_time("1h", now) == now - 3600
    # sbatch --begin's words and dates, as Slurm reads sacct's times.
    assert parse_time("today", now) == time.mktime((2026, 5, 4, 0, 0, 0, 0, 0, -1))
    assert parse_time("05/01", now) == time.mktime((2026, 5, 1, 0, 0, 0, 0, 0, -1))
    # In the past, as sacct reads them: the last midnight, yesterday's 14:00,
    # last year's 12/31.
    assert parse_time("midnight", now) == time.mktime((2026, 5, 4, 0, 0, 0, 0, 0, -1))
    assert parse_time("14:00", now) == time.mktime((2026, 5, 3, 14, 0, 0, 0, 0, -1))
    assert parse_time("12/31", now) == time.mktime((2025, 12, 31, 0, 0, 0, 0, 0, -1))
    with pytest.raises(InvalidArgument, match="malformed time 'yesterday'"):
        parse_time("yesterday", now)


def test_sinfo_layouts_are_slurms() -> None:
    from minibatch.cli import sinfo
    from minibatch.protocol.messages import NodeInfo, QueueInfo

    def node(name: str, state: str = "free", jobs=None, free=(0, 1)) -> NodeInfo:
        return NodeInfo(
            name=name,
            state=state,
            cpus=[0, 1],
            free_cpus=list(free),
            mem_kb=4 << 20,
            jobs=jobs or {},
        )

    nodes = [
        node("node0"),
        node("node1", jobs={7: [0]}, free=[1]),
        node("node2", jobs={8: [0, 1]}, free=[]),
        node("node3"),
        node("node4", state="down"),
        node("node5", state="offline"),
    ]
    batch = QueueInfo(
        name="batch", priority=0, enabled=True, started=True, default=True
    )
    short = QueueInfo(
        name="short", priority=0, enabled=True, started=False, max_walltime=3600
    )
    assert sinfo.render([batch, short], nodes).splitlines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "batch*       up   infinite      2   idle node[0,3]",
        "batch*       up   infinite      1    mix node1",
        "batch*       up   infinite      1  alloc node2",
        "batch*       up   infinite      1  down* node4",
        "batch*       up   infinite      1  drain node5",
        "short     inact    1:00:00      2   idle node[0,3]",
        "short     inact    1:00:00      1    mix node1",
        "short     inact    1:00:00      1  alloc node2",
        "short     inact    1:00:00      1  down* node4",
        "short     inact    1:00:00      1  drain node5",
    ]
    assert sinfo.render([batch], nodes, summarize=True).splitlines()[1] == (
        "batch*       up   infinite          2/2/2/6 node[0-5]"
    )
    assert sinfo.render([batch], nodes[:2], node_oriented=True).splitlines() == [
        "NODELIST  NODES PARTITION STATE",
        "node0         1 batch*    idle",
        "node1         1 batch*    mix",
    ]
    assert sinfo.render([batch], [], header=False) == ""  # sinfo -h -t alloc
    assert sinfo.reasons([], header=False) == ""
    assert sinfo.wanted_states("drain,Allocated") == {"drain", "drng", "alloc"}
    with pytest.raises(InvalidArgument, match="Bad state string 'bogus'"):
        sinfo.wanted_states("idle,bogus")
    assert sinfo.reasons(nodes).splitlines()[1:] == [
        "Not responding       root      Unknown             node4",
        "none                 root      Unknown             node5",
    ]
