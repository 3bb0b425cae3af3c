"""What Slurm's commands say about jobs, built from plain records: state codes,
reason codes, times, host lists and job ids.

Pure functions of :class:`Job` records and the current time, tested from
hand-built records. ``squeue``'s layouts are in :mod:`minibatch.cli.squeuefmt`,
``scontrol``'s in :mod:`minibatch.cli.slurmshow`, the commands in
:mod:`minibatch.cli.slurmcmds` and :mod:`minibatch.cli.slurmctl`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from minibatch.cli import render
from minibatch.core.job import Job, JobState, limit_of
from minibatch.errors import InvalidArgument

# ------------------------------------------------------------------ states

#: Slurm's job states, long name -> compact code (``squeue -t`` takes either).
STATE_CODES: dict[str, str] = {
    "PENDING": "PD",
    "RUNNING": "R",
    "SUSPENDED": "S",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "CANCELLED": "CA",
    "FAILED": "F",
    "TIMEOUT": "TO",
    "NODE_FAIL": "NF",
    "OUT_OF_MEMORY": "OOM",
    "PREEMPTED": "PR",
    "BOOT_FAIL": "BF",
    "DEADLINE": "DL",
    "CONFIGURING": "CF",
    "REQUEUED": "RQ",
    "RESIZING": "RS",
    "SIGNALING": "SI",
    "STOPPED": "ST",
}
_BY_CODE = {code: name for name, code in STATE_CODES.items()}
#: What ``squeue`` shows when no ``-t`` is given.
ACTIVE = frozenset({"PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})


def state_name(job: Job) -> str:
    """PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT, ..."""
    return render.slurm_state(job)


def state_code(job: Job) -> str:
    """PD, R, CG, CD, CA, F, TO, OOM, NF."""
    return STATE_CODES.get(state_name(job), "?")


def parse_states(text: str) -> frozenset[str]:
    """``PD,running`` -> ``{"PENDING", "RUNNING"}``; ``all`` is every state."""
    out: set[str] = set()
    for item in text.replace(" ", ",").split(","):
        word = item.strip().upper()
        if not word:
            continue
        if word == "ALL":
            return frozenset(STATE_CODES)
        name = word if word in STATE_CODES else _BY_CODE.get(word)
        if name is None:
            raise InvalidArgument(f"Invalid job state specified: {item.strip()}")
        out.add(name)
    return frozenset(out)


# ----------------------------------------------------------------- reasons

#: How our reason texts begin -> Slurm's reason code, first match wins.
_REASON_PREFIXES = (
    ("waiting for the scheduler", "None"),
    ("waiting for", "Resources"),
    ("queued behind", "Priority"),
    ("would ", "Priority"),
    ("not backfilled", "Priority"),
    ("blocked by QOS", "QOSMaxJobsPerUserLimit"),
    ("blocked: fairshare cap", "AssocGrpCPUMinutesLimit"),
    ("array limit", "JobArrayTaskLimit"),
)
#: How a finished job ended -> the reason Slurm gives it.
_END_REASONS = {
    "FAILED": "NonZeroExitCode",
    "TIMEOUT": "TimeLimit",
    "OUT_OF_MEMORY": "OutOfMemory",
    "NODE_FAIL": "NodeDown",
}


def reason_code(job: Job) -> str:
    """Slurm's one-word reason: JobHeldUser, Dependency, BeginTime, Resources,
    Priority, PartitionDown, Reservation, QOS and fairshare limits, else None."""
    if job.state is JobState.HELD:
        return "JobHeldUser"
    if job.state is JobState.WAITING:
        return "BeginTime" if job.reason.startswith("not before") else "Dependency"
    if job.state is JobState.QUEUED:
        text = job.reason
        if text.startswith("queue ") and "stopped" in text:
            return "PartitionDown"
        if re.search(r"reservation ['\"]", text):
            return "Reservation"  # waiting in one, or one it may not use
        for prefix, code in _REASON_PREFIXES:
            if text.startswith(prefix):
                return code
        return "None"
    return _END_REASONS.get(state_name(job), "None")


# ------------------------------------------------------------------- times


def clock(seconds: float | None) -> str:
    """squeue's durations: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    s = max(0, int(seconds or 0))
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def iso(t: float | None, missing: str = "N/A") -> str:
    """``2026-11-24T21:06:58`` (local time), as Slurm prints times."""
    if t is None:
        return missing
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def used(job: Job, now: float) -> float:
    """Seconds the job has run (0 while pending)."""
    return render.elapsed(job, now) or 0.0


