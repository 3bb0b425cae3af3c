"""The typer commands, with the server replaced by a recorder of requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from minibatch.cli import acct, common, jobctl, pbsnodes, qstat, render
from minibatch.core.job import Job, JobRequest, JobResult, JobState
from minibatch.errors import InvalidArgument, RemoteError, Unavailable
from minibatch.protocol import messages as m


class FakeServer:
    def __init__(self) -> None:
        self.sent: list[object] = []
        self.replies: list[object] = []

    def __call__(self, message: object, timeout: float = 10.0) -> object:
        self.sent.append(message)
        reply = self.replies.pop(0) if self.replies else m.Ok()
        if isinstance(reply, Exception):
            raise reply
        return reply


@pytest.fixture
def server(monkeypatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(common, "call", fake)
    return fake


def invoke(function, args: list[str]):
    app = typer.Typer()
    app.command(context_settings=common.HELP_ONLY_LONG)(function)
    return CliRunner().invoke(app, args)


def job(id: int, state: JobState = JobState.QUEUED, **kw) -> Job:
    return Job(
        id=id,
        name=f"j{id}",
        user=kw.pop("user", "alice"),
        uid=1000,
        gid=1000,
        group="users",
        workdir="/w",
        request=JobRequest(),
        submit_time=1_700_000_000.0,
        state=state,
        **kw,
    )


# ------------------------------------------------------------------ qstat


def test_qstat_default_query_and_output(server):
    server.replies = [
        m.JobList(jobs=[job(9), job(3, JobState.RUNNING, start_time=1.7e9)])
    ]
    result = invoke(qstat.qstat_command, [])
    assert result.exit_code == 0
    # A bare qstat asks for the rows only; a server that sends jobs is shown
    # as before.
    assert server.sent == [m.QueryJobs(selectors=[], finished=False, rows=True)]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Job ID")
    assert [line.split()[0] for line in lines[2:]] == ["3", "9"]
    rows = [("3", "j3", "alice", "00:00:01", "R", "batch")]
    server.replies = [m.JobRows(rows=msgspec.Raw(msgspec.msgpack.encode(rows)))]
    again = invoke(qstat.qstat_command, [])
    assert again.stdout == render.qstat_default_table(rows)


def test_qstat_named_jobs_include_finished_and_report_unknown(server):
    done = job(4, JobState.FINISHED, result=JobResult.COMPLETED)
    server.replies = [m.JobList(jobs=[done])]
    result = invoke(qstat.qstat_command, ["-f", "4.ws", "77"])
    assert result.exit_code == 1
    assert server.sent == [m.QueryJobs(selectors=["4", "77"], finished=True)]
    assert result.stdout.startswith("Job Id: 4\n")
    assert result.stderr == "qstat: Unknown Job Id 77\n"


def test_qstat_unknown_id_does_not_hide_the_others(server):
    not_found = RemoteError(4, "unknown job id 77")
    server.replies = [not_found, m.JobList(jobs=[job(4)]), not_found]
    result = invoke(qstat.qstat_command, ["4", "77"])
    assert result.exit_code == 1
    assert [q.selectors for q in server.sent] == [["4", "77"], ["4"], ["77"]]
    assert result.stdout.splitlines()[2].split()[0] == "4"
    assert result.stderr == "qstat: Unknown Job Id 77\n"
    server.replies = [not_found]
    result = invoke(qstat.qstat_command, ["77"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "qstat: Unknown Job Id 77\n"


def test_qstat_other_refusals_pass_through(server):
    server.replies = [RemoteError(7, "permission denied")]
    result = invoke(qstat.qstat_command, ["4", "5"])
    assert (result.exit_code, result.stderr) == (1, "qstat: permission denied\n")


def test_qstat_user_filter_json_and_x(server):
    server.replies = [m.JobList(jobs=[job(1, user="bob"), job(2, user="carol")])]
    result = invoke(qstat.qstat_command, ["-u", "bob,dave", "-x", "--json"])
    assert result.exit_code == 0
    assert server.sent == [m.QueryJobs(user=None, finished=True)]
    assert [j["id"] for j in json.loads(result.stdout)] == ["1"]
    # One user: qstat -a's rows of that user; a server that sends jobs is
    # still understood.
    bob = job(1, user="bob")
    for reply in (m.JobList(jobs=[bob]), rows_reply([render.qstat_alt_row(bob)])):
        server.replies = [reply]
        result = invoke(qstat.qstat_command, ["-u", "bob"])
        assert result.exit_code == 0
        assert server.sent[-1] == m.QueryJobs(user="bob", rows=True, alt=True)
        assert result.stdout.splitlines()[-1].split()[:3] == ["1", "bob", "batch"]


def test_qstat_of_a_tasks_own_id_shows_that_task_not_its_array(server):
    # Array 101's tasks are jobs 101, 102 and 103; its first was deleted.
    done = dict(result=JobResult.CANCELLED, array_id=101)
    tasks = [
        job(101, JobState.FINISHED, array_index=1, **done),
        job(102, JobState.HELD, array_id=101, array_index=2),
        job(103, JobState.HELD, array_id=101, array_index=3),
    ]

    def first_columns(args: list[str], reply: list[Job]) -> list[list[str]]:
        server.replies = [m.JobList(jobs=reply)]
        result = invoke(qstat.qstat_command, args)
        assert result.exit_code == 0, result.output
        return [line.split()[::4] for line in result.stdout.splitlines()[2:]]

    # Named by its own id, or by its index, a task is itself, in its state.
    assert first_columns(["101"], tasks[:1]) == [["101[1]", "F"]]
    assert first_columns(["102"], tasks[1:2]) == [["101[2]", "H"]]
    assert first_columns(["101[2]"], tasks[1:2]) == [["101[2]", "H"]]
    both = [["101[1]", "F"], ["101[3]", "H"]]
    assert first_columns(["101", "103"], [tasks[0], tasks[2]]) == both
    # The array as a whole is one line, as are the tasks not named alone.
    assert first_columns(["101[]"], tasks) == [["101[]", "H"]]
    assert first_columns(["102", "101[]"], tasks) == [["101[]", "H"], ["101[2]", "H"]]
    assert first_columns(["-t", "101[]"], tasks) == [
        ["101[1]", "F"],
        ["101[2]", "H"],
        ["101[3]", "H"],
    ]


def rows_reply(rows: list[tuple[object, ...]]) -> m.JobRows:
    return m.JobRows(rows=msgspec.Raw(msgspec.msgpack.encode(rows)))


def test_qstat_bad_id_sends_nothing(server):
    result = invoke(qstat.qstat_command, ["seven"])
    assert result.exit_code == 2
    assert result.stderr.startswith("qstat: malformed job id 'seven'")
    assert server.sent == []


def test_server_errors_are_one_line(server):
    server.replies = [
        Unavailable("no minibatch server at ipc:///x (is the cluster up?)")
    ]
    result = invoke(qstat.qstat_command, [])
    assert result.exit_code == 1
    assert (
        result.stderr == "qstat: no minibatch server at ipc:///x (is the cluster up?)\n"
    )
    assert "Traceback" not in result.output


# ------------------------------------------------------- job control


@pytest.mark.parametrize(
    ("function", "action"),
    [
        (jobctl.qdel_command, "cancel"),
        (jobctl.qhold_command, "hold"),
        (jobctl.qrls_command, "release"),
    ],
)
def test_job_control(server, function, action):
    server.replies = [m.JobList(jobs=[])]
    result = invoke(function, ["5", "6[]", "7[2].ws"])
    assert result.exit_code == 0 and result.stdout == ""
    # Each id on its own, as PBS does (the server reports the refused ones).
    assert server.sent == [
        m.JobControl(action=action, selectors=["5", "6[]", "7[2]"], each=True)
    ]


def test_qdel_refused(server):
    server.replies = [RemoteError(4, "unknown job 99")]
    result = invoke(jobctl.qdel_command, ["99"])
    assert (result.exit_code, result.stderr) == (1, "qdel: unknown job 99\n")


def test_qdel_needs_an_id(server):
    assert invoke(jobctl.qdel_command, []).exit_code == 2
    assert server.sent == []


def test_qalter(server):
    result = invoke(
        jobctl.qalter_command, ["-N", "new", "-l", "walltime=1:00,ncpus=2", "8"]
    )
    assert result.exit_code == 0
    assert server.sent == [m.Alter(selector="8", name="new", walltime=60, ncpus=2)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["8"], "nothing to alter"),
        (["-l", "mem=1gb", "8"], "cannot alter 'mem'"),
        (["-l", "ncpus=0", "8"], "positive integer"),
        (["-N", "a b", "8"], "invalid job name"),
    ],
)
def test_qalter_errors(server, args, message):
    result = invoke(jobctl.qalter_command, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert server.sent == []


# ------------------------------------------------------------- pbsnodes


def node(name: str, **kw) -> m.NodeInfo:
    fields = {"state": "up", "cpus": [0], "free_cpus": [0], "mem_kb": None, "jobs": {}}
    return m.NodeInfo(name=name, **{**fields, **kw})


def test_pbsnodes_show(server):
    server.replies = [m.NodeList(nodes=[node("b"), node("a", state="offline")])]
    result = invoke(pbsnodes.pbsnodes_command, ["-a"])
    assert result.exit_code == 0
    assert server.sent == [m.QueryNodes(names=[])]
    assert result.stdout.startswith("a\n     state = offline\n")
    server.replies = [m.NodeList(nodes=[node("a", state="offline")])]
    result = invoke(pbsnodes.pbsnodes_command, ["-l"])
    assert result.stdout.split() == ["a", "offline"]


def test_pbsnodes_unknown_node_and_json(server):
    server.replies = [m.NodeList(nodes=[node("a")])]
    result = invoke(pbsnodes.pbsnodes_command, ["--json", "a", "zz"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)[0]["name"] == "a"
    assert result.stderr == "pbsnodes: Unknown node zz\n"


def test_pbsnodes_offline_and_clear(server):
    assert (
        invoke(pbsnodes.pbsnodes_command, ["-o", "a", "b", "-N", "disk"]).exit_code == 0
    )
    assert invoke(pbsnodes.pbsnodes_command, ["-c", "a"]).exit_code == 0
    assert server.sent == [
        m.SetNodeOffline(names=["a", "b"], offline=True, comment="disk"),
        m.SetNodeOffline(names=["a"], offline=False),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["-o"], "-o needs at least one node"), (["-o", "-c", "a"], "together")]
    + [(["-N", "x", "a"], "-N is only used with -o")],
)
def test_pbsnodes_usage_errors(server, args, message):
    result = invoke(pbsnodes.pbsnodes_command, args)
    assert result.exit_code == 2 and message in result.stderr
    assert server.sent == []


# ------------------------------------------------------------------- acct


def test_acct_queries_finished_jobs(server):
    done = job(3, JobState.FINISHED, result=JobResult.FAILED, exit_status=2)
    server.replies = [m.JobList(jobs=[done])]
    result = invoke(acct.acct_command, ["-u", "alice", "-o", "JobID,State,ExitCode"])
    assert result.exit_code == 0
    query = server.sent[0]
    assert (query.user, query.finished, query.active, query.since) == (
        "alice",
        True,
        False,
        None,
    )
    assert result.stdout.splitlines()[2].split() == ["3", "FAILED", "2:0"]


def test_acct_jobs_since_and_json(server):
    server.replies = [m.JobList(jobs=[job(3)])]
    result = invoke(
        acct.acct_command, ["-j", "3,4", "-j", "5", "--since", "1h", "--json"]
    )
    assert result.exit_code == 0
    query = server.sent[0]
    assert query.selectors == ["3", "4", "5"] and query.active
    assert query.since is not None
    assert json.loads(result.stdout)[0]["id"] == "3"


def test_acct_bad_format(server):
    result = invoke(acct.acct_command, ["--format", "JobID,Nope"])
    assert result.exit_code == 2
    assert result.stderr.startswith("mb acct: unknown format field 'Nope'")
    assert server.sent == []


# -------------------------------------------------------------- common


def test_run_typer_prints_usage_errors_on_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        common.run_typer(qstat.qstat_command, "qstat", argv=["-Z"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "qstat: No such option: -Z\n"


def test_run_typer_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        common.run_typer(jobctl.qdel_command, "qdel", argv=["--help"])
    assert exc.value.code == 0
    assert "Usage: qdel" in capsys.readouterr().out


def _ended_by_run_and_exit(body: str, **kw) -> subprocess.CompletedProcess[str]:
    code = f"from minibatch.cli.common import run_and_exit\n{body}"
    return subprocess.run([sys.executable, "-c", code], text=True, timeout=30, **kw)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("run_and_exit(lambda: print('42'))", 0),
        ("def f():\n    raise SystemExit(2)\nrun_and_exit(f)", 2),
        ("def f():\n    raise SystemExit('no')\nrun_and_exit(f)", 1),
        ("def f():\n    raise SystemExit(None)\nrun_and_exit(f)", 0),
    ],
)
def test_run_and_exit_keeps_output_and_exit_status(body, status):
    done = _ended_by_run_and_exit(body, capture_output=True)
    assert done.returncode == status
    if status == 0 and "print" in body:
        assert done.stdout == "42\n"  # flushed before the process ended


def test_run_and_exit_with_closed_or_broken_stdout():
    # Started with stdout closed: the command's output goes nowhere, it still
    # succeeds (qsub job.sh >&- submits the job).
    closed = _ended_by_run_and_exit(
        "import os; os.close(1)\nimport sys; sys.stdout = None\n"
        "run_and_exit(lambda: print('lost'))",
        capture_output=True,
    )
    assert closed.returncode == 0
    # A reader that went away: exit 1, no traceback.
    reader = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    reader.wait()
    broken = _ended_by_run_and_exit(
        "run_and_exit(lambda: print('x' * 100000))",
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
    )
    reader.stdin.close()
    assert broken.returncode == 1 and "Traceback" not in broken.stderr


def test_selectors_and_exit_codes():
    assert common.parse_selector(" 12.server ") == "12"
    assert common.parse_selector("12[].ws") == "12[]"
    assert common.parse_selector("12[3]") == "12[3]"
    for bad in ("", "x", "12[a]", "-1"):
        with pytest.raises(InvalidArgument):
            common.parse_selector(bad)
    assert common.exit_code(InvalidArgument("x")) == 2
    assert common.exit_code(RemoteError(8, "bad argument")) == 1


def test_connect_fails_fast_without_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv("MB_HOME", str(tmp_path))
    with pytest.raises(Unavailable, match="is the cluster up"):
        common.connect()


def test_qstat_u_without_a_name_is_a_usage_error(server):
    result = invoke(qstat.qstat_command, ["-u", ""])
    assert result.exit_code == 2
    assert result.stderr == "qstat: -u needs a user name, got ''\n"
    assert server.sent == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("option", ["-W", "-o", "-p", "-A"])
def test_qalter_names_what_it_changes_for_pbs_options_it_does_not(option, tmp_path):
    """PBS's qalter changes dependencies, paths, priority...: here a line says
    what qalter changes, not click's "No such option" (found by a new-user
    trial)."""
    qalter = os.path.join(os.path.dirname(sys.executable), "qalter")
    done = subprocess.run(
        [qalter, option, "x", "8"],
        capture_output=True,
        text=True,
        env={**os.environ, "MB_HOME": str(tmp_path)},
        timeout=20,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"qalter: {option}: qalter changes a pending job")
