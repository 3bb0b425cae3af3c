"""Every table, block and letter the commands print, built from plain records.

Functions here take :class:`Job` / :class:`NodeInfo` records and the current time and
return text (or JSON-ready dicts), so the layouts are tested from hand-built
records. Layouts follow Torque's ``qstat``/``pbsnodes`` and Slurm's ``sacct``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import msgspec

from minibatch.cli.attrs import option_attrs
from minibatch.core.job import (
    ACTIVE_STATES,
    DEPENDENCY_REASON,
    Job,
    JobState,
    allocated_cpu_seconds,
    eligible_time,
    limit_of,
    state_letter,
)
from minibatch.core.units import format_cpu_list, format_duration, format_size_kb
from minibatch.protocol.messages import AltRow, Row

QUEUE = "batch"


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width``; a cut is marked with ``*`` as OpenPBS does."""
    return text if len(text) <= width else text[: width - 1] + "*"


def _table(
    headers: Sequence[Sequence[str]],
    rows: Sequence[Sequence[str]],
    widths: Sequence[int],
    right: AbstractSet[int] = frozenset(),
) -> str:
    # One format for the whole line, not a call per cell: a listing of 1,000
    # jobs has 10,000 cells. A line comes out longer than the columns only
    # when a value is too wide, and only then are the values cut.
    line = " ".join(
        f"{{:{'>' if i in right else '<'}{w}}}" for i, w in enumerate(widths)
    )
    width = sum(widths) + len(widths) - 1

    def row(values: Sequence[str]) -> str:
        if len(values) != len(widths):
            raise ValueError(f"{len(values)} values for {len(widths)} columns")
        text = line.format(*values)
        if len(text) != width:
            text = line.format(*map(fit, values, widths))
        return text.rstrip()

    lines = [row(h) for h in headers]
    lines.append(" ".join("-" * w for w in widths))
    lines += [row(r) for r in rows]
    return "\n".join(lines) + "\n"


def letter(job: Job) -> str:
    if on_dependency(job):
        return "H"  # as Torque: a system hold
    return state_letter(job.state, job.result)


def on_dependency(job: Job) -> bool:
    """Whether ``job`` waits on a dependency (a system hold, to Torque)."""
    return job.state is JobState.WAITING and job.reason.startswith(DEPENDENCY_REASON)


def elapsed(job: Job, now: float) -> float | None:
    """Seconds the job has run (so far), or None if it never started."""
    if job.start_time is None:
        return None
    return (job.end_time if job.end_time is not None else now) - job.start_time


def _hold_types(job: Job) -> str:
    if job.state is JobState.HELD:
        return "u"
    return "s" if on_dependency(job) else "n"


def exec_host(job: Job) -> str:
    """Torque's ``node/cpu+node/cpu``, with real CPU ids."""
    return "+".join(f"{a.node}/{cpu}" for a in job.alloc for cpu in a.cpus)


def exec_cpus(job: Job) -> str:
    return "+".join(f"{a.node}:{format_cpu_list(a.cpus)}" for a in job.alloc)


def cpu_used(job: Job) -> float | None:
    """CPU seconds so far: the node's last sample while it runs, the measured
    total once it has ended."""
    if job.state in ACTIVE_STATES and job.used_cputime_s is not None:
        return max(job.used_cputime_s, job.cputime_s or 0.0)
    return job.cputime_s


def mem_used_kb(job: Job) -> int | None:
    """Resident memory: now while it runs, its peak once it has ended."""
    if job.state in ACTIVE_STATES and job.used_rss_kb is not None:
        return job.used_rss_kb
    return job.maxrss_kb


def _cput(job: Job) -> str:
    # Torque shows 0 for a job that has not run.
    if job.start_time is None and job.cputime_s is None:
        return "0"
    return format_duration(cpu_used(job) or 0)


def _ctime(t: float | None) -> str | None:
    return None if t is None else time.ctime(t)


def malleable_range(job: Job) -> str | None:
    """``2-8`` for a malleable job, None for a rigid one."""
    m = job.request.malleable
    return None if m is None else f"{m[0]}-{m[1]}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def resize_history(job: Job) -> list[str]:
    """One line per resize: ``HH:MM:SS 4->2 CPUs 0-3 -> 0-1 (cause)``."""
    return [
        f"{_clock(r.time)} {len(r.before)}->{len(r.after)} CPUs "
        f"{format_cpu_list(r.before)} -> {format_cpu_list(r.after)}"
        + (f" ({r.cause})" if r.cause else "")
        for r in job.resizes
    ]


# ------------------------------------------------------------------ qstat


def qstat_default(jobs: Sequence[Job]) -> str:
    """``qstat``: ``Job ID  Name  User  Time Use S Queue``; empty for no jobs."""
    return qstat_default_table([qstat_default_row(j) for j in jobs])


