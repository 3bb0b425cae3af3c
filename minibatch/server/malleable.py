"""Resizing running malleable jobs: validation, CPU choice, the node's answer.

A resize comes from a plan (``Resize``, beside ``Start``), from ``qalter -l
ncpus=N`` on a running job, or from the server itself when a guest ends and its
mates get their CPUs back (seed 002, Listing 3). Whatever its origin it is
checked by :func:`minibatch.core.resize.refusal` (the rule the simulator applies
too), then applied here at once: the job's allocation and time limit change
(:func:`~minibatch.core.resize.new_limit`, worst-case model), the node is sent
``ResizeJob``, and the change is *pending* until the node answers
``JobResized``. Only then does it enter the job's history (``resizes``, with the
node's time: accounting integrates over it) and is it published
(``minibatch/v1/jobs/<id>/resized``).

CPU choice is mechanism, as for starts: a shrink keeps the job's lowest CPU ids,
a growth takes free CPUs that no advance reservation holds before the job's new
end. CPUs a shrink frees are free at once: messages to one node are handled in
the order sent, so a guest launched after its mates' shrinks never shares a CPU
with them.

A refused ``JobResized`` (the kernel would not take the mask, or the job is
ending there) leaves later resizes in flight; with none, the job keeps the CPUs
the node reports that no other job took meanwhile, gets its limit back, and is
confined to those with a new resize if some were taken; a comment says what
happened. Who may ask for a resize (``qalter``: owners shrink, operators also
grow) is the request handler's business.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from minibatch.core.job import Allocation, Job, JobState, ResizeEvent, limit_of
from minibatch.core.resize import give_back_target, limit_rate, new_limit, refusal
from minibatch.core.snapshot import Plan, Resize, Start
from minibatch.core.units import format_cpu_list
from minibatch.errors import InvalidArgument
from minibatch.protocol.messages import JobResized, ResizeJob
from minibatch.server.reservations import JobCpus

if TYPE_CHECKING:
    from minibatch.server.nodes import Node
    from minibatch.server.state import ServerState


def _node(state: ServerState, job: Job) -> Node | None:
    return state.nodes.nodes.get(job.alloc[0].node) if job.alloc else None


def stretched_limit(job: Job, held: int, target: int, now: float) -> float:
    """The job's time limit after going from ``held`` to ``target`` CPUs."""
    ppn = job.request.ppn
    return new_limit(
        now - (job.start_time or now),
        limit_of(job),
        float(job.request.walltime),
        limit_rate([held], ppn),
        limit_rate([target], ppn),
    )


def check(state: ServerState, job: Job, target: int) -> str | None:
    """Why ``job`` may not be resized to ``target`` CPUs now, or None."""
    if job.state is not JobState.RUNNING:
        return f"job {job.display_id} is {job.state}, not running"
    node = _node(state, job)
    if node is None or len(job.alloc) != 1:
        return f"job {job.display_id} does not run on one known node"
    held = len(job.alloc[0].cpus)
    room = len(_growth(state, job, node, target))
    why = refusal(job.id, job.request.malleable, held, target, room)
    if why is None and target < held:
        kept = _kept(state, job, node, target)
        why = kept if isinstance(kept, str) else None
    if why is None:
        limit = stretched_limit(job, held, target, state.clock())
        try:
            state.qos.check_walltime(job.qos, math.ceil(limit))
        except InvalidArgument as exc:
            why = f"on {target} CPUs job {job.display_id} would need a longer {exc}"
    return why


def _growth(state: ServerState, job: Job, node: Node, target: int) -> list[int]:
    """Free CPUs of ``node`` the job may take to reach ``target`` (in order)."""
    held = len(job.alloc[0].cpus)
    if target <= held:
        return []
    now = state.clock()
    end = (job.start_time or now) + stretched_limit(job, held, target, now)
    if not state.reservations.by_name and not job.advres:
        return node.free_cpus()
    return JobCpus(state.reservations, job, now, end).cpus(node)


def _kept(state: ServerState, job: Job, node: Node, target: int) -> list[int] | str:
    """The CPUs a shrink keeps: the lowest that no advance reservation (other
    than the job's own) holds before the job's stretched end; or why too few
    are left (a shrink must not run the job into a reservation)."""
    cpus = sorted(job.alloc[0].cpus)
    book = state.reservations
    if not book.by_name:
        return cpus[:target]
    now = state.clock()
    end = (job.start_time or now) + stretched_limit(job, len(cpus), target, now)
    own = book.get(job.advres) if job.advres else None
    if own is not None and end > own.end:
        return (
            f"on {target} CPUs job {job.display_id} would run past the end of "
            f"its reservation {own.name!r}"
        )
    held = book.holding(node.name, now, end, member=job.advres)
    usable = [c for c in cpus if c not in held]
    if len(usable) < target:
        names = ", ".join(sorted({repr(n) for n in held.values()}))
        return (
            f"on {target} CPUs job {job.display_id} would run into reservation {names}"
        )
    return usable[:target]


