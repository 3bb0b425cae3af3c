"""The requests a node daemon acts on for its jobs: launch, kill, signal, resize,
usage, and at its own start and stop, re-adopting or leaving jobs in their cgroups.

The supervision itself (reaping, ending, limits) is :mod:`.supervisor`'s.
Reports leave through the ``on_report`` callback, so the tracker needs no socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import time

from minibatch.core.job import JobResult
from minibatch.core.units import format_cpu_list
from minibatch.node import procfs, reaper, records, resizer
from minibatch.node.cgroup import JobCgroup
from minibatch.node.exits import ExitWatch
from minibatch.node.identity import LaunchError, describe_os_error
from minibatch.node.ownership import Run, ended_report, failed_report
from minibatch.node.supervisor import Report, Supervisor
from minibatch.protocol.messages import (
    JobEnded,
    JobResized,
    JobStarted,
    JobUsage,
    LaunchSpec,
)

__all__ = ["Report", "Tracker"]

log = logging.getLogger(__name__)
#: How long a restarted daemon waits for a reaper to write the end of a job
#: whose top process it has not reaped yet.
_REAPER_WAIT_S = 2.0


def _top(pids: list[int]) -> int:
    """The top process of a job's cgroup: the one whose parent is outside."""
    inside = set(pids)
    for pid in pids:
        p = procfs.read_stat(pid)
        if p is not None and p.ppid not in inside:
            return pid
    return pids[0]