def qstat_default_row(j: Job) -> Row:
    """One line of ``qstat``; the server sends these for a bare ``qstat``."""
    return (j.display_id, j.name, j.user, _cput(j), letter(j), j.queue or QUEUE)


def qstat_default_table(rows: Sequence[Sequence[str]]) -> str:
    """``qstat``'s table of :func:`qstat_default_row` rows; empty for none."""
    if not rows:
        return ""
    headers = [("Job ID", "Name", "User", "Time Use", "S", "Queue")]
    return _table(headers, rows, (25, 16, 15, 8, 1, 5), right={3})


def qstat_alt(jobs: Sequence[Job], now: float, server: str = "") -> str:
    """``qstat -a``: requested memory and time, nodes/tasks and elapsed time."""
    return qstat_alt_table([qstat_alt_row(j) for j in jobs], now, server)


def qstat_alt_row(j: Job) -> AltRow:
    """One line of ``qstat -a`` but its elapsed time: the cells, then the
    start and end it is computed from when printed. The server sends these for
    a plain ``qstat -a`` (or ``-u USER``)."""
    req = j.request
    session = "--" if j.session_id is None else str(j.session_id)
    return (
        j.display_id,
        j.user,
        j.queue or QUEUE,
        j.name,
        session,
        str(req.nodes),
        str(req.cpus),
        format_size_kb(req.mem_kb),
        format_duration(req.walltime),
        letter(j),
        j.start_time,
        j.end_time,
    )


def qstat_alt_table(rows: Sequence[AltRow], now: float, server: str = "") -> str:
    """``qstat -a``'s table of :func:`qstat_alt_row` rows; empty for none."""
    if not rows:
        return ""
    headers = [
        ("", "", "", "", "", "", "", "Req'd", "Req'd", "", "Elap"),
        ("Job ID", "Username", "Queue", "Jobname", "SessID", "NDS", "TSK")
        + ("Memory", "Time", "S", "Time"),
    ]
    lines = []
    for *cells, start, end in rows:
        ran = None if start is None else (now if end is None else end) - start
        lines.append([*cells, "--" if ran is None else format_duration(ran)])
    widths = (23, 11, 8, 16, 6, 5, 6, 9, 9, 1, 9)
    table = _table(headers, lines, widths, right={4, 5, 6, 7, 8, 10})
    return f"\n{server}:\n{table}" if server else table


def _full_attrs(job: Job, now: float) -> list[tuple[str, str | None]]:
    req = job.request
    host = job.env.get("PBS_O_HOST")
    ran = elapsed(job, now)
    started = job.start_time is not None
    mem = mem_used_kb(job)
    # As Torque: the PBS_O_ variables and those qsub -v / -V passed. The server
    # sends another user's job with PBS_O_HOST alone (docs/operations.md).
    origin = ",".join(f"{k}={v}" for k, v in job.env.items())
    return [
        ("Job_Name", job.name),
        ("Job_Owner", f"{job.user}@{host}" if host else job.user),
        (
            "resources_used.cput",
            format_duration(cpu_used(job) or 0) if started else None,
        ),
        ("resources_used.mem", format_size_kb(mem) if mem else None),
        ("resources_used.walltime", None if ran is None else format_duration(ran)),
        ("job_state", letter(job)),
        ("queue", job.queue or QUEUE),
        ("ctime", _ctime(job.submit_time)),
        ("Error_Path", job.stderr_path or None),
        ("exec_host", exec_host(job) or None),
        ("exec_cpus", exec_cpus(job) or None),
        ("Hold_Types", _hold_types(job)),
        ("Join_Path", "oe" if job.join else "n"),
        ("Output_Path", job.stdout_path or None),
        ("qtime", _ctime(job.submit_time)),
        ("eligible_time", format_duration(eligible_time(job, now))),
        ("Resource_List.mem", format_size_kb(req.mem_kb) if req.mem_kb else None),
        ("Resource_List.ncpus", str(req.cpus)),
        ("Resource_List.nodect", str(req.nodes)),
        ("Resource_List.nodes", f"{req.nodes}:ppn={req.ppn}"),
        ("Resource_List.walltime", format_duration(req.walltime)),
        ("Resource_List.malleable", malleable_range(job)),
        (
            "resources_used.ncpus",
            str(_alloc_cpus(job)) if req.malleable and job.alloc else None,
        ),
        (
            "walltime_limit",
            format_duration(limit_of(job)) if job.time_limit else None,
        ),
        ("resize_history", "; ".join(resize_history(job)) or None),
        (
            "resize_pending",
            "; ".join(
                f"{len(r.before)}->{len(r.after)} CPUs since {_clock(r.time)}"
                for r in job.resizing
            )
            or None,
        ),
        ("Variable_List", origin or None),
        ("euser", job.user),
        ("egroup", job.group or None),
        ("depend", _depend(job) or None),
        ("job_array_id", None if job.array_index is None else str(job.array_index)),
        ("init_work_dir", job.workdir),
        ("submit_args", job.submit_args or None),
        ("session_id", None if job.session_id is None else str(job.session_id)),
        ("start_time", _ctime(job.start_time)),
        ("comp_time", _ctime(job.end_time)),
        ("exit_status", None if job.exit_status is None else str(job.exit_status)),
        ("comment", job_comment(job) or None),
        ("estimated.start_time", _ctime(job.predicted_start)),
        ("Execution_Time", _ctime(job.options.begin)),
        *option_attrs(job),
    ]


