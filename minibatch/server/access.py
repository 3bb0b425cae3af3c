"""Who may send what: the handlers' context and their permission checks.

The caller is whoever the socket's peer credentials say (see
:func:`~minibatch.server.submit.parse_peer`). Daemons (nodes, the scheduler) are
root or the cluster's owner; operators are those and the users listed in
``server.operators`` (PBS's operators, Maui's ADMIN levels folded into one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minibatch.core.job import Job
from minibatch.errors import PermissionDenied
from minibatch.protocol.messages import Message
from minibatch.server.submit import Caller

if TYPE_CHECKING:
    from minibatch.server.state import ServerState


@dataclass
class Context:
    """What handlers know besides the state: who may do what, and where things are."""

    owner_uid: int = field(default_factory=os.getuid)
    operators: frozenset[str] = frozenset()
    endpoint: str = ""
    mqtt_url: str = ""
    pid: int = field(default_factory=os.getpid)
    #: The ``[fairshare]`` settings, reported by ``diagnose -f``.
    fairshare: dict[str, Any] = field(default_factory=dict)

    def is_daemon(self, caller: Caller | None) -> bool:
        return caller is not None and caller.uid in (0, self.owner_uid)

    def is_operator(self, caller: Caller | None) -> bool:
        return self.is_daemon(caller) or (
            caller is not None and caller.user in self.operators
        )


Handler = Callable[["ServerState", Context, Caller | None, bytes, Any], Message | None]


def need_caller(caller: Caller | None) -> Caller:
    if caller is None:
        raise PermissionDenied(
            "requests must come over the local socket (no credentials)"
        )
    return caller


def need_daemon(ctx: Context, caller: Caller | None) -> None:
    if not ctx.is_daemon(caller):
        raise PermissionDenied("only the cluster's own daemons may send this message")


def need_operator(ctx: Context, caller: Caller | None, what: str) -> Caller:
    """The caller, if an operator; else PermissionDenied saying who may ``what``."""
    c = need_caller(caller)
    if not ctx.is_operator(c):
        raise PermissionDenied(
            f"only operators may {what} (root, the cluster's owner and "
            f"server.operators); {c.user} is not one"
        )
    return c


def may_control(ctx: Context, caller: Caller | None, job: Job) -> None:
    """Raise unless the caller owns ``job`` or is an operator."""
    c = need_caller(caller)
    if c.uid != job.uid and not ctx.is_operator(c):
        raise PermissionDenied(
            f"job {job.display_id} belongs to {job.user}, not {c.user}"
        )
