"""The messages between the server and the scheduler.

The scheduler sends ``SchedHello``, ``GetSnapshot`` and ``ApplyPlan`` and
receives ``Wake``; :mod:`minibatch.protocol.messages` has the others, and the
union of them all.
"""

from typing import Any

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.protocol.base import Msg


class SchedHello(Msg, frozen=True, kw_only=True, tag="sched_hello"):
    """-> Ok. Registers the sender as the scheduler that receives ``Wake``."""

    pid: int
    policy: str
    #: The policy the server named that it keeps not running, and why (it
    #: failed to load or to plan); "" when it runs the server's choice.
    refused: str = ""


class PendingDelta(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """How the queue changed since the scheduler's copy of it, version ``base``.

    With ``base`` -1 the snapshot's ``pending`` is the queue as it is (version
    ``version``); otherwise ``pending`` is empty and the scheduler rebuilds it
    from its copy: ``removed`` ids out, ``added`` views in (replacing any of the
    same id), in rank order (:mod:`minibatch.scheduler.mirror`). A deep queue
    then costs a pass what changed, not the whole queue.
    """

    version: int
    base: int = -1
    removed: list[int] = []
    added: list[PendingView] = []


class Wake(Msg, frozen=True, kw_only=True, tag="wake"):
    """Server -> scheduler: state changed; plan this snapshot. No reply.

    Carrying the snapshot saves the scheduler a round trip per pass; without one
    (``None``) the scheduler asks with ``GetSnapshot``. ``policy`` and ``params``
    are the policy to plan with (``mb policy set``); "" keeps the scheduler's own.
    """

    generation: int
    snapshot: ClusterSnapshot | None = None
    policy: str = ""
    params: dict[str, Any] = {}
    delta: PendingDelta | None = None


class GetSnapshot(Msg, frozen=True, kw_only=True, tag="get_snapshot"):
    """-> SnapshotReply. From the scheduler: the snapshot of the pass it plans
    next (the server awaits its plan). ``peek``: a look for any user (``mb
    whatif``) that changes nothing."""

    peek: bool = False
    #: The version of the queue the scheduler holds (-1: none): the reply
    #: carries a delta from it when the server still knows it.
    base: int = -1


class SnapshotReply(Msg, frozen=True, kw_only=True, tag="snapshot"):
    snapshot: ClusterSnapshot
    policy: str = ""
    params: dict[str, Any] = {}
    delta: PendingDelta | None = None


class ApplyPlan(Msg, frozen=True, kw_only=True, tag="apply_plan"):
    """-> PlanResult. The server validates every start against current state.

    ``elapsed`` (seconds the policy took) and ``pending`` (jobs it planned) are
    for the pass event (``sched/pass``) only.
    """

    plan: Plan
    elapsed: float = 0.0
    pending: int = 0


class PlanResult(Msg, frozen=True, kw_only=True, tag="plan_result"):
    started: list[int]
    rejected: dict[int, str]
