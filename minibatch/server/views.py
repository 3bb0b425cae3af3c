"""Read-only views of the server's state: the scheduler's snapshot, job lookup."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from minibatch.core.job import ACTIVE_STATES, Job, JobState, limit_of
from minibatch.core.snapshot import ClusterSnapshot, PendingView, RunningView
from minibatch.errors import InvalidArgument, NotFound
from minibatch.policy.base import mem_per_node
from minibatch.protocol.scheduling import PendingDelta

if TYPE_CHECKING:
    from minibatch.server.state import ServerState

#: How many upcoming jobs each plan names (see :mod:`minibatch.server.dispatch`):
#: enough to refill a small cluster several times over between passes, few
#: enough to cost a pass nothing.
UPCOMING = 32


def snapshot(
    state: ServerState, now: float, pending: Sequence[PendingView] | None = None
) -> ClusterSnapshot:
    """The policy's whole world at ``now``, with ``pending`` for its queue
    (None: :func:`eligible`).

    Reservations, QOS, fairshare usage and accuracy are cached by their
    owners, so a snapshot costs a pass little beyond the running jobs.
    """
    running = []
    for jid in state.active:
        job = state.jobs[jid]
        running.append(
            RunningView(
                id=job.id,
                user=job.user,
                nodes=tuple((a.node, len(a.cpus)) for a in job.alloc),
                mem_kb_per_node=mem_per_node(job.request),
                start_time=job.start_time or now,
                walltime=limit_of(job),
                gpus_per_node=job.request.gpus,
                advres=job.advres,
                group=job.group,
                account=job.account,
                qos=job.qos,
                malleable=job.request.malleable,
                ppn=job.request.ppn,
                submit_time=job.submit_time,
                req_walltime=job.request.walltime,
            )
        )
    running.sort(key=lambda r: r.id)
    return ClusterSnapshot(
        now=now,
        generation=state.generation,
        nodes=state.nodes.views(),
        running=tuple(running),
        pending=eligible(state) if pending is None else pending,
        reservations=state.reservations.views(),
        fairshare=state.history.fairshare(now, (state.jobs[j] for j in state.active)),
        accuracy=state.history.accuracy(),
        qos=state.qos.views,
        upcoming=UPCOMING,
    )


def _filtering(state: ServerState) -> bool:
    """Whether :func:`eligible` may leave jobs out."""
    return state.qos.any_blocked or state.queues.any_stopped or bool(state.array_limits)


def eligible(state: ServerState) -> tuple[PendingView, ...]:
    """The queue in priority order, less the jobs over a QOS limit (Maui's
    throttling: they are not eligible), in a stopped queue or over their
    array's limit."""
    pending = state.queue.ordered()
    qos = state.qos
    if qos.any_blocked:
        pending = tuple(p for p in pending if not qos.blocks(p.user, p.qos))
    if state.queues.any_stopped:
        pending = tuple(p for p in pending if state.queues.started(p.queue))
    if state.array_limits:
        pending = _within_array_limits(state, pending)
    return pending


def shipped(
    state: ServerState, base: int | None = None
) -> tuple[ClusterSnapshot, PendingDelta]:
    """The scheduler's next snapshot, its queue as a delta from the scheduler's
    copy (version ``base``; None: the last shipped) when possible: then the
    snapshot's ``pending`` is empty (see :meth:`PendingQueue.ship`), and the
    queue is not even listed (at 100,000 jobs that alone cost ~2 ms a pass)."""
    pending = eligible(state) if _filtering(state) else None
    # Filters only leave jobs out, in order: as many as queued is all of them.
    whole = pending is None or len(pending) == len(state.queue)
    delta = state.queue.ship(whole, base)
    return state.snapshot(() if delta.base >= 0 else pending), delta