_DONE_OR_RUNNING = frozenset({JobState.RUNNING, JobState.EXITING, JobState.FINISHED})


def job_comment(job: Job) -> str:
    """PBS's ``comment``: why a pending job waits, else what happened to it."""
    pending_note = job.reason if job.state not in _DONE_OR_RUNNING else ""
    return pending_note or job.comment


def _depend(job: Job) -> str:
    by_kind: dict[str, list[str]] = {}
    for dep in job.depends:
        by_kind.setdefault(dep.kind.value, []).append(str(dep.job))
    return ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in by_kind.items())


#: What a terminal would act on: a user's variables, arguments and file names
#: may hold it, and an operator's ``qstat -f`` must not clear the screen or
#: retitle it. ``_LINE_CONTROL`` spares the newlines of a whole block.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LINE_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escape(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def printable(text: str) -> str:
    """``text`` (lines of a listing) with every control character but the
    newline escaped (``\\x1b``), as ``qstat -f`` escapes each value."""
    return _LINE_CONTROL.sub(_escape, text)


def qstat_full(jobs: Sequence[Job], now: float) -> str:
    """``qstat -f``: a ``Job Id:`` block of ``attr = value`` lines per job."""
    blocks = []
    for job in jobs:
        lines = [f"Job Id: {job.display_id}"]
        lines += [
            f"    {k} = {_CONTROL.sub(_escape, v)}"
            for k, v in _full_attrs(job, now)
            if v is not None
        ]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def job_record(job: Job) -> dict[str, Any]:
    """The JSON object ``qstat --json`` and ``mb acct --json`` print for a job."""
    req = job.request
    return {
        "id": job.display_id,
        "job_id": job.id,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "name": job.name,
        "user": job.user,
        "group": job.group,
        "queue": job.queue or QUEUE,
        "account": job.account,
        "qos": job.qos,
        "state": job.state.value,
        "letter": letter(job),
        "result": None if job.result is None else job.result.value,
        "exit_status": job.exit_status,
        "signal": job.signal,
        "node": job.alloc[0].node if job.alloc else None,
        "hosts": [a.node for a in job.alloc],
        "cpus": [cpu for a in job.alloc for cpu in a.cpus],
        "alloc": [{"node": a.node, "cpus": list(a.cpus)} for a in job.alloc],
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "cputime_s": job.cputime_s,
        "session_id": job.session_id,
        "maxrss_kb": job.maxrss_kb,
        "output_path": job.stdout_path,
        "error_path": job.stderr_path,
        "join": job.join,
        "workdir": job.workdir,
        "reason": job.reason,
        "comment": job.comment,
        "predicted_start": job.predicted_start,
        "nodes": req.nodes,
        "ppn": req.ppn,
        "ncpus": req.cpus,
        "mem_kb": req.mem_kb,
        "walltime": req.walltime,
        "depends": [{"kind": d.kind.value, "job": d.job} for d in job.depends],
        "malleable": None if req.malleable is None else list(req.malleable),
        "gpus": req.gpus,
        "gpu_ids": [g for a in job.alloc for g in a.gpus],
        # Every option, set or not (the encoding leaves defaults out).
        "options": msgspec.to_builtins(msgspec.structs.asdict(job.options)),
        "reruns": job.reruns,
        "time_limit": limit_of(job),
        # Finished jobs only: a record must not change between two queries.
        "allocated_cpu_s": (
            None if job.end_time is None else allocated_cpu_seconds(job, job.end_time)
        ),
        "resizes": [
            {
                "time": r.time,
                "node": r.node,
                "before": list(r.before),
                "after": list(r.after),
                "cause": r.cause,
            }
            for r in job.resizes
        ],
        "resizing": bool(job.resizing),
        "borrowed": {str(k): v for k, v in job.borrowed.items()},
    }


# ------------------------------------------------------------------- acct

#: Slurm's names for the states before the end; every pending state is PENDING.
_SLURM_ACTIVE = {JobState.RUNNING: "RUNNING", JobState.EXITING: "COMPLETING"}


