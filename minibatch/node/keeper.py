"""The parent ``mb up`` starts each node daemon under: what keeps the ends of the
jobs a killed daemon leaves.

Only a process's parent learns how it ended. A node daemon killed with SIGKILL
(or one that crashed) leaves its jobs running, and their top processes pass to
the nearest child subreaper among its ancestors; with none, init reaps them and
the exit status is lost: a job that ended before the next daemon started was
reported ``node_fail``, "exit status unknown", and its ``afterok`` dependents
were cancelled. slurmstepd, a process per job that outlives slurmd, exists for
the same reason; one process per node does here.

So ``mb up`` starts ``mb-node`` under this small program: a child subreaper that
spawns the daemon, writes the daemon's pid file, passes on the signals that stop
it (``mb up`` giving up, an operator who signals the wrong pid) and waits. Once
the daemon is gone it does what a daemon stopped by ``mb down --keep-running``
does (:mod:`.reaper`): it waits for the jobs the daemon left (the spool's
records say which process was which job's top), writes each one's wait status
beside its record, and exits with the daemon's own status when it has no child
left. While the daemon runs it costs nothing: the jobs are the daemon's
children, and nothing here wakes.

systemd starts ``mb-node`` without a keeper: when the daemon dies, its unit
(``KillMode=mixed``) ends the jobs with it, and ``Restart=on-failure`` starts
the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import types
from pathlib import Path

from minibatch.node import procfs, reaper, records

#: This module, as it appears in the keeper's command line.
PROGRAM = "minibatch.node.keeper"
#: What stops a daemon, passed on to it while it runs.
_PASSED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)

log = logging.getLogger("mb-node-keeper")


def command(pidfile: Path, spool: Path, daemon: list[str]) -> list[str]:
    """The command that runs ``daemon`` under a keeper. ``-P``: the keeper
    imports from the install only, never from the directory it started in."""
    where = [str(pidfile.absolute()), str(spool.absolute())]
    return [sys.executable, "-P", "-m", PROGRAM, *where, "--", *daemon]


def keepers(spool: Path) -> list[int]:
    """The keepers still running for the cluster whose spool is ``spool``."""
    found = []
    want = str(spool.absolute()).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{name}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            if PROGRAM.encode() in words[:4] and want in words[4:6]:
                found.append(int(name))
    return found


def _write_pid(pidfile: Path, pid: int) -> None:
    aside = pidfile.with_name(f".{pidfile.name}.keeper")
    aside.write_text(f"{pid}\n")
    aside.replace(pidfile)


def _exit_code(status: int) -> int:
    """The shell's code for a wait status: the code, or 128 + the signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def keep(pidfile: Path, spool: Path, daemon: list[str]) -> int:
    """Run ``daemon`` and outlive it; the daemon's exit code."""
    procfs.set_child_subreaper(True)
    child = 0
    pending: list[int] = []

    def pass_on(sig: int, _frame: types.FrameType | None) -> None:
        if not child:
            pending.append(sig)  # before the spawn returned: sent after it
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in _PASSED:
        signal.signal(sig, pass_on)
    child = os.posix_spawn(daemon[0], daemon, os.environ, setsigdef=_PASSED)
    _write_pid(pidfile, child)
    for early in pending:
        pass_on(early, None)
    _, status = os.waitpid(child, 0)
    # From here a reaper: only SIGTERM (a service manager's stop) stops it.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    tops = records.tops(spool)
    if os.WIFSIGNALED(status):
        log.warning(
            "mb-node (pid %d) was killed by %s; keeping the ends of the %d "
            "job(s) it left running",
            child,
            signal.Signals(os.WTERMSIG(status)).name,
            len(tops.keys() & set(procfs.own_children())),
        )
    reaper.reap(spool, tops)
    return _exit_code(status)


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s mb-node-keeper[%(process)d] %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if len(argv) < 4 or argv[2] != "--":
        print(
            f"usage: python -m {PROGRAM} PIDFILE SPOOL -- MB-NODE...", file=sys.stderr
        )
        return 2
    try:
        return keep(Path(argv[0]), Path(argv[1]), argv[3:])
    except OSError as exc:
        log.error("cannot run %s: %s", argv[3], exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
