"""Slurm's everyday commands on minibatch's server requests: ``squeue`` and
``scancel`` here, ``sacct`` in :mod:`minibatch.cli.slurmacct`, ``scontrol`` in
:mod:`minibatch.cli.slurmctl`, and what they share (ids, filters, refusals).

    squeue [-u USERS | --me] [-j IDS] [-p PARTS] [-t STATES] [-n NAMES] [-r]
           [-h] [-l] [-o '%.18i %j ...' | -O 'JobID:.10,Name']
    scancel [-s SIGNAL] [-u USER | --me] [-n NAME] [-t STATE] [-p PART] [ID...]

Job ids are Slurm's: ``7``, ``7_2`` (an array task), ``7_[1-3]``; the id of an
array (its first task's) stands for all of its tasks, as in Slurm. Layouts and
messages are Slurm's (:mod:`minibatch.cli.slurmfmt`, :mod:`~.squeuefmt`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, qstat, render, slurmfmt, squeuefmt
from minibatch.core.job import ACTIVE_STATES, Job, JobState
from minibatch.errors import ErrorCode, InvalidArgument

if TYPE_CHECKING:
    import typer

    from minibatch.protocol.messages import JobList, Refusal
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}
HELP_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

# ------------------------------------------------------------------- shared


def reporting(prog: str) -> AbstractContextManager[None]:
    """:func:`common.reporting` with Slurm's ``prog: error: message``."""
    return common.reporting(f"{prog}: error")


def current_user() -> str:
    from minibatch.cli.submission import login_name

    return login_name()


def names(text: str | None) -> list[str]:
    """``a,b`` -> ``[a, b]``; None or "" -> []."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def user_names(text: str | None) -> list[str]:
    """Users by name or uid, as Slurm takes them."""
    import pwd

    out = []
    for name in names(text):
        try:
            out.append(pwd.getpwuid(int(name)).pw_name if name.isdigit() else name)
        except KeyError:
            out.append(name)
    return out


def fetch(
    prog: str,
    given: Mapping[str, str],
    code: int,
    users: Sequence[str],
    finished: bool,
    since: float | None,
) -> list[Job]:
    """The jobs named (``given``; none when naming them failed, ``code``), else
    those of the one user asked for (all of them for several: filtered after)."""
    from minibatch.protocol.messages import QueryJobs

    with reporting(prog):
        if given:
            return qstat.fetch(QueryJobs(selectors=list(given), finished=True))
        if code:
            return []
        query = QueryJobs(
            user=users[0] if len(users) == 1 else None, finished=finished, since=since
        )
        return list(common.call(query).jobs)


def resolve(
    prog: str, texts: Iterable[str]
) -> tuple[dict[str, str], dict[str, list[Job]], int]:
    """Slurm ids -> (server selector -> id as given, the jobs each selector
    named before, exit code so far). An array's id becomes the whole array
    (``7[]``); a malformed id is said on stderr and makes the code 2."""
    given: dict[str, str] = {}
    code = 0
    for text in texts:
        for part in slurmfmt.split_list(text):
            try:
                for selector in slurmfmt.parse_job_id(part):
                    given.setdefault(selector, part)
            except InvalidArgument as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                code = common.USAGE_EXIT
    if not given:
        return {}, {}, code
    from minibatch.protocol.messages import QueryJobs

    with reporting(prog):
        found = qstat.fetch(QueryJobs(selectors=list(given), finished=True))
    known = {s: [j for j in found if qstat.matches(s, j)] for s in given}
    out: dict[str, str] = {}
    for selector, text in given.items():
        jobs = known[selector]
        whole = "[" not in selector and any(j.array_id == j.id for j in jobs)
        out[f"{selector}[]" if whole else selector] = text
        known[f"{selector}[]"] = jobs
    return out, known, code


def why(refusal: Refusal, jobs: list[Job]) -> str:
    """A refusal in Slurm's words where Slurm has them."""
    if jobs and all(j.state is JobState.FINISHED for j in jobs):
        return "Job/step already completing or completed"
    not_pending = (
        refusal.code == ErrorCode.INVALID_ARGUMENT and "pending" in refusal.message
    )
    if not_pending and jobs and all(j.state in ACTIVE_STATES for j in jobs):
        return "Job is no longer pending execution"
    if refusal.code == ErrorCode.NOT_FOUND:
        return "Invalid job id specified"
    if refusal.code == ErrorCode.PERMISSION:
        return "Access/permission denied"
    return refusal.message


