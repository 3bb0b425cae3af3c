"""Request handlers for reservations, the live policy switch and diagnostics.

Same rules as :mod:`minibatch.server.handlers` (whose table includes this one):
one function per request, permissions and arguments checked before anything
changes. Creating and releasing reservations and switching the policy are for
operators; looking is for everyone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibatch.core.job import JobState
from minibatch.errors import NotFound, PermissionDenied
from minibatch.protocol.messages import (
    Diagnose,
    DiagnoseReply,
    GetPolicy,
    Message,
    PolicyInfo,
    QueryReservations,
    ReleaseReservation,
    ReservationList,
    SetPolicy,
    SetReservation,
)
from minibatch.server import booking
from minibatch.server.access import (
    Context,
    Handler,
    need_caller,
    need_operator,
    visible,
)
from minibatch.server.submit import Caller

if TYPE_CHECKING:
    from minibatch.server.state import ServerState


def set_reservation(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: SetReservation,
) -> Message:
    c = need_operator(ctx, caller, "create reservations")
    resv = booking.create(state, msg, c.user)
    return ReservationList(reservations=[resv], now=state.clock())


def query_reservations(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: QueryReservations,
) -> Message:
    book = state.reservations
    for name in msg.names:
        if book.get(name) is None:
            raise NotFound(f"unknown reservation {name!r}")
    found = [book.by_name[n] for n in msg.names] if msg.names else list(book)
    return ReservationList(reservations=found, now=state.clock())


def release_reservation(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: ReleaseReservation,
) -> Message:
    need_operator(ctx, caller, "release reservations")
    released = booking.release(state, msg.names)
    return ReservationList(
        reservations=[r for r, _ in released],
        now=state.clock(),
        cancelled=sorted(j for _, jobs in released for j in jobs),
    )


def _policy_info(state: ServerState, ctx: Context) -> PolicyInfo:
    from minibatch.policy import registry

    choice = state.policy
    refused = state.policy_refused
    return PolicyInfo(
        name=choice.name,
        params=choice.params,
        set_by=choice.set_by,
        since=choice.since,
        scheduler_policy=state.policy_name,
        # Only a refusal of the choice in force: an older one no longer matters.
        scheduler_refused=refused if refused.startswith(f"{choice.name}:") else "",
        available=registry.available(ctx.policy_modules),
    )


def set_policy(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: SetPolicy,
) -> Message:
    from minibatch.policy import registry

    c = need_operator(ctx, caller, "change the scheduling policy")
    # Never code named by a client: an operator is not root, and the server
    # and the scheduler import what is chosen (and again at every restart).
    refusal = registry.by_name_only(msg.name)
    if refusal:
        raise PermissionDenied(refusal)
    booking.set_policy(state, msg.name, dict(msg.params), c.user, ctx.policy_modules)
    return _policy_info(state, ctx)


def get_policy(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: GetPolicy,
) -> Message:
    return _policy_info(state, ctx)


def diagnose(
    state: ServerState,
    ctx: Context,
    caller: Caller | None,
    ident: bytes,
    msg: Diagnose,
) -> Message:
    need_caller(caller)
    jobs = sorted(state.jobs.values(), key=lambda j: j.id) if msg.jobs else []
    for job in jobs:
        state.explain(job)
    # A snapshot for looking only: the time the last plan is matched against
    # (``snapshot_time``) must stay that of the scheduler's snapshot.
    planned = state.snapshot_time
    snap = state.snapshot()
    state.snapshot_time = planned
    return DiagnoseReply(
        snapshot=snap,
        policy=state.policy.name,
        params=state.policy.params,
        jobs=[
            visible(ctx, caller, j) for j in jobs if j.state is not JobState.FINISHED
        ],
        fairshare=dict(ctx.fairshare),
    )


HANDLERS: dict[type, Handler] = {
    SetReservation: set_reservation,
    QueryReservations: query_reservations,
    ReleaseReservation: release_reservation,
    SetPolicy: set_policy,
    GetPolicy: get_policy,
    Diagnose: diagnose,
}
