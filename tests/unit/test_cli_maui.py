"""Maui's commands: argument parsing and layouts, from hand-built records."""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from minibatch.cli import common, directives, pbsopts, resv
from minibatch.cli.diag import render_checkjob, render_fairshare, render_priorities
from minibatch.cli.policy import parse_params
from minibatch.cli.qsub import make_spec
from minibatch.cli.ranking import maui_duration
from minibatch.cli.showq import (
    backfill_windows,
    releases,
    render_showbf,
    render_showq,
    render_showstart,
)
from minibatch.core.job import Allocation, Job, JobRequest, JobSpec, JobState
from minibatch.core.reservation import Reservation
from minibatch.core.snapshot import Plan
from minibatch.errors import InvalidArgument
from minibatch.protocol import messages as m
from minibatch.server import admin
from minibatch.server.access import Context
from minibatch.server.nodes import Node
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import Caller

NOW = datetime(2025, 3, 1, 12, 0, 0).timestamp()


def test_maui_durations_have_days_and_signs():
    assert maui_duration(59) == "00:00:59"
    assert maui_duration(86400 + 2 * 3600 + 3 * 60 + 4) == "1:02:03:04"
    assert maui_duration(-5) == "-00:00:05"


def test_reservation_starts_as_maui_takes_them():
    assert resv.parse_start("now", NOW) == NOW
    assert resv.parse_start("+0", NOW) == NOW
    assert resv.parse_start("+1:00:00", NOW) == NOW + 3600
    assert resv.parse_start("+1:00:00:00", NOW) == NOW + 86400
    assert resv.parse_start("14:30", NOW) == NOW + 2.5 * 3600
    assert resv.parse_start("14:30:10_03/02", NOW) == NOW + 86400 + 2.5 * 3600 + 10
    assert resv.parse_start("2025-03-01T13:00", NOW) == NOW + 3600
    with pytest.raises(InvalidArgument, match="malformed start"):
        resv.parse_start("tomorrow", NOW)
    with pytest.raises(InvalidArgument, match="bad start time"):
        resv.parse_start("25:00", NOW)


def test_node_lists_and_counts():
    assert resv.parse_nodes("2") == ([], 2)
    assert resv.parse_nodes("node0,node1") == (["node0", "node1"], 0)
    with pytest.raises(InvalidArgument):
        resv.parse_nodes("0")


def test_policy_parameters_are_json_when_they_parse():
    params = parse_params(
        ["depth=3", "backfill=false", "w=0.5", "name=bestfit", 't={"a": "1"}']
    )
    assert params == {
        "depth": 3,
        "backfill": False,
        "w": 0.5,
        "name": "bestfit",
        "t": {"a": "1"},
    }
    with pytest.raises(InvalidArgument, match="KEY=VALUE"):
        parse_params(["nokey"])


def test_qsub_takes_qos_advres_and_account():
    made = make_spec(
        ["-A", "physics", "-l", "qos=high,advres=lab.1", "--", "true"],
        environ={},
        workdir="/w",
        host="h",
        user="u",
    )
    assert made is not None
    spec = made[0]
    assert isinstance(spec, JobSpec)
    assert (spec.account, spec.qos, spec.advres) == ("physics", "high", "lab.1")
    script = "#!/bin/sh\n#SBATCH --qos=debug --reservation=r -A chem\ntrue\n"
    opts = directives.parse_directives(script, "s.sh", directives.Context({}, 0.0))
    assert (opts.qos, opts.advres, opts.account) == ("debug", "r", "chem")
    with pytest.raises(InvalidArgument, match="invalid QOS"):
        pbsopts.apply_resources(directives.SubmitOptions(), "qos=a b")


def reservation(
    start: float, end: float, users: list[str] | None = None
) -> Reservation:
    return Reservation(
        name="lab",
        start=start,
        end=end,
        alloc=[Allocation("node0", [0, 1])],
        users=users or [],
    )


def test_showres_layout():
    text = resv.render_showres([reservation(NOW + 60, NOW + 3660, ["alice"])], NOW)
    lines = text.splitlines()
    assert lines[0].split() == [
        "ReservationID", "Type", "S", "Start", "End", "Duration", "N/P", "StartTime",
    ]  # fmt: skip
    assert lines[2].split()[:7] == [
        "lab", "User", "I", "00:01:00", "01:01:00", "01:00:00", "1/2",
    ]  # fmt: skip
    assert "users: alice  CPUs: node0:0-1" in text
    assert lines[-1] == "1 reservation located"
    down = resv.render_showres([reservation(NOW - 10, NOW + 10)], NOW)
    assert "System R   -00:00:10" in down and "downtime" in down


