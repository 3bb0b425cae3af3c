"""Request handlers: one function per request type, in an explicit table.

Each handler checks permissions and arguments before it changes anything, so a
refused request changes nothing. The caller's identity is the socket's peer
credentials (see :func:`~minibatch.server.submit.parse_peer`). Daemon messages
(nodes, the scheduler) are accepted only from root or the cluster's owner.
"""

from __future__ import annotations

from minibatch.core.job import ACTIVE_STATES, PENDING_STATES, Job, JobState
from minibatch.errors import InvalidArgument, NotFound, PermissionDenied
from minibatch.protocol.messages import (
    Alter,
    Heartbeat,
    JobControl,
    JobEnded,
    JobList,
    JobResized,
    JobRows,
    JobStarted,
    Message,
    NodeHello,
    NodeList,
    Ok,
    QueryJobs,
    QueryNodes,
    ServerStatus,
    SetNodeOffline,
    Status,
    Submit,
    Submitted,
)
from minibatch.protocol.scheduling import (
    ApplyPlan,
    GetSnapshot,
    PlanResult,
    SchedHello,
    SnapshotReply,
)
from minibatch.server import admin, jobops, liveness, malleable, requeue, views
from minibatch.server.access import (
    Context,
    Handler,
    need_caller,
    need_daemon,
    visible,
)
from minibatch.server.records import pass_event
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

__all__ = ["HANDLERS", "Context", "Handler"]


def _may_control(ctx: Context, caller: Caller | None, job: Job) -> None:
    c = need_caller(caller)
    if c.uid != job.uid and not ctx.is_operator(c):
        raise PermissionDenied(
            f"job {job.display_id} belongs to {job.user}, not {c.user}"
        )


def status(
    state: ServerState, ctx: Context, caller: Caller | None, ident: bytes, msg: Status
) -> Message:
    counts: dict[str, int] = {}
    for job in state.jobs.values():
        counts[job.state.value] = counts.get(job.state.value, 0) + 1
    return ServerStatus(
        pid=ctx.pid,
        endpoint=ctx.endpoint,
        mqtt_url=ctx.mqtt_url,
        policy=state.policy.name,
        nodes={n.name: n.state.value for n in state.nodes.nodes.values()},
        scheduler_pid=state.scheduler_pid,
        jobs=counts,
        events=ctx.event_stats(),
    )


def submit(
    state: ServerState, ctx: Context, caller: Caller | None, ident: bytes, msg: Submit
) -> Message:
    notes: list[str] = []
    jobs = state.submit(msg.spec, need_caller(caller), notes, msg.test_only)
    if msg.test_only:
        return Submitted(ids=[], display="", notes=notes)
    display = f"{jobs[0].id}[]" if msg.spec.array else str(jobs[0].id)
    return Submitted(ids=[j.id for j in jobs], display=display, notes=notes)


def query_jobs(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: QueryJobs,
) -> Message:
    if msg.selectors:
        found: dict[int, Job] = {}
        for sel in msg.selectors:
            for job in state.select(sel, finished=True):
                found[job.id] = job
        jobs = sorted(found.values(), key=lambda j: j.id)
    else:
        if msg.rows and msg.active and not msg.finished:
            if msg.alt:
                return JobRows(rows=state.listing.alt_rows(state, msg.user))
            if msg.user is None:
                return JobRows(rows=state.listing.rows(state))
        jobs = []
        if msg.active:
            mine = state.jobs if msg.user is None else state.by_user.get(msg.user, ())
            jobs = [state.jobs[i] for i in mine]
        if msg.finished:
            jobs += state.store.finished_jobs(user=msg.user, since=msg.since)
        jobs.sort(key=lambda j: j.id)
    for job in jobs:
        state.explain(job)
    return JobList(jobs=[visible(ctx, caller, job) for job in jobs])


