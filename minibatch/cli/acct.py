"""``mb acct``: accounting for finished jobs, in the manner of Slurm's ``sacct``.

    mb acct [-j ID[,ID]] [-u USER] [-S SINCE] [-o FIELD[%W],...] [--json]

With ``--json``, each job is its whole record, or only the ``-o`` fields when
they are given (as the table spells them: ``{"JobID": "3", "State": ...}``).

States are spelled as Slurm spells them (COMPLETED, FAILED, CANCELLED, TIMEOUT,
OUT_OF_MEMORY, NODE_FAIL) and the exit code is ``code:signal``. Naming jobs with
``-j`` shows them whatever their state.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, render
from minibatch.core.job import Job
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_SCALE = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_ABSOLUTE_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


#: Field name -> (default width, value): :data:`render.ACCT_FIELDS` or more.
Fields = dict[str, tuple[int, Callable[[Job, float], str]]]


def parse_acct_format(
    spec: str, fields: Fields = render.ACCT_FIELDS
) -> list[tuple[str, int]]:
    """``JobID,JobName%30,state`` -> ``[(field, width), ...]`` (names any case)."""
    names = {name.lower(): name for name in fields}
    columns = []
    for item in spec.split(","):
        raw, _, width_text = item.strip().partition("%")
        name = names.get(raw.lower())
        if name is None:
            known = ", ".join(fields)
            raise InvalidArgument(f"unknown format field {raw!r} (known: {known})")
        width = fields[name][0]
        if width_text:
            if not width_text.isdigit() or int(width_text) < 1:
                raise InvalidArgument(f"malformed field width in {item!r}")
            width = int(width_text)
        columns.append((name, width))
    return columns


def acct_record(
    job: Job,
    columns: list[tuple[str, int]],
    now: float,
    fields: Fields = render.ACCT_FIELDS,
) -> dict[str, str]:
    """``--format`` with ``--json``: only those fields, as the table shows
    them (uncut: widths are for the table)."""
    return {name: fields[name][1](job, now) for name, _ in columns}


def json_text(
    jobs: Sequence[Job],
    columns: list[tuple[str, int]] | None,
    now: float,
    fields: Fields = render.ACCT_FIELDS,
) -> str:
    """``--json``: each job's whole record, or only ``columns`` when given."""
    records = (
        [render.job_record(j) for j in jobs]
        if columns is None
        else [acct_record(j, columns, now, fields) for j in jobs]
    )
    return common.dump_json(records)


def parse_since(text: str, now: float) -> float:
    """``YYYY-MM-DD[THH:MM[:SS]]`` (local time) or ``30m``/``1h``/``2d``/``1w`` ago."""
    value = text.strip()
    m = _RELATIVE.match(value)
    if m is not None:
        return now - int(m.group(1)) * _SCALE[m.group(2)]
    for fmt in _ABSOLUTE_FORMATS:
        try:
            return datetime.strptime(value.replace(" ", "T"), fmt).timestamp()
        except ValueError:
            continue
    raise InvalidArgument(
        f"malformed time {text!r} (expected YYYY-MM-DD[THH:MM[:SS]] or e.g. 1h, 2d)"
    )


def acct_command(
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "-j",
            "--jobs",
            help="Job ids, comma-separated or repeated.",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("-u", "--user", help="Only jobs of USER.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "-S", "--since", help="Jobs since YYYY-MM-DD[THH:MM[:SS]] or e.g. 1h."
        ),
    ] = None,
    fields: Annotated[
        str | None,
        typer.Option(
            "-o",
            "--format",
            help=f"Columns, e.g. JobID,JobName%30 (default {render.ACCT_DEFAULT}).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list of jobs.")
    ] = False,
    as_swf: Annotated[
        bool,
        typer.Option("--swf", help="The jobs as a Standard Workload Format trace."),
    ] = False,
    swf_decimals: Annotated[
        int,
        typer.Option(
            "--swf-decimals",
            min=0,
            max=6,
            help="Keep sub-second times in --swf (minibatch's readers take them; "
            "jobs shorter than 0.5 s otherwise get run time 0).",
        ),
    ] = 0,
) -> None:
    """Show accounting data for finished jobs (like sacct)."""
    with common.reporting("mb acct"):
        now = time.time()
        selectors = [
            common.parse_selector(part)
            for item in jobs or []
            for part in item.split(",")
            if part.strip()
        ]
        columns = parse_acct_format(fields or render.ACCT_DEFAULT)
        from minibatch.protocol.messages import QueryJobs

        query = QueryJobs(
            selectors=selectors,
            user=user,
            finished=True,
            active=bool(selectors),
            since=None if since is None else parse_since(since, now),
        )
        found = sorted(common.call(query).jobs, key=lambda j: j.id)
    if as_swf:
        from minibatch.protocol.messages import NodeList, QueryNodes
        from minibatch.sim.swf import export_swf

        with common.reporting("mb acct"):
            nodes: NodeList = common.call(QueryNodes())
        # The machine the jobs ran on: a node left down by an earlier layout
        # would add CPUs nothing could use to the replay of this run.
        used = {a.node for j in found for a in j.alloc}
        layout = [
            (n.name, len(n.cpus))
            for n in nodes.nodes
            if n.state not in ("down", "unknown") or n.name in used
        ]
        sys.stdout.write(export_swf(found, nodes=layout, decimals=swf_decimals))
    elif as_json:
        sys.stdout.write(json_text(found, None if fields is None else columns, now))
    else:
        sys.stdout.write(render.acct_table(found, columns, now))


def main() -> None:
    """Run ``acct`` on its own (``mb acct`` is the usual way)."""
    common.script(acct_command, "acct", context_settings=CONTEXT_SETTINGS)
