"""What the Maui views compute from the server's snapshot, and Maui's time formats.

``showq``, ``checkjob`` and ``diagnose`` ask the server for a ``Diagnose`` reply
(the snapshot the scheduler would get, the policy and its parameters, every job
not finished) and compute here, in the command, what the policy computes in the
scheduler: the priority order and its breakdown
(:mod:`minibatch.policy.priority`), fairshare usage against targets
(:mod:`minibatch.policy.fairshare`) and PSP bins (:mod:`minibatch.policy.psp`).
The policy is instantiated from its name and parameters exactly as the scheduler
does, so the order shown is the order it plans in.

Which weights explain the order: the ``maui`` policy's own; for ``fairshare`` and
``psp`` the Maui weights that rank the same way (their component alone); for any
other policy Maui's defaults (queue time only, i.e. submission order, which is the
order ``fifo`` and ``easy`` use).
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.protocol.messages import DiagnoseReply

if TYPE_CHECKING:
    # Imported when used: the policies are not needed by every ``mb`` command.
    from minibatch.policy.fairshare import FairshareTargets
    from minibatch.policy.priority import PriorityWeights


# Cached: showq prints one of each per job, and a queue's jobs share a few
# walltimes and many submission seconds (a third of showq's rendering).
@functools.lru_cache(maxsize=4096)
def maui_duration(seconds: float) -> str:
    """Maui's ``[-][D:]HH:MM:SS``: ``1:02:03:04`` is a day and 2 h 3 min 4 s."""
    sign = "-" if seconds < 0 else ""
    s = int(round(abs(seconds)))
    days, rest = divmod(s, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{sign}{days}:{text}" if days else sign + text


def maui_date(t: float) -> str:
    """``Thu Sep  1 15:02:50`` (local time), as Maui prints dates."""
    return _date(int(t))


@functools.lru_cache(maxsize=4096)
def _date(t: int) -> str:
    return time.strftime("%a %b %e %H:%M:%S", time.localtime(t))


class Ranking(msgspec.Struct):
    """The live policy's view of the pending jobs (a Struct: dataclasses would
    import inspect, ~6 ms of showq's start)."""

    policy: str
    #: Eligible jobs in the order the policy considers them.
    order: list[PendingView]
    #: Jobs a policy limit blocks now (fairshare caps, QOS), with the reason.
    blocked: dict[int, str]
    weights: PriorityWeights
    targets: FairshareTargets
    psp_default_bin: int = 3
    #: Why the policy could not be loaded here (the views fall back to queue order).
    note: str = ""
    #: The policy orders jobs by this priority (maui, fairshare, psp); else it
    #: keeps PBS order and the weights are Maui's defaults, for information.
    by_priority: bool = False
    params: dict[str, Any] = {}


def queue_order(
    reply: DiagnoseReply,
) -> tuple[Any, list[PendingView], dict[int, str], str]:
    """The live policy (None if it cannot be loaded here), the eligible jobs in
    the order it considers them, those a policy limit blocks (with why), and
    a note when it could not be loaded. All ``showq`` needs: it does not
    import the priority modules that :func:`rank` adds for the weights."""
    from minibatch.policy import registry

    snap = reply.snapshot
    note = ""
    try:
        policy: Any = registry.load(reply.policy, dict(reply.params))
    except Exception as exc:  # a policy this command cannot load: say so
        policy, note = None, f"policy {reply.policy!r} not loadable here: {exc}"
    order: list[PendingView] = list(snap.pending)
    blocked: dict[int, str] = {}
    # A policy that reorders the queue has ``order(snap)`` (the priority
    # policies' method, or a backfill policy's ``order`` function when set).
    order_fn = getattr(policy, "order", None)
    if callable(order_fn):
        order = list(order_fn(snap))
    blocked_fn = getattr(policy, "blocked", None)
    if callable(blocked_fn):
        blocked = dict(blocked_fn(snap, order))
        order = [p for p in order if p.id not in blocked]
    return policy, order, blocked, note


def rank(reply: DiagnoseReply) -> Ranking:
    """The order, blocks and priority weights of the policy the server runs."""
    from minibatch.policy.fairshare import Fairshare, FairshareTargets
    from minibatch.policy.priority import Maui, PriorityWeights
    from minibatch.policy.psp import DEFAULT_BIN, Psp

    policy, order, blocked, note = queue_order(reply)
    weights, targets, default_bin = PriorityWeights(), FairshareTargets(), DEFAULT_BIN
    if isinstance(policy, Maui):
        weights = policy.weights
        targets = weights.fstargets
        default_bin = weights.psp_default_bin
    elif isinstance(policy, Fairshare):
        wu, wg, wa = policy.weights
        targets = policy.targets
        weights = PriorityWeights(
            queuetimeweight=0.0,
            fsuserweight=wu,
            fsgroupweight=wg,
            fsaccountweight=wa,
            fspolicy=policy.fairshare_config.policy,
            fstargets=targets,
        )
    elif isinstance(policy, Psp):
        default_bin = policy.default_bin
        weights = PriorityWeights(
            queuetimeweight=0.0, pspbinweight=1.0, psp_default_bin=default_bin
        )
    return Ranking(
        policy=reply.policy,
        order=order,
        blocked=blocked,
        weights=weights,
        targets=targets,
        psp_default_bin=default_bin,
        note=note,
        by_priority=isinstance(policy, Maui | Fairshare | Psp),
        params=dict(reply.params),
    )


def pending_view(snap: ClusterSnapshot, job_id: int) -> PendingView | None:
    for p in snap.pending:
        if p.id == job_id:
            return p
    return None
