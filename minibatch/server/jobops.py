"""Handlers for PBS's everyday job commands beyond qsub and qstat: the per-id
form of qdel/qhold/qrls, ``qsig``, ``qrerun``, ``qmove``, ``tracejob`` and
``qstat -Q``/``-q`` (registered in :data:`minibatch.server.handlers.HANDLERS`).

PBS acts on each id on its own: ``qdel 13 14`` deletes 13 even when 14 is
unknown. So here each selector is checked and done before the next, and a
refused one goes into the reply's ``refused`` instead of failing the request.
Within one selector nothing changes unless all of it may: a whole array
(``5[]``) is the exception, acted on for the tasks the action applies to (its
queued tasks for ``qhold``, its running ones for ``qsig``), refused only when
there are none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from minibatch.core.job import PENDING_STATES, Job, JobState
from minibatch.errors import (
    InvalidArgument,
    MinibatchError,
    NotFound,
    PermissionDenied,
)
from minibatch.malleable import signal_named
from minibatch.protocol.messages import (
    JobControl,
    JobList,
    JobTrace,
    Message,
    MoveJob,
    QueryQueues,
    QueueInfo,
    QueueList,
    Refusal,
    Rerun,
    Signal,
    SignalJob,
    TraceEvent,
    TraceJob,
)
from minibatch.server import requeue
from minibatch.server.access import (
    Context,
    Handler,
    may_control,
    need_caller,
    need_operator,
    visible,
)
from minibatch.server.queues import check_limits
from minibatch.server.submit import Caller

if TYPE_CHECKING:
    from minibatch.server.state import ServerState

Check = Callable[[Job], None]
Act = Callable[[Job], None]


def each(state: ServerState, selectors: list[str], check: Check, act: Act) -> JobList:
    """``act`` on the jobs of each selector that ``check`` lets through."""
    if not selectors:
        raise InvalidArgument("no job id given")
    done: dict[int, Job] = {}
    refused: list[Refusal] = []
    for selector in selectors:
        try:
            jobs = _checked(state.select(selector, finished=False), selector, check)
        except MinibatchError as exc:
            refused.append(
                Refusal(selector=selector, code=int(exc.code), message=str(exc))
            )
            continue
        for job in jobs:
            act(job)
            done[job.id] = job
    return JobList(jobs=sorted(done.values(), key=lambda j: j.id), refused=refused)


def _checked(jobs: list[Job], selector: str, check: Check) -> list[Job]:
    if not selector.split(".", 1)[0].endswith("[]"):
        for job in jobs:
            check(job)
        return jobs
    fit: list[Job] = []
    first: MinibatchError | None = None
    for job in jobs:
        try:
            check(job)
        except PermissionDenied:
            raise  # not the caller's array: none of it
        except MinibatchError as exc:
            first = first or exc
            continue
        fit.append(job)
    if not fit and first is not None:
        raise first
    return fit


# ----------------------------------------------------- qdel, qhold, qrls


def job_control(
    state: ServerState, ctx: Context, caller: Caller | None, msg: JobControl
) -> Message:
    """``JobControl`` with ``each``: the per-id form (see the module docstring)."""

    def mine(job: Job) -> None:
        may_control(ctx, caller, job)

    def pending(job: Job) -> None:
        mine(job)
        if job.state not in PENDING_STATES:
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only pending jobs can be held"
            )

    def hold(job: Job) -> None:
        # Holding a held job again is no error in PBS (it adds a hold type).
        if job.state is not JobState.HELD:
            state.hold(job)

    def held(job: Job) -> None:
        mine(job)
        if job.state is not JobState.HELD:
            raise InvalidArgument(f"job {job.display_id} is not held")

    actions: dict[str, tuple[Check, Act]] = {
        "cancel": (mine, lambda job: state.cancel(job)),
        "hold": (pending, hold),
        "release": (held, state.release),
    }
    if msg.action not in actions:
        raise InvalidArgument(f"unknown job action {msg.action!r}")
    check, act = actions[msg.action]
    return each(state, msg.selectors, check, act)


# ------------------------------------------------------------------ qsig


def signal_job(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: SignalJob,
) -> Message:
    try:
        named = signal_named(msg.signal)
    except ValueError:
        named = None
    if named is None:
        raise InvalidArgument(f"unknown signal {msg.signal!r} (e.g. TERM, USR1, 10)")
    sig = named
    who = need_caller(caller).user

    def check(job: Job) -> None:
        may_control(ctx, caller, job)
        if job.state is not JobState.RUNNING:
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only running jobs can be "
                "signalled"
            )

    def act(job: Job) -> None:
        node = job.alloc[0].node
        state.outbox.append((state.route(node), Signal(job=job.id, signal=int(sig))))
        state.record(job, "signalled", f"{sig.name} by {who}")

    return each(state, msg.selectors, check, act)


# ---------------------------------------------------------------- qrerun


def rerun(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: Rerun,
) -> Message:
    who = need_operator(ctx, caller, "rerun jobs").user
    return each(
        state,
        msg.selectors,
        requeue.check,
        lambda job: requeue.request(state, job, who),
    )


# ----------------------------------------------------------------- qmove


def move_job(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: MoveJob,
) -> Message:
    table = state.queues
    dest = table.by_name.get(msg.queue)
    if dest is None:
        names = ", ".join(table.by_name)
        raise NotFound(f"unknown queue {msg.queue!r} (queues here: {names})")
    if not dest.enabled:
        raise InvalidArgument(f"queue {dest.name!r} is closed to new jobs")

    def check(job: Job) -> None:
        may_control(ctx, caller, job)
        if job.state not in PENDING_STATES:
            raise InvalidArgument(
                f"job {job.display_id} is {job.state}; only pending jobs can be moved"
            )
        if dest.users and job.user not in dest.users and job.user != "root":
            raise PermissionDenied(f"{job.user} may not use queue {dest.name!r}")
        whose = f"job {job.display_id}'s "
        check_limits(dest, job.request.walltime, job.request.cpus, whose)

    def act(job: Job) -> None:
        before = job.queue or table.default
        if before == dest.name:
            return  # already there (a task of an array moved before)
        job.queue = dest.name
        if job.state is JobState.QUEUED:
            # Its rank depends on its queue's priority.
            state.queue.discard(job.id)
            state.queue.add(job)
        state.store.put_job(job)
        state.record(job, "moved", f"from {before} to {dest.name}")
        state.changed()

    return each(state, msg.selectors, check, act)


# ------------------------------------------------------------- qstat -Q


def query_queues(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: QueryQueues,
) -> Message:
    table = state.queues
    for name in msg.names:
        if name not in table.by_name:
            raise NotFound(f"unknown queue {name!r}")
    counts: dict[str, dict[str, int]] = {name: {} for name in table.by_name}
    for job in state.jobs.values():
        per = counts.get(job.queue or table.default)
        if per is not None:
            per[job.state.value] = per.get(job.state.value, 0) + 1
    names = msg.names or list(table.by_name)
    queues = []
    for name in names:
        q = table.by_name[name]
        queues.append(
            QueueInfo(
                name=q.name,
                priority=q.priority,
                enabled=q.enabled,
                started=q.started,
                default=q.name == table.default,
                default_walltime=q.seconds(q.default_walltime),
                max_walltime=q.seconds(q.max_walltime),
                max_cpus=q.max_cpus,
                users=list(q.users),
                jobs=counts[name],
            )
        )
    return QueueList(queues=queues)


# -------------------------------------------------------------- tracejob


def trace_job(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: TraceJob,
) -> Message:
    jobs = state.select(msg.selector, finished=True)
    shown = [visible(ctx, caller, job) for job in jobs]
    events = [
        TraceEvent(
            job=job.id,
            time=t,
            event=event,
            # The submission's arguments, which only the job's owner may see.
            detail="" if event == "submitted" and whole is not job else detail,
        )
        for job, whole in zip(jobs, shown, strict=True)
        for t, event, detail in state.store.events_of(job.id)
    ]
    return JobTrace(jobs=shown, events=events)


HANDLERS: dict[type, Handler] = {
    SignalJob: signal_job,
    Rerun: rerun,
    MoveJob: move_job,
    QueryQueues: query_queues,
    TraceJob: trace_job,
}