class Tracker(Supervisor):
    """Launches, supervises and reports the jobs of one node.

    Args:
        launcher: spawns top processes.
        config: kill grace and sampling interval.
        on_report: receives every JobStarted and JobEnded, synchronously.
        exclusive: every child of this process is a job's (true in the daemon).
            Then unknown zombies are reaped and strangers are killed once every job
            that could have left them has ended. Tests run the tracker inside
            pytest, whose other children must be left alone: False.
        cgroups: each job's cgroups (None: affinity and sampling only).
    """

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
            if run.popen is not None and run.popen.returncode is None:
                run.popen.returncode = -signal.SIGKILL
            self._own.remove(run)
        self.launcher.flush()

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

    def detach(self) -> dict[int, int]:
        """Stop supervising, leaving every job running in its cgroups for the
        next daemon to re-adopt (``mb down --keep-running``). Returns the top
        processes that are our children (pid -> job), whose ends a
        :mod:`~minibatch.node.reaper` must keep."""
        # Their ends are the reaper's to keep from now on: reaping here would
        # take them (and pass them to nobody), even by a SIGCHLD queued before.
        self.detached = True
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGCHLD)
        if self._ticker is not None:
            self._ticker.cancel()
        tops: dict[int, int] = {}
        for run in list(self._own.jobs.values()):
            for handle in run.timers:
                handle.cancel()
            if run.popen is not None:
                # Never waited on again by this process: the reaper it
                # becomes waits for it.
                run.popen.returncode = -1
                if run.status is None:
                    tops[run.pid] = run.spec.job
            if run.status is not None:
                # Ended, its leftovers not yet gone: say how, now.
                end = reaper.ExitRecord(pid=run.pid, status=run.status, end=time.time())
                try:
                    reaper.write(self.launcher.spool, run.spec.job, end)
                except OSError as exc:
                    job = run.spec.display_id
                    log.warning("job %s: cannot keep its end: %s", job, exc)
            self._own.remove(run)
        self._idle.set()
        return tops

    def recover(self) -> tuple[list[int], list[int]]:
        """Before the first hello: re-adopt the jobs an earlier daemon of this
        node left running in their cgroups, and report the others: ended by
        themselves meanwhile (their cgroup is empty; how is known if that
        daemon became their reaper), or killed now (without cgroups they
        cannot be supervised; they may run again), or killed by an ``mb down``
        meanwhile (as a stopping daemon reports them). Returns (re-adopted,
        reported) job ids."""
        adopted: list[int] = []
        killed: list[int] = []
        left = records.load_all(self.launcher.spool, self.launcher.node)
        # Listening from before the first look at a job's processes: an exit
        # cannot fall between that look and the subscription.
        exits = ExitWatch.open() if left and self.cgroups is not None else None
        # Only a top process still there is watched: a pid gone by now may be
        # reused, and a guessed top (pid 0 recorded) may be a descendant.
        watched: list[Run] = []
        for rec in left:
            cg = JobCgroup.at(rec.cgroup) if self.cgroups else None
            inside = cg.procs() if cg is not None else []
            if cg is not None and inside:
                run = Run(
                    rec.spec,
                    None,
                    rec.pid or _top(inside),
                    rec.start,
                    cg=cg,
                    adopted=True,
                    cpus=list(rec.cpus),
                    seq=rec.seq,
                )
                run.oom_seen = cg.oom_kills()
                self._own.add(run)
                self._idle.clear()
                self._arm_walltime(run, rec.limit or rec.spec.walltime)
                if rec.pid and rec.pid in inside:
                    watched.append(run)
                adopted.append(rec.spec.job)
                log.info("job %s: re-adopted (pid %d)", rec.spec.display_id, rec.pid)
                continue
            ended = self._exit_of(rec)
            n = procfs.kill_job_remains(rec.pid, rec.spec.uid, cg)
            self.launcher.cleanup(rec.spec.job)
            killed.append(rec.spec.job)
            self._remember(rec.spec.job, rec.spec.reruns)
            if rec.cgroup and rec.pid and not n:
                # Its cgroup is empty, or gone: removed by the earlier daemon
                # when the job ended, before that daemon could report it.
                log.info("job %s: ended while no daemon ran", rec.spec.display_id)
                self._emit(self._ended_unseen(rec, cg, ended))
                if cg is not None:
                    cg.remove()
                continue
            if cg is not None:
                cg.remove()
            log.warning(
                "job %s: left by an earlier daemon, %d process(es) killed",
                rec.spec.display_id,
                n,
            )
            why = (
                "its node daemon restarted and could not supervise it; killed"
                if rec.pid
                else "its node daemon was killed as it started the job, which "
                "may have run"
            )
            self._emit(
                failed_report(
                    rec.spec.job, JobResult.NODE_FAIL, why, rec.spec.reruns, True
                )
            )
        for swept in records.take_swept(self.launcher.spool, self.launcher.node):
            spec = swept.record.spec
            killed.append(spec.job)
            self._remember(spec.job, spec.reruns)
            if swept.ended is not None:
                self._emit(self._ended_unseen(swept.record, None, swept.ended))
                continue
            why = "killed by mb down while its node daemon was down"
            self._emit(
                failed_report(spec.job, JobResult.NODE_FAIL, why, spec.reruns, True)
            )
        if exits is not None and watched:
            self._watch_exits(exits, watched)
        elif exits is not None:
            exits.close()
        reaper.remove_stale(self.launcher.spool)
        return adopted, killed

    def _exit_of(self, rec: records.RunRecord) -> reaper.ExitRecord | None:
        """How a job whose processes are gone ended, if the reaper its last
        daemon became saw it. Its top process may be a zombie still, the
        reaper about to write: that takes it a moment."""
        spool, job = self.launcher.spool, rec.spec.job
        deadline = time.monotonic() + _REAPER_WAIT_S
        while (ended := reaper.read(spool, job, rec.pid)) is None and rec.pid:
            top = procfs.read_stat(rec.pid)
            if top is None or not top.zombie or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return ended

    def _ended_unseen(
        self,
        rec: records.RunRecord,
        cg: JobCgroup | None,
        ended: reaper.ExitRecord | None = None,
    ) -> JobEnded:
        """The end of a job that ended while no daemon of its node ran: how,
        if a reaper kept it (``ended``); what it used is known while its
        cgroup is."""
        run = Run(rec.spec, None, rec.pid, rec.start, cg=cg, adopted=True)
        end_time = None
        unseen = "ended while its node daemon was down"
        if ended is not None:
            run.status, end_time = ended.status, ended.end
            run.comment = unseen  # kept by the reaper that daemon became
        if cg is None:
            return ended_report(run, end_time, unseen=unseen)
        run.cputime_s, run.maxrss_kb = cg.cpu_seconds(), cg.peak_kb()
        if cg.oom_kills():
            run.kill_reason = JobResult.OUT_OF_MEMORY
            run.comment = self._oom_comment(run)
        return ended_report(run, end_time, unseen=unseen)

    def adopted_pids(self) -> set[int]:
        return {p for run in self._own.jobs.values() if run.cg for p in run.cg.procs()}

    # ------------------------------------------------------------ requests

    def launch(self, spec: LaunchSpec) -> None:
        """Start ``spec``; a job already running or recently ended is ignored
        (unless this is a later run of it: ``qrerun``)."""
        spec = self.launcher.lent(spec)
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
        cpus = self.launcher.job_cores(spec)
        # A rerun's cgroup has the same name as the one its last run's end
        # is still removing.
        self.launcher.swept(spec.job)
        cg = None
        try:
            if self.cgroups is not None:
                try:
                    cg = self.cgroups.create(spec.job, cpus, spec.mem_kb)
                except OSError as exc:
                    raise LaunchError(f"cannot create its cgroup: {exc}") from exc
            placement = self.cgroups.inside(cg) if self.cgroups and cg else None
            # Taken before the fork: the job may write files before we look up.
            start = time.time()
            # Recorded before the fork too (the pid is added after it), so
            # that a daemon killed right after it leaves a trace of the job.
            first = records.RunRecord(
                node=self.launcher.node,
                spec=spec,
                pid=0,
                start=start,
                cgroup=records.dirs_of(cg),
                cpus=list(spec.cpus),
                limit=float(spec.walltime),
            )
            try:
                records.begin(self.launcher.spool, first)
            except OSError as exc:
                why = f"cannot record it: {describe_os_error(exc)}"
                raise LaunchError(why, node_trouble=True) from exc
            popen = self.launcher.spawn(spec, placement)
        except LaunchError as exc:
            if cg is not None:
                cg.remove()
            log.warning("job %s: cannot start: %s", spec.display_id, exc)
            if exc.node_trouble:
                # Not the job's fault: it goes back to the queue, and the node
                # takes no more until its spool can be written again.
                self.trouble = f"spool unusable: {exc}"
                self._fail(
                    spec.job, JobResult.NODE_FAIL, self.trouble, spec.reruns, True
                )
            else:
                why = f"cannot start: {exc}"
                self._fail(spec.job, JobResult.FAILED, why, spec.reruns)
            return
        except Exception as exc:
            # A bug, but the server must still hear that the job will not run.
            log.exception("job %s: launching failed", spec.display_id)
            why = f"node daemon error: {exc!r}"
            self._fail(spec.job, JobResult.FAILED, why, spec.reruns)
            return
        run = Run(spec, popen, popen.pid, start, cg=cg, cpus=list(spec.cpus))
        run.spawner_maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._own.add(run)
        self._idle.clear()
        self._arm_walltime(run, spec.walltime)
        try:
            records.started(self.launcher.spool, spec.job, run.pid)
        except OSError as exc:
            log.warning("job %s: cannot record its pid: %s", spec.display_id, exc)
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
        """Confine the job to ``cpus`` (node ids: the real cores behind them
        when they are virtual), tell it, and answer with a ``JobResized``. A
        job not running here, or being killed, is answered with an error (and
        the CPUs it runs on, if any); a resize already applied (a repeat after
        a server restart) is answered again."""
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
            if run.cg is not None:
                # Every thread at once; the masks below then only confirm it.
                try:
                    run.cg.set_cpus(physical)
                except OSError as exc:
                    raise resizer.ResizeRefused(f"cgroup cpuset: {exc}") from exc
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
        self._record(run)
        log.info(
            "job %s: resized to CPUs %s on cores %s (%d threads moved, %d "
            "processes told)",
            run.spec.display_id,
            format_cpu_list(cpus),
            format_cpu_list(physical),
            moved,
            len(signalled),
        )
        self._emit(JobResized(job=job, cpus=list(cpus), time=now, seq=seq))

    def _tree_now(self, run: Run) -> list[int]:
        table = self._own.scan()
        return [p for p in self._own.tree(run, table) if not table.procs[p].zombie]
