"""Running qsub: what it sends, prints and imports, and how `mb qsub` hooks in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minibatch.cli import qsub


def test_client_side_errors_send_nothing(tmp_path, monkeypatch, capsys):
    def no_server(message, timeout=10.0):
        raise AssertionError("nothing may be sent for a client-side error")

    monkeypatch.setattr("minibatch.cli.common.call", no_server)
    monkeypatch.chdir(tmp_path)
    for argv in (["missing.sh"], ["-l", "ncpus=0", "--", "true"], ["-Q"]):
        with pytest.raises(SystemExit) as exc:
            qsub.run(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("qsub: ") and err.count("\n") == 1


def test_submit_prints_the_id(tmp_path, monkeypatch, capsys):
    from minibatch.protocol.messages import Submit, Submitted

    sent = []

    def fake_call(message, timeout=10.0):
        sent.append(message)
        return Submitted(ids=[5, 6], display="5[]")

    monkeypatch.setattr("minibatch.cli.common.call", fake_call)
    monkeypatch.chdir(tmp_path)
    qsub.run(["-t", "1-2", "--", "true"])
    assert capsys.readouterr().out == "5[]\n"
    assert isinstance(sent[0], Submit) and sent[0].spec.workdir == str(tmp_path)


def test_server_rejection_exits_1(monkeypatch, capsys):
    from minibatch.errors import RemoteError

    def refuse(message, timeout=10.0):
        raise RemoteError(6, "job asks for 64 CPUs; the largest node has 8")

    monkeypatch.setattr("minibatch.cli.common.call", refuse)
    with pytest.raises(SystemExit) as exc:
        qsub.run(["--", "true"])
    assert exc.value.code == 1
    assert (
        capsys.readouterr().err
        == "qsub: job asks for 64 CPUs; the largest node has 8\n"
    )


def test_qsub_imports_neither_typer_nor_rich():
    code = (
        "import sys, minibatch.cli.qsub\n"
        "print(sorted(m for m in ('typer', 'rich', 'psutil') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_submission_reads_and_writes_without_every_message():
    # Creating every message class (~80 with the snapshot's) is ~1.5 ms of a
    # qsub; what a submission sends and gets back needs three.
    code = (
        "import os, sys\n"
        "from minibatch.cli.qsub import make_spec\n"
        "from minibatch.protocol import decode_reply, encode\n"
        "from minibatch.protocol.base import Error\n"
        "from minibatch.protocol.submit import Submit, Submitted\n"
        "spec, _ = make_spec(['--', 'true'], environ={}, workdir='/')\n"
        "assert encode(Submit(spec=spec))\n"
        "done = Submitted(ids=[7], display='7')\n"
        "assert decode_reply(encode(done, re=1)).body == done\n"
        "refused = Error(code=1, message='no')\n"
        "assert decode_reply(encode(refused)).body == refused\n"
        "print('minibatch.protocol.messages' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_registered_mb_qsub_keeps_double_dash_and_hold(monkeypatch):
    import typer
    from typer.testing import CliRunner

    sent = []
    monkeypatch.setattr(
        "minibatch.cli.common.call",
        lambda message, timeout=10.0: sent.append(message) or _submitted(),
    )
    app = typer.Typer()
    qsub.register(app)

    @app.command("other")
    def other() -> None:  # a second command makes "qsub" a subcommand, as in `mb`
        pass

    result = CliRunner().invoke(app, ["qsub", "-h", "--", "hostname"])
    assert result.exit_code == 0, result.output
    assert sent[0].spec.argv == ["hostname"] and sent[0].spec.hold
    result = CliRunner().invoke(app, ["qsub", "--help"])
    assert result.exit_code == 0 and "usage: qsub" in result.output


def test_plain_registration_still_works(monkeypatch):
    import typer
    from typer.testing import CliRunner

    sent = []
    monkeypatch.setattr(
        "minibatch.cli.common.call",
        lambda message, timeout=10.0: sent.append(message) or _submitted(),
    )
    app = typer.Typer()
    app.command("qsub", context_settings=qsub.CONTEXT_SETTINGS)(qsub.qsub_command)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["qsub", "-N", "x", "-l", "ncpus=2", "--", "ls"])
    assert result.exit_code == 0, result.output
    assert sent[0].spec.argv == ["ls"] and sent[0].spec.request.ppn == 2


def test_lazy_typer_command_attribute():
    import typer

    assert callable(qsub.qsub_command)
    assert issubclass(qsub.QsubCommand, typer.core.TyperCommand)
    with pytest.raises(AttributeError):
        _ = qsub.no_such_thing


def _submitted():
    from minibatch.protocol.messages import Submitted

    return Submitted(ids=[1], display="1")


def test_block_waits_through_a_lost_server_and_says_so_once(monkeypatch, capsys):
    from minibatch.cli import blocking, common
    from minibatch.core.job import Job, JobRequest, JobResult, JobState
    from minibatch.errors import RemoteError, Unavailable
    from minibatch.protocol.messages import JobList, Submitted

    def job(state: JobState, **kw) -> Job:
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
            state=state,
            **kw,
        )

    gone = Unavailable("no minibatch server at ipc:///x (is the cluster up?)")
    ended = job(
        JobState.FINISHED, end_time=2.0, exit_status=4, result=JobResult.COMPLETED
    )
    replies: list[object] = [job(JobState.RUNNING), gone, gone, gone, ended]
    slept: list[float] = []

    def fake_call(message, timeout=10.0):
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return JobList(jobs=[reply])

    def wait() -> None:
        with common.reporting("qsub"):
            blocking.wait_for_end(Submitted(ids=[7], display="7"), "qsub")

    monkeypatch.setattr(common, "call", fake_call)
    monkeypatch.setattr(blocking.time, "sleep", slept.append)
    with pytest.raises(SystemExit) as exc:
        wait()
    assert exc.value.code == 4
    assert slept[1:4] == [blocking.RETRY] * 3
    assert capsys.readouterr().err.splitlines() == [
        "qsub: lost the server while waiting for job 7, which was submitted: "
        "asking again every 1 s until it answers (Ctrl-C stops waiting, not the job)",
        "qsub: the server is back; waiting for job 7",
        "qsub: job 7 ended with exit status 4",
    ]
    # A server back without the job's record: one line, status 1.
    replies[:] = [gone, RemoteError(4, "unknown job id 7")]
    with pytest.raises(SystemExit) as exc:
        wait()
    assert exc.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "qsub: the server has no record of job 7 any more (unknown job id 7): "
        "its exit status cannot be known"
    )
    # Ctrl-C while the server is away: the usual 130.
    replies[:] = [gone, KeyboardInterrupt()]
    with pytest.raises(SystemExit) as exc:
        wait()
    assert exc.value.code == 130
