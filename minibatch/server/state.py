"""The resource manager's state machine, free of IO.

:class:`ServerState` owns jobs and nodes. Each handler validates first, then
changes state, queueing the consequences instead of performing them: database
writes go to the :class:`~minibatch.server.store.Store` (committed by the service
before any reply leaves), messages for daemons to :attr:`outbox`, MQTT events to
:attr:`events`, and :attr:`wake` asks the scheduler for a pass. The service in
``service.py`` performs them, so this module is tested without sockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from minibatch.config import Config
from minibatch.core.job import (
    ACTIVE_STATES,
    DEPENDENCY_REASON,
    PENDING_STATES,
    Allocation,
    Job,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
    transition,
)
from minibatch.core.resize import refusal, start_limit
from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.core.units import format_cpu_list
from minibatch.errors import InfeasibleRequest, InvalidArgument
from minibatch.policy.base import NEVER, mem_per_node
from minibatch.protocol.messages import Kill, Launch, Message
from minibatch.protocol.scheduling import Wake
from minibatch.server import (
    admission,
    booking,
    dependencies,
    mail,
    malleable,
    requeue,
    views,
)
from minibatch.server.acctlog import Pending
from minibatch.server.history import UsageHistory
from minibatch.server.listing import Listing
from minibatch.server.nodes import Node, NodeRegistry
from minibatch.server.qos import QosTable
from minibatch.server.queue import PendingQueue
from minibatch.server.queues import QueueTable
from minibatch.server.records import job_event, launch_spec
from minibatch.server.reservations import JobCpus, ReservationBook
from minibatch.server.store import Store
from minibatch.server.submit import Caller, build_jobs, check_spec

#: Heartbeats in a row that may omit a running job before it counts as lost.
LOST_AFTER_MISSES = 3


class ServerState:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], float] = time.time,
        config: Config | None = None,
    ) -> None:
        config = config or Config()
        self.store = store
        self.clock = clock
        self.jobs: dict[int, Job] = {}
        self.arrays: dict[int, list[int]] = {}
        self.dependents: dict[int, set[int]] = {}
        self.next_id = store.next_id()
        self.generation = 0
        #: Array id -> (running tasks, queued task ids), kept until a task of
        #: the array comes, goes or changes state (views._array_counts).
        self.array_counts: dict[int, tuple[int, list[int]]] = {}
        # Facts about connections, not stored: a failed commit's rollback keeps
        # them (rollback.restore lists them; a new one belongs there too).
        self.scheduler: bytes | None = None
        self.scheduler_pid: int | None = None
        #: The policy the scheduler says it runs, and why it refused ours ("").
        self.policy_name = ""
        self.policy_refused = ""
        #: The policy it should run: ``mb policy set``, else the configuration's.
        self.policy = booking.load_policy(store, config)
        self.qos = QosTable(config)
        self.queues = QueueTable(config)
        self.queue = PendingQueue(self.queues.priority)
        #: Pending jobs with a start time (``qsub -a``), checked every second.
        self.begin_waiting: set[int] = set()
        #: Job mail due: (job, its -m letter), sent by the service.
        self.mail: list[tuple[Job, str]] = []
        #: Arrays with a ``%N`` limit on their running tasks, by array id.
        self.array_limits: dict[int, int] = {}
        #: Running and exiting jobs (they hold resources).
        self.active: set[int] = set()
        #: Jobs not finished by user (``qstat -u``), and a bare qstat's rows.
        self.by_user: dict[str, set[int]] = {}
        self.listing = Listing()
        self.snapshot_time = 0.0
        self.outbox: list[tuple[bytes, Message]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        #: PBS accounting records, written by the service once committed.
        self.accounting = Pending()
        #: Who sent the request being handled (None between requests).
        self.requestor: Caller | None = None
        #: State changed since the scheduler's last snapshot.
        self.wake = False
        #: A job released its CPUs: the plan's upcoming jobs may start.
        self.freed = False
        #: A snapshot is out and its plan has not come back yet (server clock).
        self.plan_pending_since: float | None = None
        now = clock()
        nodes = store.load_nodes()
        for node in nodes:
            # Runtime fields start afresh: allocations are rebuilt from the jobs,
            # and the node counts as down until its daemon says hello again.
            node.up, node.used, node.mem_used, node.misses = False, {}, {}, {}
            node.stopping = False
            node.route = b""
            node.last_heartbeat = now
        self.nodes = NodeRegistry(nodes, config.gpus, config.features)
        self.reservations = ReservationBook(store.load_reservations())
        self.reservations.started = {
            r.name for r in self.reservations if r.start <= now
        }
        self.history = UsageHistory(store, config.fairshare, now, self.nodes.totals)
        for job in store.load_jobs():
            if job.state is JobState.QUEUED and job.queued_since is None:
                job.queued_since = job.submit_time  # a record older than the field
            self._index(job)
            if job.state in ACTIVE_STATES:
                self.qos.started(job)
            for alloc in job.alloc:
                holder = self.nodes.nodes.get(alloc.node)
                if holder is not None:
                    for cpu in alloc.cpus:
                        holder.used[cpu] = job.id
                    mem = mem_per_node(job.request)
                    if mem is not None:
                        holder.mem_used[job.id] = mem
                    if alloc.gpus:
                        holder.gpus_used[job.id] = list(alloc.gpus)

    # ------------------------------------------------------------ helpers

    def _index(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.by_user.setdefault(job.user, set()).add(job.id)
        if job.state is JobState.QUEUED:
            self.queue.add(job)
        elif job.state in ACTIVE_STATES:
            self.active.add(job.id)
        if job.array_id is not None:
            self.arrays.setdefault(job.array_id, []).append(job.id)
            self.array_counts.pop(job.array_id, None)
            if job.options.array_limit:
                self.array_limits[job.array_id] = job.options.array_limit
        if job.options.begin is not None and job.state in PENDING_STATES:
            self.begin_waiting.add(job.id)
        if job.state is JobState.WAITING or (
            job.state is JobState.HELD and job.depends
        ):
            for dep in job.depends:
                self.dependents.setdefault(dep.job, set()).add(job.id)

    def _unindex(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        mine = self.by_user.get(job.user)
        if mine is not None:
            mine.discard(job.id)
            if not mine:
                del self.by_user[job.user]
        self.queue.discard(job.id)
        self.active.discard(job.id)
        if job.array_id is not None:
            tasks = self.arrays.get(job.array_id)
            self.array_counts.pop(job.array_id, None)
            if tasks is not None:
                tasks.remove(job.id)
                if not tasks:
                    del self.arrays[job.array_id]
                    self.array_limits.pop(job.array_id, None)

    def _move(self, job: Job, to: JobState) -> str:
        """:func:`transition`, keeping the queue and the active set in step."""
        before = job.state
        event = transition(job, to)
        if job.array_id is not None:
            self.array_counts.pop(job.array_id, None)
        now = self.clock()
        if before is JobState.QUEUED and job.queued_since is not None:
            job.eligible_s += max(0.0, now - job.queued_since)
            job.queued_since = None
        if to is JobState.QUEUED:
            job.queued_since = now
        if before is JobState.QUEUED:
            self.queue.discard(job.id)
        elif before in ACTIVE_STATES and to not in ACTIVE_STATES:
            self.active.discard(job.id)
        if to is JobState.QUEUED:
            self.queue.add(job)
        elif to in ACTIVE_STATES:
            self.active.add(job.id)
        return event

    def route(self, node: str) -> bytes:
        """Where messages for ``node`` go; empty while its daemon is unknown."""
        known = self.nodes.nodes.get(node)
        return known.route if known is not None else b""

    def changed(self) -> None:
        self.generation += 1
        self.wake = True

    def record(
        self, job: Job, event: str, detail: str = "", private: bool = False
    ) -> None:
        """Log ``event`` in the job's event log and publish it (and mail it,
        when the job asked for mail at that point). A ``private`` detail (the
        submission's arguments: ``qsub -v TOKEN=...``) stays out of the event:
        anyone may subscribe."""
        now = self.clock()
        self.store.event(job.id, now, event, detail)
        points = job.options.mail_points
        if points:
            # One mail per event: an abort that is also an end is the abort.
            letter = next((c for c in mail.letters_for(job, event) if c in points), "")
            if letter:
                self.mail.append((job, letter))
        self.events.append(
            (
                f"jobs/{job.display_id}/{event}",
                job_event(job, event, now, "" if private else detail),
            )
        )
        self.accounting.event(job, event, now)

    def publish_node(self, node: Node) -> None:
        self.nodes.published[node.name] = node.state
        self.events.append(
            (
                f"nodes/{node.name}/state",
                {"name": node.name, "state": node.state.value, "time": self.clock()},
            )
        )

    def take_wake(self, stale_after: float = 5.0) -> Message | None:
        """A ``Wake`` carrying a fresh snapshot, if the scheduler should plan now.

        Only one snapshot is out at a time: changes made while the scheduler plans
        are folded into the next one, sent when its plan arrives. A plan that never
        comes back (a scheduler that died mid-pass) stops blocking after
        ``stale_after`` seconds.
        """
        if not self.wake or self.scheduler is None:
            return None
        since = self.plan_pending_since
        if since is not None and self.clock() - since < stale_after:
            return None
        self.wake = False
        snap, delta = views.shipped(self)
        self.plan_pending_since = snap.now
        return Wake(
            generation=self.generation,
            snapshot=snap,
            policy=self.policy.name,
            params=self.policy.params,
            delta=delta,
        )

    # ------------------------------------------------------------- lookup

    def select(self, selector: str, *, finished: bool = True) -> list[Job]:
        """Jobs named by ``7``, ``7.host``, ``7[]`` (whole array) or ``7[2]``."""
        return views.select(self, selector, finished=finished)

    # ---------------------------------------------------------- submission

    def submit(
        self,
        spec: JobSpec,
        caller: Caller,
        notes: list[str] | None = None,
        test_only: bool = False,
    ) -> list[Job]:
        """Queue ``spec``'s job(s), or raise having changed nothing. ``notes``
        gets a line for each thing the submitter should know (an unknown queue
        replaced by the default, a node feature nobody has). ``test_only``
        checks everything and queues nothing (``sbatch --test-only``)."""
        notes = [] if notes is None else notes
        check_spec(spec)
        spec, caller = admission.admit(self, spec, caller, notes)
        qos = self.qos.resolve(spec.qos, notes, self.queues.strict)
        self.qos.check_walltime(qos, spec.request.walltime)
        if spec.advres:
            booking.check_advres(self, spec.advres, caller.user, spec.request)
        if qos != spec.qos:
            spec = msgspec.structs.replace(spec, qos=qos)
        outcomes = dependencies.outcomes(self, spec.depends)
        if test_only:
            return []
        now = self.clock()
        begin = spec.options.begin
        if spec.hold:
            state = JobState.HELD
        elif all(o is True for o in outcomes) and (begin is None or begin <= now):
            state = JobState.QUEUED
        else:
            state = JobState.WAITING
        jobs = build_jobs(spec, caller, self.next_id, now, state)
        self.next_id += len(jobs)
        self.store.set_next_id(self.next_id)
        for job in jobs:
            self._index(job)
            self.store.put_job(job)
            self.record(job, "submitted", job.submit_args, private=True)
            self._set_pending_reason(job)
        if False in outcomes:
            for job in jobs:
                dependencies.cancel_unsatisfiable(self, job)
        self.changed()
        return jobs

    def begin_due(self) -> None:
        """Queue the waiting jobs whose start time (``qsub -a``) has come."""
        now = self.clock()
        for jid in sorted(self.begin_waiting):
            job = self.jobs.get(jid)
            if job is None or job.state is not JobState.WAITING:
                self.begin_waiting.discard(jid)
            elif (job.options.begin or 0.0) <= now:
                self.begin_waiting.discard(jid)
                dependencies.update(self, job)

    def _set_pending_reason(self, job: Job) -> None:
        if job.state is JobState.HELD:
            job.reason = "held (user hold)"
        elif job.state is JobState.WAITING:
            waiting = [d.job for d in job.depends if d.job in self.jobs]
            ids = ", ".join(map(str, waiting))
            begin = job.options.begin
            if waiting:
                job.reason = f"{DEPENDENCY_REASON} {ids}"
            elif begin is not None and begin > self.clock():
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(begin))
                job.reason = f"not before {when} (qsub -a / --begin)"
            else:
                job.reason = "dependency"
        elif job.state is JobState.QUEUED:
            job.reason = "waiting for the scheduler"

    # ------------------------------------------------------------ control

    def cancel(self, job: Job, comment: str = "cancelled by qdel") -> None:
        job.rerun_pending = False  # a qdel after a qrerun ends the job
        self.accounting.deleted(job, self.clock(), self.requestor)
        node = self.nodes.nodes.get(job.alloc[0].node) if job.alloc else None
        if job.state in ACTIVE_STATES and node is not None and not node.up:
            # Nobody can answer the Kill now; its returning daemon kills what is
            # left, since the job is no longer running here.
            why = f"{comment}; node {node.name} is down: its daemon kills the rest"
            self.job_ended(job, JobResult.CANCELLED, comment=why)
            return
        if job.state in PENDING_STATES:
            self._finish(job, JobResult.CANCELLED, comment=comment)
        elif job.state is JobState.RUNNING:
            self._move(job, JobState.EXITING)
            job.comment = comment
            self.store.put_job(job)
            self.record(job, "exiting", comment)
            self.outbox.append(
                (
                    self.route(job.alloc[0].node),
                    Kill(job=job.id, result=JobResult.CANCELLED),
                )
            )
        elif job.state is JobState.EXITING:
            self.outbox.append(
                (
                    self.route(job.alloc[0].node),
                    Kill(job=job.id, result=JobResult.CANCELLED),
                )
            )

    def hold(self, job: Job) -> None:
        self._move(job, JobState.HELD)
        self.store.put_job(job)
        self.record(job, "held")
        self._set_pending_reason(job)
        self.changed()

    def release(self, job: Job) -> None:
        if job.state is not JobState.HELD:
            raise InvalidArgument(f"job {job.display_id} is not held")
        pending = [d for d in job.depends if d.job in self.jobs]
        later = (job.options.begin or 0.0) > self.clock()
        self._move(job, JobState.WAITING if pending or later else JobState.QUEUED)
        self.store.put_job(job)
        self.record(job, "released")
        self._set_pending_reason(job)
        self.changed()

    def altered(
        self, job: Job, name: str | None, walltime: int | None, ncpus: int | None
    ) -> tuple[str, JobRequest]:
        """A pending job's name and request after ``qalter``, or raise (nothing
        changes here)."""
        if job.state not in PENDING_STATES:
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only pending jobs can be altered"
            )
        request = job.request
        if walltime is not None:
            request = msgspec.structs.replace(request, walltime=walltime)
        if ncpus is not None:
            if request.nodes != 1:
                raise InvalidArgument("ncpus can only be altered for single-node jobs")
            request = msgspec.structs.replace(request, ppn=ncpus)
        new_name = job.name if name is None else name
        check_spec(
            JobSpec(name=new_name, workdir=job.workdir, request=request, argv=["x"])
        )
        why = self.nodes.feasible(request, job.options.features)
        if why is not None:
            raise InfeasibleRequest(f"job could never run: {why}")
        self.qos.check_walltime(job.qos, request.walltime)
        if job.advres:
            booking.check_advres(self, job.advres, job.user, request)
        return new_name, request

    def alter(
        self, job: Job, name: str | None, walltime: int | None, ncpus: int | None
    ) -> None:
        job.name, job.request = self.altered(job, name, walltime, ncpus)
        self.queue.discard(job.id)
        self.queue.add(job)
        self.store.put_job(job)
        self.record(job, "altered")
        self.changed()

    # --------------------------------------------------------- scheduling

    def snapshot(self, pending: Sequence[PendingView] | None = None) -> ClusterSnapshot:
        """What the policy plans from (see :func:`views.snapshot`)."""
        now = self.clock()
        self.snapshot_time = now
        self.queue.snapshot_taken(self.generation)
        return views.snapshot(self, now, pending)

    def start(self, job_id: int, names: tuple[str, ...], ppn: int = 0) -> str | None:
        """Validate and apply one start decision; the reason it is refused, or None.

        ``ppn`` (a malleable job only, within its range) starts it on fewer or
        more CPUs than it asked for; its time limit stretches accordingly.
        """
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.QUEUED:
            return f"job {job_id} is not queued"
        if self.qos.blocks(job.user, job.qos):
            return self.qos.reason(job.user, job.qos)
        request, limit = job.request, 0.0
        if ppn and ppn != request.ppn:
            why = refusal(job.id, request.malleable, request.ppn, ppn, ppn)
            if why is not None:
                return why
            limit = start_limit(float(request.walltime), request.ppn, ppn)
            request = msgspec.structs.replace(request, ppn=ppn)
        now = self.clock()
        chooser = None
        if self.reservations.by_name or job.advres:
            end = now + (limit or request.walltime)
            chooser = JobCpus(self.reservations, job, now, end)
            why = chooser.refusal()
            if why is not None:
                return why
        allocs = self.nodes.allocate(
            job.id, names, request, chooser, job.options.features
        )
        if isinstance(allocs, str):
            return allocs
        self.qos.started(job)
        job.first_predicted_start = self.queue.planned_start(job)
        self._move(job, JobState.RUNNING)
        job.time_limit = limit
        job.alloc, job.start_time, job.reason = allocs, self.clock(), ""
        job.predicted_start = None
        self.store.put_job(job)
        where = " ".join(f"{a.node}/{format_cpu_list(a.cpus)}" for a in allocs)
        self.record(job, "started", where)
        spec = launch_spec(job, self.nodes.nodes)
        self.outbox.append((self.route(allocs[0].node), Launch(spec=spec)))
        self.generation += 1
        return None

    def explain(self, job: Job) -> None:
        """Fill a queued job's reason and predicted start from the last plan."""
        if job.state is JobState.QUEUED:
            self.queue.explain(job)
            blocked = self.qos.reason(job.user, job.qos)
            if not self.queues.started(job.queue):
                blocked = f"queue {job.queue} is stopped (started = false)"
            blocked = blocked or views.array_limit_reason(self, job)
            if job.reason == NEVER:
                # Admitted for nodes it no longer has (mb up with another layout).
                why = self.nodes.feasible(job.request, job.options.features)
                if why is not None:
                    blocked = f"can never run on this cluster's nodes: {why}"
            if blocked:
                job.reason, job.predicted_start = blocked, None

    # --------------------------------------------------------------- ends

    def job_ended(
        self,
        job: Job,
        result: JobResult,
        *,
        exit_status: int | None = None,
        signal: int | None = None,
        end_time: float | None = None,
        cputime_s: float | None = None,
        maxrss_kb: int | None = None,
        comment: str = "",
    ) -> None:
        if job.rerun_pending:  # qrerun killed it: queued again (requeue.py)
            requeue.back_to_queue(self, job, result, exit_status, comment)
            return
        job.exit_status, job.signal = exit_status, signal
        job.cputime_s, job.maxrss_kb = cputime_s, maxrss_kb
        self._finish(job, result, end_time=end_time, comment=comment)

    def _finish(
        self,
        job: Job,
        result: JobResult,
        *,
        end_time: float | None = None,
        comment: str = "",
    ) -> None:
        was_active = job.state in ACTIVE_STATES
        self._move(job, JobState.FINISHED)
        job.result, job.end_time = result, end_time or self.clock()
        if was_active:
            if self.qos.ended(job):
                self.queue.unblocked()
            self.history.job_ended(job)
            self.freed = True
        job.reason, job.predicted_start = "", None
        if comment:
            job.comment = comment
        self.nodes.release(job.id, job.alloc)
        if job.resizing:
            # Resizes the node never confirmed did not happen, as far as anyone
            # knows: accounting keeps what it held before the first of them.
            first = job.resizing[0]
            job.alloc = [Allocation(first.node, first.before)]
            job.time_limit, job.resizing = first.limit, []
        if was_active and job.borrowed:
            malleable.give_back(self, job)
        self._unindex(job)
        self.store.finish_job(job)
        self.record(job, "finished", result.value + (f": {comment}" if comment else ""))
        self.changed()
        for dep_id in sorted(self.dependents.pop(job.id, ())):
            dependent = self.jobs.get(dep_id)
            if dependent is not None:
                dependencies.update(self, dependent)
