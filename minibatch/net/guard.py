"""A cap on each user's connections to a bound ipc socket (and on each host's
to its tcp endpoints, :mod:`minibatch.net.curve`).

libzmq accepts every connection to a ROUTER, and each holds a file descriptor
for as long as its peer keeps it open: one user opening thousands would use up
the daemon's descriptors, and libzmq aborts when ``accept`` then fails. It has
no limit of its own, so a socket monitor reports each accepted connection
(``EVENT_ACCEPTED`` carries its descriptor), ``SO_PEERCRED`` on it names the
user, and a connection over its user's cap is shut down; libzmq sees it end and
closes it. We never close libzmq's descriptor ourselves (libzmq would close
the number again later, by then perhaps someone else's): we act on a duplicate.

Events arrive after the fact, so the descriptor may have been closed and its
number reused by the time one is handled. Only the number is taken from the
event; who holds it is read then. A connection is thus always counted for, and
refused by, the user it really belongs to, and ``EVENT_DISCONNECTED`` (queued by
libzmq before it closes the descriptor, so before the number can be reused)
keeps the counts right. The monitor's pipe has no high-water mark, so no event
is dropped however far behind the loop falls.

The cap cannot stop a burst faster than the loop, which is why the daemons
also raise their descriptor limit (:mod:`minibatch.net.limits`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections import Counter
from collections.abc import Hashable

import zmq

from minibatch.net.driver import Frames, SocketDriver
from minibatch.net.limits import raise_fd_limit
from minibatch.net.ratelog import RateLimitedLog

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_EVENT = struct.Struct("=Hi")  # libzmq's first monitor frame: event id, value
UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: Descriptors kept for the daemon's own use (database, logs, the MQTT
#: connection, libzmq's own) when the total is capped below the limit.
RESERVED_FDS = 256


def peer_uid(fd: int) -> int | str | None:
    """The uid at the other end of the connected unix socket ``fd``, the
    address of the peer of the tcp connection ``fd``, or None when ``fd`` is
    neither (any more). tcp peers (``[server] listen``) are capped per host,
    like users: before their handshake they are anyone on the network."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=dup)
    except OSError:  # not a socket
        os.close(dup)
        return None
    with sock:
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return None
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                return str(sock.getpeername()[0])
            if sock.family != socket.AF_UNIX:
                return None
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
        except OSError:
            return None
    return int(UCRED.unpack(creds)[1])


def shut_down(fd: int) -> None:
    """End the connection on ``fd`` without closing libzmq's descriptor."""
    try:
        dup = os.dup(fd)
    except OSError:
        return
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return
    with sock, contextlib.suppress(OSError):  # already gone
        sock.shutdown(socket.SHUT_RDWR)


class Caps:
    """The connections each uid (a tcp peer: its address) holds, capped at
    ``per_user``, and everyone's, capped at ``total`` (below the descriptor
    limit); ``exempt`` uids (root, the daemons' own) only count towards the
    total. One budget for all of a server's listeners: each names its
    connections by keys of its own (:class:`ConnectionGuard`: libzmq's
    descriptor numbers; :mod:`minibatch.net.local`: its own)."""

    def __init__(
        self,
        *,
        per_user: int,
        total: int,
        exempt: frozenset[int],
        complaints: RateLimitedLog,
    ) -> None:
        self.per_user, self.total, self.exempt = per_user, total, exempt
        self.complaints = complaints
        #: Each tracked connection's uid (or address) by its key, and the count
        #: per uid (or address).
        self.conns: dict[Hashable, int | str] = {}
        self.by_uid: Counter[int | str] = Counter()

    def admit(self, key: Hashable, uid: int | str) -> str | None:
        """Count the connection ``key`` of ``uid``; or, when a cap refuses it,
        why (also said in the log)."""
        who = f"uid {uid}" if isinstance(uid, int) else f"host {uid}"
        if len(self.conns) >= self.total:
            why = (
                f"{len(self.conns)} connections are open, the most the server's "
                "open file limit leaves room for"
            )
        elif uid not in self.exempt and self.by_uid[uid] >= self.per_user:
            why = (
                f"{who} has {self.by_uid[uid]} connections open, the most one "
                "user may have ([server] max_connections_per_user)"
            )
        else:
            self.conns[key] = uid
            self.by_uid[uid] += 1
            return None
        self.complaints.warning("closed a connection of %s: %s", who, why)
        return why

    def forget(self, key: Hashable) -> None:
        uid = self.conns.pop(key, None)
        if uid is not None:
            self.by_uid[uid] -= 1
            if not self.by_uid[uid]:
                del self.by_uid[uid]


class ConnectionGuard:
    """Applies ``caps`` to the connections libzmq accepts on ``sock``. Made
    before ``sock`` is bound: a connection accepted before the monitor's pipe
    is connected would go uncounted."""

    def __init__(self, sock: zmq.Socket[bytes], caps: Caps) -> None:
        self.caps = caps
        address = f"inproc://guard-{id(self)}"
        sock.monitor(address, _EVENTS)
        self._sock = sock
        self._mon: zmq.Socket[bytes] = sock.context.socket(zmq.PAIR)
        self._mon.setsockopt(zmq.LINGER, 0)
        self._mon.setsockopt(zmq.RCVHWM, 0)  # unbounded: no event is dropped
        self._mon.connect(address)
        self._driver: SocketDriver | None = None

    def start(self) -> None:
        """Handle events from the running loop on."""
        self._driver = SocketDriver(self._mon, self._on_batch)

    def close(self) -> None:
        self._sock.disable_monitor()
        if self._driver is not None:
            self._driver.close()
        else:
            self._mon.close(0)

    def _on_batch(self, batch: list[Frames]) -> None:
        for frames in batch:
            if len(frames) != 2 or len(frames[0].bytes) != _EVENT.size:
                continue
            event, fd = _EVENT.unpack(frames[0].bytes)
            self.caps.forget(fd)
            if event == zmq.EVENT_ACCEPTED:
                self.accepted(fd)

    def accepted(self, fd: int) -> None:
        """Count the connection on ``fd``, or shut it down if over a cap."""
        uid = peer_uid(fd)
        if uid is not None and self.caps.admit(fd, uid) is not None:
            shut_down(fd)


def listen(
    endpoint: str,
    *,
    max_message_bytes: int,
    per_user: int,
    complaints: RateLimitedLog,
) -> tuple[zmq.Socket[bytes], ConnectionGuard]:
    """A ROUTER bound to ``endpoint``, in a process whose descriptor limit is
    raised, that drops a message over ``max_message_bytes`` with its connection
    (libzmq does, before reading it whole), and its guard (not yet started)."""
    fd_limit = raise_fd_limit()
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    caps = Caps(
        per_user=per_user,
        total=max(1, fd_limit - RESERVED_FDS),
        exempt=frozenset({0, os.getuid()}),
        complaints=complaints,
    )
    guard = ConnectionGuard(sock, caps)
    sock.bind(endpoint)
    return sock, guard