def slurm_state(job: Job) -> str:
    """Slurm's spelling: COMPLETED, FAILED, CANCELLED, TIMEOUT, ..., or PENDING."""
    if job.state is JobState.FINISHED:
        return job.result.value.upper() if job.result is not None else "UNKNOWN"
    return _SLURM_ACTIVE.get(job.state, "PENDING")


def slurm_duration(seconds: float | None) -> str:
    """``[D-]HH:MM:SS`` as sacct prints Elapsed and TotalCPU."""
    s = max(0, round(seconds or 0))
    days, rest = divmod(s, 86400)
    text = format_duration(rest)
    return f"{days}-{text}" if days else text


def _slurm_time(t: float | None) -> str:
    if t is None:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _slurm_mem(kb: int | None) -> str:
    if kb is None:
        return ""
    for unit, size in (("G", 1024**2), ("M", 1024)):
        if kb % size == 0:
            return f"{kb // size}{unit}"
    return f"{kb}K"


def _alloc_cpus(job: Job) -> int:
    return sum(len(a.cpus) for a in job.alloc)


def slurm_exit_code(job: Job) -> str:
    """sacct's ``code:signal``: a job killed by signal N shows ``0:N``.

    Our ``exit_status`` follows Torque (256+N for a signalled top process); it is
    translated here so the column means what Slurm users expect.
    """
    if job.signal:
        return f"0:{job.signal}"
    return f"{job.exit_status or 0}:0"


_Getter = Callable[[Job, float], str]

#: sacct field name -> (default width, value). Widths are sacct's defaults.
ACCT_FIELDS: dict[str, tuple[int, _Getter]] = {
    "JobID": (12, lambda j, now: j.display_id),
    "JobIDRaw": (12, lambda j, now: str(j.id)),
    "JobName": (10, lambda j, now: j.name),
    "User": (9, lambda j, now: j.user),
    "Group": (9, lambda j, now: j.group),
    "Partition": (10, lambda j, now: j.queue or QUEUE),
    "Account": (10, lambda j, now: j.account),
    "QOS": (10, lambda j, now: j.qos),
    "State": (10, lambda j, now: slurm_state(j)),
    "ExitCode": (8, lambda j, now: slurm_exit_code(j)),
    "Elapsed": (10, lambda j, now: slurm_duration(elapsed(j, now))),
    "TotalCPU": (10, lambda j, now: slurm_duration(j.cputime_s)),
    "CPUTime": (10, lambda j, now: slurm_duration(allocated_cpu_seconds(j, now))),
    "MaxRSS": (10, lambda j, now: "" if j.maxrss_kb is None else f"{j.maxrss_kb}K"),
    "AllocCPUS": (10, lambda j, now: str(_alloc_cpus(j))),
    "ReqCPUS": (8, lambda j, now: str(j.request.cpus)),
    "NNodes": (8, lambda j, now: str(len(j.alloc) or j.request.nodes)),
    "NodeList": (
        15,
        lambda j, now: ",".join(a.node for a in j.alloc) or "None assigned",
    ),
    "Submit": (19, lambda j, now: _slurm_time(j.submit_time)),
    "Start": (19, lambda j, now: _slurm_time(j.start_time)),
    "End": (19, lambda j, now: _slurm_time(j.end_time)),
    "Timelimit": (10, lambda j, now: slurm_duration(j.request.walltime)),
    "ReqMem": (10, lambda j, now: _slurm_mem(j.request.mem_kb)),
    "Malleable": (9, lambda j, now: malleable_range(j) or ""),
    "Resizes": (7, lambda j, now: str(len(j.resizes))),
    "Reason": (20, lambda j, now: j.reason or "None"),
    "WorkDir": (30, lambda j, now: j.workdir),
}
ACCT_DEFAULT = "JobID,JobName,User,AllocCPUS,State,ExitCode,Elapsed,TotalCPU,MaxRSS"


def _sacct_cell(text: str, width: int) -> str:
    # sacct right-aligns and marks a cut value with a trailing '+'.
    return text.rjust(width) if len(text) <= width else text[: width - 1] + "+"


def acct_table(
    jobs: Sequence[Job],
    columns: Sequence[tuple[str, int]],
    now: float,
    fields: dict[str, tuple[int, _Getter]] = ACCT_FIELDS,
) -> str:
    """An sacct-style table of ``jobs`` with the given columns of ``fields``."""
    lines = [" ".join(_sacct_cell(name, w) for name, w in columns)]
    lines.append(" ".join("-" * w for _, w in columns))
    for job in jobs:
        cells = [_sacct_cell(fields[name][1](job, now), w) for name, w in columns]
        lines.append(" ".join(cells))
    return "\n".join(line.rstrip() for line in lines) + "\n"
