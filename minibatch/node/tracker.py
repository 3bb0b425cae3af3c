"""Supervising running jobs: reaping, ending, limits and usage.

Which processes are a job's is decided by :mod:`.ownership`; this module acts on it.

**Ending.** A job ends when its top process has been reaped *and* nothing of its
tree remains: leftovers are SIGKILLed when the top process exits, as Slurm's
proctrack does, so nothing a job started outlives it. The check after the top
process exits is cheap when nothing is left (one ``killpg(pgid, 0)`` and one read
of our children list), which keeps hundreds of ``/bin/true`` jobs a second
affordable; only when something may remain is ``/proc`` scanned.

**Reaping** runs on SIGCHLD and on every sampling tick (signals coalesce).
``waitid(WNOWAIT)`` peeks at an exited child first, so a zombie not yet known can
still be placed by its session before ``wait4`` reaps it and returns its rusage. A
job's CPU time is the sum of the rusage of its top process and of every orphan of
it the daemon reaped; a process waited for by its own parent is already counted in
that parent's rusage, so the sum is exact. ``popen.returncode`` is set on reap so
``Popen`` never waits on a pid that may have been reused.

**Limits.** Walltime: SIGTERM to the tree, SIGKILL after ``kill_grace``. Memory: the
tree's summed RSS is sampled every ``sample_interval``; over the limit, SIGKILL.
A ``Kill`` from the server does what walltime does, with the server's result.
A ``Signal`` (``qsig``) goes to every process of the tree, as a kill does.

**Max RSS** is the larger of the sampled tree sum and the reaped processes'
``ru_maxrss``, with one exception. At exec the kernel folds the peak RSS of the
memory the process had *before* exec into its ``ru_maxrss``, and a top process
spawned by (v)fork had the daemon's memory then: its ``ru_maxrss`` is at least the
daemon's own peak and says nothing about the job unless it is larger than that.

Reports leave through the ``on_report`` callback, so the tracker needs no socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import time
from collections import OrderedDict
from collections.abc import Callable

from minibatch.config import NodeDaemonConfig
from minibatch.core.job import JobResult
from minibatch.core.units import format_cpu_list
from minibatch.node import limits, procfs, resizer
from minibatch.node.launcher import Launcher, LaunchError
from minibatch.node.ownership import Ownership, Run, ended_report, failed_report
from minibatch.node.procfs import ProcTable
from minibatch.protocol.messages import (
    JobEnded,
    JobResized,
    JobStarted,
    JobUsage,
    LaunchSpec,
)

log = logging.getLogger(__name__)

Report = JobStarted | JobResized | JobEnded
#: How many finished job ids are remembered, so a repeated Launch is ignored.
_FINISHED_MEMORY = 10_000
#: A job whose leftovers will not die (uninterruptible sleep) is ended anyway.
_DRAIN_LIMIT_S = 30.0


class Tracker:
    """Launches, supervises and reports the jobs of one node.

    Args:
        launcher: spawns top processes.
        config: kill grace and sampling interval.
        on_report: receives every JobStarted and JobEnded, synchronously.
        exclusive: every child of this process is a job's (true in the daemon).
            Then unknown zombies are reaped and strangers are killed once every job
            that could have left them has ended. Tests run the tracker inside
            pytest, whose other children must be left alone: False.
    """

    def __init__(
        self,
        launcher: Launcher,
        config: NodeDaemonConfig,
        on_report: Callable[[Report], None],
        *,
        exclusive: bool = True,
    ) -> None:
        self.launcher = launcher
        self.config = config
        self._on_report = on_report
        self._exclusive = exclusive
        self._own = Ownership(launcher.node, launcher.home)
        #: Job id -> the run (``LaunchSpec.reruns``) that ended here last.
        self._finished: OrderedDict[int, int] = OrderedDict()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.stopping = False

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGCHLD, self.reap)
        # A burst of job exits overflows asyncio's self-pipe with SIGCHLD bytes.
        # Losing some is harmless (one reap collects every exited child), but
        # Python would print a warning for each one.
        fd = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
        self._ticker = self._loop.create_task(self._tick_forever())

    async def close(self) -> None:
        """Stop supervising; SIGKILL and reap whatever still runs (no reports)."""
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        runs = list(self._own.jobs.values())
        for run in runs:
            self._signal_tree(run, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while self._own.owned() and time.monotonic() < deadline:
            self._reap_owned(set())
            for pid, _ in self._own.owned():
                if procfs.read_stat(pid) is None:
                    self._own.forget(pid)
            await asyncio.sleep(0.02)
        for run in runs:
            if run.popen.returncode is None:
                run.popen.returncode = -signal.SIGKILL
            self._own.remove(run)

    def running(self) -> list[int]:
        return sorted(self._own.jobs)

    async def stop_all(self, result: JobResult, comment: str) -> None:
        """Kill every job (TERM, grace, KILL) and wait until all have ended."""
        self.stopping = True
        for job in self.running():
            self.kill(job, result, comment)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.config.kill_grace + 2.0)
        for run in list(self._own.jobs.values()):
            self._signal_tree(run, signal.SIGKILL)
            self._finish(run)

    # ------------------------------------------------------------ requests

    def launch(self, spec: LaunchSpec) -> None:
        """Start ``spec``; a job already running or recently ended is ignored
        (unless this is a later run of it: ``qrerun``)."""
        ended = self._finished.get(spec.job, -1)
        if spec.job in self._own.jobs or ended >= spec.reruns:
            log.info("job %s: launch repeated, ignored", spec.display_id)
            return
        if self.stopping:
            self._fail(
                spec.job,
                JobResult.NODE_FAIL,
                "node daemon stopping",
                spec.reruns,
                requeue=True,
            )
            return
        try:
            popen = self.launcher.spawn(spec)
        except LaunchError as exc:
            log.warning("job %s: cannot start: %s", spec.display_id, exc)
            self._fail(spec.job, JobResult.FAILED, f"cannot start: {exc}", spec.reruns)
            return
        except Exception as exc:
            # A bug, but the server must still hear that the job will not run.
            log.exception("job %s: launching failed", spec.display_id)
            why = f"node daemon error: {exc!r}"
            self._fail(spec.job, JobResult.FAILED, why, spec.reruns)
            return
        run = Run(spec, popen, popen.pid, time.time(), cpus=list(spec.cpus))
        run.spawner_maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._own.add(run)
        self._idle.clear()
        self._arm_walltime(run, spec.walltime)
        log.info("job %s: started pid %d", spec.display_id, run.pid)
        self._emit(JobStarted(job=spec.job, pid=run.pid, time=run.start))

    def kill(self, job: int, result: JobResult, comment: str = "") -> None:
        """TERM the job's tree now, KILL it after the grace period."""
        run = self._own.jobs.get(job)
        if run is None:
            if job not in self._finished:
                # The server believes we run it and we do not: close it there.
                self._fail(job, result, "not running on this node")
            return
        if run.kill_reason is not None:
            return  # already being killed; the first reason stands
        run.kill_reason, run.comment = result, comment
        log.info("job %s: killing (%s)", run.spec.display_id, result)
        self._tell(run)
        self._terminate(run)

    def signal(self, job: int, sig: int) -> None:
        """``qsig``: send ``sig`` to every process of the job. Not a kill: what
        the signal does is the job's business (it may end it, or not)."""
        run = self._own.jobs.get(job)
        if run is None or run.status is not None:
            log.info("job %d: signal %d for a job not running here, ignored", job, sig)
            return
        log.info("job %s: sending signal %d (qsig)", run.spec.display_id, sig)
        self._signal_tree(run, sig)

    def usage(self) -> list[JobUsage]:
        """Each running job's CPU time and resident memory at the last sample."""
        return [
            JobUsage(run.spec.job, round(run.cpu_now_s, 2), run.rss_now_kb)
            for run in self._own.jobs.values()
        ]

    def resize(
        self, job: int, cpus: list[int], time_limit: float, seq: int = 0
    ) -> None:
        """Confine the job to ``cpus`` (node ids), tell it, and answer with a
        ``JobResized``. A job not running here, or being killed, is answered
        with an error (and the CPUs it runs on, if any); a resize already
        applied (a repeat after a server restart) is answered again."""
        run = self._own.jobs.get(job)
        if run is None:
            why = "the job is not running on this node"
            self._emit(
                JobResized(job=job, cpus=[], time=time.time(), error=why, seq=seq)
            )
            return
        if run.status is not None or run.kill_reason is not None:
            why = "the job is ending"
            self._emit(
                JobResized(job=job, cpus=run.cpus, time=time.time(), error=why, seq=seq)
            )
            return
        if seq and seq <= run.seq:
            self._emit(
                JobResized(job=job, cpus=run.cpus, time=time.time(), seq=run.seq)
            )
            return
        physical = self.launcher.physical_cpus(cpus)
        # The last read of the tree (the one that found no new thread) is also
        # who is told: one /proc scan less per resize.
        tree: list[int] = []

        def read_tree() -> list[int]:
            tree[:] = self._tree_now(run)
            return tree

        try:
            moved = resizer.set_mask(read_tree, physical)
        except resizer.ResizeRefused as exc:
            log.warning("job %s: resize refused: %s", run.spec.display_id, exc)
            self._emit(
                JobResized(
                    job=job, cpus=run.cpus, time=time.time(), error=str(exc), seq=seq
                )
            )
            return
        now = time.time()
        run.cpus, run.seq = list(cpus), seq
        try:
            resizer.write_cpuset(self.launcher.cpuset_path(job), physical)
        except OSError as exc:
            log.warning("job %s: cannot write its CPU list: %s", job, exc)
        signalled = resizer.notify(tree, self.launcher.signal)
        self._arm_walltime(run, time_limit)
        log.info(
            "job %s: resized to CPUs %s (%d threads moved, %d processes told)",
            run.spec.display_id,
            format_cpu_list(physical),
            moved,
            len(signalled),
        )
        self._emit(JobResized(job=job, cpus=list(cpus), time=now, seq=seq))

    def _tree_now(self, run: Run) -> list[int]:
        table = self._own.scan()
        return [p for p in self._own.tree(run, table) if not table.procs[p].zombie]

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
        if pid == run.pid:
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
        if run.popen.returncode is None:
            run.popen.returncode = -signal.SIGKILL  # never wait on that pid again
        self._own.remove(run)
        self._remember(run.spec.job, run.spec.reruns)
        self.launcher.cleanup(run.spec.job)
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
        # id; once reaped, the id may be somebody else's new group.
        group = run.status is None
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, sig)
        for pid in pids:
            p = table.procs.get(pid)
            if p is not None and not p.zombie and not (group and p.pgid == run.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    # ------------------------------------------------------------ sampling

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sample_interval)
            try:
                self._tick()
            except Exception:
                log.exception("sampling the jobs' processes failed")

    def _tick(self) -> None:
        self.reap()
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
            elif run.kill_reason is None:
                why = limits.exceeded(run, live)
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
