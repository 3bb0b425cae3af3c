"""Supervising running jobs: reaping, ending, limits and usage.

Which processes are a job's is decided by :mod:`.ownership` (and, where the node
has them, by the job's cgroups: :mod:`.cgroup`); this module acts on it.
:class:`~.tracker.Tracker` adds the requests (launch, kill, signal, resize).

**Ending.** A job ends when its top process has been reaped *and* nothing of its
tree (or cgroup) remains: leftovers are SIGKILLed when the top process exits, as
Slurm's proctrack does, so nothing a job started outlives it. The check after the
top process exits is cheap when nothing is left (one read of its cgroup, or one
``killpg(pgid, 0)`` and one read of our children list), which keeps hundreds of
``/bin/true`` jobs a second affordable; only when something may remain is
``/proc`` scanned. A re-adopted job (not our child) ends when its top process is
gone from its cgroup, and what is left is killed the same way.

**Reaping** runs on SIGCHLD and on every sampling tick (signals coalesce).
``waitid(WNOWAIT)`` peeks at an exited child first, so a zombie not yet known can
still be placed by its session before ``wait4`` reaps it and returns its rusage. A
job's CPU time is the sum of the rusage of its top process and of every orphan of
it the daemon reaped (a process waited for by its own parent is already counted in
that parent's rusage), or its cgroup's count where larger (processes that escaped
to another parent). ``popen.returncode`` is set on reap so ``Popen`` never waits on
a pid that may have been reused.

**Limits.** Walltime: SIGTERM to the tree, SIGKILL after ``kill_grace``. Memory: in
a cgroup the kernel holds the job to ``mem`` (an OOM kill there ends the whole job
``out_of_memory``, and so does thrashing at the limit for ``_THRASH_S``, which
the kernel may take minutes to end); without one the tree's summed RSS is sampled every
``sample_interval`` and over the limit, SIGKILL. A ``Kill`` from the server does
what walltime does, with the server's result. A ``Signal`` (``qsig``) goes to every
process of the tree, as a kill does.

**Max RSS** is the cgroup's peak where there is one: what the limit applies to. Else
the larger of the sampled tree sum and the reaped processes' ``ru_maxrss``, with one
exception: at exec the kernel folds the peak RSS of the memory the process had
*before* exec into its ``ru_maxrss``, and a top process spawned by (v)fork had the
daemon's memory then: its ``ru_maxrss`` is at least the daemon's own peak and says
nothing about the job unless it is larger than that.

Reports leave through the ``on_report`` callback, so the tracker needs no socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import signal
import time
from collections import OrderedDict
from collections.abc import Callable

from minibatch.config import NodeDaemonConfig
from minibatch.core.job import JobResult
from minibatch.node import limits, procfs, reaper, records, shm
from minibatch.node.cgroup import Cgroups, JobCgroup
from minibatch.node.exits import ExitWatch
from minibatch.node.launcher import Launcher
from minibatch.node.ownership import Ownership, Run, ended_report, failed_report
from minibatch.node.procfs import ProcTable
from minibatch.protocol.messages import JobEnded, JobResized, JobStarted

log = logging.getLogger(__name__)

Report = JobStarted | JobResized | JobEnded
#: How many finished job ids are remembered, so a repeated Launch is ignored.
_FINISHED_MEMORY = 10_000
#: A job whose leftovers will not die (uninterruptible sleep) is ended anyway.
_DRAIN_LIMIT_S = 30.0
#: A job thrashing at its memory limit this long is out of memory
#: (:mod:`.thrash`): short against the minutes the kernel may take.
_THRASH_S = 2.0


class Supervisor:
    """The machinery under :class:`~.tracker.Tracker` (see the module docstring);
    its constructor is the tracker's."""

    def __init__(
        self,
        launcher: Launcher,
        config: NodeDaemonConfig,
        on_report: Callable[[Report], None],
        *,
        exclusive: bool = True,
        cgroups: Cgroups | None = None,
    ) -> None:
        self.launcher = launcher
        self.cgroups = cgroups if cgroups is not None and cgroups.enabled else None
        #: Why the node can start no job now (its spool is full), or "".
        self.trouble = ""
        self.config = config
        self._on_report = on_report
        self._exclusive = exclusive
        #: Root: no job can move its processes out of its cgroup.
        self._root = os.geteuid() == 0
        self._own = Ownership(launcher.node, launcher.home)
        #: Job id -> the run (``LaunchSpec.reruns``) that ended here last.
        self._finished: OrderedDict[int, int] = OrderedDict()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.stopping = False
        #: The jobs were left to a reaper (:meth:`Tracker.detach`): hands off.
        self.detached = False
        #: Process exits, while re-adopted jobs run (:mod:`.exits`).
        self.exits: ExitWatch | None = None

    def _arm_walltime(self, run: Run, limit: float) -> None:
        """(Re)arm the walltime kill ``limit`` seconds after the job's start."""
        run.limit = limit
        if run.walltime_timer is not None:
            run.walltime_timer.cancel()
            run.timers.remove(run.walltime_timer)
            run.walltime_timer = None
        if run.spec.walltime <= 0:
            return  # no limit at all
        assert self._loop is not None
        delay = max(0.0, run.start + limit - time.time())
        handle = self._loop.call_later(delay, self._walltime, run)
        run.walltime_timer = handle
        run.timers.append(handle)

    # ------------------------------------------------------------- reaping

    def reap(self) -> None:
        """Reap every exited child, then settle the jobs that lost a process."""
        if self.detached:
            return
        touched: set[Run] = set()
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None:
                break
            pid = info.si_pid
            run = self._own.place_zombie(pid)
            if run is None and not self._exclusive:
                # Another part of this process owns that child: leave it, and
                # ask for ours by pid instead.
                self._reap_owned(touched)
                break
            try:
                _, status, ru = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            self._own.forget(pid)
            if run is not None:
                self._reaped(run, pid, status, ru)
                touched.add(run)
        for run in touched:
            if run.status is not None and self._own.jobs.get(run.spec.job) is run:
                self._settle(run)

    def _reap_owned(self, touched: set[Run]) -> None:
        for pid, run in self._own.owned():
            try:
                got, status, ru = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got == pid:
                self._own.forget(pid)
                self._reaped(run, pid, status, ru)
                touched.add(run)

    def _reaped(
        self, run: Run, pid: int, status: int, ru: resource.struct_rusage
    ) -> None:
        run.cputime_s += ru.ru_utime + ru.ru_stime
        if pid != run.pid or ru.ru_maxrss > run.spawner_maxrss_kb:
            run.maxrss_kb = max(run.maxrss_kb, ru.ru_maxrss)
        if pid == run.pid and run.popen is not None:
            run.status = status
            run.popen.returncode = os.waitstatus_to_exitcode(status)

    # --------------------------------------------------------------- ending

    def _settle(self, run: Run, table: ProcTable | None = None) -> None:
        """The top process is gone: finish the job, or kill what is left of it."""
        if table is None:
            if not self._may_remain(run):
                self._finish(run)
                return
            table = self._own.scan()
        tree = self._own.tree(run, table)
        if not tree:
            self._finish(run)
            return
        now = time.monotonic()
        if run.drain_since is None:
            run.drain_since = now
            run.leftovers = sum(not table.procs[p].zombie for p in tree)
            if run.leftovers:
                log.info(
                    "job %s: top process exited; killing %d leftover process(es)",
                    run.spec.display_id,
                    run.leftovers,
                )
        elif now - run.drain_since > _DRAIN_LIMIT_S:
            log.warning(
                "job %s: processes %s will not die; ending the job anyway",
                run.spec.display_id,
                sorted(tree),
            )
            self._finish(run)
            return
        self._kill_pids(run, tree, table, signal.SIGKILL)

    def _may_remain(self, run: Run) -> bool:
        if run.cg is not None and run.cg.procs():
            return True
        if run.cg is not None and self._root:
            # Nothing the job started can leave its cgroup (only root moves
            # processes, and the job's own session cannot be joined from
            # outside): an empty one is the whole answer, without a look at
            # /proc. Not so under a daemon of the job's own user (delegated
            # cgroup v2): the job may move itself up the tree.
            return False
        try:
            os.killpg(run.pid, 0)
            return True  # the group lives (or its id was reused): look closer
        except ProcessLookupError:
            pass
        except PermissionError:
            return True
        if any(procfs.read_stat(pid) is not None for pid in run.pids):
            return True
        return any(
            pid not in self._own.by_root and self._own.place(pid) is run
            for pid in procfs.own_children()
        )

    def _finish(self, run: Run) -> None:
        if self._own.jobs.get(run.spec.job) is not run:
            return
        for handle in run.timers:
            handle.cancel()
        if run.popen is not None and run.popen.returncode is None:
            run.popen.returncode = -signal.SIGKILL  # never wait on that pid again
        removal = None
        if run.cg is not None:
            self._close_cgroup(run)
            removal = functools.partial(_remove_cgroup, run.cg, run.spec.display_id)
        self._own.remove(run)
        if run.adopted and not any(r.adopted for r in self._own.jobs.values()):
            self._stop_watching_exits()
        self._remember(run.spec.job, run.spec.reruns)
        self.launcher.cleanup_later(run.spec.job, removal)
        if not self._own.jobs:
            self._idle.set()
        report = ended_report(run)
        log.info(
            "job %s: ended %s (exit status %s, cpu %.2f s, max rss %d kb)",
            run.spec.display_id,
            report.result,
            report.exit_status,
            report.cputime_s,
            report.maxrss_kb,
        )
        self._emit(report)

    def _close_cgroup(self, run: Run) -> None:
        """Take the job's totals from its cgroup and clear what it left in
        ``/dev/shm`` (:mod:`.shm`)."""
        cg = run.cg
        assert cg is not None
        run.cputime_s = max(run.cputime_s, cg.cpu_seconds())
        # The kernel's peak is what the limit applies to (page cache and shared
        # memory included); RSS sums count shared library pages once per process.
        run.maxrss_kb = cg.peak_kb() or run.maxrss_kb
        if run.kill_reason is None and (cg.unlimited or cg.oom_kills() > run.oom_seen):
            # The kill (or the limit it could not be held to) ended the job
            # before a sample saw it: say so in its error file as when a
            # sample does.
            run.kill_reason = JobResult.OUT_OF_MEMORY
            run.comment = cg.unlimited or self._oom_comment(run)
            self._tell(run)
        # Only a job whose cgroup still holds shared memory left files there:
        # the scan cannot tell the job's files from other processes' of its
        # user, so it runs only when there is something of the job's to find.
        removed: list[str] = []
        if cg.shmem_bytes():
            others = {r.spec.uid for r in self._own.jobs.values() if r is not run}
            removed = shm.remove_left(run.spec.uid, run.start, busy_uids=others)
        if removed:
            log.info(
                "job %s: removed %s from /dev/shm",
                run.spec.display_id,
                ", ".join(removed),
            )

    def _oom(self, run: Run) -> tuple[JobResult, str] | None:
        """The kernel OOM-killed a process of the job, or the job has been
        thrashing at its memory limit a while: the whole job ends."""
        if run.cg is None:
            return None
        if run.cg.unlimited:
            return JobResult.OUT_OF_MEMORY, run.cg.unlimited
        kills = run.cg.oom_kills()
        if kills > run.oom_seen:
            run.oom_seen = kills
            return JobResult.OUT_OF_MEMORY, self._oom_comment(run)
        # Without a limit there is nothing to thrash against: no file to read.
        memory = run.cg.memory_now() if run.cg.memory_limit() else None
        stuck = run.thrash.look(memory, time.monotonic())
        if memory is None or stuck < _THRASH_S:
            return None
        return JobResult.OUT_OF_MEMORY, (
            f"memory limit of {memory.limit // 1024} kb exceeded: its memory filled "
            f"the limit and for {stuck:.1f} s the kernel kept evicting and "
            "reading back its files (thrashing)"
        )

    def _oom_comment(self, run: Run) -> str:
        peak = run.cg.peak_kb() if run.cg is not None else 0
        return (
            f"memory limit of {run.spec.mem_kb} kb exceeded: the kernel killed a "
            f"process of the job (peak {peak} kb)"
        )

    def _record(self, run: Run) -> None:
        """Leave what a restarted daemon needs to find the job (:mod:`.records`)."""
        rec = records.RunRecord(
            node=self.launcher.node,
            spec=run.spec,
            pid=run.pid,
            start=run.start,
            cgroup=records.dirs_of(run.cg),
            cpus=run.cpus,
            limit=run.limit,
            seq=run.seq,
        )
        try:
            records.save(self.launcher.spool, rec)
        except OSError as exc:
            log.warning("job %s: cannot record it: %s", run.spec.display_id, exc)

    def _fail(
        self,
        job: int,
        result: JobResult,
        comment: str,
        reruns: int = 0,
        requeue: bool = False,
    ) -> None:
        self._remember(job, reruns)
        self._emit(failed_report(job, result, comment, reruns, requeue))

    def _remember(self, job: int, reruns: int = 0) -> None:
        self._finished.pop(job, None)  # the newest stays last, to be kept longest
        self._finished[job] = reruns
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _emit(self, report: Report) -> None:
        try:
            self._on_report(report)
        except Exception:
            log.exception("delivering %s failed", type(report).__name__)

    # ------------------------------------------------------------- signals

    def _walltime(self, run: Run) -> None:
        if run.kill_reason is None:
            run.kill_reason = JobResult.TIMEOUT
            run.comment = f"walltime of {run.limit:.0f} s exceeded"
            log.info("job %s: %s", run.spec.display_id, run.comment)
            self._tell(run)
            self._terminate(run)

    def _tell(self, run: Run) -> None:
        line = limits.kill_line(run, self.launcher.node, time.time())
        if line:
            limits.tell_job(run, self.launcher, line)

    def _warn(self, run: Run, tree: set[int], table: ProcTable) -> None:
        """``--signal``: the job's signal, ahead of its time limit."""
        sig = run.spec.options.warn_signal
        log.info("job %s: sending signal %d before its limit", run.spec.display_id, sig)
        if run.spec.options.warn_shell_only:
            if run.status is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(run.pid, sig)
        else:
            self._kill_pids(run, tree, table, sig)

    def _terminate(self, run: Run) -> None:
        self._signal_tree(run, signal.SIGTERM)
        assert self._loop is not None
        run.timers.append(
            self._loop.call_later(
                self.config.kill_grace, self._signal_tree, run, signal.SIGKILL
            )
        )

    def _signal_tree(self, run: Run, sig: int) -> None:
        if self._own.jobs.get(run.spec.job) is not run:
            return
        table = self._own.scan()
        self._kill_pids(run, self._own.tree(run, table), table, sig)

    def _kill_pids(self, run: Run, pids: set[int], table: ProcTable, sig: int) -> None:
        # The group is signalled as a whole only while the top process holds its
        # id; once reaped (or when another reaped it), the id may be somebody
        # else's new group.
        group = run.status is None and not run.adopted
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, sig)
        for pid in pids:
            p = table.procs.get(pid)
            if p is not None and not p.zombie and not (group and p.pgid == run.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    # ------------------------------------------------------- re-adopted exits

    def _watch_exits(self, exits: ExitWatch, runs: list[Run]) -> None:
        """Take the exit statuses of the re-adopted ``runs`` from ``exits``."""
        self.exits = exits
        for run in runs:
            exits.watch(run.pid)
        if self._loop is not None:
            self._loop.add_reader(exits.fileno(), self._exited)

    def _exited(self) -> None:
        if self.exits is not None:
            self.exits.drain(self._adopted_exit)

    def _adopted_exit(self, pid: int, status: int) -> None:
        for run in list(self._own.jobs.values()):
            if run.adopted and run.pid == pid and run.status is None:
                run.status = status
                self._settle(run)

    def _stop_watching_exits(self) -> None:
        exits, self.exits = self.exits, None
        if exits is not None:
            if self._loop is not None:
                self._loop.remove_reader(exits.fileno())
            exits.close()

    # ------------------------------------------------------------ sampling

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sample_interval)
            try:
                self._tick()
            except Exception:
                log.exception("sampling the jobs' processes failed")

    def _tick(self) -> None:
        if self.detached:
            return
        self.reap()
        self._exited()
        if not self._own.jobs and not self._own.strangers:
            return
        table = self._own.scan()
        for run in list(self._own.jobs.values()):
            tree = self._own.tree(run, table)
            live = [table.procs[p] for p in tree if not table.procs[p].zombie]
            rss = sum(p.rss_kb for p in live)
            run.maxrss_kb = max(run.maxrss_kb, rss)
            run.rss_now_kb = rss
            run.cpu_now_s = run.cputime_s + sum(p.cpu_s for p in live)
            if run.status is not None:
                self._settle(run, table)
            elif run.adopted and all(p.pid != run.pid for p in live):
                # Its top process exited (reaped by whoever inherited it): what
                # is left goes, as for any job (see _settle). Its exit event,
                # or the file of the reaper that inherited it, comes after it
                # left /proc: wait a tick for them.
                self._exited()
                if self._own.jobs.get(run.spec.job) is not run:
                    continue
                if run.status is not None:
                    continue
                ended = reaper.read(self.launcher.spool, run.spec.job, run.pid)
                if ended is not None:
                    run.status = ended.status
                    self._settle(run, table)
                    continue
                if not run.exit_awaited:
                    run.exit_awaited = True
                    continue
                if not live:
                    self._finish(run)
                else:
                    run.leftovers = max(run.leftovers, len(live))
                    self._kill_pids(run, tree, table, signal.SIGKILL)
            elif run.kill_reason is None:
                why = self._oom(run) or limits.exceeded(
                    run, live, kernel_memory=run.cg is not None
                )
                if why is not None:
                    run.kill_reason, run.comment = why
                    log.info("job %s: %s", run.spec.display_id, run.comment)
                    self._kill_pids(run, tree, table, signal.SIGKILL)
                    self._tell(run)
                elif limits.warning_due(run, time.time()):
                    run.warned = True
                    self._warn(run, tree, table)
        self._own.prune(table)
        if self._exclusive:
            for pid, jobs in list(self._own.strangers.items()):
                if not jobs & self._own.jobs.keys():
                    log.warning("killing pid %d, left behind by job(s) %s", pid, jobs)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)


def _remove_cgroup(cg: JobCgroup, display_id: str) -> None:
    if not cg.remove():
        log.warning("job %s: its cgroup is not empty yet", display_id)
