"""What the kernel says about processes, read straight from ``/proc``.

The tracker needs, for every process on the machine, its parent, process group,
session and resident size, several times a second. psutil would build one object per
process and read several files each (and it does not expose the session id), so a
scan here reads exactly one file per process, ``/proc/<pid>/stat``, and keeps the
four numbers. Environments are read only for the rare processes that cannot be
placed otherwise (an orphan that left the job's session).

Also here: the child-subreaper switch, the list of this process's direct children,
and the start-up sweep that kills processes a previous incarnation of a node left.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minibatch.node.cgroup import JobCgroup

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    rss_kb: int
    #: CPU seconds of the process and of its children it has waited for.
    cpu_s: float = 0.0
    #: Virtual memory size (KB).
    vsize_kb: int = 0
    #: When it started, in seconds since boot (see :func:`boot_time`).
    start_s: float = 0.0

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_stat(pid: int) -> Proc | None:
    """One process's stat line, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; it ends at the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        state=fields[0].decode(),
        rss_kb=int(fields[21]) * _PAGE_KB,
        cpu_s=sum(int(f) for f in fields[11:15]) / _TICKS,
        vsize_kb=int(fields[20]) // 1024,
        start_s=int(fields[19]) / _TICKS,
    )


def boot_time() -> float:
    """When the machine booted (epoch seconds): what :attr:`Proc.start_s`
    counts from."""
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


class ProcTable:
    """A snapshot of every process, indexed by parent, group and session."""

    def __init__(self, procs: dict[int, Proc]) -> None:
        self.procs = procs
        self._kids: dict[int, list[int]] = defaultdict(list)
        self._groups: dict[int, list[int]] = defaultdict(list)
        self._sessions: dict[int, list[int]] = defaultdict(list)
        for p in procs.values():
            self._kids[p.ppid].append(p.pid)
            self._groups[p.pgid].append(p.pid)
            self._sessions[p.sid].append(p.pid)

    @classmethod
    def scan(cls) -> ProcTable:
        procs: dict[int, Proc] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                p = read_stat(int(name))
                if p is not None:
                    procs[p.pid] = p
        return cls(procs)

    def __contains__(self, pid: object) -> bool:
        return pid in self.procs

    def children(self, pid: int) -> list[int]:
        return self._kids.get(pid, [])

    def members(self, leader: int) -> set[int]:
        """Processes whose session or process group is ``leader``'s."""
        return set(self._sessions.get(leader, ())) | set(self._groups.get(leader, ()))

    def subtree(self, seeds: Iterable[int]) -> set[int]:
        """``seeds`` (those that exist) and all their descendants."""
        out: set[int] = set()
        todo = [p for p in seeds if p in self.procs]
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.add(pid)
                todo.extend(self._kids.get(pid, ()))
        return out


def own_children() -> list[int]:
    """Direct children of this process, without a full scan.

    Children hang off the thread that forked them (or, once reparented, any of our
    threads), so every task's ``children`` file is read. Kernels built without
    CONFIG_PROC_CHILDREN lack the file; fall back to a scan then.
    """
    if not _HAVE_CHILDREN_FILE:
        return list(ProcTable.scan().children(os.getpid()))
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                pids.extend(int(x) for x in f.read().split())
        except OSError:
            continue  # the thread just ended
    return pids


_HAVE_CHILDREN_FILE = Path(f"/proc/self/task/{os.getpid()}/children").exists()


def read_environ(pid: int) -> dict[str, str] | None:
    """A process's initial environment; None if gone, unreadable or a zombie."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def set_child_subreaper(on: bool = True) -> bool:
    """Make orphans of our descendants reparent to us instead of to init.

    Without it a job that double-forks escapes: its grandchild is adopted by init
    and nothing ties it to the job any more. Returns False where unsupported.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot become a child subreaper (%s); orphans may escape", exc)
        return False
    return True


def _ancestors() -> set[int]:
    out = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        p = read_stat(pid)
        if p is None:
            break
        pid = p.ppid
    return out


def kill_job_remains(top: int, uid: int, cg: JobCgroup | None) -> int:
    """SIGKILL what is left of a job an earlier daemon ran; how many processes.

    Its cgroup holds all of it. Without one, its session and process group
    (named by its top process's pid) are what can be found, and only processes
    of the job's user: the ids may have been reused since.
    """
    spare = _ancestors()
    killed: set[int] = set()
    if cg is not None:
        for _ in range(100):  # until a fork in flight has landed too
            pids = [p for p in cg.procs() if p not in spare]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(pids)
            time.sleep(0.01)
        return len(killed)
    if top <= 0:  # recorded before its fork: no session to look for
        return 0
    for pid in ProcTable.scan().members(top) - spare:
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.add(pid)
    return len(killed)


def kill_leftovers(node: str, home: str, spare: set[int] | None = None) -> list[int]:
    """SIGKILL processes a previous incarnation of node ``node`` left running.

    A job process carries ``MB_NODE`` and ``MB_HOME`` in its environment; matching
    both keeps two clusters on one machine (each in its own home) from killing each
    other's jobs. This process and its ancestors are spared (a daemon started from
    inside a job inherits those variables), and so are ``spare`` (re-adopted jobs).
    """
    spare = _ancestors() | (spare or set())
    killed: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        pid = int(name)
        env = read_environ(pid)
        if env and env.get("MB_NODE") == node and env.get("MB_HOME") == home:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            killed.append(pid)
            log.warning(
                "killed pid %d left over from an earlier mb-node %s (job %s)",
                pid,
                node,
                env.get("MB_JOBID", "?"),
            )
    return killed