def expected_end(job: Job) -> float | None:
    """When it ended, or will at the latest (start + limit), or None."""
    if job.end_time is not None:
        return job.end_time
    start = job.start_time if job.start_time is not None else job.predicted_start
    return None if start is None else start + limit_of(job)


# --------------------------------------------------------------- host lists

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def split_list(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise InvalidArgument(f"Invalid hostlist: {text}")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise InvalidArgument(f"Invalid hostlist: {text}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(name: str, whole: str) -> list[str]:
    open_at = name.find("[")
    if open_at < 0:
        return [name]
    close_at = name.find("]", open_at)
    head, body, tail = (
        name[:open_at],
        name[open_at + 1 : close_at],
        name[close_at + 1 :],
    )
    numbers: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise InvalidArgument(f"Invalid hostlist: {whole}")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise InvalidArgument(f"Invalid hostlist: {whole}")
        width = len(lo_text) if lo_text.startswith("0") else 0
        numbers += [str(i).zfill(width) for i in range(lo, hi + 1)]
    rest = _expand_one(tail, whole)
    return [f"{head}{n}{r}" for n in numbers for r in rest]


def expand_hostlist(text: str) -> list[str]:
    """``node[0-2,7],gpu1`` -> ``[node0, node1, node2, node7, gpu1]``; padding
    is kept (``n[01-02]``) and several brackets multiply (``r[1-2]n[1-2]``)."""
    out: list[str] = []
    for part in split_list(text.strip()):
        out += _expand_one(part, text)
    return out


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _padded(number: str) -> bool:
    return len(number) > 1 and number.startswith("0")


def index_ranges(numbers: list[str]) -> str:
    """``["1", "2", "3", "9", "10"]`` -> ``1-3,9-10``. Zero-padded numbers keep
    their width (``08-09``, not ``08-9``), as Slurm's host lists do; others
    run on across a digit (``9-10``)."""
    values = sorted({(int(n), n) for n in numbers})
    runs: list[list[tuple[int, str]]] = []
    for value in values:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and value[0] == last[0] + 1
            and (
                len(value[1]) == len(last[1])
                or not (_padded(value[1]) or _padded(last[1]))
            )
        ):
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(r[0][1] if len(r) == 1 else f"{r[0][1]}-{r[-1][1]}" for r in runs)


def compress_hostlist(names: Iterable[str]) -> str:
    """``[node0, node1, node3, gpu1]`` -> ``node[0-1,3],gpu1`` (Slurm's form)."""
    groups: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        m = _NUMBERED.match(name)
        prefix, number = (m.group(1), m.group(2)) if m else (name, "")
        groups.setdefault(prefix, [])
        if number:
            groups[prefix].append(number)
    parts = []
    for prefix, numbers in groups.items():
        if not numbers:
            parts.append(prefix)
        elif len(set(numbers)) == 1:
            parts.append(prefix + numbers[0])
        else:
            parts.append(f"{prefix}[{index_ranges(numbers)}]")
    return ",".join(parts)


def node_list(job: Job) -> str:
    return compress_hostlist(a.node for a in job.alloc)


# ------------------------------------------------------------------ job ids

_JOB_ID = re.compile(r"^(\d+)(?:_(\d+|\[[\d,\-]+(?:%\d+)?\]))?(?:\.[\w.+-]+)?$")


def parse_job_id(text: str) -> list[str]:
    """A Slurm job id -> the server's selectors: ``7`` -> ``7``, ``7_2`` ->
    ``7[2]``, ``7_[1-3]`` -> one per task; a step (``7.batch``) is its job."""
    m = _JOB_ID.match(text.strip())
    if m is None:
        raise InvalidArgument(f"Invalid job id {text}")
    base, task = m.group(1), m.group(2)
    if task is None:
        return [base]
    if not task.startswith("["):
        return [f"{base}[{task}]"]
    indices = expand_hostlist("x" + task.split("%")[0].rstrip("]") + "]")
    return [f"{base}[{int(i[1:])}]" for i in indices]


def job_id(job: Job) -> str:
    """``7`` or ``7_2`` (an array task), as Slurm prints ids."""
    if job.array_id is None:
        return str(job.id)
    return f"{job.array_id}_{job.array_index}"


def dependency(job: Job) -> str:
    """``afterok:7(unfulfilled),afterany:8(unfulfilled)`` while it waits on them."""
    if job.state is not JobState.WAITING or not job.depends:
        return "(null)"
    return ",".join(f"{d.kind.value}:{d.job}(unfulfilled)" for d in job.depends)
