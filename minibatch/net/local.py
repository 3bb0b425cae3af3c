"""The server's side of the commands' socket (:mod:`minibatch.net.stream`).

asyncio's unix server accepts and buffers; this module frames, names each
connection by a route of its own, and hands complete requests to the server in
batches, as :class:`~minibatch.net.driver.SocketDriver` does for the ROUTER, so
that one commit still answers a burst. Every connection counts towards its
user's cap (:class:`~minibatch.net.guard.Caps`, shared with the ROUTER's
guard). What a peer makes the server hold is bounded: a message over
``max_message_bytes`` ends its connection (after an error reply saying so); a
connection has at most :data:`PENDING_PER_CONNECTION` requests taken and not
yet handled, and none taken while its replies pile up unread, and is not read
meanwhile (so the replies queued for it are those of a few requests); a
user's messages not yet taken hold about one largest message in all
(:meth:`LocalListener.over_budget`); a request whose sender closed its end
before it was handled (a command that timed out) is dropped, not carried out,
which is why a client must not half-close its end before its reply comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from minibatch.errors import ErrorCode
from minibatch.net.guard import UCRED, Caps
from minibatch.net.ratelog import RateLimitedLog
from minibatch.net.stream import HEADER
from minibatch.protocol import encode
from minibatch.protocol.messages import Error

#: Routes of this socket's connections start with these bytes. libzmq's
#: routing ids are five bytes when it makes them and never start with a zero
#: byte when a peer sets one, so no ROUTER peer can have one of these.
ROUTE_PREFIX = b"\x00local"
#: Requests taken from one connection and not yet handled, at most: a command
#: has one in flight, so more only ever queue replies in the server's memory.
PENDING_PER_CONNECTION = 4
#: Connections waiting to be accepted: a burst of commands is not refused.
BACKLOG = 1024


class Peer(NamedTuple):
    """Who is at the other end of a connection, as the kernel says."""

    uid: int
    gid: int
    pid: int


class LocalRequest(NamedTuple):
    route: bytes
    data: bytes
    peer: Peer


Deliver = Callable[[list[LocalRequest]], None]


class LocalListener:
    """Serves the commands' socket at ``path`` for ``deliver``."""

    def __init__(
        self,
        path: str,
        deliver: Deliver,
        *,
        caps: Caps,
        max_message_bytes: int,
        complaints: RateLimitedLog,
        batch: int = 512,
    ) -> None:
        self.path, self.deliver, self.caps = path, deliver, caps
        self.max_message_bytes, self.complaints = max_message_bytes, complaints
        self.batch = batch
        self.connections: dict[bytes, _Connection] = {}
        #: Bytes each user's connections hold of messages not yet taken, and
        #: those connections, the first to hold first.
        self.partial: Counter[int] = Counter()
        self.holders: dict[int, dict[bytes, _Connection]] = {}
        self._pending: list[LocalRequest] = []
        self._scheduled = False
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Bind and listen; any local user may connect (identity comes from
        the peer credentials, as on the ipc endpoint)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _Connection(self), self.path, backlog=BACKLOG
        )
        os.chmod(self.path, 0o777)

    def send(self, route: bytes, data: bytes) -> None:
        """Send ``data`` to the connection ``route``, if it is still open."""
        conn = self.connections.get(route)
        if conn is not None and conn.transport is not None and not conn.closing:
            conn.transport.write(HEADER.pack(len(data)) + data)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections.values()):
            if conn.transport is not None:
                conn.transport.close()  # after what is buffered is written
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def over_budget(self, uid: int) -> bool:
        """Whether ``uid``'s messages not yet taken hold more than one largest
        message: 256 connections each halfway through a 64 MiB message would
        otherwise hold 16 GiB of the server's memory. Only its first holder
        is read on then (:meth:`first_holder`)."""
        return (
            uid not in self.caps.exempt and self.partial[uid] > self.max_message_bytes
        )

    def first_holder(self, uid: int) -> bytes | None:
        """The route of ``uid``'s connection that has held part of a message
        the longest: it goes on while the others wait, so that some message
        always finishes and gives its room back."""
        return next(iter(self.holders.get(uid, {})), None)

    def _hold(self, conn: _Connection, uid: int, change: int) -> None:
        self.partial[uid] += change
        held = self.holders.setdefault(uid, {})
        if conn.held:
            held.setdefault(conn.route, conn)
        else:
            held.pop(conn.route, None)
        if self.partial[uid] <= 0:
            del self.partial[uid], self.holders[uid]
        elif change < 0:  # room again: its paused connections may go on
            for other in list(held.values()):
                other.flow()

    def _queue(self, request: LocalRequest) -> None:
        self._pending.append(request)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        batch, self._pending = (
            self._pending[: self.batch],
            self._pending[self.batch :],
        )
        if self._pending:  # after the loop has run what else is due
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)
        live = []
        for request in batch:
            conn = self.connections.get(request.route)
            if conn is None or conn.closing:
                continue
            conn.handled()
            if not conn.gone():
                live.append(request)
        if live:
            self.deliver(live)


