"""What keeps the exit statuses of jobs left running while no node daemon runs.

A job's top process is the node daemon's child, and only its parent learns how
it ended. ``mb down --keep-running`` stops the daemon and leaves its jobs
running for the next one (an upgrade): a job that ended before that next
daemon started had its status reaped by init and lost, so it was reported
``node_fail`` and its ``afterok`` dependents were cancelled. slurmstepd exists
for the same reason: a process per job that outlives slurmd.

Here the stopping daemon itself stays the parent: once it has said goodbye to
the server it replaces its program (``execv``, the same pid) with this small
one, which waits for the jobs it left, writes each top process's wait status
beside the job's record (``<job>.exit``, only while the record is
there: a job whose record is gone was reported already) and exits when it has
no child left. The next daemon reads those files for the jobs that ended
meanwhile (:meth:`Tracker.recover <minibatch.node.tracker.Tracker.recover>`),
and for the jobs it re-adopted that end later (the process connector tells a
root daemon too; the file is what an unprivileged one has).

A reaper killed with SIGKILL loses what it would have written, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import msgspec

SUFFIX = ".exit"
#: This module, as it appears in the reaper's command line.
PROGRAM = "minibatch.node.reaper"


class ExitRecord(msgspec.Struct, kw_only=True):
    """How a job's top process ended. What the job used is its cgroup's to
    say (the top's rusage counts the daemon's memory it was forked from)."""

    #: The top process: a record is believed only for the run it names (a
    #: rerun of the job has another top).
    pid: int
    #: Its wait status.
    status: int
    end: float


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ExitRecord)


def path(spool: Path, job: int) -> Path:
    return spool / f"{job}{SUFFIX}"


def write(spool: Path, job: int, rec: ExitRecord) -> bool:
    """Keep ``rec`` for ``job`` if its record is still there."""
    if not (spool / f"{job}.run").exists():
        return False
    target = path(spool, job)
    aside = target.with_suffix(".exit-new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _encoder.encode(rec))
    finally:
        os.close(fd)
    os.replace(aside, target)
    return True


def read(spool: Path, job: int, pid: int) -> ExitRecord | None:
    """How ``job``'s top process ``pid`` ended, if a reaper saw it."""
    try:
        rec = _decoder.decode(path(spool, job).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    return rec if pid and rec.pid == pid else None


def remove(spool: Path, job: int) -> None:
    for name in (f"{job}{SUFFIX}", f"{job}{SUFFIX}-new"):
        with contextlib.suppress(OSError):
            (spool / name).unlink()


def remove_stale(spool: Path) -> None:
    """Remove the exit files of jobs whose record is gone (reported already)."""
    for entry in [*spool.glob(f"*{SUFFIX}"), *spool.glob(f"*{SUFFIX}-new")]:
        if not (spool / f"{entry.name.split('.')[0]}.run").exists():
            with contextlib.suppress(OSError):
                entry.unlink()


def become(spool: Path, tops: dict[int, int]) -> None:
    """Replace this process with a reaper of ``tops`` (top pid -> job id)."""
    pairs = [f"{pid}:{job}" for pid, job in sorted(tops.items())]
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # -P and /: the reaper imports from the install only, never from the
    # directory a daemon was started in (as root).
    os.chdir("/")
    os.execv(
        sys.executable,
        [sys.executable, "-P", "-m", PROGRAM, str(spool.absolute()), *pairs],
    )


def reap(spool: Path, tops: dict[int, int]) -> None:
    """Wait for every child; keep the ends of ``tops``; return with none left."""
    while True:
        try:
            # Looked at, not collected: a top stays a zombie until its end is
            # written (the next daemon waits while it sees one).
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:  # pragma: no cover - only with WNOHANG
            continue
        job = tops.pop(info.si_pid, None)
        if job is not None:
            end = ExitRecord(pid=info.si_pid, status=_status(info), end=time.time())
            with contextlib.suppress(OSError):
                write(spool, job, end)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def _status(info: os.waitid_result) -> int:
    """The wait status ``waitpid`` would give for ``info``."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return info.si_status | (0x80 if info.si_code == os.CLD_DUMPED else 0)


def main(argv: list[str]) -> int:
    # What stops a daemon does not stop this: its jobs' ends would be lost
    # (a second mb down --keep-running, a closed terminal). SIGTERM does,
    # as a service manager's stop.
    for sig in (signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    spool = Path(argv[0])
    tops = {int(p): int(j) for p, _, j in (a.partition(":") for a in argv[1:])}
    # Still the subreaper it was (the flag survives execve): orphans of the
    # jobs come here, and are reaped with them.
    reap(spool, tops)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
