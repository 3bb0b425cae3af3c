"""``showq``, ``showstart`` and ``showbf``: Maui's views of the queue.

    showq [-r|-i|-b] [-u USER]
                         the active, eligible and blocked jobs (Maui's layout;
                         -r, -i, -b: only that section; -u: one user's jobs)
    showstart ID         when a job is predicted to start (the policy's forecast)
    showbf               CPUs free now, and for how long (backfill windows)

``showq`` lists eligible jobs in the order the live policy ranks them, each with
the scheduler's reason; blocked jobs are held, waiting on a dependency, or
over a QOS (or fairshare cap) limit. Layouts follow Maui's ``src/MUI.c``
(``UIFormatShowAllJobs``) and ``src/mclient.c`` (``MCShowEStart``).
"""

from __future__ import annotations

import math
import os
import pwd
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common
from minibatch.cli.ranking import maui_date, maui_duration, queue_order
from minibatch.core.job import Job, JobState
from minibatch.core.reservation import Reservation
from minibatch.protocol.messages import DiagnoseReply, NodeInfo

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}

_ROW = "{:>18} {:>8} {:>10} {:>5} {:>11}  {:>19}"
_BLOCKED_STATE = {JobState.HELD: "UserHold", JobState.WAITING: "Depend"}
#: Release times ``showbf`` lists at most.
MAX_RELEASES = 5


def _section(title: str) -> str:
    return f"{title} JOBS".ljust(31, "-")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _pct(part: int, whole: int) -> str:
    return f"({100.0 * part / whole:.2f}%)" if whole else "(0.00%)"


def render_showq(
    reply: DiagnoseReply,
    now: float,
    only: frozenset[str] = frozenset(),
    user: str | None = None,
) -> str:
    """The three sections, Maui's summary lines and the totals; ``only`` some
    sections ("active", "eligible", "blocked": ``-r``, ``-i``, ``-b``), and only
    ``user``'s jobs (``-u``)."""
    snap = reply.snapshot
    _, order, limited, note = queue_order(reply)
    jobs = {j.id: j for j in reply.jobs}
    active = [j for j in reply.jobs if j.state in (JobState.RUNNING, JobState.EXITING)]
    active.sort(key=lambda j: ((j.start_time or now) + j.request.walltime, j.id))
    eligible = [jobs[p.id] for p in order if p.id in jobs]
    listed = {j.id for j in eligible}
    blocked: list[tuple[Job, str, str]] = []
    for job in reply.jobs:
        if job.state in _BLOCKED_STATE:
            blocked.append((job, _BLOCKED_STATE[job.state], job.reason))
        elif job.state is JobState.QUEUED and job.id not in listed:
            reason = limited.get(job.id) or job.reason
            blocked.append((job, "Idle", reason))
    if user is not None:
        active = [j for j in active if j.user == user]
        eligible = [j for j in eligible if j.user == user]
        blocked = [b for b in blocked if b[0].user == user]
    lines: list[str] = []
    if not only or "active" in only:
        lines += _active(active, snap.nodes, now)
    header = (
        _ROW.format("JOBNAME", "USERNAME", "STATE", "PROC", "WCLIMIT", "QUEUETIME")
        + "  REASON"
    )
    if not only or "eligible" in only:
        lines += [_section("ELIGIBLE"), header, ""]
        lines += [_idle_row(job, "Idle", job.reason) for job in eligible]
        lines += ["", _plural(len(eligible), "Eligible Job"), ""]
    if not only or "blocked" in only:
        lines += [_section("BLOCKED"), header, ""]
        lines += [_idle_row(job, state, why) for job, state, why in blocked]
        lines += ["", _plural(len(blocked), "Blocked Job"), ""]
    if not only:
        total = len(active) + len(eligible) + len(blocked)
        lines.append(
            f"Total Jobs: {total}   Active Jobs: {len(active)}   "
            f"Eligible Jobs: {len(eligible)}   Blocked Jobs: {len(blocked)}"
        )
    if note and (not only or "eligible" in only):
        lines.append(f"note: {note}; eligible jobs are in queue order")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _active(active: list[Job], nodes: Sequence[Any], now: float) -> list[str]:
    """The active section with Maui's processor and node summary."""
    lines = [
        _section("ACTIVE"),
        _ROW.format("JOBNAME", "USERNAME", "STATE", "PROC", "REMAINING", "STARTTIME"),
        "",
    ]
    for job in active:
        left = (job.start_time or now) + job.request.walltime - now
        state = "Running" if job.state is JobState.RUNNING else "Exiting"
        lines.append(
            _ROW.format(
                job.display_id,
                job.user,
                state,
                job.request.cpus,
                maui_duration(left),
                maui_date(job.start_time or now),
            )
        )
    procs = sum(n.cpus for n in nodes)
    busy = sum(n.cpus - n.free_cpus for n in nodes)
    nodes_busy = sum(1 for n in nodes if n.free_cpus < n.cpus)
    lines += [
        "",
        f"{_plural(len(active), 'Active Job'):>17}  {busy:>5} of {procs:>5} "
        f"Processors Active {_pct(busy, procs)}",
    ]
    if procs != len(nodes):
        lines.append(
            f"{'':>17}  {nodes_busy:>5} of {len(nodes):>5} "
            f"Nodes Active      {_pct(nodes_busy, len(nodes))}"
        )
    return [*lines, ""]