def job_control(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: JobControl,
) -> Message:
    if msg.each:  # PBS's way: each id on its own
        return jobops.job_control(state, ctx, caller, msg)
    if msg.action not in ("cancel", "hold", "release"):
        raise InvalidArgument(f"unknown job action {msg.action!r}")
    if not msg.selectors:
        raise InvalidArgument("no job id given")
    jobs: list[Job] = []
    for sel in msg.selectors:
        jobs.extend(state.select(sel, finished=False))
    for job in jobs:
        _may_control(ctx, caller, job)
        if msg.action == "hold" and job.state not in (
            JobState.QUEUED,
            JobState.WAITING,
        ):
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only pending jobs can be held"
            )
        if msg.action == "release" and job.state is not JobState.HELD:
            raise InvalidArgument(f"job {job.display_id} is not held")
    for job in jobs:
        if msg.action == "cancel":
            state.cancel(job)
        elif msg.action == "hold":
            state.hold(job)
        else:
            state.release(job)
    return JobList(jobs=jobs)


def alter(
    state: ServerState, ctx: Context, caller: Caller | None, ident: bytes, msg: Alter
) -> Message:
    """Every job is checked before any changes, so a refusal changes nothing."""
    jobs = state.select(msg.selector, finished=False)
    resize: list[Job] = []
    for job in jobs:
        _may_control(ctx, caller, job)
        if job.state in PENDING_STATES:
            state.altered(job, msg.name, msg.walltime, msg.ncpus)
        elif job.state is JobState.RUNNING and job.request.malleable is not None:
            resize.append(job)
        else:
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only pending jobs can be "
                "altered (and the ncpus of a running malleable job)"
            )
    if resize:
        target = _resize_target(state, ctx, caller, resize, msg)
    for job in jobs:
        if job.state in PENDING_STATES:
            state.alter(job, msg.name, msg.walltime, msg.ncpus)
    if resize:
        cause = f"qalter by {need_caller(caller).user}"
        why = malleable.resize(state, resize[0], target, cause)
        assert why is None, why  # checked above, nothing changed since
    return JobList(jobs=jobs)


def _resize_target(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    jobs: list[Job],
    msg: Alter,
) -> int:
    """The CPUs ``qalter`` asks a running malleable job to run on, or raise.

    One running job per request: each resize is checked against the CPUs free
    now, so two could not both be checked before either is applied. Only an
    operator may grow a job: a user shrinks theirs (within its range), as Slurm
    lets users shrink and not grow, since growing would take CPUs ahead of the
    queue.
    """
    if len(jobs) > 1:
        raise InvalidArgument(
            f"{msg.selector} names {len(jobs)} running jobs: resize them one at a time"
        )
    job = jobs[0]
    if msg.name is not None or msg.walltime is not None or msg.ncpus is None:
        raise InvalidArgument(
            f"job {job.display_id} is running: only its ncpus can be altered"
        )
    held = len(job.alloc[0].cpus) if job.alloc else 0
    if msg.ncpus > held and not ctx.is_operator(caller):
        cpus = "1 CPU" if held == 1 else f"{held} CPUs"
        raise PermissionDenied(
            f"only operators may grow a running job; you may shrink job "
            f"{job.display_id} (it holds {cpus})"
        )
    why = malleable.check(state, job, msg.ncpus)
    if why is not None:
        raise InvalidArgument(why)
    return msg.ncpus


def query_nodes(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: QueryNodes,
) -> Message:
    nodes = state.nodes.nodes
    for name in msg.names:
        if name not in nodes:
            raise NotFound(f"unknown node {name}")
    names = msg.names or list(nodes)
    return NodeList(nodes=[nodes[n].info() for n in names])


def set_node_offline(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: SetNodeOffline,
) -> Message:
    if not ctx.is_operator(caller):
        raise PermissionDenied(
            "only operators may take nodes offline or bring them back"
        )
    nodes = state.nodes.nodes
    for name in msg.names:
        if name not in nodes:
            raise NotFound(f"unknown node {name}")
    for name in msg.names:
        liveness.set_offline(state, nodes[name], msg.offline, msg.comment)
    return NodeList(nodes=[nodes[n].info() for n in msg.names])


