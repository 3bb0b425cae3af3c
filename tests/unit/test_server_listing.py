"""qstat's and qstat -a's rows from the server (the tables qstat printed from
jobs), and job ids as users may type them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from minibatch.cli import common, qstat, render
from minibatch.core.job import JobRequest, JobSpec
from minibatch.errors import InvalidArgument, NotFound
from minibatch.net.client import Client
from minibatch.protocol.messages import (
    ALT_ROW,
    ROW,
    JobControl,
    JobList,
    JobRows,
    QueryJobs,
    Submit,
)
from minibatch.server import handlers
from minibatch.server.access import Context
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

pytestmark = pytest.mark.timeout(60)

ME = Caller(uid=1000, gid=1000, pid=1)
CTX = Context(operators=frozenset())


def spec(name: str = "j", **kw: Any) -> JobSpec:
    kw.setdefault("request", JobRequest(ppn=1))
    return JobSpec(name=name, workdir="/tmp", argv=["true"], **kw)


def table_from_rows(state: ServerState) -> str:
    reply = handlers.query_jobs(state, CTX, ME, b"", QueryJobs(rows=True))
    assert isinstance(reply, JobRows)
    return render.qstat_default_table(msgspec.msgpack.decode(reply.rows, type=ROW))


def table_from_jobs(state: ServerState) -> str:
    """What qstat printed from the whole jobs (and still does for a server
    that sends them)."""
    reply = handlers.query_jobs(state, CTX, ME, b"", QueryJobs())
    assert isinstance(reply, JobList)
    jobs = sorted(reply.jobs, key=lambda j: j.id)
    return qstat.render_jobs(qstat.shown(jobs, [], False), now=0.0)


def test_rows_print_the_table_jobs_printed_and_follow_every_change(
    server_state: ServerState,
) -> None:
    state = server_state
    assert table_from_rows(state) == "" == table_from_jobs(state)
    (first,) = state.submit(spec("a-rather-long-job-name-cut"), ME)
    tasks = state.submit(spec("arr", array=[1, 2, 3]), ME)
    (held,) = state.submit(spec("held", hold=True), ME)
    assert state.start(first.id, ("n0",)) is None
    assert state.start(tasks[0].id, ("n1",)) is None
    assert table_from_rows(state) == table_from_jobs(state)
    assert "2[]" in table_from_rows(state)
    # A change of state, and the CPU time a heartbeat reports (not stored).
    state.release(held)
    assert " Q " in table_from_rows(state).splitlines()[-1]
    first.used_cputime_s = 75.0
    assert "00:01:15" in table_from_rows(state)
    state.cancel(tasks[1])
    assert table_from_rows(state) == table_from_jobs(state)


def test_qstat_u_finds_a_users_jobs_by_index(server_state: ServerState) -> None:
    state = server_state
    other = Caller(uid=0, gid=0, pid=2)
    mine = [state.submit(spec(), ME)[0].id for _ in range(3)]
    theirs = state.submit(spec(), other)[0]
    user = state.jobs[mine[0]].user
    reply = handlers.query_jobs(state, CTX, ME, b"", QueryJobs(user=user))
    assert isinstance(reply, JobList)
    assert [j.id for j in reply.jobs] == mine
    state.cancel(state.jobs[mine[1]])
    reply = handlers.query_jobs(state, CTX, ME, b"", QueryJobs(user=user))
    assert isinstance(reply, JobList)
    assert [j.id for j in reply.jobs] == [mine[0], mine[2]]
    assert theirs.user != user
    nobody = handlers.query_jobs(state, CTX, ME, b"", QueryJobs(user="no-such"))
    assert isinstance(nobody, JobList) and nobody.jobs == []


def alt_from_rows(state: ServerState, now: float, user: str | None = None) -> str:
    query = QueryJobs(rows=True, alt=True, user=user)
    reply = handlers.query_jobs(state, CTX, ME, b"", query)
    assert isinstance(reply, JobRows)
    rows = msgspec.msgpack.decode(reply.rows, type=ALT_ROW)
    return render.qstat_alt_table(rows, now, "host")


def alt_from_jobs(state: ServerState, now: float, user: str | None = None) -> str:
    reply = handlers.query_jobs(state, CTX, ME, b"", QueryJobs(user=user))
    assert isinstance(reply, JobList)
    jobs = sorted(reply.jobs, key=lambda j: j.id)
    shown = qstat.shown(jobs, [], False)
    return qstat.render_jobs(shown, now=now, alt=True, server="host")


def test_alt_rows_print_qstat_a_and_follow_every_change(
    server_state: ServerState,
) -> None:
    state = server_state
    other = Caller(uid=0, gid=0, pid=2)
    assert alt_from_rows(state, 0.0) == "" == alt_from_jobs(state, 0.0)
    (first,) = state.submit(spec("first"), ME)
    tasks = state.submit(spec("arr", array=[1, 2, 3]), ME)
    (theirs,) = state.submit(spec("theirs"), other)
    assert state.start(first.id, ("n0",)) is None
    assert state.start(tasks[0].id, ("n1",)) is None
    start = state.jobs[first.id].start_time
    assert start is not None
    # The elapsed time is the printing command's: a later one sees more.
    for now in (start + 5, start + 3725):
        assert alt_from_rows(state, now) == alt_from_jobs(state, now)
    assert "01:02:05" in alt_from_rows(state, start + 3725)
    mine = state.jobs[first.id].user
    assert theirs.user != mine
    for user in (mine, theirs.user, "no-such"):
        assert alt_from_rows(state, start, user) == alt_from_jobs(state, start, user)
    assert "theirs" not in alt_from_rows(state, start, mine)
    # Names nobody has are answered, never kept: anyone may ask for any.
    assert "no-such" not in state.listing._alt
    # The cached rows follow a change.
    state.cancel(tasks[1])
    state.cancel(theirs)
    for user in (None, mine, theirs.user):
        assert alt_from_rows(state, start, user) == alt_from_jobs(state, start, user)
    assert alt_from_rows(state, start, theirs.user) == ""


def test_ids_past_sqlites_integers_and_non_ascii_digits_name_no_job(
    server_state: ServerState,
) -> None:
    """A user may type any number: too large for the database it is an
    unknown id, never an internal error; digits of other scripts are no id."""
    state = server_state
    (job,) = state.submit(spec(), ME)
    huge = str(10**20)
    for selector in (huge, f"{huge}[]", f"{job.id}[{huge}]", f"{huge}[1]"):
        with pytest.raises(NotFound):
            state.select(selector)
    for selector in ("٨", "８"):
        with pytest.raises(InvalidArgument, match="malformed"):
            state.select(selector)
    assert state.store.finished_jobs(ids=[10**20, job.id]) == []
    # Per id, as qdel does: the known one is done, the other refused.
    reply = handlers.job_control(
        state,
        CTX,
        ME,
        b"",
        JobControl(action="cancel", selectors=[str(job.id), huge], each=True),
    )
    assert isinstance(reply, JobList)
    assert [r.selector for r in reply.refused] == [huge]
    assert state.store.is_finished(job.id) is not None
    with pytest.raises(InvalidArgument, match="malformed"):
        common.parse_selector("٨١")


def test_a_number_too_large_to_send_is_one_clear_error() -> None:
    client = Client("ipc:///nonexistent/server.sock")
    huge = JobRequest(ppn=1, walltime=10**20)
    with pytest.raises(InvalidArgument, match="out of range"):
        client.call(Submit(spec=spec(request=huge)))


def test_array_indices_are_bounded(server_state: ServerState) -> None:
    with pytest.raises(InvalidArgument, match="array indices are limited"):
        server_state.submit(spec(array=[1, 1 << 63]), ME)
