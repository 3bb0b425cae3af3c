"""``qstat``: show jobs, queues or the server, in Torque's layouts or as JSON.

    qstat [-a | -f | --json] [-n [-1]] [-s] [-r | -i] [-t] [-u USER] [-x] [ID...]
    qstat -Q [-f] [QUEUE...]     qstat -q [QUEUE...]     qstat -B [-f]

By default only jobs that have not finished are shown; ``-x`` adds finished ones,
and naming jobs shows them whatever their state. An id the server does not know
is reported as ``qstat: Unknown Job Id ID`` and makes the exit status 1.

An array is one line, ``5[]``, as PBS shows it (its state R while a task runs,
Q while one waits, C/F once all have ended), unless ``-t`` lists its tasks or
a task is named (``5[2]``, or by its own job id: each task has one); ``-f`` and
``--json`` always show each task, since each is a job with its own record.
``-n``, ``-s``, ``-r``, ``-i`` and ``-u`` use the ``-a`` layout, as in Torque.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from minibatch.cli import common, qlayouts, render
from minibatch.core.job import ACTIVE_STATES, PENDING_STATES, Job
from minibatch.errors import ErrorCode, RemoteError

if TYPE_CHECKING:
    import typer

    from minibatch.protocol.messages import QueryJobs
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}


def matches(selector: str, job: Job) -> bool:
    """Whether ``selector`` (``7``, ``7[]`` or ``7[2]``) names ``job``."""
    base, bracket, index = selector.partition("[")
    number = int(base)
    if not bracket:
        return job.id == number or job.array_id == number
    if index == "]":
        return job.array_id == number
    return job.array_id == number and job.array_index == int(index[:-1])


def unmatched(selectors: Sequence[str], jobs: Sequence[Job]) -> list[str]:
    """The selectors that name none of ``jobs``."""
    return [s for s in selectors if not any(matches(s, j) for j in jobs)]


def fetch(query: QueryJobs) -> list[Job]:
    """The jobs ``query`` asks for; an unknown id does not hide the others.

    The server refuses a whole request that names an unknown job, so after such a
    refusal each id is asked for alone, and the unknown ones are left out.
    """
    try:
        return list(common.call(query).jobs)
    except RemoteError as exc:
        if exc.code is not ErrorCode.NOT_FOUND or not query.selectors:
            raise
    found: dict[int, Job] = {}
    for selector in query.selectors if len(query.selectors) > 1 else []:
        try:
            reply = common.call(msgspec.structs.replace(query, selectors=[selector]))
        except RemoteError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            continue
        found.update((j.id, j) for j in reply.jobs)
    return list(found.values())


def shown(jobs: Sequence[Job], selectors: Sequence[str], tasks: bool) -> list[Job]:
    """The lines of the table: arrays summed up unless ``tasks`` (``-t``); a
    task named by its index (``5[2]``) or by its own job id (``6``, which is
    ``5[2]``) keeps its own line: that one task is what was asked for."""
    if tasks:
        return list(jobs)
    # Not matches(): a bare id names the job with that id, never its array.
    ids = {int(s) for s in selectors if "[" not in s}
    named = [s for s in selectors if "[" in s and not s.endswith("[]")]
    return qlayouts.summarize(
        jobs, lambda j: j.id in ids or any(matches(s, j) for s in named)
    )


def render_jobs(
    jobs: Sequence[Job],
    *,
    now: float,
    alt: bool = False,
    full: bool = False,
    as_json: bool = False,
    server: str = "",
    nodes: bool = False,
    comments: bool = False,
    one_line: bool = False,
) -> str:
    """The output for ``jobs`` in the layout the options ask for."""
    if as_json:
        records = [render.job_record(j) for j in jobs]
        if full:
            for record, job in zip(records, jobs, strict=True):
                record["resources_used"] = qlayouts.used_record(job, now)
        return common.dump_json(records)
    if full:
        return render.qstat_full(jobs, now)
    if alt or nodes or comments:
        return qlayouts.annotated_alt(
            jobs, now, server, nodes=nodes, comments=comments, one_line=one_line
        )
    return render.qstat_default(jobs)


def _queues(names: list[str], *, limits: bool, full: bool, as_json: bool) -> None:
    """``-Q`` / ``-q``: the queues, by name or all."""
    from minibatch.protocol.messages import QueryQueues, QueueList

    with common.reporting("qstat"):
        reply: QueueList = common.call(QueryQueues(names=names))
    if as_json:
        out = common.dump_json(msgspec.to_builtins(reply.queues))
    elif full:
        out = qlayouts.queue_full(reply.queues)
    elif limits:
        out = qlayouts.queue_limits(reply.queues, os.uname().nodename)
    else:
        out = qlayouts.queue_table(reply.queues)
    sys.stdout.write(out)


def _server(*, full: bool, as_json: bool) -> None:
    """``-B``: the server's status."""
    from minibatch.protocol.messages import QueryQueues, QueueList, ServerStatus, Status

    with common.reporting("qstat"):
        status: ServerStatus = common.call(Status())
        queues: QueueList = common.call(QueryQueues()) if full else QueueList(queues=[])
    host = os.uname().nodename
    if as_json:
        out = common.dump_json(msgspec.to_builtins(status))
    elif full:
        out = qlayouts.server_full(status, host, queues.queues)
    else:
        out = qlayouts.server_table(status, host)
    sys.stdout.write(out)


