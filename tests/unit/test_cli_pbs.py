"""PBS's everyday commands on the client side: per-id reporting, qstat's flags
and layouts, qselect, qsig, qmove, qrerun, tracejob and acct --json fields,
with the server replaced by a recorder of requests."""

from __future__ import annotations

import json
import time

import pytest

from minibatch.cli import acct, common, jobctl, pbsctl, qlayouts, qstat, render
from minibatch.core.job import Allocation, Job, JobRequest, JobResult, JobState
from minibatch.errors import ErrorCode
from minibatch.protocol import messages as m
from tests.unit.test_cli_commands import FakeServer, invoke

T0 = 1_700_000_000.0


@pytest.fixture
def server(monkeypatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(common, "call", fake)
    return fake


def job(id: int, state: JobState = JobState.QUEUED, **kw) -> Job:
    return Job(
        id=id,
        name=kw.pop("name", f"j{id}"),
        user=kw.pop("user", "alice"),
        uid=1000,
        gid=1000,
        group="users",
        workdir="/w",
        request=JobRequest(),
        submit_time=T0,
        state=state,
        **kw,
    )


def running(id: int, node: str = "node0", **kw) -> Job:
    fields = {"start_time": T0 + 10, "alloc": [Allocation(node, [0, 1])]}
    return job(id, JobState.RUNNING, **{**fields, **kw})


def task(id: int, array: int, index: int, state=JobState.QUEUED, **kw) -> Job:
    if state is JobState.RUNNING:
        kw = {"start_time": T0 + 10, "alloc": [Allocation("node1", [2])], **kw}
    return job(id, state, array_id=array, array_index=index, **kw)


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[2:]]