def sched_hello(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: SchedHello,
) -> Message:
    need_daemon(ctx, caller)
    state.policy_name = msg.policy  # what it runs now (it may have switched)
    state.policy_refused = msg.refused
    if (state.scheduler, state.scheduler_pid) == (ident, msg.pid):
        return Ok()  # the same scheduler checking in: nothing else changes
    state.scheduler, state.scheduler_pid = ident, msg.pid
    state.queue.upcoming.clear()  # another scheduler: its plans only count
    state.plan_pending_since = None
    state.wake = True
    return Ok()


def get_snapshot(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: GetSnapshot,
) -> Message:
    delta = None
    if msg.peek:
        # What diagnose shows anyone (no scripts, environments or arguments),
        # taken without the scheduler's bookkeeping: no plan is pending on it.
        need_caller(caller)
        snap = views.snapshot(state, state.clock())
    else:
        need_daemon(ctx, caller)
        snap, delta = views.shipped(state, msg.base)
        state.plan_pending_since = snap.now
    return SnapshotReply(
        snapshot=snap, policy=state.policy.name, params=state.policy.params, delta=delta
    )


def apply_plan(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: ApplyPlan,
) -> Message:
    need_daemon(ctx, caller)
    started, rejected = malleable.apply_plan(state, msg.plan)
    state.queue.take_notes(msg.plan, state.snapshot_time)
    if rejected:
        # The plan is stale (the server started jobs meanwhile); a refused
        # start of it would leave a hole in its upcoming jobs until the next.
        state.queue.upcoming.clear()
    state.plan_pending_since = None
    state.events.append(
        ("sched/pass", pass_event(msg, started, rejected, state.clock(), state.policy))
    )
    return PlanResult(started=started, rejected=rejected)


def node_hello(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: NodeHello,
) -> Message:
    need_daemon(ctx, caller)
    liveness.hello(state, msg, ident, remote=caller is not None and caller.remote)
    return Ok()


def heartbeat(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: Heartbeat,
) -> Message:
    need_daemon(ctx, caller)
    liveness.heartbeat(state, msg, ident)
    return Ok()


def job_started(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: JobStarted,
) -> Message | None:
    need_daemon(ctx, caller)
    job = state.jobs.get(msg.job)
    if job is not None and job.state in (JobState.RUNNING, JobState.EXITING):
        # The start that counts is when the process exists, not when it was planned.
        job.start_time, job.session_id = msg.time, msg.pid
        state.store.put_job(job)
        state.store.event(job.id, msg.time, "launched", f"pid {msg.pid}")
    return None  # a notification


def job_resized(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: JobResized,
) -> Message:
    need_daemon(ctx, caller)
    malleable.acknowledged(state, msg)
    return Ok()


def job_ended(
    state: ServerState, ctx: Context, caller: Caller | None, ident: bytes, msg: JobEnded
) -> Message:
    need_daemon(ctx, caller)
    job = state.jobs.get(msg.job)
    if job is not None and job.alloc:
        sender = state.nodes.named_by_route(ident)
        if sender is not None and sender != job.alloc[0].node:
            # Only the job's own node can say how it ended.
            raise PermissionDenied(
                f"node {sender} reported the end of job {job.display_id}, "
                f"which runs on {job.alloc[0].node}"
            )
    if (
        job is not None
        and job.state in ACTIVE_STATES
        # A late report of a run qrerun already ended must not end the next.
        and msg.reruns >= job.reruns
    ):
        if msg.requeue:
            requeue.stopped_node(state, job, msg)
            return Ok()
        requeue.end_as_reported(state, job, msg)
    return Ok()


HANDLERS: dict[type, Handler] = {
    Status: status,
    Submit: submit,
    QueryJobs: query_jobs,
    JobControl: job_control,
    Alter: alter,
    QueryNodes: query_nodes,
    SetNodeOffline: set_node_offline,
    SchedHello: sched_hello,
    GetSnapshot: get_snapshot,
    ApplyPlan: apply_plan,
    NodeHello: node_hello,
    Heartbeat: heartbeat,
    JobStarted: job_started,
    JobResized: job_resized,
    JobEnded: job_ended,
    **admin.HANDLERS,
    **jobops.HANDLERS,
}