def test_backfill_windows_stop_at_reservations():
    nodes = [
        m.NodeInfo(name="node0", state="free", cpus=[0, 1], free_cpus=[0, 1],
                   mem_kb=None, jobs={}),
        m.NodeInfo(name="node1", state="free", cpus=[2, 3], free_cpus=[3],
                   mem_kb=None, jobs={1: [2]}),
        m.NodeInfo(name="node2", state="down", cpus=[4], free_cpus=[4],
                   mem_kb=None, jobs={}),
    ]  # fmt: skip
    windows = backfill_windows(nodes, [reservation(NOW + 600, NOW + 900)], NOW)
    assert windows == [
        (3, 600.0, {"node0": 2, "node1": 1}),
        (1, math.inf, {"node1": 1}),
    ]
    text = render_showbf(windows, [(30.0, {"node1": 1})], "alice", NOW)
    assert "  3 procs available for    00:10:00   (node0: 2, node1: 1)" in text
    assert "  1 proc  available with no timelimit   (node1: 1)" in text
    assert "  1 more in    00:00:30   (node1: 1)" in text
    assert "no procs available" in render_showbf([], [], "alice", NOW)


def job(jid: int, state: JobState = JobState.QUEUED, **kw) -> Job:
    return Job(
        id=jid,
        name="j",
        user="alice",
        uid=1000,
        gid=1000,
        group="users",
        workdir="/w",
        request=JobRequest(ppn=kw.pop("ppn", 1), walltime=600),
        submit_time=NOW - 60,
        state=state,
        **kw,
    )


def test_showstart_says_when_there_is_no_forecast():
    text = render_showstart(job(7, predicted_start=NOW + 120), "easy", NOW)
    assert text.startswith("job 7 requires 1 proc for 00:10:00\n")
    assert "Earliest start in         00:02:00 on Sat Mar  1 12:02:00" in text
    assert "Earliest completion in    00:12:00 on Sat Mar  1 12:12:00" in text
    none = render_showstart(job(8, reason="queued behind job 7 (fifo)"), "fifo", NOW)
    assert "no start time predicted: policy 'fifo' has predicted no start" in none
    assert "queued behind job 7" in none
    held = render_showstart(job(9, JobState.HELD, reason="held (user hold)"), "x", NOW)
    assert "not eligible to start (held (user hold))" in held
    run = render_showstart(job(10, JobState.RUNNING, start_time=NOW - 60), "x", NOW)
    assert "is running since" in run and "Latest completion in    00:09:00" in run
    assert releases([job(10, JobState.RUNNING, start_time=NOW - 60,
                         alloc=[Allocation("n0", [0])])], NOW) == [
        (540.0, {"n0": 1})
    ]  # fmt: skip