def report(
    reply: JobList,
    given: dict[str, str],
    known: dict[str, list[Job]],
    line: str,
    quiet: bool = False,
) -> int:
    """Print ``line`` (with ``{id}`` and ``{why}``) for each refused id; 1 if
    any was (``quiet``: ids unknown or ended are not errors, as scancel -Q)."""
    code = 0
    for refusal in reply.refused:
        text = why(refusal, known.get(refusal.selector, []))
        if quiet and text.startswith(("Invalid job id", "Job/step already")):
            continue
        shown = given.get(refusal.selector, refusal.selector)
        print(line.format(id=shown, why=text), file=sys.stderr)
        code = common.ERROR_EXIT
    return code


def keep(
    jobs: Iterable[Job],
    *,
    users: list[str],
    partitions: list[str],
    job_names: list[str],
    accounts: Sequence[str] = (),
    states: frozenset[str] | None = None,
) -> list[Job]:
    """The jobs that pass every filter given."""
    return [
        j
        for j in jobs
        if (not users or j.user in users)
        and (not partitions or (j.queue or render.QUEUE) in partitions)
        and (not job_names or j.name in job_names)
        and (not accounts or j.account in accounts)
        and (states is None or slurmfmt.state_name(j) in states)
    ]


# ------------------------------------------------------------------- squeue

#: How long Slurm keeps a finished job for squeue (MinJobAge's default).
MIN_JOB_AGE = 300.0


def squeue_command(
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "-j", "--jobs", help="Job ids (7, 7_2, comma lists).", show_default=False
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("-u", "--user", help="Users (comma list).")
    ] = None,
    me: Annotated[bool, typer.Option("--me", help="My jobs.")] = False,
    partition: Annotated[
        str | None, typer.Option("-p", "--partition", help="Partitions.")
    ] = None,
    states: Annotated[
        str | None, typer.Option("-t", "--states", help="States: PD,R,CD,... or all.")
    ] = None,
    name: Annotated[str | None, typer.Option("-n", "--name", help="Job names.")] = None,
    account: Annotated[
        str | None, typer.Option("-A", "--account", help="Accounts.")
    ] = None,
    noheader: Annotated[
        bool, typer.Option("-h", "--noheader", help="No header.")
    ] = False,
    long: Annotated[bool, typer.Option("-l", "--long", help="Long layout.")] = False,
    fmt: Annotated[
        str | None, typer.Option("-o", "--format", help="Fields: '%.18i %j %T ...'.")
    ] = None,
    fmt_long: Annotated[
        str | None, typer.Option("-O", "--Format", help="Fields: 'JobID:.10,Name'.")
    ] = None,
    array: Annotated[
        bool, typer.Option("-r", "--array", help="A line per array task.")
    ] = False,
    all_partitions: Annotated[
        bool, typer.Option("-a", "--all", help="Accepted.")
    ] = False,
) -> None:
    """Show jobs in the queue, as Slurm's squeue."""
    now = time.time()
    with reporting("squeue"):
        wanted = None if states is None else slurmfmt.parse_states(states)
        fmt_long = fmt_long or (None if fmt else os.environ.get("SQUEUE_FORMAT2"))
        fmt = fmt or os.environ.get("SQUEUE_FORMAT")
        if fmt_long:
            items = squeuefmt.parse_long_format(fmt_long)
        else:
            spec = fmt or (squeuefmt.LONG_FORMAT if long else squeuefmt.DEFAULT_FORMAT)
            items = squeuefmt.parse_format(spec)
        users = [current_user()] if me else user_names(user)
    given, _, code = resolve("squeue", jobs or [])
    old = wanted is not None and bool(wanted - slurmfmt.ACTIVE)
    found = fetch("squeue", given, code, users, old, now - MIN_JOB_AGE if old else None)
    if wanted is None and not given:
        wanted = slurmfmt.ACTIVE
    shown = keep(
        found,
        users=users,
        partitions=names(partition),
        job_names=names(name),
        accounts=names(account),
        states=wanted,
    )
    if given and not found:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        raise SystemExit(common.ERROR_EXIT)
    if long and not noheader:
        print(time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)))
    lines = squeuefmt.rows(shown, one_per_task=array)
    sys.stdout.write(squeuefmt.render_rows(lines, items, now, header=not noheader))
    if code:
        raise SystemExit(code)