def resize(state: ServerState, job: Job, target: int, cause: str) -> str | None:
    """Resize ``job`` to ``target`` CPUs now (see the module docstring); the
    reason it is refused (nothing changed), or None."""
    why = check(state, job, target)
    if why is not None:
        return why
    node = _node(state, job)
    assert node is not None
    if target != len(job.alloc[0].cpus):
        after = _take(state, job, node, target)
        state.outbox.append((node.route, _commit(state, job, node, after, cause)))
    return None


def _take(state: ServerState, job: Job, node: Node, target: int) -> list[int]:
    """Change ``node``'s allocation to the job's ``target`` CPUs (checked by
    :func:`check`); the CPU ids."""
    before = job.alloc[0].cpus
    if target < len(before):
        after = _kept(state, job, node, target)
        assert not isinstance(after, str), after
        for cpu in set(before) - set(after):
            if node.used.get(cpu) == job.id:
                del node.used[cpu]
        state.freed = True  # the plan's upcoming jobs may fit now
        return after
    extra = _growth(state, job, node, target)[: target - len(before)]
    for cpu in extra:
        node.used[cpu] = job.id
    return sorted([*before, *extra])


def _commit(
    state: ServerState, job: Job, node: Node, after: list[int], cause: str
) -> ResizeJob:
    """Record the resize as pending; the message that tells the node."""
    now = state.clock()
    before = list(job.alloc[0].cpus)
    job.resize_seq += 1
    pending = ResizeEvent(
        time=now,
        node=node.name,
        before=before,
        after=after,
        cause=cause,
        seq=job.resize_seq,
        limit=job.time_limit,
    )
    job.time_limit = stretched_limit(job, len(before), len(after), now)
    job.alloc = [Allocation(node.name, after)]
    job.resizing = [*job.resizing, pending]
    state.store.put_job(job)
    state.record(job, "resizing", _describe(pending))
    state.changed()
    return ResizeJob(job=job.id, cpus=after, time_limit=job.time_limit, seq=pending.seq)


def start_guest(state: ServerState, start: Start, shrinks: list[Resize]) -> str | None:
    """Start a guest on CPUs its mates give up (SD-Policy): every shrink and the
    start are checked first, and stand or fall together. The mates' ``ResizeJob``
    messages go out before the guest's ``Launch``, so the node confines the
    mates before the guest's first instruction."""
    mates: list[tuple[Job, Node, int]] = []
    for r in shrinks:
        mate = state.jobs.get(r.job)
        if mate is None:
            return f"mate {r.job} is not running"
        why = check(state, mate, r.cpus)
        if why is None and r.cpus >= len(mate.alloc[0].cpus):
            why = f"mate {r.job} would not shrink (to {r.cpus} CPUs)"
        if why is not None:
            return why
        node = _node(state, mate)
        assert node is not None
        mates.append((mate, node, r.cpus))
    freed = {}
    for mate, node, target in mates:
        before = mate.alloc[0].cpus
        freed[mate.id] = set(before) - set(_take(state, mate, node, target))
    sent = len(state.outbox)
    why = state.start(start.job, start.nodes, start.ppn)
    if why is not None:
        for mate, node, _ in mates:  # undo: nothing was sent or recorded
            for cpu in freed[mate.id]:
                node.used[cpu] = mate.id
        return why
    guest = state.jobs[start.job]
    cause = f"{state.policy.name}: room for job {guest.display_id}"
    messages = []
    for mate, node, _ in mates:
        after = sorted(set(mate.alloc[0].cpus) - freed[mate.id])
        messages.append((node.route, _commit(state, mate, node, after, cause)))
    state.outbox[sent:sent] = messages
    guest.borrowed = {mate.id: len(freed[mate.id]) for mate, _, _ in mates}
    state.store.put_job(guest)
    return None


