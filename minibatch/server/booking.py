"""Operator actions on what the scheduler plans with: reservations and the policy.

Reservations: :func:`create` (``setres``) validates everything, then lets
:func:`~minibatch.server.reservations.place` pick CPUs; :func:`release`
(``releaseres``) and :func:`tick` (a window's start or end, driven by the server's
timer) publish ``minibatch/v1/reservations/<name>/<event>`` (``created started
ended released``). A reservation that goes away cancels the pending jobs that
were submitted into it, as PBS deletes a job whose dependency can never be met.

Policy: :func:`set_policy` (``mb policy set``) loads the policy by name in this
process and plans the current queue with it once, so an unknown name, bad
parameters or a policy that raises are refused with one line and the previous
policy stays; then it stores the choice (it survives a restart), publishes it on
``minibatch/v1/sched/policy`` and hands it to the scheduler with the next wake.
"""

from __future__ import annotations

import logging
import pwd
from typing import TYPE_CHECKING, Any

import msgspec

from minibatch.config import Config
from minibatch.core.job import ACTIVE_STATES, PENDING_STATES, JobRequest, limit_of
from minibatch.core.reservation import NAME_PATTERN, Reservation
from minibatch.core.units import format_duration
from minibatch.errors import (
    InfeasibleRequest,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from minibatch.policy.base import Policy
from minibatch.protocol.messages import SetReservation
from minibatch.server import views
from minibatch.server.reservations import clock_text, place
from minibatch.server.store import Store

if TYPE_CHECKING:
    from minibatch.server.state import ServerState

log = logging.getLogger("minibatch.server")

#: Longest reservation window, seconds.
MAX_DURATION = 366 * 86400
#: A start this far in the past (clock skew between command and server) is "now".
PAST_SLACK = 60.0


class PolicyChoice(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    params: dict[str, Any] = {}
    set_by: str = ""
    since: float = 0.0


# ------------------------------------------------------------------ policy


def load_policy(store: Store, config: Config) -> PolicyChoice:
    """The stored choice (``mb policy set``), else the configuration's."""
    default = PolicyChoice(
        name=config.scheduler.policy, params=dict(config.scheduler.params)
    )
    stored = store.setting("policy")
    if stored is None:
        return default
    try:
        choice = msgspec.convert(stored, PolicyChoice)
        if choice.name != default.name:
            # Loaded by name only, as when it was set: a choice saved before
            # that rule, or whose name the configuration no longer maps to
            # code, is not imported.
            validate_policy(choice.name, choice.params, config.scheduler.policy_modules)
        return choice
    except (msgspec.ValidationError, InvalidArgument) as exc:
        log.warning("ignoring the stored policy (%s); using %s", exc, default.name)
        return default


def validate_policy(
    name: str, params: dict[str, Any], modules: dict[str, str] | None = None
) -> Policy:
    """Load the policy by name here: InvalidArgument in one line if that fails."""
    from minibatch.policy import registry

    try:
        return registry.load_named(name, params, modules)
    except InvalidArgument:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"bad parameters for policy {name!r}: {exc}") from None
    except Exception as exc:  # an import error, or a policy that fails to build
        raise InvalidArgument(f"cannot load policy {name!r}: {exc}") from None


def try_plan(state: ServerState, name: str, policy: Policy) -> None:
    """Plan the current queue with ``policy`` once, and throw the plan away:
    a policy that raises is refused now, with the previous one kept, rather
    than found by the scheduler at its next pass."""
    try:
        policy.plan(views.snapshot(state, state.clock()))
    except Exception as exc:
        raise InvalidArgument(
            f"policy {name!r} failed to plan the current queue "
            f"({type(exc).__name__}: {exc}); keeping {state.policy.name}"
        ) from None


def set_policy(
    state: ServerState,
    name: str,
    params: dict[str, Any],
    user: str,
    modules: dict[str, str] | None = None,
) -> PolicyChoice:
    try_plan(state, name, validate_policy(name, params, modules))
    name = name.lower()
    choice = PolicyChoice(name=name, params=params, set_by=user, since=state.clock())
    state.policy = choice
    state.queue.upcoming.clear()  # the old policy's order
    state.store.put_setting("policy", msgspec.to_builtins(choice))
    log.info("policy set to %s %s by %s", name, params, user)
    announce_policy(state)
    state.changed()
    return choice


def announce_policy(state: ServerState) -> None:
    """Publish the policy in force (``sched/policy``, retained: a view that
    connects later learns it)."""
    state.events.append(("sched/policy", msgspec.to_builtins(state.policy)))


# ------------------------------------------------------------ reservations


def resv_event(resv: Reservation, event: str, when: float) -> dict[str, Any]:
    """The JSON payload published for a reservation event."""
    return {
        "name": resv.name,
        "event": event,
        "time": when,
        "type": resv.kind,
        "start": resv.start,
        "end": resv.end,
        "users": list(resv.users),
        "owner": resv.owner,
        "nodes": {a.node: list(a.cpus) for a in resv.alloc},
    }


def _publish(state: ServerState, resv: Reservation, event: str) -> None:
    state.events.append(
        (f"reservations/{resv.name}/{event}", resv_event(resv, event, state.clock()))
    )


def check_advres(state: ServerState, name: str, user: str, request: JobRequest) -> None:
    """Refuse a job for reservation ``name`` that could never run inside it."""
    resv = state.reservations.get(name)
    if resv is None:
        raise NotFound(f"unknown reservation {name!r}")
    if not resv.users:
        raise PermissionDenied(
            f"reservation {name!r} is a downtime reservation: no job may use it"
        )
    if not resv.allows(user):
        raise PermissionDenied(
            f"reservation {name!r} is for {', '.join(resv.users)}, not {user}"
        )
    left = resv.end - max(state.clock(), resv.start)
    if request.walltime > left:
        raise InfeasibleRequest(
            f"walltime {format_duration(request.walltime)} is longer than "
            f"reservation {name!r} has left ({format_duration(left)})"
        )
    wide = sum(1 for a in resv.alloc if len(a.cpus) >= request.ppn)
    if wide < request.nodes:
        shape = ", ".join(f"{a.node}: {len(a.cpus)}" for a in resv.alloc)
        raise InfeasibleRequest(
            f"{request.nodes} node(s) with {request.ppn} CPUs each do not fit in "
            f"reservation {name!r} (CPUs per node: {shape})"
        )


def _check_users(users: list[str]) -> None:
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise InvalidArgument(f"unknown user {user!r}") from None


def _name(state: ServerState, msg: SetReservation) -> str:
    if msg.name:
        if not NAME_PATTERN.match(msg.name):
            raise InvalidArgument(
                f"invalid reservation name {msg.name!r} (letters, digits, . _ -)"
            )
        if msg.name in state.reservations.by_name:
            raise InvalidArgument(f"reservation {msg.name!r} already exists")
        return msg.name
    prefix = msg.users[0] if msg.users else "system"
    number = state.store.counter("next_reservation")
    while f"{prefix}.{number}" in state.reservations.by_name:
        number += 1
    state.store.set_counter("next_reservation", number + 1)
    return f"{prefix}.{number}"


def create(state: ServerState, msg: SetReservation, owner: str) -> Reservation:
    now = state.clock()
    if not 0 < msg.duration <= MAX_DURATION:
        raise InvalidArgument("duration must be between 1 s and 366 days")
    if msg.start < now - PAST_SLACK:
        raise InvalidArgument(f"start {clock_text(msg.start, now)} is in the past")
    given = [bool(msg.nodes), msg.node_count > 0, msg.cpus > 0]
    if sum(given) != 1:
        raise InvalidArgument("give exactly one of nodes, a node count or CPUs")
    if msg.node_count < 0 or msg.cpus < 0:
        raise InvalidArgument("node and CPU counts must be positive")
    _check_users(msg.users)
    for node in msg.nodes:
        if node not in state.nodes.nodes:
            raise NotFound(f"unknown node {node}")
    if len(set(msg.nodes)) != len(msg.nodes):
        raise InvalidArgument("a node is named twice")
    start = max(msg.start, now)
    end = start + msg.duration
    ends = {
        job.id: (job.start_time or now) + limit_of(job)
        for job in state.jobs.values()
        if job.state in ACTIVE_STATES
    }
    alloc = place(
        state.nodes,
        state.reservations,
        ends,
        start,
        end,
        now,
        names=msg.nodes,
        count=msg.node_count,
        cpus=msg.cpus,
        any_state=not msg.users,
    )
    resv = Reservation(
        name=_name(state, msg),
        start=start,
        end=end,
        alloc=alloc,
        users=list(msg.users),
        owner=owner,
        created=now,
        comment=msg.comment,
    )
    state.reservations.add(resv)
    state.store.put_reservation(resv)
    log.info("reservation %s created by %s", resv.name, owner)
    _publish(state, resv, "created")
    if start <= now:
        state.reservations.started.add(resv.name)
        _publish(state, resv, "started")
    state.changed()
    return resv


def _drop(state: ServerState, resv: Reservation, event: str, why: str) -> list[int]:
    """Remove ``resv``; cancel the pending jobs bound to it (their ids)."""
    state.reservations.remove(resv.name)
    state.store.delete_reservation(resv.name)
    _publish(state, resv, event)
    orphans = [
        job
        for job in state.jobs.values()
        if job.advres == resv.name and job.state in PENDING_STATES
    ]
    for job in sorted(orphans, key=lambda j: j.id):
        state.cancel(job, comment=f"reservation {resv.name!r} {why}")
    state.changed()
    return [job.id for job in orphans]


def release(
    state: ServerState, names: list[str]
) -> list[tuple[Reservation, list[int]]]:
    """Release the named reservations (all must exist), with the jobs cancelled."""
    found = []
    for name in names:
        resv = state.reservations.get(name)
        if resv is None:
            raise NotFound(f"unknown reservation {name!r}")
        found.append(resv)
    out = []
    for resv in found:
        log.info("reservation %s released", resv.name)
        out.append((resv, _drop(state, resv, "released", "was released")))
    return out


def tick(state: ServerState) -> None:
    """Announce reservations that started, drop those that ended."""
    now = state.clock()
    book = state.reservations
    for resv in list(book):
        if resv.end <= now:
            _drop(state, resv, "ended", "ended before the job could run")
        elif resv.start <= now and resv.name not in book.started:
            book.started.add(resv.name)
            _publish(state, resv, "started")
            state.changed()