def qstat_command(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ID",
            help="Jobs to show: 7, 7[] (a whole array) or 7[2]; queues with -Q/-q.",
            show_default=False,
        ),
    ] = None,
    alt: Annotated[
        bool,
        typer.Option("-a", help="Long layout: requested memory/time, elapsed time."),
    ] = False,
    full: Annotated[
        bool, typer.Option("-f", help="Every attribute of each job (queue, server).")
    ] = False,
    user: Annotated[
        str | None, typer.Option("-u", help="Only jobs of USER (or U1,U2); implies -a.")
    ] = None,
    finished: Annotated[
        bool, typer.Option("-x", help="Include finished jobs.")
    ] = False,
    tasks: Annotated[
        bool,
        typer.Option("-t", help="List array tasks one per line, not one per array."),
    ] = False,
    nodes: Annotated[
        bool, typer.Option("-n", help="The nodes of each job under it; implies -a.")
    ] = False,
    one_line: Annotated[
        bool, typer.Option("-1", help="With -n/-s: on the job's line.")
    ] = False,
    comments: Annotated[
        bool, typer.Option("-s", help="Each job's comment under it; implies -a.")
    ] = False,
    running: Annotated[
        bool, typer.Option("-r", help="Only running jobs; implies -a.")
    ] = False,
    idle: Annotated[
        bool,
        typer.Option("-i", help="Only jobs not running (queued, held, waiting)."),
    ] = False,
    queues: Annotated[
        bool, typer.Option("-Q", help="Queues: their jobs by state.")
    ] = False,
    limits: Annotated[
        bool, typer.Option("-q", help="Queues: their limits, running and queued.")
    ] = False,
    server: Annotated[bool, typer.Option("-B", help="The server's status.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list of jobs.")
    ] = False,
) -> None:
    """Show the status of batch jobs, queues or the server."""
    if queues or limits:
        _queues(job_ids or [], limits=limits, full=full, as_json=as_json)
        return
    if server:
        _server(full=full, as_json=as_json)
        return
    users = [u for u in (user or "").split(",") if u]
    if user is not None and not users:
        common.fail("qstat", f"-u needs a user name, got {user!r}", common.USAGE_EXIT)
    # As in Torque, -u, -r and -i select the long layout.
    alt = alt or bool(users) or running or idle
    # The plain tables come as rows (minibatch/server/listing.py).
    plain = not (job_ids or full or finished or tasks or nodes or comments)
    plain = plain and not (running or idle or as_json) and len(users) <= 1
    with common.reporting("qstat"):
        selectors = [common.parse_selector(s) for s in job_ids or []]
        from minibatch.protocol.messages import ALT_ROW, ROW, JobRows, QueryJobs

        query = QueryJobs(
            selectors=selectors,
            # One user is filtered by the server; several are filtered here.
            user=users[0] if len(users) == 1 else None,
            finished=finished or bool(selectors),
            rows=plain,
            alt=plain and alt,
        )
        if plain:
            reply = common.call(query)
            if isinstance(reply, JobRows) and alt:
                table = msgspec.msgpack.decode(reply.rows, type=ALT_ROW)
                server_name = os.uname().nodename
                sys.stdout.write(
                    render.qstat_alt_table(table, time.time(), server_name)
                )
                return
            if isinstance(reply, JobRows):
                rows = msgspec.msgpack.decode(reply.rows, type=ROW)
                sys.stdout.write(render.qstat_default_table(rows))
                return
            jobs = list(reply.jobs)
        else:
            jobs = fetch(query)
    if users:
        # The server ignores the user when ids are named, and takes only one.
        jobs = [j for j in jobs if j.user in users]
    jobs.sort(key=lambda j: j.id)
    missing = unmatched(selectors, jobs)
    if running:
        jobs = [j for j in jobs if j.state in ACTIVE_STATES]
    if idle:
        jobs = [j for j in jobs if j.state in PENDING_STATES]
    if not (full or as_json):
        jobs = shown(jobs, selectors, tasks)
    sys.stdout.write(
        render_jobs(
            jobs,
            now=time.time(),
            alt=alt,
            full=full,
            as_json=as_json,
            server=os.uname().nodename,
            nodes=nodes,
            comments=comments,
            one_line=one_line,
        )
    )
    for selector in missing:
        print(f"qstat: Unknown Job Id {selector}", file=sys.stderr)
    if missing:
        raise SystemExit(common.ERROR_EXIT)


def main() -> None:
    """The ``qstat`` entry point."""
    common.script(qstat_command, "qstat", context_settings=CONTEXT_SETTINGS)
