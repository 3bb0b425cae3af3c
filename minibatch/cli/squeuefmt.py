"""``squeue``'s layouts: its rows (an array's pending tasks on one line), its
``-o`` letters and ``-O`` names, and the table, from plain records.

A field with a width is cut to it and padded (``.`` pads on the left); one
without is printed as it is. ``-O`` fields are 20 wide unless given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from minibatch.cli import render
from minibatch.cli.slurmfmt import (
    STATE_CODES,
    clock,
    dependency,
    expected_end,
    index_ranges,
    iso,
    job_id,
    node_list,
    reason_code,
    state_code,
    state_name,
    used,
)
from minibatch.core.job import PENDING_STATES, Job, limit_of
from minibatch.errors import InvalidArgument

# ------------------------------------------------------------ squeue rows


@dataclass(frozen=True)
class Row:
    """One line of ``squeue``: a job, or an array's pending tasks together."""

    job: Job
    jobid: str
    task: str


def rows(jobs: Sequence[Job], one_per_task: bool) -> list[Row]:
    """A line per job, an array's pending tasks on one (``7_[2-4%2]``) unless
    ``one_per_task`` (``-r``), in squeue's order: partition, state, id."""
    pending: dict[int, list[Job]] = {}
    out: list[Row] = []
    for job in jobs:
        if (
            job.array_id is not None
            and not one_per_task
            and job.state in PENDING_STATES
        ):
            pending.setdefault(job.array_id, []).append(job)
            continue
        task = "N/A" if job.array_index is None else str(job.array_index)
        out.append(Row(job, job_id(job), task))
    for array_id, tasks in pending.items():
        if len(tasks) == 1:
            out.append(Row(tasks[0], job_id(tasks[0]), str(tasks[0].array_index)))
            continue
        indices = index_ranges([str(t.array_index) for t in tasks])
        limit = tasks[0].options.array_limit
        text = indices + (f"%{limit}" if limit else "")
        out.append(Row(tasks[0], f"{array_id}_[{text}]", text))
    rank = {name: i for i, name in enumerate(STATE_CODES)}
    out.sort(key=lambda r: (r.job.queue, rank.get(state_name(r.job), 99), r.job.id))
    return out


def _reason_or_nodes(row: Row, now: float) -> str:
    nodes = node_list(row.job)
    if nodes and row.job.state not in PENDING_STATES:
        return nodes
    return f"({reason_code(row.job)})"


_Getter = Callable[[Row, float], str]

#: squeue's ``-o`` letters: letter -> (header, value).
FIELDS: dict[str, tuple[str, _Getter]] = {
    "i": ("JOBID", lambda r, now: r.jobid),
    "A": ("JOBID", lambda r, now: str(r.job.id)),
    "F": ("ARRAY_JOB_ID", lambda r, now: str(r.job.array_id or r.job.id)),
    "K": ("ARRAY_TASK_ID", lambda r, now: r.task),
    "j": ("NAME", lambda r, now: r.job.name),
    "u": ("USER", lambda r, now: r.job.user),
    "U": ("UID", lambda r, now: str(r.job.uid)),
    "g": ("GROUP", lambda r, now: r.job.group),
    "a": ("ACCOUNT", lambda r, now: r.job.account or "(null)"),
    "q": ("QOS", lambda r, now: r.job.qos or "(null)"),
    "P": ("PARTITION", lambda r, now: r.job.queue or render.QUEUE),
    "t": ("ST", lambda r, now: state_code(r.job)),
    "T": ("STATE", lambda r, now: state_name(r.job)),
    "M": ("TIME", lambda r, now: clock(used(r.job, now))),
    "l": ("TIME_LIMIT", lambda r, now: clock(limit_of(r.job))),
    "L": (
        "TIME_LEFT",
        lambda r, now: clock(max(0.0, limit_of(r.job) - used(r.job, now))),
    ),
    "D": ("NODES", lambda r, now: str(len(r.job.alloc) or r.job.request.nodes)),
    "C": (
        "CPUS",
        lambda r, now: str(sum(len(a.cpus) for a in r.job.alloc) or r.job.request.cpus),
    ),
    "c": ("MIN_CPUS", lambda r, now: str(r.job.request.ppn)),
    "m": (
        "MIN_MEMORY",
        lambda r, now: render._slurm_mem(r.job.request.mem_kb) or "0",
    ),
    "f": ("FEATURES", lambda r, now: "&".join(r.job.options.features) or "(null)"),
    "N": ("NODELIST", lambda r, now: node_list(r.job)),
    "R": ("NODELIST(REASON)", _reason_or_nodes),
    "r": ("REASON", lambda r, now: reason_code(r.job)),
    "E": ("DEPENDENCY", lambda r, now: dependency(r.job)),
    "V": ("SUBMIT_TIME", lambda r, now: iso(r.job.submit_time)),
    "S": (
        "START_TIME",
        lambda r, now: iso(
            r.job.start_time if r.job.start_time is not None else r.job.predicted_start
        ),
    ),
    "e": ("END_TIME", lambda r, now: iso(expected_end(r.job))),
    "Z": ("WORK_DIR", lambda r, now: r.job.workdir),
}

