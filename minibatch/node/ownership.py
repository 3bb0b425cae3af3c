"""Which processes belong to which job, and how a job's end is reported.

A job is its top process (a session and group leader, see :mod:`.launcher`) and
everything it starts. The daemon is a child subreaper, so whatever a job orphans is
reparented to the daemon instead of init. A process belongs to a job when it is

1. the top process, or in its session or process group (while the top process
   lives and so holds that id), or
2. a child the daemon adopted whose session or group is the job's, or whose
   environment carries the job's ``MB_JOBID`` with this node's ``MB_NODE`` and
   ``MB_HOME`` (an orphan that called ``setsid``), or
3. a descendant of one of those.

Ownership found once is remembered per pid, so a process keeps its job after it
changes session; it is forgotten when the pid is reaped or disappears from a scan
(pids are reused). A child the daemon adopted that cannot be placed is a
*stranger*, remembered with the jobs running when it was first seen: one of them
left it behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from minibatch.core.job import JobResult
from minibatch.node import procfs
from minibatch.node.cgroup import JobCgroup
from minibatch.node.procfs import ProcTable
from minibatch.node.thrash import Watch
from minibatch.protocol.messages import JobEnded, LaunchSpec


@dataclass(eq=False)
class Run:
    """One running job as the tracker sees it."""

    spec: LaunchSpec
    #: None for a job re-adopted from an earlier daemon (not our child).
    popen: subprocess.Popen[bytes] | None
    pid: int
    start: float
    #: The job's cgroups, when the node uses them (:mod:`.cgroup`).
    cg: JobCgroup | None = None
    #: Re-adopted: its processes are found by cgroup only, and its exit
    #: status only from the kernel's process events (:mod:`.exits`).
    adopted: bool = False
    #: Re-adopted, its top process gone and no exit event read yet: the end is
    #: decided a tick later, by when the event has surely arrived.
    exit_awaited: bool = False
    #: Kernel OOM kills in its cgroup already acted on.
    oom_seen: int = 0
    #: Whether it thrashes at its memory limit (:mod:`.thrash`).
    thrash: Watch = field(default_factory=Watch)
    #: Wait status of the top process, once reaped.
    status: int | None = None
    cputime_s: float = 0.0
    maxrss_kb: int = 0
    #: The daemon's own peak RSS when it spawned the job (see the tracker).
    spawner_maxrss_kb: int = 0
    #: Why the daemon is killing the job (walltime, memory, the server's Kill).
    kill_reason: JobResult | None = None
    comment: str = ""
    #: Every pid this job owns in the :class:`Ownership` map.
    pids: set[int] = field(default_factory=set)
    leftovers: int = 0
    drain_since: float | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    #: The node CPU ids the job is confined to now (they change on a resize),
    #: and the number of the last resize applied (a repeat is answered again).
    cpus: list[int] = field(default_factory=list)
    seq: int = 0
    #: Seconds from the start the job may run, and the timer that enforces it
    #: (re-armed when a resize stretches the limit).
    limit: float = 0.0
    walltime_timer: asyncio.TimerHandle | None = None
    #: At the last sample: CPU seconds of the whole job (reaped processes
    #: included) and resident memory now (KB); what ``qstat`` shows as it runs.
    cpu_now_s: float = 0.0
    rss_now_kb: int = 0
    #: The ``--signal`` warning has been sent.
    warned: bool = False


class Ownership:
    """The pid -> job map, and the job trees built from a :class:`ProcTable`."""

    def __init__(self, node: str, home: str) -> None:
        self.node = node
        self.home = home
        self.mypid = os.getpid()
        self.jobs: dict[int, Run] = {}
        self.by_root: dict[int, Run] = {}
        self._by_display: dict[str, Run] = {}
        self._owner: dict[int, Run] = {}
        self.strangers: dict[int, set[int]] = {}

    def add(self, run: Run) -> None:
        self.jobs[run.spec.job] = run
        self.by_root[run.pid] = run
        self._by_display[run.spec.display_id] = run
        self.own(run.pid, run)

    def remove(self, run: Run) -> None:
        self.jobs.pop(run.spec.job, None)
        # A new job's top process may already have reused this one's pid.
        if self.by_root.get(run.pid) is run:
            del self.by_root[run.pid]
        if self._by_display.get(run.spec.display_id) is run:
            del self._by_display[run.spec.display_id]
        for pid in run.pids:
            if self._owner.get(pid) is run:
                del self._owner[pid]
        run.pids.clear()

    def own(self, pid: int, run: Run) -> None:
        self._owner[pid] = run
        run.pids.add(pid)

    def owner(self, pid: int) -> Run | None:
        return self._owner.get(pid)

    def owned(self) -> list[tuple[int, Run]]:
        return list(self._owner.items())

    def forget(self, pid: int) -> None:
        run = self._owner.pop(pid, None)
        if run is not None:
            run.pids.discard(pid)
        self.strangers.pop(pid, None)

    def prune(self, table: ProcTable) -> None:
        """Forget pids that no longer exist."""
        for pid in [p for p in self._owner if p not in table]:
            self.forget(pid)
        for pid in [p for p in self.strangers if p not in table]:
            del self.strangers[pid]

    def place_zombie(self, pid: int) -> Run | None:
        """The job of an exited child: its environment is gone, its session not."""
        run = self._owner.get(pid)
        if run is None:
            p = procfs.read_stat(pid)
            if p is not None:
                run = self.by_root.get(p.sid) or self.by_root.get(p.pgid)
        return run

    def place(self, pid: int) -> Run | None:
        """The job an adopted child of ours belongs to (remembered), if any."""
        run = self._owner.get(pid)
        if run is not None or pid in self.strangers:
            return run
        p = procfs.read_stat(pid)
        if p is not None:
            run = self.by_root.get(p.sid) or self.by_root.get(p.pgid)
        if run is None:
            env = procfs.read_environ(pid) or {}
            if env.get("MB_NODE") == self.node and env.get("MB_HOME") == self.home:
                run = self._by_display.get(env.get("MB_JOBID", ""))
        if run is None:
            self.strangers[pid] = set(self.jobs)
        else:
            self.own(pid, run)
        return run

    def scan(self) -> ProcTable:
        """Read every process and place the children we adopted since last time."""
        table = ProcTable.scan()
        for pid in table.children(self.mypid):
            if pid not in self.by_root:
                self.place(pid)
        return table

    def tree(self, run: Run, table: ProcTable) -> set[int]:
        """Every process of ``run`` alive (or a zombie) in ``table``; owns them."""
        seeds = {p for p in run.pids if p in table}
        if run.cg is not None:
            # No process leaves its cgroup: it is the whole job, setsid or not.
            seeds |= {p for p in run.cg.procs() if p in table}
        elif run.status is None:
            seeds |= table.members(run.pid)
        else:
            # Everything left was adopted by us (placed by :meth:`scan`) or descends
            # from something that was. Session and group ids are not used: the
            # reaped top process's pid may already be a stranger's.
            seeds.discard(run.pid)
        tree = table.subtree(seeds)
        for pid in tree:
            if pid not in self._owner:
                self.own(pid, run)
        return tree


def ended_report(
    run: Run,
    end_time: float | None = None,
    unseen: str = "re-adopted by a restarted node daemon",
) -> JobEnded:
    """The JobEnded for a finished run, following PBS's exit status rules
    (``unseen``: why a re-adopted run's exit status is unknown)."""
    status = run.status
    exit_status: int | None = None
    sig: int | None = None
    comments = [run.comment] if run.comment else []
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        exit_status = 256 + sig
    elif status is not None:
        exit_status = os.WEXITSTATUS(status)
    if run.kill_reason is not None:
        result = run.kill_reason
    elif run.adopted and status is None:
        # Its top process was reaped by whoever inherited it while no daemon
        # listened: it ended by itself, how is not known. Not a success: an
        # afterok dependent must not run on a failure nobody saw (Slurm says
        # NODE_FAIL when the daemon that would have known is gone). Not run
        # again either: it did run, perhaps to the end.
        result = JobResult.NODE_FAIL
        comments.append(f"{unseen}; exit status unknown")
    elif exit_status == 0:
        result = JobResult.COMPLETED
    else:
        result = JobResult.FAILED
    if sig is not None and run.kill_reason is None:
        comments.append(f"killed by signal {_signal_name(sig)}")
    if run.leftovers:
        comments.append(f"{run.leftovers} leftover process(es) killed")
    return JobEnded(
        job=run.spec.job,
        result=result,
        exit_status=exit_status,
        signal=sig,
        end_time=time.time() if end_time is None else end_time,
        cputime_s=round(run.cputime_s, 6),
        maxrss_kb=run.maxrss_kb,
        comment="; ".join(comments),
        reruns=run.spec.reruns,
        # Killed by its node stopping (mb down): it may run again.
        requeue=run.kill_reason is JobResult.NODE_FAIL,
    )


def failed_report(
    job: int, result: JobResult, comment: str, reruns: int = 0, requeue: bool = False
) -> JobEnded:
    """The JobEnded for a job that never ran here (``reruns``: which run;
    ``requeue``: refused by a stopping node, it may run elsewhere)."""
    return JobEnded(
        job=job,
        result=result,
        exit_status=None,
        signal=None,
        end_time=time.time(),
        cputime_s=0.0,
        maxrss_kb=0,
        comment=comment,
        reruns=reruns,
        requeue=requeue,
    )


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
