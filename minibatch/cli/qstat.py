"""``qstat``: show jobs, in Torque's layouts or as JSON.

    qstat [-a | -f | --json] [-u USER] [-x] [ID...]

By default only jobs that have not finished are shown; ``-x`` adds finished ones,
and naming jobs shows them whatever their state. An id the server does not know
is reported as ``qstat: Unknown Job Id ID`` and makes the exit status 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer

from minibatch.cli import common, render
from minibatch.core.job import Job
from minibatch.errors import ErrorCode, RemoteError

if TYPE_CHECKING:
    from minibatch.protocol.messages import QueryJobs

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


def render_jobs(
    jobs: Sequence[Job],
    *,
    now: float,
    alt: bool = False,
    full: bool = False,
    as_json: bool = False,
    server: str = "",
) -> str:
    """The output for ``jobs`` in the layout the options ask for."""
    if as_json:
        return json.dumps([render.job_record(j) for j in jobs], indent=2) + "\n"
    if full:
        return render.qstat_full(jobs, now)
    if alt:
        return render.qstat_alt(jobs, now, server)
    return render.qstat_default(jobs)


def qstat_command(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ID",
            help="Jobs to show: 7, 7[] (a whole array) or 7[2].",
            show_default=False,
        ),
    ] = None,
    alt: Annotated[
        bool,
        typer.Option("-a", help="Long layout: requested memory/time, elapsed time."),
    ] = False,
    full: Annotated[
        bool, typer.Option("-f", help="Every attribute of each job.")
    ] = False,
    user: Annotated[
        str | None, typer.Option("-u", help="Only jobs of USER (or U1,U2); implies -a.")
    ] = None,
    finished: Annotated[
        bool, typer.Option("-x", help="Include finished jobs.")
    ] = False,
    tasks: Annotated[
        bool,
        typer.Option(
            "-t",
            help="List array tasks one per line (always done; for Torque scripts).",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list of jobs.")
    ] = False,
) -> None:
    """Show the status of batch jobs."""
    with common.reporting("qstat"):
        selectors = [common.parse_selector(s) for s in job_ids or []]
        users = [u for u in (user or "").split(",") if u]
        from minibatch.protocol.messages import QueryJobs

        query = QueryJobs(
            selectors=selectors,
            # One user is filtered by the server; several are filtered here.
            user=users[0] if len(users) == 1 else None,
            finished=finished or bool(selectors),
        )
        jobs = fetch(query)
    if users:
        # The server ignores the user when ids are named, and takes only one.
        jobs = [j for j in jobs if j.user in users]
    jobs.sort(key=lambda j: j.id)
    sys.stdout.write(
        render_jobs(
            jobs,
            now=time.time(),
            # As in Torque, -u selects the long layout.
            alt=alt or bool(users),
            full=full,
            as_json=as_json,
            server=os.uname().nodename,
        )
    )
    missing = unmatched(selectors, jobs)
    for selector in missing:
        print(f"qstat: Unknown Job Id {selector}", file=sys.stderr)
    if missing:
        raise SystemExit(common.ERROR_EXIT)


def main() -> None:
    """The ``qstat`` entry point."""
    common.script(qstat_command, "qstat", context_settings=CONTEXT_SETTINGS)
