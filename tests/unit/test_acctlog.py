"""The PBS accounting log: the records the state machine notes, their line
format, and how the day files are written."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import pytest

from minibatch.core.job import (
    Dependency,
    DependKind,
    Job,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
)
from minibatch.server import requeue
from minibatch.server.acctlog import AccountingFile, Record, record
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller, user_name

ME = Caller(uid=os.getuid(), gid=os.getgid(), pid=1)
HOST = os.uname().nodename
#: Torque's layout: ``MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...``.
LINE = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d);([QSEDAR]);([^;]+);(.*)$")


def spec(**kw: object) -> JobSpec:
    return JobSpec(
        name="j",
        workdir="/tmp",
        request=JobRequest(ppn=2, walltime=600, mem_kb=4096),
        argv=["true"],
        **kw,  # type: ignore[arg-type]
    )


def a_job() -> Job:
    return Job(
        id=7,
        name="j",
        user="u",
        uid=1,
        gid=1,
        group="g",
        workdir="/",
        request=JobRequest(),
        submit_time=0.0,
        state=JobState.QUEUED,
    )


def parsed(state: ServerState) -> list[tuple[str, str, dict[str, str]]]:
    """The records noted so far as (type, job id, keys); each line checked."""
    out = []
    for rec in state.accounting.take():
        m = LINE.match(rec.line)
        assert m, f"not a PBS accounting line: {rec.line!r}"
        stamp = time.strptime(m.group(1), "%m/%d/%Y %H:%M:%S")
        assert rec.day == time.strftime("%Y%m%d", stamp)
        keys = dict(kv.split("=", 1) for kv in m.group(4).split(" ") if kv)
        out.append((m.group(2), m.group(3), keys))
    return out


def test_a_line_is_torques_layout_in_local_time():
    when = 1_700_000_000.0
    rec = record("Q", a_job(), when, [("queue", "batch"), ("n", 3)])
    local = time.localtime(when)
    assert rec == Record(
        time.strftime("%Y%m%d", local),
        f"{time.strftime('%m/%d/%Y %H:%M:%S', local)};Q;7;queue=batch n=3",
    )


def test_values_keep_no_blanks_so_fields_and_lines_stay_apart():
    rec = record("S", a_job(), 0.0, [("jobname", "my job\nname\t2")])
    assert rec.line.endswith(";jobname=my_job_name_2")
    assert "\n" not in rec.line


def test_a_job_that_runs_gets_q_s_and_e(server_state: ServerState, clock):
    (job,) = server_state.submit(spec(account="chem"), ME)
    clock.t += 5
    assert server_state.start(job.id, ("n1",)) is None
    clock.t += 60
    server_state.job_ended(
        job,
        JobResult.COMPLETED,
        exit_status=0,
        end_time=clock.t,
        cputime_s=59.6,
        maxrss_kb=2048,
    )
    (q, s, e) = parsed(server_state)
    assert q == ("Q", "1", {"queue": "batch"})
    me = user_name(os.getuid())
    assert s[:2] == ("S", "1")
    assert s[2] == {
        "user": me,
        "group": job.group,
        "account": "chem",
        "jobname": "j",
        "queue": "batch",
        "ctime": "1000",
        "qtime": "1000",
        "etime": "1000",
        "start": "1005",
        "owner": f"{me}@{HOST}",
        "exec_host": "n1/2+n1/3",
        "Resource_List.mem": "4096kb",
        "Resource_List.ncpus": "2",
        "Resource_List.nodect": "1",
        "Resource_List.nodes": "1:ppn=2",
        "Resource_List.walltime": "00:10:00",
    }
    assert e[:2] == ("E", "1")
    assert e[2] == {
        **s[2],
        "end": "1065",
        "Exit_status": "0",
        "resources_used.cput": "00:01:00",
        "resources_used.mem": "2048kb",
        "resources_used.walltime": "00:01:00",
    }


def test_qdel_is_a_d_record_with_the_requestor(server_state: ServerState):
    pending, running = (server_state.submit(spec(), ME)[0] for _ in range(2))
    assert server_state.start(running.id, ("n0",)) is None
    parsed(server_state)
    server_state.requestor = ME
    server_state.cancel(pending)
    server_state.cancel(running)
    who = {"requestor": f"{user_name(os.getuid())}@{HOST}"}
    assert parsed(server_state) == [("D", "1", who), ("D", "2", who)]
    # The running one ends when its node says so: its E record comes then.
    server_state.requestor = None
    server_state.job_ended(running, JobResult.CANCELLED, exit_status=271)
    ((kind, jid, keys),) = parsed(server_state)
    assert (kind, jid, keys["Exit_status"]) == ("E", "2", "271")


def test_the_servers_own_cancellations_are_a_records(server_state: ServerState):
    (first,) = server_state.submit(spec(), ME)
    (after,) = server_state.submit(
        spec(depends=[Dependency(DependKind.AFTEROK, first.id)]), ME
    )
    parsed(server_state)
    server_state.cancel(first, "reservation 'r' ended")  # no request behind it
    # ... and the job depending on it can never run: the server cancels it too.
    assert parsed(server_state) == [("A", "1", {}), ("A", "2", {})]


def test_a_rerun_is_an_r_record_and_the_next_run_a_new_s(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    assert server_state.start(job.id, ("n0",)) is None
    requeue.request(server_state, job, "root")
    server_state.job_ended(job, JobResult.CANCELLED, exit_status=271)
    assert server_state.start(job.id, ("n1",)) is None
    kinds = [(kind, jid) for kind, jid, _ in parsed(server_state)]
    assert kinds == [("Q", "1"), ("S", "1"), ("R", "1"), ("S", "1")]


def test_records_go_to_the_file_of_their_day(tmp_path: Path):
    directory = tmp_path / "accounting"
    log = AccountingFile(directory)
    log.write([Record("20250101", "a"), Record("20250101", "b")])
    log.write([Record("20250101", "c"), Record("20250102", "d")])
    assert (directory / "20250101").read_text() == "a\nb\nc\n"
    assert (directory / "20250102").read_text() == "d\n"
    # Job names and users: not for everyone's eyes.
    assert stat.S_IMODE(directory.stat().st_mode) & 0o007 == 0


def test_a_failed_write_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    blocker = tmp_path / "accounting"
    blocker.write_text("a file where the directory should be")
    AccountingFile(blocker).write([Record("20250101", "a")])
    assert "records lost" in caplog.text


def test_mail_is_built_only_when_sent(monkeypatch: pytest.MonkeyPatch, caplog):
    # A qdel of a big array that asked for abort mail: no sendmail, no work;
    # more than may run at once, one warning for the rest.
    from minibatch.server import mail

    built: list[str] = []
    monkeypatch.setattr(mail, "message", lambda job, letter, host: built.append(letter))
    mailer = mail.Mailer()
    mailer.path = None
    mailer.send_all([(a_job(), "a")] * 1000, "h")
    assert built == []
    mailer.path = "/nonexistent/sendmail"
    mailer.send_all([(a_job(), "a")] * 1000, "h")
    assert len(built) == 64
    assert sum("936 mail(s) dropped" in r.message for r in caplog.records) == 1