def _within_array_limits(
    state: ServerState, pending: tuple[PendingView, ...]
) -> tuple[PendingView, ...]:
    """Leave out the tasks of arrays already running their ``%N`` limit, and
    enough of the others that no array can start more than its limit."""
    room = {
        array_id: limit - _array_counts(state, array_id)[0]
        for array_id, limit in state.array_limits.items()
    }
    out = []
    for p in pending:
        task_of = state.jobs[p.id].array_id
        left = room.get(task_of, 1) if task_of is not None else 1
        if left > 0:
            if task_of is not None and task_of in room:
                room[task_of] = left - 1
            out.append(p)
    return tuple(out)


def array_limit_reason(state: ServerState, job: Job) -> str:
    """Why ``job``, a queued array task, waits for its array's ``%N`` limit
    (:func:`_within_array_limits` leaves it out of the scheduler's queue), or ""."""
    array = job.array_id
    limit = None if array is None else state.array_limits.get(array)
    if array is None or limit is None:
        return ""
    active, queued = _array_counts(state, array)
    if active + bisect.bisect_left(queued, job.id) < limit:
        return ""
    return f"array limit: at most {limit} tasks of {array}[] run at once"


def _array_counts(state: ServerState, array: int) -> tuple[int, list[int]]:
    """The array's running tasks and its queued ones' ids in order, counted
    once while no task of it changes (``ServerState.array_counts``): a
    listing explains every task of an array, and counting per task would be
    quadratic (100,000 tasks)."""
    counts = state.array_counts.get(array)
    if counts is None:
        active, queued = 0, []
        for jid in state.arrays.get(array, ()):
            other = state.jobs[jid]
            if other.state in ACTIVE_STATES:
                active += 1
            elif other.state is JobState.QUEUED:
                queued.append(jid)
        counts = state.array_counts[array] = (active, sorted(queued))
    return counts


def select(state: ServerState, selector: str, *, finished: bool = True) -> list[Job]:
    """Jobs named by ``7``, ``7.host``, ``7[]`` (whole array) or ``7[2]``.

    ``finished`` also looks in accounting. Raises NotFound when none match.
    """
    text = selector.strip().split(".", 1)[0]
    base, bracket, rest = text.partition("[")
    if not (base.isascii() and base.isdigit()) or (bracket and not rest.endswith("]")):
        raise InvalidArgument(f"malformed job id {selector!r}")
    jid, index = int(base), rest[:-1] if bracket else None
    if index == "":
        found = [state.jobs[i] for i in state.arrays.get(jid, [])]
        if finished:
            found += state.store.finished_in_array(jid)
        found.sort(key=lambda j: j.id)
    elif index is not None:
        if not (index.isascii() and index.isdigit()):
            raise InvalidArgument(f"malformed array index in {selector!r}")
        tasks = [state.jobs[i] for i in state.arrays.get(jid, [])]
        if finished:
            tasks += state.store.finished_in_array(jid)
        found = [j for j in tasks if j.array_index == int(index)]
    else:
        job = state.jobs.get(jid)
        if job is None:
            done = state.store.is_finished(jid)
            if done is not None and not finished:
                # Known, so "unknown" would name the wrong problem.
                raise InvalidArgument(
                    f"job {done.display_id} has finished "
                    f"({done.result.value if done.result else 'ended'})"
                )
            job = done
        found = [job] if job is not None else []
    if not found and not finished and index is not None:
        _refuse_finished_tasks(state, jid, index)
    if not found:
        raise NotFound(f"unknown job id {selector}")
    return found


def _refuse_finished_tasks(state: ServerState, array_id: int, index: str) -> None:
    """An array (``5[]``) or task (``5[2]``) that has finished is known:
    "unknown" would name the wrong problem (qdel of a finished job)."""
    done = [
        j
        for j in state.store.finished_in_array(array_id)
        if index == "" or j.array_index == int(index)
    ]
    if index == "" and done:
        raise InvalidArgument(f"job {array_id}[] has finished")
    if done:
        result = done[0].result.value if done[0].result else "ended"
        raise InvalidArgument(f"job {done[0].display_id} has finished ({result})")
