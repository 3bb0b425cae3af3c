"""Who may send what: the handlers' context and their permission checks.

The caller is whoever the socket's peer credentials say (see
:func:`~minibatch.server.submit.parse_peer`), or on tcp the user or node its
CURVE key was registered for. Daemons (nodes, the scheduler) are root or the
cluster's owner on this host, or a node's key for that node's messages alone;
operators are root and the owner on this host, and the users listed in
``server.operators`` (PBS's operators, Maui's ADMIN levels folded into one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from minibatch.core.job import Job
from minibatch.errors import PermissionDenied
from minibatch.protocol.messages import (
    Heartbeat,
    JobEnded,
    JobResized,
    JobStarted,
    Message,
    NodeHello,
    Status,
)
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
    #: ``[scheduler.policy_modules]``: the policies the configuration names
    #: besides the installed ones (``mb policy set`` chooses by name only).
    policy_modules: dict[str, str] = field(default_factory=dict)
    #: The event publisher's counters (sent, pending, dropped, connected).
    event_stats: Callable[[], dict[str, int]] = dict

    def is_daemon(self, caller: Caller | None) -> bool:
        if caller is None:
            return False
        if caller.remote:  # over tcp only a node key, and only for its node
            return caller.node is not None
        return caller.uid in (0, self.owner_uid)

    def is_operator(self, caller: Caller | None) -> bool:
        if caller is None or caller.node is not None:
            return False
        if not caller.remote and caller.uid in (0, self.owner_uid):
            return True
        return caller.user in self.operators


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


def need_remote_allowed(state: ServerState, caller: Caller, msg: Message) -> None:
    """Refuse what a tcp caller's key may not send. A user's key makes an
    ordinary user (the handlers check the rest); a node's key may only say
    hello and heartbeats for its node and report that node's jobs."""
    node = caller.node
    if node is None or isinstance(msg, Status):
        return
    if isinstance(msg, NodeHello | Heartbeat):
        if msg.name == node:
            return
        what = f"speak for node {msg.name}"
    elif isinstance(msg, JobStarted | JobResized | JobEnded):
        job = state.jobs.get(msg.job)
        if job is None or any(a.node == node for a in job.alloc):
            return  # an unknown job's report changes nothing
        what = f"report job {job.display_id}, which does not run there"
    else:
        what = f"send {type(msg).__name__}"
    raise PermissionDenied(f"the key of node {node} may not {what}")


def visible(ctx: Context, caller: Caller | None, job: Job) -> Job:
    """``job`` as ``caller`` may see it: whole to its owner and operators; to
    anyone else without its environment, arguments and script, which may hold
    secrets (``qsub -v TOKEN=...``). What PBS shows everyone stays: state,
    owner (and the host it submitted from), queue, resources, paths."""
    if caller is not None and (caller.uid == job.uid or ctx.is_operator(caller)):
        return job
    host = job.env.get("PBS_O_HOST")
    return msgspec.structs.replace(
        job,
        env={"PBS_O_HOST": host} if host else {},
        argv=None,
        script=None,
        submit_args="",
        options=msgspec.structs.replace(job.options, script_args=[]),
    )


def may_control(ctx: Context, caller: Caller | None, job: Job) -> None:
    """Raise unless the caller owns ``job`` or is an operator."""
    c = need_caller(caller)
    if c.uid != job.uid and not ctx.is_operator(c):
        raise PermissionDenied(
            f"job {job.display_id} belongs to {job.user}, not {c.user}"
        )
