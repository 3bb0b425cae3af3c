"""What qstat, mb acct and pbsnodes print, from hand-built records."""

from __future__ import annotations

import json
import time

import pytest

from minibatch.cli import noderender, render
from minibatch.cli.acct import parse_acct_format, parse_since
from minibatch.cli.qstat import matches, render_jobs, unmatched
from minibatch.core.job import (
    Allocation,
    Dependency,
    DependKind,
    Job,
    JobRequest,
    JobResult,
    JobState,
)
from minibatch.errors import InvalidArgument
from minibatch.protocol.messages import NodeInfo

T0 = 1_700_000_000.0


def words(text: str) -> list[str]:
    return text.split()


def job(**kw) -> Job:
    fields = {
        "id": 7,
        "name": "sleep",
        "user": "alice",
        "uid": 1000,
        "gid": 1000,
        "group": "users",
        "workdir": "/home/alice",
        "request": JobRequest(),
        "submit_time": T0,
        "state": JobState.QUEUED,
    }
    fields.update(kw)
    return Job(**fields)


def running(**kw) -> Job:
    base = {
        "state": JobState.RUNNING,
        "start_time": T0 + 10,
        "alloc": [Allocation("node0", [2, 3])],
        "request": JobRequest(ppn=2, mem_kb=512 * 1024, walltime=600),
    }
    return job(**{**base, **kw})


def finished(result: JobResult = JobResult.COMPLETED, **kw) -> Job:
    base = {
        "state": JobState.FINISHED,
        "result": result,
        "exit_status": 0,
        "start_time": T0 + 10,
        "end_time": T0 + 100,
        "cputime_s": 42.4,
        "maxrss_kb": 2048,
        "alloc": [Allocation("node0", [0])],
    }
    return job(**{**base, **kw})


# ------------------------------------------------------------------ qstat


def test_qstat_default_layout():
    jobs = [job(), running(id=8, name="a-rather-long-job-name", cputime_s=65)]
    assert render.qstat_default(jobs) == (
        "Job ID                    Name             User            Time Use S Queue\n"
        "------------------------- ---------------- --------------- -------- - -----\n"
        "7                         sleep            alice                  0 Q batch\n"
        "8                         a-rather-long-j* alice           00:01:05 R batch\n"
    )


def test_qstat_default_empty_and_letters():
    assert render.qstat_default([]) == ""
    letters = [
        render.letter(j)
        for j in (
            job(state=JobState.HELD),
            job(state=JobState.WAITING),
            job(state=JobState.WAITING, reason="dependency on 5"),
            running(state=JobState.EXITING),
            finished(),
            finished(JobResult.TIMEOUT),
        )
    ]
    # W waits for a start time; a dependency is a system hold, as in Torque.
    assert letters == ["H", "W", "H", "E", "C", "F"]


def test_array_tasks_show_their_display_id():
    line = render.qstat_default([job(id=12, array_id=10, array_index=2)]).splitlines()[
        2
    ]
    assert line.startswith("10[2] ")


def test_qstat_alt_layout():
    out = render.qstat_alt(
        [running(), job(id=9, request=JobRequest(nodes=2, ppn=3))], T0 + 70
    )
    lines = out.splitlines()
    assert lines[0].split() == ["Req'd", "Req'd", "Elap"]
    assert lines[1].split() == (
        words("Job ID Username Queue Jobname SessID NDS TSK Memory Time S Time")
    )
    assert set(lines[2]) == {"-", " "}
    assert lines[3].split() == (
        words("7 alice batch sleep -- 1 2 512mb 00:10:00 R 00:01:00")
    )
    assert lines[4].split() == words("9 alice batch sleep -- 2 6 -- 01:00:00 Q --")
    # Every row lines up with the dashes.
    assert len(lines[3]) == len(lines[2])


def test_qstat_alt_with_server_header():
    assert render.qstat_alt([job()], T0, "ws").startswith("\nws:\n")
    assert render.qstat_alt([], T0, "ws") == ""


def test_qstat_full_running_job():
    j = running(
        env={"PBS_O_HOST": "ws", "PBS_O_WORKDIR": "/home/alice", "OTHER": "x"},
        stdout_path="/home/alice/sleep.o7",
        stderr_path="/home/alice/sleep.e7",
        cputime_s=3,
        maxrss_kb=1000,
        submit_args="-l ncpus=2 job.sh",
    )
    out = render.qstat_full([j], T0 + 70)
    lines = out.splitlines()
    assert lines[0] == "Job Id: 7"
    attrs = dict(line.strip().split(" = ", 1) for line in lines[1:])
    assert attrs["Job_Name"] == "sleep"
    assert attrs["Job_Owner"] == "alice@ws"
    assert attrs["job_state"] == "R"
    assert attrs["queue"] == "batch"
    assert attrs["ctime"] == time.ctime(T0)
    assert attrs["start_time"] == time.ctime(T0 + 10)
    assert attrs["resources_used.cput"] == "00:00:03"
    assert attrs["resources_used.mem"] == "1000kb"
    assert attrs["resources_used.walltime"] == "00:01:00"
    assert attrs["Resource_List.ncpus"] == "2"
    assert attrs["Resource_List.nodes"] == "1:ppn=2"
    assert attrs["Resource_List.mem"] == "512mb"
    assert attrs["Resource_List.walltime"] == "00:10:00"
    assert attrs["exec_host"] == "node0/2+node0/3"
    assert attrs["exec_cpus"] == "node0:2-3"
    assert attrs["Output_Path"] == "/home/alice/sleep.o7"
    assert attrs["Error_Path"] == "/home/alice/sleep.e7"
    # As Torque: qsub -v / -V variables too (its owner sees them).
    want = "PBS_O_HOST=ws,PBS_O_WORKDIR=/home/alice,OTHER=x"
    assert attrs["Variable_List"] == want
    assert attrs["submit_args"] == "-l ncpus=2 job.sh"
    for absent in ("comp_time", "exit_status", "comment", "estimated.start_time"):
        assert absent not in attrs
    assert all(line.startswith("    ") for line in lines[1:])