def _idle_row(job: Job, state: str, reason: str) -> str:
    row = _ROW.format(
        job.display_id,
        job.user,
        state,
        job.request.cpus,
        maui_duration(job.request.walltime),
        maui_date(job.submit_time),
    )
    return f"{row}  {reason}" if reason else row


def showq_command(
    running: Annotated[bool, typer.Option("-r", help="Active jobs only.")] = False,
    idle: Annotated[
        bool, typer.Option("-i", help="Eligible (idle) jobs only.")
    ] = False,
    blocked: Annotated[bool, typer.Option("-b", help="Blocked jobs only.")] = False,
    user: Annotated[
        str | None, typer.Option("-u", metavar="USER", help="Only USER's jobs.")
    ] = None,
) -> None:
    """Active, eligible (in priority order, with reasons) and blocked jobs."""
    if user is not None and not user:
        common.fail("showq", "-u needs a user name, got ''", common.USAGE_EXIT)
    with common.reporting("showq"):
        from minibatch.protocol.messages import Diagnose

        reply = common.call(Diagnose())
    wanted = {"active": running, "eligible": idle, "blocked": blocked}
    only = frozenset(name for name, asked in wanted.items() if asked)
    sys.stdout.write(render_showq(reply, time.time(), only, user))


# -------------------------------------------------------------- showstart


def render_showstart(job: Job, policy: str, now: float) -> str:
    """Maui's ``showstart`` block, or a plain sentence when there is no forecast."""
    req = job.request
    procs = "proc" if req.cpus == 1 else "procs"
    head = f"job {job.display_id} requires {req.cpus} {procs} for " + maui_duration(
        req.walltime
    )
    if job.state in (JobState.RUNNING, JobState.EXITING):
        start = job.start_time or now
        end = start + req.walltime
        return (
            f"{head}\n\njob {job.display_id} is running since {maui_date(start)}"
            f"\nLatest completion in {maui_duration(end - now):>11} on "
            f"{maui_date(end)}\n"
        )
    if job.state is JobState.FINISHED:
        return f"{head}\n\njob {job.display_id} has finished\n"
    if job.state is not JobState.QUEUED or job.predicted_start is None:
        why = job.reason or "no reason given"
        what = (
            f"policy {policy!r} has predicted no start for it"
            if job.state is JobState.QUEUED
            else "it is not eligible to start"
        )
        return f"{head}\n\nno start time predicted: {what} ({why})\n"
    start = max(job.predicted_start, now)
    end = start + req.walltime
    first = f"{maui_duration(start - now):>11} on {maui_date(start)}"
    last = f"{maui_duration(end - now):>11} on {maui_date(end)}"
    return (
        f"{head}\n\nEarliest start in      {first}\n"
        f"Earliest completion in {last}\n\nBest Partition: ALL\n"
    )


def showstart_command(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A job id.")],
) -> None:
    """When job ID is predicted to start, from the policy's reservations."""
    with common.reporting("showstart"):
        from minibatch.protocol.messages import QueryJobs, Status

        selector = common.parse_selector(job_id)
        (job,) = common.call(QueryJobs(selectors=[selector], finished=True)).jobs[:1]
        policy = common.call(Status()).policy
    sys.stdout.write(render_showstart(job, policy, time.time()))


