"""A trace replayed on the live cluster, scaled in time (``mb replay``): which job
is submitted when, what it asks for and what it runs. Pure: the command
(:mod:`minibatch.cli.replay`) submits, waits and compares.

The jobs are those the simulator keeps for the live cluster's nodes
(:func:`~minibatch.sim.swf.select_jobs` on them, ``--limit`` included), so the
live run and its replay in the simulator are of the same slice. Times are
divided by the speedup:

* a job is submitted ``submit / speedup`` seconds after the first one;
* it runs ``run / speedup`` seconds, at least :data:`MIN_RUN`: a run of 0 whole
  seconds is not a job to the simulator's filter;
* it asks for ``ceil(requested / speedup)`` seconds, and at least
  :data:`MARGIN` more than it runs: a trace job that ran past its requested
  time would be killed live and not in the simulator, so it gets time to end.

Each job is the program :data:`PROGRAM` (it sleeps: its run time is the trace's
however many jobs share the real cores), or with ``burn`` ``rigid_burn.py``,
which keeps each of its CPUs busy for as long (wall-clock time too).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import NamedTuple

from minibatch.errors import InvalidArgument
from minibatch.sim.swf import BUNDLED, TraceJob

#: The shortest run of a replayed job, in seconds.
MIN_RUN = 1.0
#: Seconds a replayed job's walltime exceeds its run at least.
MARGIN = 2
#: The job programs (``jobs/examples`` in the repository).
EXAMPLES = BUNDLED.parent / "examples"
PROGRAM = EXAMPLES / "trace_job.sh"
BURNER = EXAMPLES / "rigid_burn.py"


class Submission(NamedTuple):
    """One trace job as the live cluster gets it."""

    trace_id: int
    #: Seconds after the replay's start.
    at: float
    #: The trace's user, which becomes the job's account.
    user: str
    nodes: int
    ppn: int
    #: Seconds the job program runs, and the walltime it asks for.
    run: float
    walltime: int


def check_speedup(speedup: float) -> None:
    if not speedup > 0:  # NaN too
        raise InvalidArgument(f"--speedup must be a positive number, not {speedup}")


def schedule(
    jobs: Sequence[TraceJob],
    speedup: float,
    min_run: float = MIN_RUN,
    margin: int = MARGIN,
) -> list[Submission]:
    """The submissions for ``jobs`` (from ``select_jobs``), in submission order;
    ``min_run`` and ``margin`` replace :data:`MIN_RUN` and :data:`MARGIN` where
    the run is not exported to SWF (``mb demo``)."""
    check_speedup(speedup)
    out = []
    for job in sorted(jobs, key=lambda j: (j.submit, j.id)):
        run = max(min_run, round(job.run_time / speedup, 3))
        walltime = max(math.ceil(job.req_time / speedup), math.ceil(run) + margin)
        out.append(
            Submission(
                trace_id=job.id,
                at=job.submit / speedup,
                user=job.user,
                nodes=job.request.nodes,
                ppn=job.request.ppn,
                run=run,
                walltime=walltime,
            )
        )
    return out


def program(burn: bool = False) -> list[str]:
    """The command every replayed job runs, less its seconds."""
    path = BURNER if burn else PROGRAM
    if not path.is_file():
        raise InvalidArgument(
            f"the job program {path} is missing (mb replay runs from the "
            "repository's source tree)"
        )
    return [sys.executable, str(path), "--seconds"] if burn else [str(path)]


def qsub_args(sub: Submission, command: Sequence[str], output: str) -> list[str]:
    """The qsub command line of one submission: named ``trace<ID>``, charged to
    ``trace-user-<USER>``, its output joined in the directory ``output``."""
    return [
        "-N",
        f"trace{sub.trace_id}",
        "-A",
        f"trace-user-{sub.user}",
        "-l",
        f"nodes={sub.nodes}:ppn={sub.ppn},walltime={sub.walltime}",
        "-j",
        "oe",
        "-o",
        output,
        "--",
        *command,
        str(sub.run),
    ]


def mapping_csv(subs: Sequence[Submission], ids: Sequence[int]) -> str:
    """``replay.csv``: each trace job, the live job it became and what it asked."""
    lines = ["trace_job,job,trace_user,submit_s,nodes,ppn,run_s,walltime_s"]
    lines += [
        f"{s.trace_id},{jid},{s.user},{s.at:.3f},{s.nodes},{s.ppn},{s.run},{s.walltime}"
        for s, jid in zip(subs, ids, strict=True)
    ]
    return "\n".join(lines) + "\n"


def progress_line(total: int, submitted: int, running: int, finished: int) -> str:
    return (
        f"{submitted}/{total} submitted, {submitted - running - finished} queued, "
        f"{running} running, {finished} finished"
    )
