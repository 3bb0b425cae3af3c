"""PBS's other everyday commands: ``qselect``, ``qsig``, ``qrerun``, ``qmove``
and ``tracejob``.

    qselect [-u USER] [-s STATES] [-q QUEUE] [-N NAME] [-x]   job ids, one a line
    qsig [-s SIGNAL] ID...       a signal to every process of running jobs
    qrerun ID...                 operators: kill and queue again, same id
    qmove QUEUE ID...            pending jobs to another queue
    tracejob ID...               each job's event log, with times

Like ``qdel``, the commands that act on jobs act on each id on its own and
report those refused (see :func:`minibatch.cli.jobctl.per_id`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, render
from minibatch.cli.jobctl import IDS_HELP, per_id
from minibatch.core.job import Job
from minibatch.core.units import format_duration, format_size_kb
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer

    from minibatch.protocol.messages import JobTrace
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}


#: The letters ``qselect -s`` takes (PBS's, as ``qstat`` shows them).
STATE_LETTERS = "QHWREFC"


# ---------------------------------------------------------------- qselect


def select(
    jobs: list[Job],
    *,
    users: list[str],
    states: str,
    queue: str | None,
    name: str | None,
) -> list[Job]:
    """The jobs that pass every filter given (none given: all of them)."""
    return [
        j
        for j in jobs
        if (not users or j.user in users)
        and (not states or render.letter(j) in states)
        and (queue is None or (j.queue or render.QUEUE) == queue)
        and (name is None or j.name == name)
    ]


def parse_states(text: str) -> str:
    letters = text.upper().replace(",", "")
    bad = sorted({c for c in letters if c not in STATE_LETTERS})
    if bad:
        raise InvalidArgument(
            f"unknown job state {''.join(bad)!r} (states: {STATE_LETTERS})"
        )
    return letters


def qselect_command(
    user: Annotated[
        str | None, typer.Option("-u", help="Jobs of USER (or U1,U2).")
    ] = None,
    states: Annotated[
        str | None,
        typer.Option("-s", help=f"Jobs in these states, e.g. QH ({STATE_LETTERS})."),
    ] = None,
    queue: Annotated[str | None, typer.Option("-q", help="Jobs in QUEUE.")] = None,
    name: Annotated[str | None, typer.Option("-N", help="Jobs named NAME.")] = None,
    finished: Annotated[
        bool, typer.Option("-x", help="Finished jobs too (also -s C or F).")
    ] = False,
) -> None:
    """Print the ids of the jobs that match, one a line (for qdel $(qselect ...))."""
    with common.reporting("qselect"):
        letters = parse_states(states or "")
        users = [u for u in (user or "").split(",") if u]
        from minibatch.protocol.messages import QueryJobs

        query = QueryJobs(
            user=users[0] if len(users) == 1 else None,
            finished=finished or bool(set(letters) & {"C", "F"}),
        )
        jobs = common.call(query).jobs
    found = select(jobs, users=users, states=letters, queue=queue, name=name)
    found.sort(key=lambda j: j.id)
    sys.stdout.write("".join(f"{j.display_id}\n" for j in found))


# ------------------------------------------------------------------- qsig


def qsig_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
    signal: Annotated[
        str,
        typer.Option("-s", help="The signal: a name (TERM, SIGUSR1) or a number."),
    ] = "SIGTERM",
) -> None:
    """Send a signal to every process of running jobs."""
    from minibatch.malleable import signal_named

    try:
        named = signal_named(signal)
    except ValueError:
        named = None
    if named is None:
        common.fail("qsig", f"unknown signal {signal!r}", common.USAGE_EXIT)
        return
    name = named.name
    from minibatch.protocol.messages import SignalJob

    per_id("qsig", job_ids, lambda ids: SignalJob(selectors=ids, signal=name))


# ----------------------------------------------------------------- qrerun


def qrerun_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
) -> None:
    """Kill running jobs and queue them again, same ids (operators only)."""
    from minibatch.protocol.messages import Rerun

    per_id("qrerun", job_ids, lambda selectors: Rerun(selectors=selectors))


# ------------------------------------------------------------------ qmove


def qmove_command(
    destination: Annotated[
        str,
        typer.Argument(metavar="QUEUE", help="The queue (QUEUE or QUEUE@server)."),
    ],
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
) -> None:
    """Move pending jobs to another queue."""
    queue = destination.split("@", 1)[0]
    if not queue:
        common.fail("qmove", "no queue given", common.USAGE_EXIT)
    from minibatch.protocol.messages import MoveJob

    per_id(
        "qmove", job_ids, lambda selectors: MoveJob(queue=queue, selectors=selectors)
    )


# --------------------------------------------------------------- tracejob

#: Where an event comes from, as tracejob marks it: S server, M the node (mom).
_SOURCE = {"launched": "M", "resized": "M", "resize_failed": "M"}


def _stamp(t: float) -> str:
    return time.strftime("%m/%d/%Y %H:%M:%S", time.localtime(t))


def _line(t: float, source: str, text: str) -> str:
    return f"{_stamp(t)}  {source:<4} {text}"


def _accounting(job: Job, last: float) -> str | None:
    """The ``A`` line of a job that has ended: its exit status and usage,
    with ``end=`` as Torque's accounting record has it. Stamped when the end
    was recorded (``last``, its last event), as Torque stamps the record: a
    job whose end reached the server late (its node daemon was down) shows
    its real end in ``end=``, not out of order."""
    if job.end_time is None:
        return None
    parts = [f"Exit_status={'' if job.exit_status is None else job.exit_status}"]
    if job.result is not None:
        parts.append(f"result={job.result.value}")
    if job.start_time is not None:
        parts.append(f"resources_used.cput={format_duration(job.cputime_s or 0)}")
        parts.append(f"resources_used.mem={format_size_kb(job.maxrss_kb or 0)}")
        ran = job.end_time - job.start_time
        parts.append(f"resources_used.walltime={format_duration(ran)}")
    parts.append(f"end={int(job.end_time)}")
    return _line(max(job.end_time, last), "A", " ".join(parts))


def render_trace(trace: JobTrace) -> str:
    """One block per job: ``Job: ID``, then its events, oldest first."""
    blocks = []
    for job in trace.jobs:
        lines = [f"Job: {job.display_id}", ""]
        last = 0.0
        for e in trace.events:
            if e.job == job.id:
                text = f"{e.event}: {e.detail}" if e.detail else e.event
                lines.append(_line(e.time, _SOURCE.get(e.event, "S"), text))
                last = max(last, e.time)
        account = _accounting(job, last)
        if account is not None:
            lines.append(account)
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def tracejob_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
) -> None:
    """Show each job's event log: submission, starts, holds, signals, its end."""
    from minibatch.protocol.messages import TraceJob

    out: list[str] = []
    code: int | str | None = 0
    for text in job_ids:
        try:
            with common.reporting("tracejob"):
                selector = common.parse_selector(text)
                out.append(render_trace(common.call(TraceJob(selector=selector))))
        except SystemExit as exc:
            code = code or exc.code  # said on stderr; the other ids go on
    sys.stdout.write(render.printable("\n".join(out)))
    if code:
        raise SystemExit(code)


# ------------------------------------------------------------ entry points


def qselect_main() -> None:
    common.script(qselect_command, "qselect", context_settings=CONTEXT_SETTINGS)


def qsig_main() -> None:
    common.script(qsig_command, "qsig", context_settings=CONTEXT_SETTINGS)


def qrerun_main() -> None:
    common.script(qrerun_command, "qrerun", context_settings=CONTEXT_SETTINGS)


def qmove_main() -> None:
    common.script(qmove_command, "qmove", context_settings=CONTEXT_SETTINGS)


def tracejob_main() -> None:
    common.script(tracejob_command, "tracejob", context_settings=CONTEXT_SETTINGS)