class _Connection(asyncio.Protocol):
    def __init__(self, listener: LocalListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.route = ROUTE_PREFIX + next(listener._ids).to_bytes(8, "big")
        self.peer: Peer | None = None
        self.buffer = bytearray()
        self.waiting = 0  # requests queued, not yet handled
        self.reading_paused = False
        self.writing_paused = False
        #: Refused: nothing more is read from it.
        self.closing = False
        #: Bytes of an unfinished message in ``buffer``, as counted for its user.
        self.held = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        sock: socket.socket = transport.get_extra_info("socket")
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
        except OSError:  # gone already
            transport.abort()
            return
        pid, uid, gid = UCRED.unpack(creds)
        refused = self.listener.caps.admit(self.route, uid)
        if refused is not None:
            # Said to the command too, which reads it before the reset.
            transport.write(_error(f"connection refused: {refused}"))
            transport.close()
            return
        self.transport, self.peer = transport, Peer(uid, gid, pid)
        self.listener.connections[self.route] = self

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.listener.caps.forget(self.route)
            del self.listener.connections[self.route]
            self.transport = None
            self._keep(0)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.peer is None or self.closing:
            return
        self.buffer += data
        self._take()

    def _take(self) -> None:
        """Take the whole messages in ``buffer`` while few of this connection's
        wait and its replies are read; keep the rest (counted for its user)."""
        if self.transport is None or self.peer is None or self.closing:
            return
        buffer = self.buffer
        offset = 0
        while (
            self.waiting < PENDING_PER_CONNECTION
            and not self.writing_paused
            and len(buffer) - offset >= HEADER.size
        ):
            (size,) = HEADER.unpack_from(buffer, offset)
            if size > self.listener.max_message_bytes:
                self._refuse_large(size)
                return
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            data = bytes(buffer[offset + HEADER.size : end])
            offset = end
            self.waiting += 1
            self.listener._queue(LocalRequest(self.route, data, self.peer))
        del buffer[:offset]
        self._keep(len(buffer))
        self.flow()

    def _keep(self, size: int) -> None:
        """Count the ``size`` bytes this connection now holds of messages not
        yet taken in its user's budget."""
        if self.peer is not None and size != self.held:
            change, self.held = size - self.held, size
            self.listener._hold(self, self.peer.uid, change)

    def _refuse_large(self, size: int) -> None:
        """Say why, then end the connection: what follows the header cannot
        be told apart from a next message."""
        assert self.transport is not None and self.peer is not None
        limit = self.listener.max_message_bytes
        self.listener.complaints.warning(
            "closed a connection of uid %d pid %d: a message of %d bytes, over "
            "[server] max_message_bytes (%d)",
            self.peer.uid,
            self.peer.pid,
            size,
            limit,
        )
        self.transport.write(
            _error(
                f"the request is {size} bytes, over the server's "
                f"[server] max_message_bytes ({limit})",
                ErrorCode.INVALID_MESSAGE,
            )
        )
        self.transport.close()
        self.closing = True
        self.buffer.clear()
        self._keep(0)

    def gone(self) -> bool:
        """Whether the peer has closed its end: a command that gave up
        waiting (its timeout) must not have its request carried out after it
        said it got no answer (a qsub run again would make a second job)."""
        assert self.transport is not None
        fd = self.transport.get_extra_info("socket").fileno()
        try:
            peer = socket.socket(fileno=fd)
        except (OSError, ValueError):  # closed meanwhile: connection_lost says
            return False
        try:
            return peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:  # open, nothing more sent
            return False
        except OSError:  # reset, or closed under us
            return True
        finally:
            peer.detach()  # asyncio's descriptor, not ours to close

    def handled(self) -> None:
        self.waiting -= 1
        self._take()

    def flow(self) -> None:
        """Read while few requests wait, the replies are taken and the user's
        unfinished messages are within budget."""
        if self.transport is None or self.peer is None:
            return
        stop = self.waiting >= PENDING_PER_CONNECTION or self.writing_paused
        if self.held and not stop and self.listener.over_budget(self.peer.uid):
            stop = self.listener.first_holder(self.peer.uid) != self.route
        if stop and not self.reading_paused:
            self.transport.pause_reading()
        elif not stop and self.reading_paused:
            self.transport.resume_reading()
        self.reading_paused = stop

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.flow()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._take()


def _error(message: str, code: ErrorCode = ErrorCode.UNAVAILABLE) -> bytes:
    """An error that answers no request in particular (``re`` 0), framed."""
    reply = encode(Error(code=int(code), message=message), re=0)
    return HEADER.pack(len(reply)) + reply