def test_showq_sections_from_a_real_server_state(tmp_path: Path):
    store = Store(tmp_path / "db")
    store.put_node(Node(name="n0", cpus=[0, 1], pid=1))
    store.commit()
    state = ServerState(store, clock=time.time)
    state.nodes.nodes["n0"].up = True
    me = Caller(0, 0, 1)

    def submit(ppn: int = 1, **kw) -> Job:
        request = JobRequest(ppn=ppn, walltime=600)
        return state.submit(
            JobSpec(name="j", workdir="/w", request=request, argv=["x"], **kw), me
        )[0]

    running = submit()
    assert state.start(running.id, ("n0",)) is None
    wide, held = submit(ppn=2), submit(hold=True)
    plan = Plan(generation=1, reasons={wide.id: "waiting for 2 CPUs (1 free)"})
    state.queue.take_notes(plan, state.snapshot_time + 1e9)
    ctx = Context(fairshare={"policy": "DEDICATEDPS", "interval": 43200.0})
    reply = admin.diagnose(state, ctx, me, b"", m.Diagnose())
    text = render_showq(reply, time.time())
    assert text.startswith("ACTIVE JOBS--------------------\n")
    assert "     1 Active Job      1 of     2 Processors Active (50.00%)" in text
    assert f"{wide.id:>18}     root       Idle     2" in text
    assert "waiting for 2 CPUs (1 free)" in text
    assert f"{held.id:>18}     root   UserHold" in text
    assert text.rstrip().endswith(
        "Total Jobs: 3   Active Jobs: 1   Eligible Jobs: 1   Blocked Jobs: 1"
    )
    (wide_job,) = [j for j in reply.jobs if j.id == wide.id]
    # checkjob asks for its job on its own: the ranking needs only the snapshot.
    lean = admin.diagnose(state, ctx, me, b"", m.Diagnose(jobs=False))
    assert lean.jobs == []
    same_time = msgspec.structs.replace(lean.snapshot, now=reply.snapshot.now)
    assert same_time == reply.snapshot
    assert "StartPriority:" in render_checkjob(wide_job, lean, time.time())
    checked = render_checkjob(wide_job, reply, time.time())
    assert checked.startswith(f"checking job {wide.id}\n\nState: Idle\n")
    assert "StartPriority:" in checked and "Serv: " in checked
    # EASY keeps PBS order: checkjob says the priority shown does not order it.
    assert "(policy easy does not order by it: queue priority 0, then qsub -p 0" in (
        checked
    )
    assert "PSP: bin 3 (a3), root has no finished job yet" in checked
    assert "Reservation: none (policy 'easy' holds none" in checked
    assert "Reason: waiting for 2 CPUs (1 free)" in checked
    prio = render_priorities(reply).splitlines()
    assert prio[0].startswith("diagnosing job priority information")
    assert prio[2].split() == ["Job", "PRIORITY*", "Serv(QTime)"]
    assert prio[4].split()[0] == str(wide.id)
    fs = render_fairshare(reply)
    assert "FS Policy:" in fs and "USER" in fs and "root" in fs
    store.close()


def test_mb_registers_the_maui_commands():
    from minibatch.cli.app import app

    runner = CliRunner()
    for name in ("showq", "showstart", "showbf", "setres", "showres",
                 "releaseres", "checkjob", "diagnose"):  # fmt: skip
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
    result = runner.invoke(app, ["policy", "--help"])
    assert "show" in result.output and "set" in result.output


def test_setres_usage_errors_are_caught_before_sending(monkeypatch):
    sent: list[object] = []
    monkeypatch.setattr(common, "connect", lambda *a, **k: sent.append(a))
    app = typer.Typer()
    app.command(context_settings=common.HELP_ONLY_LONG)(resv.setres_command)
    runner = CliRunner()
    no_duration = runner.invoke(app, ["-c", "1"])
    assert no_duration.exit_code == 2 and "a duration is needed" in no_duration.output
    both = runner.invoke(app, ["-d", "60", "-c", "1", "-n", "2"])
    assert both.exit_code == 2 and "either -n NODES or -c CPUS" in both.output
    assert not sent


def test_showq_sections_and_one_users_jobs(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.put_node(Node(name="n0", cpus=[0, 1], pid=1))
    store.commit()
    state = ServerState(store, clock=time.time)
    state.nodes.nodes["n0"].up = True
    me, other = Caller(0, 0, 1), Caller(1000, 1000, 2)

    def submit(caller: Caller, hold: bool = False) -> Job:
        request = JobRequest(ppn=1, walltime=600)
        spec = JobSpec(name="j", workdir="/w", request=request, argv=["x"], hold=hold)
        return state.submit(spec, caller)[0]

    def rows(text: str) -> set[int]:
        """The jobs listed: rows of an id, a user and a state."""
        states = {"Running", "Idle", "UserHold", "Depend"}
        lines = [line.split() for line in text.splitlines()]
        return {int(w[0]) for w in lines if len(w) > 2 and w[2] in states}

    mine, theirs, held = submit(me), submit(other), submit(me, hold=True)
    assert state.start(mine.id, ("n0",)) is None
    reply = admin.diagnose(state, Context(), me, b"", m.Diagnose())
    now = time.time()
    whole = render_showq(reply, now)
    active = render_showq(reply, now, frozenset({"active"}))
    assert active.startswith("ACTIVE JOBS") and "ELIGIBLE" not in active
    assert whole.startswith(active.rstrip("\n"))
    blocked = render_showq(reply, now, frozenset({"blocked"}))
    assert blocked.startswith("BLOCKED JOBS") and rows(blocked) == {held.id}
    assert "Total Jobs" not in blocked
    only_theirs = render_showq(reply, now, user=theirs.user)
    assert rows(only_theirs) == {theirs.id}
    assert rows(whole) == {mine.id, theirs.id, held.id}
    assert "Total Jobs: 1   Active Jobs: 0   Eligible Jobs: 1" in only_theirs