def test_qstat_full_pending_and_finished():
    waiting = job(
        state=JobState.WAITING,
        reason="Dependency",
        predicted_start=T0 + 3600,
        depends=[Dependency(DependKind.AFTEROK, 3), Dependency(DependKind.AFTEROK, 4)]
        + [Dependency(DependKind.AFTERANY, 5)],
    )
    done = finished(JobResult.FAILED, id=8, exit_status=3, comment="exit 3")
    blocks = [
        b + "\n" for b in render.qstat_full([waiting, done], T0 + 200).split("\n\n")
    ]
    assert len(blocks) == 2
    assert "    comment = Dependency\n" in blocks[0]
    assert f"    estimated.start_time = {time.ctime(T0 + 3600)}\n" in blocks[0]
    assert "    depend = afterok:3:4,afterany:5\n" in blocks[0]
    assert "resources_used" not in blocks[0]
    assert "    job_state = F\n" in blocks[1]
    assert "    exit_status = 3\n" in blocks[1]
    assert "    comment = exit 3\n" in blocks[1]
    assert f"    comp_time = {time.ctime(T0 + 100)}\n" in blocks[1]
    assert "    resources_used.walltime = 00:01:30\n" in blocks[1]


def test_job_record_shape():
    record = render.job_record(running(id=12, array_id=10, array_index=2))
    assert json.loads(json.dumps(record)) == record
    for key in words(
        "id name user state result exit_status node cpus submit_time start_time "
        "end_time cputime_s maxrss_kb output_path error_path reason predicted_start "
        "nodes ppn mem_kb walltime"
    ):
        assert key in record
    assert record["id"] == "10[2]"
    assert record["job_id"] == 12
    assert (record["state"], record["letter"], record["result"]) == (
        "running",
        "R",
        None,
    )
    assert (record["node"], record["cpus"]) == ("node0", [2, 3])
    assert (record["nodes"], record["ppn"], record["mem_kb"]) == (1, 2, 512 * 1024)
    done = render.job_record(finished(JobResult.OUT_OF_MEMORY))
    assert (done["result"], done["letter"]) == ("out_of_memory", "F")
    assert render.job_record(job())["node"] is None


def test_render_jobs_picks_the_layout():
    jobs = [job()]
    assert render_jobs(jobs, now=T0) == render.qstat_default(jobs)
    assert render_jobs(jobs, now=T0, alt=True) == render.qstat_alt(jobs, T0)
    assert render_jobs(jobs, now=T0, full=True, alt=True) == render.qstat_full(jobs, T0)
    assert json.loads(render_jobs(jobs, now=T0, as_json=True))[0]["id"] == "7"


def test_selectors_match_jobs():
    plain, task = job(id=3), job(id=12, array_id=10, array_index=2)
    assert matches("3", plain) and not matches("3", task)
    assert matches("10", task) and matches("10[]", task) and matches("10[2]", task)
    assert not matches("10[1]", task)
    assert unmatched(["3", "10[2]", "99"], [plain, task]) == ["99"]


# ------------------------------------------------------------------- acct


def test_slurm_state_and_duration():
    assert render.slurm_state(finished(JobResult.NODE_FAIL)) == "NODE_FAIL"
    assert render.slurm_state(finished(JobResult.CANCELLED)) == "CANCELLED"
    assert render.slurm_state(job(state=JobState.HELD)) == "PENDING"
    assert render.slurm_state(running()) == "RUNNING"
    assert render.slurm_duration(59.6) == "00:01:00"
    assert render.slurm_duration(90061) == "1-01:01:01"
    assert render.slurm_duration(None) == "00:00:00"


def test_acct_default_table():
    jobs = [finished(), finished(JobResult.TIMEOUT, id=8, exit_status=None, signal=15)]
    out = render.acct_table(jobs, parse_acct_format(render.ACCT_DEFAULT), T0)
    assert out == (
        "       JobID    JobName      User  AllocCPUS      State ExitCode    Elapsed"
        "   TotalCPU     MaxRSS\n"
        "------------ ---------- --------- ---------- ---------- -------- ----------"
        " ---------- ----------\n"
        "           7      sleep     alice          1  COMPLETED      0:0   00:01:30"
        "   00:00:42      2048K\n"
        "           8      sleep     alice          1    TIMEOUT     0:15   00:01:30"
        "   00:00:42      2048K\n"
    )