# ------------------------------------------------------------------ scancel


def scancel_command(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="ID", help="7, 7_2 or 7_[1-3].", show_default=False),
    ] = None,
    signal: Annotated[
        str | None, typer.Option("-s", "--signal", help="Send this signal instead.")
    ] = None,
    user: Annotated[
        str | None, typer.Option("-u", "--user", help="USER's jobs.")
    ] = None,
    me: Annotated[bool, typer.Option("--me", help="My jobs.")] = False,
    name: Annotated[
        str | None, typer.Option("-n", "--name", "--jobname", help="Jobs named NAME.")
    ] = None,
    state: Annotated[
        str | None, typer.Option("-t", "--state", help="Jobs in STATE (PD, R).")
    ] = None,
    partition: Annotated[
        str | None, typer.Option("-p", "--partition", help="In PART.")
    ] = None,
    account: Annotated[
        str | None, typer.Option("-A", "--account", help="Of ACCOUNT.")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("-Q", "--quiet", help="Ids unknown or ended are no error.")
    ] = False,
    batch: Annotated[bool, typer.Option("-b", "--batch", help="Accepted.")] = False,
    full: Annotated[bool, typer.Option("-f", "--full", help="Accepted.")] = False,
) -> None:
    """Cancel jobs, or send them a signal, as Slurm's scancel."""
    prog = "scancel"
    from minibatch.malleable import signal_named
    from minibatch.protocol.messages import JobControl, QueryJobs, SignalJob

    with reporting(prog):
        wanted = None if state is None else slurmfmt.parse_states(state)
        sig = None
        if signal is not None:
            try:
                sig = signal_named(signal)
            except ValueError:
                sig = None
            if sig is None:
                raise InvalidArgument(f"Unknown job signal: {signal}")
    users = [current_user()] if me else user_names(user)
    filtered = bool(users or name or partition or account or wanted)
    if not job_ids and not filtered:
        common.fail(prog, "error: No job identification provided", common.USAGE_EXIT)
    given, known, code = resolve(prog, job_ids or [])
    if filtered:
        if not users and not job_ids and os.getuid() != 0:
            users = [current_user()]  # a filter alone means my jobs
        with reporting(prog):
            if job_ids:  # only those, and none if none was well formed
                pool = qstat.fetch(QueryJobs(selectors=list(given))) if given else []
            else:
                one = users[0] if len(users) == 1 else None
                pool = list(common.call(QueryJobs(user=one)).jobs)
        picked = keep(
            (j for j in pool if j.state is not JobState.FINISHED),
            users=users,
            partitions=names(partition),
            job_names=names(name),
            accounts=names(account),
            states=wanted,
        )
        given = {str(j.id): slurmfmt.job_id(j) for j in picked}
        known = {str(j.id): [j] for j in picked}
    if given:
        selectors = list(given)
        request = (
            JobControl(action="cancel", selectors=selectors, each=True)
            if sig is None
            else SignalJob(selectors=selectors, signal=sig.name)
        )
        with reporting(prog):
            reply = common.call(request)
        line = prog + ": error: Kill job error on job id {id}: {why}"
        failed = report(reply, given, known, line, quiet)
        code = code or failed
    if code:
        raise SystemExit(code)


# ------------------------------------------------------------- entry points


def squeue_main() -> None:
    common.script(squeue_command, "squeue", context_settings=CONTEXT_SETTINGS)


def scancel_main() -> None:
    common.script(scancel_command, "scancel", context_settings=HELP_SETTINGS)
