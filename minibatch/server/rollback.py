"""A batch whose commit failed: back to what the database holds, said once.

When the commit of a batch fails (disk full, read-only file system, I/O error)
none of its writes reached the database, yet the in-memory state has them all.
:func:`restore` rebuilds the state from the database with the start-up path
(:class:`~minibatch.server.state.ServerState`'s constructor: the code a restarted
server already trusts) rather than undoing changes one by one. An undo log would
have to follow every mutation of every handler (jobs, the queue, nodes,
reservations, QOS counters, fairshare history, the next job id), and a change
it missed would reach the database with the next commit: a client told "failed"
would find it done later. A reload costs what a server start costs, and only
when a commit fails; the path that commits pays nothing.

The database does not hold facts about connections, which stay true whatever
was committed: which scheduler is registered, and where each node daemon is
connected and when it was last heard of. :func:`restore` keeps them, for a node
only while the database knows the same daemon (same pid): a hello from a
restarted daemon that was rolled back is said again, as the daemon was answered
with an error. Everything else that is not stored starts afresh, as after a
restart: the last plan's notes and upcoming jobs (the next pass brings them back),
and heartbeat miss counts. Those must start afresh: a job whose end report was
refused no longer shows in its node's heartbeats, and each refusal resetting
the count keeps it from being found lost before the node's next resend lands.

The batch's daemon messages, MQTT events, mail and accounting records go with the
state dropped. Two kinds of announcement would then never be made again, because
what triggers them has already happened: a reservation's start (it is announced
again by the next tick) and a node's state (the restored one is published).
Job ids come from the database's counter, committed with the jobs: a rolled-back
submission's id was never told to anyone, so the next job takes it.
"""

from __future__ import annotations

import logging

from minibatch.config import Config
from minibatch.errors import StorageError
from minibatch.net.ratelog import RateLimitedLog
from minibatch.server.state import ServerState

#: Not stored, true whatever was committed: carried over by :func:`restore`.
_CONNECTIONS = (
    "scheduler",
    "scheduler_pid",
    "policy_name",
    "policy_refused",
    "plan_pending_since",
    "snapshot_time",
)

#: Seconds between two lines about commits failing for the same reason.
LOG_WINDOW = 60.0


def restore(old: ServerState, config: Config) -> ServerState:
    """A state equal to the database's, with ``old``'s connections."""
    store = old.store
    store.discard()
    new = ServerState(store, clock=old.clock, config=config)
    for name in _CONNECTIONS:
        setattr(new, name, getattr(old, name))
    # Plans are matched to snapshots by generation: never number one twice.
    new.generation = old.generation + 1
    new.wake = True  # the scheduler's last plan may have been refused
    dropped = {topic for topic, _ in old.events}
    for node in new.nodes.nodes.values():
        was = old.nodes.nodes.get(node.name)
        if was is not None and was.pid == node.pid:
            node.up, node.route = was.up, was.route
            node.last_heartbeat = was.last_heartbeat
        if f"nodes/{node.name}/state" in dropped:
            new.publish_node(node)
    book = new.reservations
    book.started = {
        name for name in book.started if f"reservations/{name}/started" not in dropped
    }
    return new


class CommitTrouble:
    """The log of failed commits: a line per kind of failure at most every
    :data:`LOG_WINDOW` seconds, then how many more there were; a line when
    commits work again. A full disk fails every write, and each line about it
    would make it worse."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.failed = 0
        self._kinds: dict[str, RateLimitedLog] = {}

    def failure(self, error: StorageError) -> None:
        kind = self._kinds.get(error.cause)
        if kind is None:
            what = f"failed commits ({error.cause})"
            kind = RateLimitedLog(self.logger, what, burst=1, window=LOG_WINDOW)
            self._kinds[error.cause] = kind
        self.failed += 1
        kind.error("commit failed, the batch is refused: %s", error)

    def recovered(self) -> None:
        if not self.failed:
            return
        for kind in self._kinds.values():
            kind.summarize()
        self.logger.warning("commits work again (%d failed before)", self.failed)
        self.failed = 0
