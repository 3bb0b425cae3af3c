"""The event loop: replays jobs through an unmodified policy, one pass per instant.

Events are job arrivals (trace submit times, in (submit, job id) order) and job
ends (a heap of start + run time). At each instant that has events:

1. every job end at that instant is applied (its CPUs and memory come back),
2. every arrival at that instant joins the queue, in (submit, id) order,
3. one scheduling pass runs: a :class:`ClusterSnapshot` is built and handed to
   ``policy.plan``, and the plan's starts are applied with the server's rules
   (the job is queued, the named nodes are distinct, exist and have the CPUs and
   memory free now). A start that breaks them is a policy bug: :class:`PlanRejected`.

The pass is skipped when the queue is empty, and when it is *quiet*
(:mod:`minibatch.sim.quiet`): provably without a start, a resize or a prediction
to keep. A job runs for its trace run time (``kill_at_walltime`` cuts it at
its requested time); the policy only ever sees requested times, and a running job
past its requested end counts as ending now (``RunningView.expected_end``).

Speed comes from sharing, not from a special policy API: each job's
:class:`PendingView` is made once at arrival and its :class:`RunningView` once at
start; the queue and the running set are insertion-ordered dicts, and a snapshot
gets read-only *views* of them (:class:`~minibatch.sim.views.RecordView`), so a
pass never copies or re-sorts the queue. A view refuses to be read after the
simulator has moved on. For a policy that asks (``needs``, below), the running
jobs are also kept in order of their requested end, a derived index a snapshot
gets a view of (``running_by_end``; none with malleable jobs, whose limits
move). Snapshots ask for no reasons (``reasons=False``): the simulator keeps
none.

A simulation may also start from a machine already at work (a :class:`Backlog`:
jobs running and queued at an instant, as :mod:`minibatch.sim.whatif` takes them
from a live cluster): the running ones hold their CPUs until their expected end,
the queued ones are in the queue, in its order, at the first pass.

Downtimes (:mod:`minibatch.sim.downtime`) are advance reservations for nobody:
every snapshot lists those not yet over, their starts and ends are instants with
a pass, and each start is checked against them as the server checks it.

Usage and accuracy: a policy that declares ``needs`` ("fairshare", "accuracy"; see
:mod:`minibatch.policy.ordered`) gets ``snap.fairshare`` (decayed usage per user
and group, from a :class:`~minibatch.core.usage.UsageLedger` fed with every start
and end, under the policy's ``fairshare_config``) and ``snap.accuracy`` (each
user's last 10 run/requested ratios, updated at every end), exactly as the server
computes them; one that declares "running_by_end" (EASY) gets
``snap.running_by_end``. Other policies pay nothing for it.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec

from minibatch.core.resize import RuntimeModel, refusal, start_limit
from minibatch.core.snapshot import (
    ClusterSnapshot,
    FairshareView,
    NodeView,
    PendingView,
    ReservationView,
    Resize,
    RunningView,
)
from minibatch.core.usage import (
    AccuracyLedger,
    FairshareConfig,
    FsPolicy,
    UsageLedger,
    processor_equivalent,
)
from minibatch.policy.base import Policy, mem_per_node
from minibatch.sim.backlog import Backlog, seed
from minibatch.sim.heap import frozen_heap
from minibatch.sim.machine import Machine
from minibatch.sim.malleable import Malleability, PlanRejected
from minibatch.sim.quiet import prediction_reach
from minibatch.sim.rules import check_downtimes, check_start, room
from minibatch.sim.swf import TraceJob
from minibatch.sim.views import Clock, RecordView

__all__ = ["Outcome", "PlanRejected", "RecordView", "SimStats", "Simulator"]

#: Called now and then with (jobs that arrived so far, all jobs).
Progress = Callable[[int, int], None]
#: Called after each pass with the jobs queued and the policy's seconds on it.
Meter = Callable[[int, float], None]


class Outcome(NamedTuple):
    """What happened to one job in a simulation."""

    job: TraceJob
    start: float
    end: float
    nodes: tuple[str, ...]
    #: The start the policy predicted at the job's submission instant, if any;
    #: its submit time if it started then.
    predicted: float | None
    #: Times its CPUs changed while it ran, and whether it started as a guest
    #: (on CPUs running malleable jobs lent it, SD-Policy).
    resizes: int = 0
    guest: bool = False
    #: A malleable job's CPU-seconds (its CPUs integrated over its run).
    cpu_s: float | None = None


class SimStats(NamedTuple):
    """Counters of one run, for profiling and the bench."""

    instants: int
    passes: int
    starts: int
    #: Passes skipped as quiet (:mod:`minibatch.sim.quiet`).
    quiet: int = 0


class Simulator:
    """Replay ``jobs`` on ``machine`` under ``policy``.

    Args:
        policy: any :class:`~minibatch.policy.base.Policy` (the live objects).
        machine: the simulated nodes.
        jobs: jobs from :func:`~minibatch.sim.swf.select_jobs`; ids must be unique.
        kill_at_walltime: end a job at its requested time if it runs longer.
        progress: optional callback, called every few thousand arrivals.
        reservations: downtimes (reservations without users) on the machine.
        runtime_model: how a malleable job's run time follows its CPUs
            (:mod:`minibatch.sim.malleable`).
        backlog: start from this state at its ``now`` (no job of ``jobs`` may
            arrive, no downtime start, before it) rather than an idle machine.
        skip_quiet: skip the passes that provably change nothing
            (:mod:`minibatch.sim.quiet`); False runs one at every instant with
            a queue, to check that skipping changes nothing.
        meter: optional callback, called after every pass with the number of
            queued jobs and the seconds the policy took (``mb bench sim``).
    """

    def __init__(
        self,
        policy: Policy,
        machine: Machine,
        jobs: Sequence[TraceJob],
        *,
        kill_at_walltime: bool = False,
        progress: Progress | None = None,
        reservations: Sequence[ReservationView] = (),
        runtime_model: RuntimeModel = RuntimeModel.IDEAL,
        backlog: Backlog | None = None,
        skip_quiet: bool = True,
        meter: Meter | None = None,
    ) -> None:
        if any(r.users for r in reservations):
            raise ValueError("the simulator models downtimes only (no users)")
        if backlog is not None and (
            any(j.submit < backlog.now for j in jobs)
            or any(r.start < backlog.now for r in reservations)
        ):
            raise ValueError("nothing may arrive or begin before the backlog's now")
        self.backlog = backlog
        self.reservations = tuple(sorted(reservations, key=lambda r: r.start))
        self.policy = policy
        self.machine = machine
        self.jobs = sorted(jobs, key=lambda j: (j.submit, j.id))
        queued = [job for _, job in backlog.queued] if backlog else []
        ids = [j.id for j in (*queued, *self.jobs)]
        ids += [r.id for r in backlog.running] if backlog else []
        if len(set(ids)) != len(ids):
            raise ValueError("job ids in a simulation must be unique")
        self.kill_at_walltime = kill_at_walltime
        self.runtime_model = runtime_model
        self.progress = progress
        self.meter = meter
        self.stats = SimStats(0, 0, 0)
        self.needs: frozenset[str] = getattr(policy, "needs", frozenset())
        config = getattr(policy, "fairshare_config", None)
        self.fairshare_config: FairshareConfig = (
            config if isinstance(config, FairshareConfig) else FairshareConfig()
        )
        # A malleable job may start on fewer CPUs than it asks for, and the
        # usage ledger is read at every pass: no quiet pass with either.
        malleable = any(j.request.malleable for j in (*queued, *self.jobs)) or any(
            r.malleable for r in (backlog.running if backlog else ())
        )
        self.skip_quiet = skip_quiet and not malleable and "fairshare" not in self.needs
        # Resizes move a malleable job's limit: no running jobs by end then.
        self.keep_by_end = "running_by_end" in self.needs and not malleable
        # A backlog's queue may hold jobs that never fit, or in reservations.
        reach = None if backlog else prediction_reach(policy)
        self.reach: float = math.inf if reach is None else reach

    def run(self) -> list[Outcome]:
        """Simulate to the end; one :class:`Outcome` per job, in submission order."""
        with frozen_heap():
            return self._run()

    def _run(self) -> list[Outcome]:
        # One long loop on purpose: everything it touches per event is a local
        # name, which is what keeps a pass at a few microseconds of overhead.
        jobs = self.jobs
        total = len(jobs)
        policy_plan = self.policy.plan
        clock = Clock()
        free = {n.name: n.cpus for n in self.machine.nodes}
        free_mem = {n.name: n.mem_kb for n in self.machine.nodes}
        spec = {n.name: n for n in self.machine.nodes}
        views = {
            n.name: NodeView(
                name=n.name,
                cpus=n.cpus,
                free_cpus=n.cpus,
                mem_kb=n.mem_kb,
                free_mem_kb=n.mem_kb,
            )
            for n in self.machine.nodes
        }
        node_views = tuple(views.values())
        dirty: set[str] = set()
        queue: dict[int, PendingView] = {}
        running: dict[int, RunningView] = {}
        by_id = {j.id: j for j in jobs}
        ends: list[tuple[float, int]] = []
        # Downtime boundaries are instants too: id -1 marks them in the heap.
        reservations = self.reservations
        active = reservations
        for r in reservations:
            ends.extend(((r.start, -1), (r.end, -1)))
        heapq.heapify(ends)
        # Each start's time, end and nodes, kept apart: floats in dicts, and
        # one tuple per set of nodes, leave the garbage collector nothing new
        # to go through as the run goes on (~0.05 s on SDSC-SP2).
        begun: dict[int, float] = {}
        ended: dict[int, float] = {}
        where: dict[int, tuple[str, ...]] = {}
        placements: dict[tuple[str, ...], tuple[str, ...]] = {}
        predicted: dict[int, float] = {}
        kill = self.kill_at_walltime
        progress = self.progress
        next_report = 4096
        arrived = 0
        # Accounting, only for a policy that reads it.
        fs_cfg = self.fairshare_config
        ledger = UsageLedger(fs_cfg) if "fairshare" in self.needs else None
        pe = fs_cfg.policy is FsPolicy.DEDICATEDPES
        procs, mem_total = self.machine.procs, self.machine.mem_kb
        history = AccuracyLedger() if "accuracy" in self.needs else None

        def rate_of(cpus: int, mem_kb: int | None) -> float:
            """What fairshare charges per second for these CPUs and memory."""
            if pe:
                return processor_equivalent(cpus, mem_kb, procs, mem_total)
            return float(cpus)

        def recharge(jid: int, cpus: int, t: float) -> None:
            """Fairshare charges a resized job its new CPUs from ``t`` on."""
            assert ledger is not None
            view = running[jid]
            ledger.end(jid, t)
            ledger.start(
                jid, view.user, view.group, view.account, rate_of(cpus, None), t
            )

        backlog = self.backlog
        queued = (
            []
            if backlog is None
            else seed(backlog, free, free_mem, running, queue, ends)
        )
        # The backlog's running jobs, charged from their start (in time order).
        for busy in sorted(running.values(), key=lambda b: b.start_time):
            dirty.update(name for name, _ in busy.nodes)
            if ledger is not None:
                mem = busy.mem_kb_per_node and busy.mem_kb_per_node * len(busy.nodes)
                rate = rate_of(sum(c for _, c in busy.nodes), mem)
                ledger.start(
                    busy.id, busy.user, busy.group, busy.account, rate, busy.start_time
                )
        by_id.update((j.id, j) for j in queued)
        # The running jobs in order of their keys, (start + requested time,
        # id), for ``snap.running_by_end``: a policy that wants what ends
        # first reads it rather than sorting every running job every pass.
        by_end: list[RunningView] | None = None
        keys: list[tuple[float, int]] = []
        if self.keep_by_end:
            keys = sorted((r.start_time + r.walltime, r.id) for r in running.values())
            by_end = [running[jid] for _, jid in keys]
        qos = {} if backlog is None else dict(backlog.qos)
        # Quiet passes: a heap of the queued jobs' (CPUs per node, id); the
        # entry of a job that left the queue (none comes back) stays until it
        # would hide the least.
        least = [(v.request.ppn, v.id) for v in queue.values()]
        heapq.heapify(least)
        skip_quiet, reach = self.skip_quiet, self.reach
        pool = next(iter(free)) if len(free) == 1 else None
        meter = self.meter

        def room_for(node: str, jid: int, t: float, until: float) -> int:
            span = (t, until)
            return room(node, span, active, running, free, spec, exclude=jid)[0]

        mall = Malleability(
            self.runtime_model,
            kill,
            free,
            running,
            ends,
            on_change=recharge if ledger is not None else None,
            room=room_for,
        )
        runs = mall.runs
        accounting = ledger is not None or history is not None
        no_usage = FairshareView()
        no_accuracy: dict[str, tuple[float, ...]] = {}
        instants = passes = quiet = 0
        running_jobs, queued_jobs = running.values(), queue.values()
        # Submit times, and one past the last job: never reached.
        submits = [j.submit for j in jobs]
        submits.append(math.inf)
        while arrived < total or ends:
            now = submits[arrived]
            if ends and ends[0][0] <= now:
                now = ends[0][0]
            instants += 1
            # 1. Ends first: CPUs freed at an instant are usable by arrivals at it.
            while ends and ends[0][0] <= now:
                end, jid = heapq.heappop(ends)
                if jid < 0:
                    active = tuple(r for r in reservations if r.end > now)
                    continue
                if runs and jid in runs:
                    if mall.stale(jid, end):
                        continue  # a resize moved this job's end
                    ended[jid] = end
                done = running.pop(jid, None)
                if done is None:
                    continue  # the end a resize moved, of a job now gone
                if by_end is not None:
                    at = bisect_left(keys, (done.start_time + done.walltime, jid))
                    del keys[at], by_end[at]
                if accounting:
                    if ledger is not None:
                        ledger.end(jid, end)
                    if history is not None:
                        wall = done.req_walltime or done.walltime
                        history.record(done.user, end - done.start_time, wall)
                mem = done.mem_kb_per_node
                for name, cpus in done.nodes:
                    free[name] += cpus
                    if mem is not None:
                        held = free_mem[name]
                        if held is not None:
                            free_mem[name] = held + mem
                    dirty.add(name)
                if runs or mall.borrowed:
                    mall.ended(jid, now)  # a guest's mates grow back
            # 2. Arrivals, already in (submit, id) order.
            first_new = arrived
            while submits[arrived] <= now:
                job = jobs[arrived]
                queue[job.id] = PendingView(
                    id=job.id,
                    user=job.user,
                    group=job.group,
                    request=job.request,
                    submit_time=job.submit,
                )
                if skip_quiet:
                    heapq.heappush(least, (job.request.ppn, job.id))
                arrived += 1
            clock.version += 1
            if progress is not None and arrived >= next_report:
                progress(arrived, total)
                next_report += 4096
            if not queue and not (runs and mall.growable()):
                continue  # nothing to start, predict or grow: no pass
            # Predictions are kept for arrivals only: with arrivals, a pass may be
            # quiet only if the policy cannot be predicting for them.
            if skip_quiet and (
                arrived == first_new or len(queue) - (arrived - first_new) >= reach
            ):
                widest = free[pool] if pool is not None else max(free.values())
                # Stale entries (jobs gone) matter only while they hide the least.
                while least[0][0] <= widest and least[0][1] not in queue:
                    heapq.heappop(least)
                if least[0][0] > widest:
                    quiet += 1
                    continue  # no start, resize or prediction possible
            # 3. One pass over views of the current state.
            if dirty:
                for name in dirty:
                    node = spec[name]
                    views[name] = NodeView(
                        name=name,
                        cpus=node.cpus,
                        free_cpus=free[name],
                        mem_kb=node.mem_kb,
                        free_mem_kb=free_mem[name],
                    )
                node_views = tuple(views.values())
                dirty.clear()
            snap = ClusterSnapshot(
                now=now,
                generation=clock.version,
                nodes=node_views,
                running=RecordView(running_jobs, clock),
                pending=RecordView(queued_jobs, clock),
                running_by_end=None if by_end is None else RecordView(by_end, clock),
                reservations=active,
                fairshare=no_usage if ledger is None else ledger.view(now),
                accuracy=no_accuracy if history is None else history.view(),
                qos=qos,
                reasons=False,
            )
            if meter is None:
                plan = policy_plan(snap)
            else:
                began = time.perf_counter()
                plan = policy_plan(snap)
                meter(len(queue), time.perf_counter() - began)
            passes += 1
            clock.version += 1  # the snapshot's views are stale from here on
            guests: dict[int, list[Resize]] = {}
            if plan.resizes:
                for resize in plan.resizes:
                    if resize.guest:
                        guests.setdefault(resize.guest, []).append(resize)
                    else:
                        mall.resize(resize, now)
                    if resize.job in running:
                        dirty.add(running[resize.job].nodes[0][0])
            if plan.predicted:
                for k in range(first_new, arrived):
                    jid = jobs[k].id
                    when = plan.predicted.get(jid)
                    if when is not None:
                        predicted[jid] = when
            for start in plan.starts:
                jid = start.job
                pending = queue.get(jid)
                if pending is None:
                    raise PlanRejected(f"plan starts job {jid}, which is not queued")
                req = pending.request
                names = start.nodes
                mem = mem_per_node(req)
                shrinks = guests.pop(jid, None)
                if shrinks:
                    mall.guest_start(jid, shrinks, now)
                if start.ppn or req.malleable is not None:
                    # The resource manager's rule for a start on other CPUs
                    # than requested; from here on the job holds ``ppn``.
                    ppn = start.ppn or req.ppn
                    if ppn != req.ppn:
                        why = refusal(jid, req.malleable, req.ppn, ppn, ppn)
                        if why is not None:
                            raise PlanRejected(why)
                        # Downtimes are checked against its stretched limit.
                        wall = start_limit(req.walltime, req.ppn, ppn)
                        req = msgspec.structs.replace(
                            req, ppn=ppn, walltime=math.ceil(wall)
                        )
                check_start(jid, names, req.nodes, req.ppn, mem, free, free_mem)
                if active:
                    span = (now, now + req.walltime)
                    check_downtimes(
                        jid, names, req.ppn, span, active, running, free, spec
                    )
                del queue[jid]
                if pending.submit_time == now:
                    # Started at its submission: its predicted start is now,
                    # whatever the plan may have said (applied after it).
                    predicted[jid] = now
                for name in names:
                    free[name] -= req.ppn
                    if mem is not None:
                        held = free_mem[name]
                        if held is not None:
                            free_mem[name] = held - mem
                    dirty.add(name)
                asked = pending.request
                run = by_id[jid].run_time
                if asked.malleable is not None:
                    end = mall.start(jid, asked, names[0], req.ppn, now, run)
                    walltime = runs[jid].limit
                else:
                    if kill and run > req.walltime:
                        run = float(req.walltime)
                    end = now + run
                    walltime = float(req.walltime)
                running[jid] = view = RunningView(
                    id=jid,
                    user=pending.user,
                    nodes=tuple([(name, req.ppn) for name in names]),
                    mem_kb_per_node=mem,
                    start_time=now,
                    walltime=walltime,
                    gpus_per_node=req.gpus,
                    advres=pending.advres,
                    group=pending.group,
                    account=pending.account,
                    qos=pending.qos,
                    malleable=asked.malleable,
                    ppn=asked.ppn,
                    submit_time=pending.submit_time,
                    req_walltime=asked.walltime,
                )
                if by_end is not None:
                    key = (now + walltime, jid)
                    at = bisect_left(keys, key)
                    keys.insert(at, key)
                    by_end.insert(at, view)
                if ledger is not None:
                    rate = rate_of(req.ppn * len(names), req.mem_kb)
                    ledger.start(
                        jid, pending.user, pending.group, pending.account, rate, now
                    )
                heapq.heappush(ends, (end, jid))
                begun[jid], ended[jid] = now, end
                where[jid] = placements.setdefault(names, names)
            if guests:
                raise PlanRejected(
                    f"plan shrinks jobs for guests it does not start: {guests}"
                )
        if progress is not None:
            progress(total, total)
        self.stats = SimStats(instants, passes, len(begun), quiet)
        if queue:
            raise PlanRejected(
                f"{len(queue)} job(s) never started (first: {next(iter(queue))}); "
                "the policy left them waiting on an idle machine"
            )
        resized, guest_ids, cpu_s = mall.resized, mall.guests, mall.cpu_s
        return [
            Outcome(
                j,
                begun[j.id],
                ended[j.id],
                where[j.id],
                predicted.get(j.id),
                resized.get(j.id, 0),
                j.id in guest_ids,
                cpu_s.get(j.id),
            )
            for j in (*queued, *jobs)
        ]
