"""``qsub -W block=true`` / ``sbatch --wait``: wait for the job, exit with its status.

The job is the cluster's once submitted, and a server that stops or restarts
loses none (it runs on; its end is reported to the next server). So a waiter
outlives the server too: it says once that it lost it, asks again every
:data:`RETRY` s until a server answers, and then waits on as before. Ctrl-C
stops the waiting (not the job), with the usual 130.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, NoReturn

from minibatch.errors import ErrorCode, NotFound, RemoteError, Unavailable

if TYPE_CHECKING:
    from minibatch.core.job import Job
    from minibatch.protocol.messages import JobList, Submitted

#: Seconds between attempts to reach a server that went away.
RETRY = 1.0


def wait_for_end(submitted: Submitted, prog: str) -> NoReturn:
    """Exit with the job's exit status (the highest of an array's) once every
    job of ``submitted`` has ended."""
    # The id printed already is wanted now (a pipe would hold it until the end).
    sys.stdout.flush()
    pause = 0.05
    lost = False
    while True:
        try:
            jobs = _ask(submitted).jobs
        except Unavailable:
            if not lost:
                print(
                    f"{prog}: lost the server while waiting for job "
                    f"{submitted.display}, which was submitted: asking again every "
                    f"{RETRY:g} s until it answers (Ctrl-C stops waiting, not the job)",
                    file=sys.stderr,
                )
            lost = True
            time.sleep(RETRY)
            continue
        if lost:
            print(
                f"{prog}: the server is back; waiting for job {submitted.display}",
                file=sys.stderr,
            )
            lost = False
        if jobs and all(j.end_time is not None for j in jobs):
            break
        time.sleep(pause)
        pause = min(1.0, pause * 1.5)
    worst = max(jobs, key=_exit_status)
    status = _exit_status(worst)
    if status:
        print(
            f"{prog}: job {worst.display_id} ended with exit status {status}",
            file=sys.stderr,
        )
    raise SystemExit(status)


def _ask(submitted: Submitted) -> JobList:
    """The jobs' records now; a server that has none (a new state, say) is
    one line and exit status 1, since nothing can tell how the job ends."""
    from minibatch.cli import common
    from minibatch.protocol.messages import QueryJobs

    selectors = [str(i) for i in submitted.ids]
    try:
        reply: JobList = common.call(
            QueryJobs(selectors=selectors, finished=True, active=True)
        )
    except RemoteError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise
        raise NotFound(
            f"the server has no record of job {submitted.display} any more "
            f"({exc}): its exit status cannot be known"
        ) from None
    return reply


def _exit_status(job: Job) -> int:
    """As a shell reports it: the exit code, or 128 + the signal that ended it
    (PBS records a job killed by signal N as 256 + N)."""
    if job.exit_status is not None:
        status = job.exit_status
        return 128 + status - 256 if status > 255 else status
    return 128 + job.signal if job.signal else 1
