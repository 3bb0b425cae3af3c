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
import time
import types
from pathlib import Path

from minibatch.node import procfs, reaper, records

#: This module, as it appears in the keeper's command line.
PROGRAM = "minibatch.node.keeper"
#: What stops a daemon, passed on to it while it runs.
_PASSED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
#: A job's record is taken just before its fork: its top started within this
#: of the record's start, or it is another process with a reused pid.
_SAME_START_S = 5.0
#: How long a daemon left without its pid file gets to stop before SIGKILL.
_STOP_GRACE_S = 10.0

log = logging.getLogger("mb-node-keeper")


def command(pidfile: Path, spool: Path, node: str, daemon: list[str]) -> list[str]:
    """The command that runs ``daemon`` (of node ``node``) under a keeper.
    ``-P``: the keeper imports from the install only, never from the
    directory it started in."""
    where = [str(pidfile.absolute()), str(spool.absolute()), node]
    return [sys.executable, "-P", "-m", PROGRAM, *where, "--", *daemon]


def keepers(spool: Path) -> list[int]:
    """The keepers still running for the cluster whose spool is ``spool``:
    processes of the spool's owner (anyone may name a spool on a command
    line) running this program for it."""
    found = []
    want = str(spool.absolute()).encode()
    try:
        owner = spool.stat().st_uid
    except OSError:
        return []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{name}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            ours = os.stat(f"/proc/{name}").st_uid == owner
            if ours and PROGRAM.encode() in words[:4] and want in words[4:6]:
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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def orphans(spool: Path, node: str) -> dict[int, int]:
    """Top process -> job for the jobs of ``node`` whose top is our child now:
    its record names it and it started when the record says (a pid the
    daemon had reaped may be another process's by now)."""
    boot = procfs.boot_time()
    ours = set(procfs.own_children())
    found = {}
    for pid, (job, start) in records.tops(spool, node).items():
        top = procfs.read_stat(pid) if pid in ours else None
        if top is not None and abs(boot + top.start_s - start) < _SAME_START_S:
            found[pid] = job
    return found


def _spawn(daemon: list[str]) -> tuple[int, int]:
    """The daemon's pid and a pidfd of it, to signal it even after its pid
    is reaped (and maybe reused)."""
    child = os.posix_spawn(daemon[0], daemon, os.environ, setsigdef=_PASSED)
    return child, os.pidfd_open(child)


def _stop(child: int, pidfd: int) -> None:
    """End a daemon that must not run on without its keeper."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitpid(child, 0)
            return
        time.sleep(0.05)


def keep(pidfile: Path, spool: Path, node: str, daemon: list[str]) -> int:
    """Run ``daemon`` and outlive it; the daemon's exit code."""
    procfs.set_child_subreaper(True)
    pidfd = -1
    pending: list[int] = []

    def pass_on(sig: int, _frame: types.FrameType | None) -> None:
        if pidfd < 0:
            pending.append(sig)  # before the spawn returned: sent after it
            return
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, sig)

    for sig in _PASSED:
        signal.signal(sig, pass_on)
    child, pidfd = _spawn(daemon)
    try:
        _write_pid(pidfile, child)
    except OSError as exc:
        # No pid file: nothing could find the daemon to stop it.
        log.error("cannot write %s: %s; stopping mb-node", pidfile, exc)
        _stop(child, pidfd)
        return 1
    for early in pending:
        pass_on(early, None)
    _, status = os.waitpid(child, 0)
    # From here a reaper: only SIGTERM (a service manager's stop) stops it.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    tops: dict[int, int] = {}
    try:
        tops = orphans(spool, node)
        if status != 0 and tops:
            how = (
                f"was killed by {_signal_name(os.WTERMSIG(status))}"
                if os.WIFSIGNALED(status)
                else f"exited with status {os.WEXITSTATUS(status)}"
            )
            log.warning(
                "mb-node (pid %d) %s; keeping the ends of the %d job(s) it left "
                "running",
                child,
                how,
                len(tops),
            )
    finally:
        reaper.reap(spool, tops)
    return _exit_code(status)


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s mb-node-keeper[%(process)d] %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if len(argv) < 5 or argv[3] != "--":
        usage = f"usage: python -m {PROGRAM} PIDFILE SPOOL NODE -- MB-NODE..."
        print(usage, file=sys.stderr)
        return 2
    try:
        return keep(Path(argv[0]), Path(argv[1]), argv[2], argv[4:])
    except OSError as exc:
        log.error("cannot run %s: %s", argv[4], exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