#: ``-O`` names (any case) -> the ``-o`` letter they print.
LONG_FIELDS: dict[str, str] = {
    "jobarrayid": "i",
    "jobid": "A",
    "arrayjobid": "F",
    "arraytaskid": "K",
    "name": "j",
    "username": "u",
    "userid": "U",
    "groupname": "g",
    "account": "a",
    "qos": "q",
    "partition": "P",
    "statecompact": "t",
    "state": "T",
    "timeused": "M",
    "timelimit": "l",
    "timeleft": "L",
    "numnodes": "D",
    "numcpus": "C",
    "mincpus": "c",
    "minmemory": "m",
    "feature": "f",
    "nodelist": "N",
    "reasonlist": "R",
    "reason": "r",
    "dependency": "E",
    "submittime": "V",
    "starttime": "S",
    "endtime": "e",
    "workdir": "Z",
}

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"


@dataclass(frozen=True)
class Field:
    letter: str
    width: int | None
    right: bool
    suffix: str = ""


Item = str | Field
_SPEC = re.compile(r"%(\.)?(\d*)(.)|%$")


def parse_format(
    spec: str, fields: Mapping[str, object] | None = None, what: str = "job"
) -> list[Item]:
    """``-o``: ``%.18i %j`` -> literal text and fields (``.`` right-justifies,
    a number is the width; values longer than it are cut). ``fields``: the
    letters known (squeue's unless given; sinfo has its own)."""
    known = FIELDS if fields is None else fields
    items: list[Item] = []
    pos = 0
    for m in _SPEC.finditer(spec):
        if m.start() > pos:
            items.append(spec[pos : m.start()])
        pos = m.end()
        letter = m.group(3)
        if letter == "%":
            items.append("%")
            continue
        if letter is None or letter not in known:
            raise InvalidArgument(f"Invalid {what} format specification: {m.group(0)}")
        width = int(m.group(2)) if m.group(2) else None
        items.append(Field(letter, width, bool(m.group(1))))
    if pos < len(spec):
        items.append(spec[pos:])
    return items


_LONG_SPEC = re.compile(r"^([A-Za-z]+)(?::(\.)?(\d*)(.*))?$")


def parse_long_format(spec: str) -> list[Item]:
    """``-O``: ``JobID:.10,Name,State`` -> fields, 20 wide unless given."""
    items: list[Item] = []
    for part in spec.split(","):
        m = _LONG_SPEC.match(part.strip())
        letter = LONG_FIELDS.get(m.group(1).lower()) if m else None
        if m is None or letter is None:
            known = ", ".join(LONG_FIELDS)
            raise InvalidArgument(f"Invalid job format field: {part} (known: {known})")
        width = int(m.group(3)) if m.group(3) else 20
        items.append(Field(letter, width, bool(m.group(2)), m.group(4) or ""))
    return items


def _cell(text: str, field: Field) -> str:
    if field.width is None:
        return text + field.suffix
    cut = text[: field.width]
    padded = cut.rjust(field.width) if field.right else cut.ljust(field.width)
    return padded + field.suffix


def format_line(items: Sequence[Item], value: Callable[[Field], str]) -> str:
    return "".join(
        item if isinstance(item, str) else _cell(value(item), item) for item in items
    )


def render_rows(
    lines: Sequence[Row], items: Sequence[Item], now: float, header: bool = True
) -> str:
    """The table: a header of the fields' names, then a line per row."""
    out = [format_line(items, lambda f: FIELDS[f.letter][0])] if header else []
    out += [_row_line(items, row, now) for row in lines]
    return "".join(line + "\n" for line in out)


def _row_line(items: Sequence[Item], row: Row, now: float) -> str:
    return format_line(items, lambda f: FIELDS[f.letter][1](row, now))