def alt_ids(out: str) -> list[str]:
    """The job ids of a ``qstat -a`` table (rows after the dashes)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line.split()[0] for line in lines[start:] if not line.startswith(" ")]


def refused(selector: str, code: ErrorCode, message: str) -> m.Refusal:
    return m.Refusal(selector=selector, code=int(code), message=message)


# --------------------------------------------------- per id: qdel and co


def test_qdel_reports_each_refused_id_after_doing_the_others(server: FakeServer):
    server.replies = [
        m.JobList(
            jobs=[job(13)],
            refused=[
                refused("14", ErrorCode.NOT_FOUND, "unknown job id 14"),
                refused("9", ErrorCode.INVALID_ARGUMENT, "job 9 has finished"),
            ],
        )
    ]
    result = invoke(jobctl.qdel_command, ["13", "14.ws", "9"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == "qdel: Unknown Job Id 14.ws\nqdel: job 9 has finished\n"
    assert server.sent[0].selectors == ["13", "14", "9"] and server.sent[0].each


def test_a_malformed_id_does_not_stop_the_others(server: FakeServer):
    server.replies = [m.JobList(jobs=[job(13)])]
    result = invoke(jobctl.qhold_command, ["13", "abc"])
    assert result.exit_code == 2
    assert result.stderr.startswith("qhold: malformed job id 'abc'")
    assert server.sent == [m.JobControl(action="hold", selectors=["13"], each=True)]


def test_qsig_qrerun_qmove_requests(server: FakeServer):
    server.replies = [m.JobList(jobs=[])] * 3
    assert invoke(pbsctl.qsig_command, ["-s", "usr1", "5", "6[]"]).exit_code == 0
    assert invoke(pbsctl.qrerun_command, ["5"]).exit_code == 0
    assert invoke(pbsctl.qmove_command, ["short@ws", "5", "6[2]"]).exit_code == 0
    assert server.sent == [
        m.SignalJob(selectors=["5", "6[]"], signal="SIGUSR1"),
        m.Rerun(selectors=["5"]),
        m.MoveJob(queue="short", selectors=["5", "6[2]"]),
    ]
    server.replies = [m.JobList(jobs=[])]
    assert invoke(pbsctl.qsig_command, ["5"]).exit_code == 0
    assert server.sent[-1] == m.SignalJob(selectors=["5"], signal="SIGTERM")


def test_qsig_refuses_an_unknown_signal_before_sending(server: FakeServer):
    result = invoke(pbsctl.qsig_command, ["-s", "suspend", "5"])
    assert result.exit_code == 2 and "unknown signal 'suspend'" in result.stderr
    assert server.sent == []


# ----------------------------------------------------------------- qselect


def test_qselect_prints_matching_ids(server: FakeServer):
    jobs = [
        running(3, user="bob"),
        job(4, JobState.HELD, name="sweep", queue="short"),
        task(6, 5, 2),
        job(7),
    ]
    server.replies = [m.JobList(jobs=jobs)] * 4
    assert invoke(pbsctl.qselect_command, []).stdout == "3\n4\n5[2]\n7\n"
    assert invoke(pbsctl.qselect_command, ["-s", "QH"]).stdout == "4\n5[2]\n7\n"
    named = invoke(pbsctl.qselect_command, ["-q", "short", "-N", "sweep"])
    assert named.stdout == "4\n"
    assert invoke(pbsctl.qselect_command, ["-u", "bob,carol"]).stdout == "3\n"
    assert server.sent[-1] == m.QueryJobs(user=None)
    server.replies = [m.JobList(jobs=[])]
    invoke(pbsctl.qselect_command, ["-u", "bob", "-s", "C"])
    assert server.sent[-1] == m.QueryJobs(user="bob", finished=True)
    result = invoke(pbsctl.qselect_command, ["-s", "QZ"])
    assert result.exit_code == 2 and "unknown job state 'Z'" in result.stderr


# --------------------------------------------------------------- tracejob


def test_tracejob_lines(server: FakeServer):
    done = job(
        8,
        JobState.FINISHED,
        result=JobResult.CANCELLED,
        exit_status=271,
        start_time=T0 + 1,
        end_time=T0 + 4,
        cputime_s=2.0,
        maxrss_kb=4160,
    )
    events = [
        m.TraceEvent(job=8, time=T0, event="submitted", detail="-N x"),
        m.TraceEvent(job=8, time=T0 + 1, event="launched", detail="pid 42"),
        m.TraceEvent(job=8, time=T0 + 4, event="finished", detail="cancelled"),
    ]
    server.replies = [m.JobTrace(jobs=[done], events=events)]
    lines = invoke(pbsctl.tracejob_command, ["8"]).stdout.splitlines()
    assert lines[:2] == ["Job: 8", ""]
    stamp = time.strftime("%m/%d/%Y %H:%M:%S", time.localtime(T0 + 1))
    assert lines[3] == f"{stamp}  M    launched: pid 42"
    assert lines[2].endswith("  S    submitted: -N x")
    assert lines[4].endswith("  S    finished: cancelled")
    assert lines[5].endswith(
        "  A    Exit_status=271 result=cancelled resources_used.cput=00:00:02"
        f" resources_used.mem=4160kb resources_used.walltime=00:00:03 end={int(T0) + 4}"
    )
    # An end the server heard of later (its node daemon was down): the A line
    # comes when it was recorded, with the real end in end=.
    late = m.TraceEvent(job=8, time=T0 + 60, event="finished", detail="cancelled")
    server.replies = [m.JobTrace(jobs=[done], events=[*events[:2], late])]
    lines = invoke(pbsctl.tracejob_command, ["8"]).stdout.splitlines()
    stamp = time.strftime("%m/%d/%Y %H:%M:%S", time.localtime(T0 + 60))
    assert lines[5].startswith(f"{stamp}  A    Exit_status=271")
    assert lines[5].endswith(f" end={int(T0) + 4}")


# -------------------------------------------------------------- qstat jobs


def test_qstat_r_i_and_n_s_1(server: FakeServer):
    jobs = [
        running(3, comment="started by the scheduler"),
        job(4, reason="waiting for 2 CPUs"),
        job(5, JobState.HELD, reason="held (user hold)"),
    ]
    server.replies = [m.JobList(jobs=jobs)] * 4
    assert alt_ids(invoke(qstat.qstat_command, ["-r"]).stdout) == ["3"]
    assert alt_ids(invoke(qstat.qstat_command, ["-i"]).stdout) == ["4", "5"]
    out = invoke(qstat.qstat_command, ["-n", "-s"]).stdout.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("3 "))
    assert out[at + 1 : at + 3] == [
        "   node0/0+node0/1",
        "   started by the scheduler",
    ]
    assert out[at + 3].startswith("4 ") and out[at + 4 : at + 6] == [
        "   --",
        "   waiting for 2 CPUs",
    ]
    one = invoke(qstat.qstat_command, ["-n1"]).stdout.splitlines()
    line = next(line for line in one if line.startswith("3 "))
    assert line.endswith("   node0/0+node0/1")


def test_qstat_shows_an_array_as_one_line_unless_t(server: FakeServer):
    tasks = [
        task(10, 10, 1, JobState.RUNNING, used_cputime_s=3.0),
        task(11, 10, 2, used_cputime_s=None),
        task(12, 10, 3, JobState.HELD),
    ]
    plain = job(13)
    server.replies = [m.JobList(jobs=[*tasks, plain])] * 2
    summary = rows(invoke(qstat.qstat_command, []).stdout)
    assert summary == [
        ["10[]", "j10", "alice", "00:00:03", "R", "batch"],
        ["13", "j13", "alice", "0", "Q", "batch"],
    ]
    expanded = rows(invoke(qstat.qstat_command, ["-t"]).stdout)
    assert [r[0] for r in expanded] == ["10[1]", "10[2]", "10[3]", "13"]
    # A task named by its index keeps its own line.
    server.replies = [m.JobList(jobs=[tasks[1]])]
    assert rows(invoke(qstat.qstat_command, ["10[2]"]).stdout)[0][0] == "10[2]"


def test_array_line_states():
    def letter(*states: JobState, **kw) -> str:
        tasks = [task(20 + i, 20, i + 1, s, **kw) for i, s in enumerate(states)]
        return render.letter(qlayouts.array_line(tasks))

    done = {"result": JobResult.COMPLETED}
    assert letter(JobState.HELD, JobState.WAITING) == "H"
    assert letter(JobState.WAITING) == "W"
    assert letter(JobState.FINISHED, JobState.QUEUED, **done) == "Q"
    assert letter(JobState.FINISHED, JobState.FINISHED, **done) == "C"
    failed = [
        task(30, 30, 1, JobState.FINISHED, result=JobResult.COMPLETED),
        task(31, 30, 2, JobState.FINISHED, result=JobResult.FAILED),
    ]
    line = qlayouts.array_line(failed)
    assert (line.display_id, render.letter(line), line.tasks) == ("30[]", "F", 2)


def test_live_usage_in_time_use_and_full():
    j = running(3, used_cputime_s=65.0, used_rss_kb=2048, cputime_s=None)
    assert rows(render.qstat_default([j]))[0][3] == "00:01:05"
    attrs = render.qstat_full([j], T0 + 70)
    assert "    resources_used.cput = 00:01:05\n" in attrs
    assert "    resources_used.mem = 2048kb\n" in attrs
    # Once it has ended, the node's measured totals.
    done = job(
        4,
        JobState.FINISHED,
        result=JobResult.COMPLETED,
        start_time=T0,
        end_time=T0 + 5,
        cputime_s=4.0,
        maxrss_kb=900,
        used_cputime_s=3.0,
        used_rss_kb=500,
    )
    full = render.qstat_full([done], T0 + 70)
    assert "resources_used.cput = 00:00:04\n" in full
    assert "resources_used.mem = 900kb\n" in full
    record = json.loads(qstat.render_jobs([j], now=T0 + 70, full=True, as_json=True))
    assert record[0]["resources_used"] == {
        "cput_s": 65.0,
        "mem_kb": 2048,
        "walltime_s": 60.0,
    }
    assert "resources_used" not in render.job_record(j)


# ---------------------------------------------------- qstat -Q, -q and -B


QUEUES = [
    m.QueueInfo(
        name="batch",
        priority=0,
        enabled=True,
        started=True,
        default=True,
        jobs={"queued": 2, "running": 1, "held": 1},
    ),
    m.QueueInfo(
        name="short",
        priority=10,
        enabled=False,
        started=False,
        max_walltime=168 * 3600,
        max_cpus=4,
        users=["alice"],
        jobs={"exiting": 1},
    ),
]


def test_qstat_Q_layout_is_torques(server: FakeServer):
    server.replies = [m.QueueList(queues=QUEUES)]
    out = invoke(qstat.qstat_command, ["-Q"]).stdout
    # Torque's own header and a row of it, to the character.
    assert out.splitlines() == [
        "Queue              Max    Tot   Ena   Str   Que   Run   Hld   Wat   Trn"
        "   Ext T   Cpt",
        "----------------   ---   ----    --    --   ---   ---   ---   ---   ---"
        "   --- -   ---",
        "batch                0      4   yes   yes     2     1     1     0     0"
        "     0 E     0",
        "short                0      1    no    no     0     0     0     0     0"
        "     1 E     0",
    ]
    assert server.sent == [m.QueryQueues(names=[])]


def test_qstat_q_layout_is_torques(server: FakeServer):
    server.replies = [m.QueueList(queues=QUEUES)]
    out = qlayouts.queue_limits(QUEUES, "ws")
    assert out.splitlines() == [
        "",
        "server: ws",
        "",
        "Queue            Memory CPU Time Walltime Node  Run Que Lm  State",
        "---------------- ------ -------- -------- ----  --- --- --  -----",
        "batch              --      --       --      --    1   2 --   E R",
        "short              --      --    168:00:0   --    1   0 --   D S",
        "                                               ----- -----",
        "                                                   2     2",
    ]
    assert invoke(qstat.qstat_command, ["-q", "batch"]).exit_code == 0
    assert server.sent == [m.QueryQueues(names=["batch"])]


def test_qstat_Q_f_and_json(server: FakeServer):
    full = qlayouts.queue_full(QUEUES[1:])
    assert full.splitlines()[:2] == ["Queue: short", "    queue_type = Execution"]
    assert "    state_count = Transit:0 Queued:0 Held:0 Waiting:0 Running:0" in full
    assert "    resources_max.walltime = 168:00:00\n" in full
    assert "    acl_users = alice\n" in full and "    enabled = False\n" in full
    server.replies = [m.QueueList(queues=QUEUES)]
    records = json.loads(invoke(qstat.qstat_command, ["-Q", "--json"]).stdout)
    assert records[1]["max_cpus"] == 4


STATUS = m.ServerStatus(
    pid=10,
    endpoint="ipc:///x",
    mqtt_url="",
    policy="easy",
    nodes={"node0": "up"},
    scheduler_pid=11,
    jobs={"queued": 3, "running": 2, "exiting": 1},
)


def test_qstat_B_layout_is_torques(server: FakeServer):
    out = qlayouts.server_table(STATUS, "ws")
    assert out.splitlines() == [
        "Server             Max   Tot   Que   Run   Hld   Wat   Trn   Ext   Com Status",
        "----------------   ---   ---   ---   ---   ---   ---   ---   ---   ---"
        " ----------",
        "ws                   0     6     3     2     0     0     0     1     0 Active",
    ]
    server.replies = [STATUS]
    assert invoke(qstat.qstat_command, ["-B"]).exit_code == 0
    assert server.sent == [m.Status()]
    server.replies = [STATUS, m.QueueList(queues=QUEUES)]
    full = invoke(qstat.qstat_command, ["-B", "-f"]).stdout
    assert "    default_queue = batch\n" in full
    assert "    server_state = Active\n" in full


# ------------------------------------------------------------ acct --json


def test_acct_format_with_json_keeps_only_those_fields(server: FakeServer):
    done = job(
        3,
        JobState.FINISHED,
        result=JobResult.CANCELLED,
        exit_status=271,
        signal=15,
        start_time=T0,
        end_time=T0 + 3,
        cputime_s=2.0,
        maxrss_kb=4160,
    )
    server.replies = [m.JobList(jobs=[done])]
    result = invoke(
        acct.acct_command, ["--format", "jobid,State,ExitCode,MaxRSS%3", "--json"]
    )
    assert json.loads(result.stdout) == [
        {"JobID": "3", "State": "CANCELLED", "ExitCode": "0:15", "MaxRSS": "4160K"}
    ]