# ----------------------------------------------------------------- showbf


def backfill_windows(
    nodes: Sequence[NodeInfo], reservations: Sequence[Reservation], now: float
) -> list[tuple[int, float, dict[str, int]]]:
    """(CPUs, seconds, CPUs per node) windows: CPUs free now and unreserved for
    that long, widest first; ``math.inf`` seconds means no time limit.

    A free CPU is usable until the earliest start of a reservation that holds
    it; one inside an active reservation is not free for other jobs at all.
    """
    until: dict[tuple[str, int], float] = {}
    for node in nodes:
        if node.state in ("down", "offline"):
            continue
        for cpu in node.free_cpus:
            until[(node.name, cpu)] = math.inf
    for resv in reservations:
        if resv.end <= now:
            continue
        for alloc in resv.alloc:
            for cpu in alloc.cpus:
                key = (alloc.node, cpu)
                if key in until:
                    until[key] = min(until[key], max(resv.start, now))
    windows = []
    for limit in sorted({u for u in until.values() if u > now}):
        per_node: dict[str, int] = {}
        for (name, _), u in until.items():
            if u >= limit:
                per_node[name] = per_node.get(name, 0) + 1
        windows.append((sum(per_node.values()), limit - now, per_node))
    return windows


def releases(jobs: Sequence[Job], now: float) -> list[tuple[float, dict[str, int]]]:
    """(seconds from now, CPUs per node) that running jobs free at the latest,
    by their walltimes, soonest first."""
    out: dict[float, dict[str, int]] = {}
    for job in jobs:
        if job.state not in (JobState.RUNNING, JobState.EXITING):
            continue
        end = max(now, (job.start_time or now) + job.request.walltime)
        per_node = out.setdefault(end, {})
        for alloc in job.alloc:
            per_node[alloc.node] = per_node.get(alloc.node, 0) + len(alloc.cpus)
    return [(end - now, out[end]) for end in sorted(out)]


def render_showbf(
    windows: list[tuple[int, float, dict[str, int]]],
    freed: list[tuple[float, dict[str, int]]],
    user: str,
    now: float,
) -> str:
    lines = [f"backfill window (user: '{user}' partition: ALL) {maui_date(now)}", ""]
    if not windows:
        lines.append("no procs available")
    for cpus, seconds, per_node in windows:
        procs = "proc " if cpus == 1 else "procs"
        where = ", ".join(f"{n}: {c}" for n, c in sorted(per_node.items()))
        span = (
            "with no timelimit"
            if math.isinf(seconds)
            else f"for {maui_duration(seconds):>11}"
        )
        lines.append(f"{cpus:>3} {procs} available {span}   ({where})")
    if freed:
        lines += ["", "running jobs free, by their walltimes at the latest:"]
    for seconds, per_node in freed[:MAX_RELEASES]:
        cpus = sum(per_node.values())
        where = ", ".join(f"{n}: {c}" for n, c in sorted(per_node.items()))
        lines.append(f"{cpus:>3} more in {maui_duration(seconds):>11}   ({where})")
    if len(freed) > MAX_RELEASES:
        lines.append(f"    ... and {len(freed) - MAX_RELEASES} later")
    return "\n".join(lines) + "\n"


def showbf_command() -> None:
    """CPUs free now and for how long, given running jobs and reservations."""
    with common.reporting("showbf"):
        from minibatch.protocol.messages import (
            QueryJobs,
            QueryNodes,
            QueryReservations,
        )

        with common.connect() as client:
            nodes = client.call(QueryNodes()).nodes
            jobs = client.call(QueryJobs()).jobs
            reply = client.call(QueryReservations())
    now = reply.now or time.time()
    windows = backfill_windows(nodes, reply.reservations, now)
    freed = releases(jobs, now)
    sys.stdout.write(render_showbf(windows, freed, _me(), now))


def _me() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def showq_main() -> None:
    common.script(showq_command, "showq", context_settings=CONTEXT_SETTINGS)


def showstart_main() -> None:
    common.script(showstart_command, "showstart", context_settings=CONTEXT_SETTINGS)


def showbf_main() -> None:
    common.script(showbf_command, "showbf", context_settings=CONTEXT_SETTINGS)