def apply_plan(state: ServerState, plan: Plan) -> tuple[list[int], dict[int, str]]:
    """The plan's resizes and starts, in that order: the ids started, and why
    each refused decision was refused (by job id)."""
    started: list[int] = []
    rejected: dict[int, str] = {}
    groups: dict[int, list[Resize]] = {}
    for r in plan.resizes:
        if r.guest:
            groups.setdefault(r.guest, []).append(r)
            continue
        job = state.jobs.get(r.job)
        if job is None:
            why: str | None = f"job {r.job} is not running"
        else:
            held = len(job.alloc[0].cpus) if job.alloc else 0
            what = "idle CPUs" if r.cpus > held else "CPUs for the queue"
            why = resize(state, job, r.cpus, f"{state.policy.name}: {what}")
        if why is not None:
            rejected[r.job] = why
    for start in plan.starts:
        shrinks = groups.pop(start.job, [])
        if shrinks:
            why = start_guest(state, start, shrinks)
        else:
            why = state.start(start.job, start.nodes, start.ppn)
        if why is None:
            started.append(start.job)
        else:
            rejected[start.job] = why
    for guest in groups:
        rejected[guest] = "the plan shrinks jobs for a guest it does not start"
    return started, rejected


def resend(state: ServerState, node: Node) -> None:
    """Send again the pending resizes of jobs on ``node`` (its daemon said hello:
    it may never have had them). Applying one twice changes nothing."""
    for jid in sorted(set(node.used.values())):
        job = state.jobs.get(jid)
        if job is not None and job.resizing and job.state is JobState.RUNNING:
            msg = ResizeJob(
                job=jid,
                cpus=job.alloc[0].cpus,
                time_limit=limit_of(job),
                seq=job.resizing[-1].seq,
            )
            state.outbox.append((node.route, msg))


def acknowledged(state: ServerState, msg: JobResized) -> None:
    """The node's answer to ``ResizeJob`` number ``msg.seq``; a repeat or a late
    one is a no-op."""
    job = state.jobs.get(msg.job)
    if job is None or not job.resizing:
        return
    # The node applies resizes in order and reports only its latest: every
    # earlier one is done (lasting no time we know of), and so is this one
    # unless it failed.
    last = msg.seq - 1 if msg.error else msg.seq
    for pending in [r for r in job.resizing if r.seq <= last]:
        event = msgspec.structs.replace(pending, time=msg.time)
        job.resizes = [*job.resizes, event]
        state.record(job, "resized", _describe(event))
    failed = [r for r in job.resizing if r.seq == msg.seq] if msg.error else []
    job.resizing = [r for r in job.resizing if r.seq > msg.seq]
    state.store.put_job(job)
    if failed:
        _failed(state, job, msg, failed[0])


def _failed(state: ServerState, job: Job, msg: JobResized, failed: ResizeEvent) -> None:
    """The node could not apply ``failed``. If it sent a later resize too, the
    node will still apply that one (it names whole CPU lists), so nothing is to
    be done; if the job is ending there, its end releases its CPUs. Otherwise
    the job runs on ``msg.cpus``: it keeps those still free or its own, gets its
    limit back, and is confined to them if some went to another job meanwhile."""
    job.comment = f"resize refused by node {failed.node}: {msg.error}"
    state.record(job, "resize_failed", job.comment)
    state.store.put_job(job)
    node = _node(state, job)
    if job.resizing or not msg.cpus or node is None:
        return
    kept = sorted(c for c in msg.cpus if node.used.get(c, job.id) == job.id)
    for cpu in set(job.alloc[0].cpus) - set(kept):
        if node.used.get(cpu) == job.id:
            del node.used[cpu]
    for cpu in kept:
        node.used[cpu] = job.id
    job.time_limit = failed.limit
    job.alloc = [Allocation(node.name, msg.cpus)]
    if kept != sorted(msg.cpus):
        if not kept:
            state.cancel(job, f"{job.comment}; its CPUs went to other jobs")
            return
        cause = "confined after a refused resize"
        message = _commit(state, job, node, kept, cause)
        state.outbox.append((node.route, message))
    state.changed()


def give_back(state: ServerState, guest: Job) -> None:
    """A guest ended: each mate still running grows back by what it lent
    (within its range and what is free), as seed 002's node manager does."""
    for mate_id, lent in sorted(guest.borrowed.items()):
        mate = state.jobs.get(mate_id)
        if mate is None or mate.state is not JobState.RUNNING or not mate.alloc:
            continue
        high = (mate.request.malleable or (0, 0))[1]
        node = _node(state, mate)
        if node is None:
            continue
        held = len(mate.alloc[0].cpus)
        room = len(_growth(state, mate, node, min(high, held + lent)))
        target = give_back_target(held, lent, high, room)
        if target > held:
            resize(state, mate, target, f"job {guest.display_id} ended")


def _describe(event: ResizeEvent) -> str:
    text = (
        f"{len(event.before)}->{len(event.after)} CPUs: "
        f"{format_cpu_list(event.before)} -> {format_cpu_list(event.after)}"
    )
    return f"{text} ({event.cause})" if event.cause else text