def test_acct_custom_format_and_truncation():
    columns = parse_acct_format("jobid,JobName%5,nodelist,submit,ReqMem,state%4")
    assert columns == [
        ("JobID", 12),
        ("JobName", 5),
        ("NodeList", 15),
        ("Submit", 19),
        ("ReqMem", 10),
        ("State", 4),
    ]
    j = finished(
        JobResult.OUT_OF_MEMORY, name="analysis", request=JobRequest(mem_kb=2048)
    )
    row = render.acct_table([j], columns, T0).splitlines()[2].split()
    submit = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(T0))
    assert row == ["7", "anal+", "node0", submit, "2M", "OUT+"]
    never = render.acct_table([job()], parse_acct_format("NodeList,Start"), T0)
    assert never.splitlines()[2].split() == ["None", "assigned", "Unknown"]


@pytest.mark.parametrize("spec", ["JobID,Bogus", "JobID%0", "JobID%x"])
def test_acct_format_errors(spec):
    with pytest.raises(InvalidArgument):
        parse_acct_format(spec)


def test_parse_since():
    now = T0
    assert parse_since("90m", now) == now - 5400
    assert parse_since("2d", now) == now - 172800
    assert parse_since("1w", now) == now - 604800
    expected = time.mktime((2024, 3, 1, 12, 30, 0, 0, 0, -1))
    assert parse_since("2024-03-01T12:30", now) == expected
    assert parse_since("2024-03-01 12:30:00", now) == expected
    assert parse_since("2024-03-01", now) == time.mktime(
        (2024, 3, 1, 0, 0, 0, 0, 0, -1)
    )
    for bad in ("yesterday", "1y", "2024-13-01"):
        with pytest.raises(InvalidArgument):
            parse_since(bad, now)


# ------------------------------------------------------------------ nodes


def node(**kw) -> NodeInfo:
    fields = {
        "name": "node0",
        "state": "up",
        "cpus": [0, 1],
        "free_cpus": [0, 1],
        "mem_kb": 8 * 1024 * 1024,
        "jobs": {},
    }
    fields.update(kw)
    return NodeInfo(**fields)


def test_node_states():
    assert noderender.node_state(node()) == "free"
    assert noderender.node_state(node(free_cpus=[1], jobs={7: [0]})) == "free"
    full = node(free_cpus=[], jobs={7: [0], 8: [1]})
    assert noderender.node_state(full) == "job-exclusive"
    assert noderender.node_state(node(state="down")) == "down"
    assert noderender.node_state(node(state="offline", jobs={7: [0]})) == "offline"


def test_pbsnodes_full_block():
    busy = node(
        name="node1",
        cpus=[2, 3],
        free_cpus=[],
        jobs={8: [3], 7: [2]},
        shared_cpus=[2, 3],
        last_heartbeat=T0,
        pid=99,
        comment="flaky fan",
    )
    out = noderender.pbsnodes_full([node(), busy])
    first, second = out.split("\n\n")
    assert first.splitlines() == [
        "node0",
        "     state = free",
        "     np = 2",
        "     cpus = 0-1",
        "     ntype = cluster",
        "     jobs =",
        "     status = ncpus=2,availcpus=0-1,physmem=8388608kb,state=free,jobs=",
    ]
    lines = second.splitlines()
    assert lines[1] == "     state = job-exclusive"
    assert "     jobs = 2/7, 3/8" in lines
    assert (
        "     status = rectime=1700000000,ncpus=2,availcpus=,physmem=8388608kb,"
        "state=job-exclusive,jobs=7 8,pid=99"
    ) in lines
    assert "     note = flaky fan" in lines
    assert lines[-1] == "     oversubscribed = CPUs 2,3 are shared with other nodes"


def test_pbsnodes_list_and_record():
    nodes = [
        node(),
        node(name="n1", state="offline", comment="repair"),
        node(name="n2", state="down"),
    ]
    assert noderender.pbsnodes_list(nodes).splitlines() == [
        "n1                   offline         repair",
        "n2                   down",
    ]
    record = noderender.node_record(node(jobs={7: [0]}, free_cpus=[1], shared_cpus=[0]))
    assert json.loads(json.dumps(record)) == record
    assert record["state"] == "free"
    assert record["np"] == 2
    assert record["jobs"] == {"7": [0]}
    assert record["oversubscribed"] is True


def test_qstat_f_shows_control_characters_escaped() -> None:
    # A user's variables reach an operator's terminal: no escape sequence may.
    j = job(submit_args="-v X=\x1b[2J -- true", env={"X": "\x1b]0;owned\x07"})
    out = render.qstat_full([j], now=1.0)
    assert "\x1b" not in out and "\x07" not in out
    assert "submit_args = -v X=\\x1b[2J -- true" in out
    # Whole listings (scontrol show job, tracejob, checkjob) keep their lines.
    assert render.printable("a\x1b]0;t\x07\nb\tc\n") == "a\\x1b]0;t\\x07\nb\\x09c\n"
