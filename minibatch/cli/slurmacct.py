"""``sacct``: Slurm's accounting command on ``mb acct``'s code (its fields,
format parser and JSON), with sacct's options, defaults and layouts.

    sacct [-j IDS] [-u USERS | -a] [-S TIME] [-E TIME] [-s STATES] [--name N]
          [-r PARTS] [-o FIELDS | -b | -l] [-n] [-P | -p [--delimiter C]] [-X]
          [--json]

As sacct: without ``-j``, the caller's jobs (everyone's for root or with
``-a``) since midnight, running and pending ones too; columns
``JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode`` (or
``$SACCT_FORMAT``), right-aligned and cut with ``+``; ``-P`` separates fields
with ``|`` and pads nothing. Array tasks are ``7_2``. There are no job steps,
so ``-X`` changes nothing.
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated

from minibatch.cli import acct, common, render, slurmfmt
from minibatch.cli.optvalues import parse_slurm_begin, relative_time
from minibatch.cli.slurmcmds import (
    HELP_SETTINGS,
    current_user,
    fetch,
    keep,
    names,
    reporting,
    resolve,
    user_names,
)
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer


def _account_fields() -> acct.Fields:
    # Slurm writes array tasks as 7_2, where mb acct writes PBS's 7[2].
    fields = dict(render.ACCT_FIELDS)
    fields["JobID"] = (12, lambda j, now: slurmfmt.job_id(j))
    return fields


SACCT_FIELDS = _account_fields()
SACCT_DEFAULT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
SACCT_BRIEF = "JobID,State,ExitCode"
SACCT_LONG = (
    "JobID,JobIDRaw,JobName,Partition,User,Group,Account,QOS,AllocCPUS,ReqCPUS,"
    "NNodes,NodeList,State,ExitCode,Submit,Start,End,Elapsed,Timelimit,TotalCPU,"
    "CPUTime,MaxRSS,ReqMem"
)
_CLOCK = re.compile(r"^\d{1,2}:\d{2}(:\d{2})?$")


#: A date without its year: MM/DD, MM.DD or MMDD.
_YEARLESS = re.compile(r"^\d{1,2}[/.]\d{1,2}$|^\d{4}$")


def parse_time(text: str, now: float) -> float:
    """sacct's times: ``now[-N[unit]]``, ``HH:MM[:SS]``, what ``mb acct -S``
    takes (``YYYY-MM-DD[THH:MM[:SS]]``, ``1h``, ``2d``) and what sbatch
    ``--begin`` takes (today, midnight, ``MM/DD``...), in the past as sacct
    reads them (Slurm's ``parse_time(..., past=1)``): a clock time or a word
    still ahead today means yesterday's, a date ahead this year last year's."""
    value = text.strip().lower()
    relative = relative_time(value, now)
    if relative is not None:
        return relative
    if _CLOCK.match(value):
        today = datetime.fromtimestamp(now).strftime("%Y-%m-%d")
        t = acct.parse_since(f"{today}T{value}", now)
    else:
        try:
            return acct.parse_since(text, now)
        except InvalidArgument:
            try:
                t = parse_slurm_begin(text, now)
            except InvalidArgument:
                raise InvalidArgument(
                    f"malformed time {text!r} (expected e.g. YYYY-MM-DD[THH:MM"
                    "[:SS]], HH:MM, MM/DD, today, now-2hours)"
                ) from None
    if t <= now:
        return t
    when = datetime.fromtimestamp(t)
    if _YEARLESS.match(value):
        return when.replace(year=when.year - 1).timestamp()
    return (when - timedelta(days=1)).timestamp()


def midnight(now: float) -> float:
    day = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp()


def sacct_command(
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "-j", "--jobs", help="Job ids (7, 7_2, comma lists).", show_default=False
        ),
    ] = None,
    user: Annotated[str | None, typer.Option("-u", "--user", help="Users.")] = None,
    all_users: Annotated[
        bool, typer.Option("-a", "--allusers", help="Every user.")
    ] = False,
    start: Annotated[
        str | None, typer.Option("-S", "--starttime", help="Since (default: midnight).")
    ] = None,
    end: Annotated[str | None, typer.Option("-E", "--endtime", help="Until.")] = None,
    state: Annotated[str | None, typer.Option("-s", "--state", help="States.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Job names.")] = None,
    partition: Annotated[
        str | None, typer.Option("-r", "--partition", help="Partitions.")
    ] = None,
    fields: Annotated[
        str | None, typer.Option("-o", "--format", help=f"Columns ({SACCT_DEFAULT}).")
    ] = None,
    brief: Annotated[bool, typer.Option("-b", "--brief", help=SACCT_BRIEF)] = False,
    long: Annotated[bool, typer.Option("-l", "--long", help="Many columns.")] = False,
    allocations: Annotated[
        bool, typer.Option("-X", "--allocations", help="Accepted (no steps here).")
    ] = False,
    noheader: Annotated[
        bool, typer.Option("-n", "--noheader", help="No header.")
    ] = False,
    parsable: Annotated[
        bool, typer.Option("-p", "--parsable", help="'|' after every field.")
    ] = False,
    parsable2: Annotated[
        bool, typer.Option("-P", "--parsable2", help="'|' between fields.")
    ] = False,
    delimiter: Annotated[str, typer.Option("--delimiter", help="For -p/-P.")] = "|",
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list of jobs.")
    ] = False,
) -> None:
    """Accounting data of jobs, as Slurm's sacct (mb acct's fields)."""
    now = time.time()
    with reporting("sacct"):
        spec = fields or (SACCT_BRIEF if brief else SACCT_LONG if long else None)
        spec = spec or os.environ.get("SACCT_FORMAT") or SACCT_DEFAULT
        columns = acct.parse_acct_format(spec, SACCT_FIELDS)
        wanted = None if state is None else slurmfmt.parse_states(state)
        # As sacct: since midnight, unless jobs are named (then whenever).
        since = parse_time(start, now) if start else None
        if since is None and not jobs:
            since = midnight(now)
        until = parse_time(end, now) if end else None
        users = user_names(user)
        if not users and not all_users and not jobs and os.getuid() != 0:
            users = [current_user()]
    given, _, code = resolve("sacct", jobs or [])
    if code and not given:
        raise SystemExit(code)  # as sacct: a bad job id is fatal, no table
    found = fetch("sacct", given, code, users, True, since)
    found = keep(
        found,
        users=users,
        partitions=names(partition),
        job_names=names(name),
        states=wanted,
    )
    found = sorted(
        (j for j in found if until is None or j.submit_time <= until),
        key=lambda j: j.id,
    )
    if as_json:
        sys.stdout.write(
            acct.json_text(found, columns if fields else None, now, SACCT_FIELDS)
        )
    elif parsable or parsable2:
        end_mark = delimiter if parsable else ""
        rows = [] if noheader else [[n for n, _ in columns]]
        rows += [[SACCT_FIELDS[n][1](j, now) for n, _ in columns] for j in found]
        sys.stdout.write("".join(delimiter.join(r) + end_mark + "\n" for r in rows))
    else:
        table = render.acct_table(found, columns, now, SACCT_FIELDS)
        sys.stdout.write(
            "".join(table.splitlines(keepends=True)[2 if noheader else 0 :])
        )
    if code:
        raise SystemExit(code)


def main() -> None:
    common.script(sacct_command, "sacct", context_settings=HELP_SETTINGS)
