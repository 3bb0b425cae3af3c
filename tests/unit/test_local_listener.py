"""The commands' socket, read however the bytes arrive (minibatch/net/local.py).

A connection is driven by hand (a transport that records what is done to it):
every message comes out whole and in order whatever the chunks, a peer that
sends faster than it is answered is paused, and one that announces too large a
message is told why and cut off.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.net.guard import Caps
from minibatch.net.local import (
    PENDING_PER_CONNECTION,
    LocalListener,
    LocalRequest,
    _Connection,
)
from minibatch.net.ratelog import RateLimitedLog
from minibatch.net.stream import HEADER
from minibatch.protocol import decode
from minibatch.protocol.messages import Error

pytestmark = pytest.mark.timeout(120)

LIMIT = 1000
PEER = (4242, 1001, 1002)  # struct ucred: pid, uid, gid


class Sock:
    def getsockopt(self, *args: Any) -> bytes:
        return struct.pack("3i", *PEER)

    def fileno(self) -> int:
        return -1  # no real peer: never taken for one that left


class SockWithCreds(Sock):
    """A real socket's descriptor, with made-up peer credentials."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


class Transport(asyncio.Transport):
    def __init__(self, sock: socket.socket | None = None) -> None:
        super().__init__()
        self.sock = sock
        self.written = b""
        self.paused = False
        self.pauses = 0
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name != "socket":
            return default
        return Sock() if self.sock is None else SockWithCreds(self.sock)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def listener(delivered: list[LocalRequest]) -> LocalListener:
    complaints = RateLimitedLog(logging.getLogger("test.local"), "complaints")
    caps = Caps(per_user=10, total=10, exempt=frozenset(), complaints=complaints)
    return LocalListener(
        "/nonexistent",
        delivered.extend,
        caps=caps,
        max_message_bytes=LIMIT,
        complaints=complaints,
    )


def framed(data: bytes) -> bytes:
    return HEADER.pack(len(data)) + data


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=LIMIT), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=20 * (LIMIT + 4)), max_size=30),
)
def test_messages_come_out_whole_and_in_order_however_they_are_cut(
    messages: list[bytes], cuts: list[int]
) -> None:
    async def run() -> list[LocalRequest]:
        delivered: list[LocalRequest] = []
        conn = _Connection(listener(delivered))
        transport = Transport()
        conn.connection_made(transport)
        stream = b"".join(framed(m) for m in messages)
        edges = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
        for start, end in zip(edges, edges[1:], strict=False):
            conn.data_received(stream[start:end])
            await settle()
        assert not transport.closed and not transport.paused
        return delivered

    delivered = asyncio.run(run())
    assert [r.data for r in delivered] == messages
    uid, gid, pid = PEER[1], PEER[2], PEER[0]
    assert all(r.peer == (uid, gid, pid) for r in delivered)
    assert len({r.route for r in delivered}) <= 1


def test_a_peer_that_sends_faster_than_it_is_answered_is_paused() -> None:
    """However many requests one send holds, a few are taken at a time, the
    rest as those are handled; none while its replies are not read."""

    async def run() -> None:
        delivered: list[LocalRequest] = []
        owner = listener(delivered)
        conn = _Connection(owner)
        transport = Transport()
        conn.connection_made(transport)
        count = 10 * PENDING_PER_CONNECTION + 3
        conn.data_received(framed(b"x") * count)
        assert transport.paused and conn.waiting == PENDING_PER_CONNECTION
        assert len(owner._pending) == PENDING_PER_CONNECTION
        for _ in range(count):
            await asyncio.sleep(0)
            assert conn.waiting <= PENDING_PER_CONNECTION
        assert len(delivered) == count and not transport.paused
        # A peer that does not read its replies is neither read nor taken from.
        conn.pause_writing()
        assert transport.paused
        conn.data_received(framed(b"y"))
        await settle()
        assert len(delivered) == count
        conn.resume_writing()
        await settle()
        assert len(delivered) == count + 1 and not transport.paused

    asyncio.run(run())


def test_a_request_is_dropped_when_its_sender_has_given_up() -> None:
    """A real socket pair: the request is taken, then its sender closes
    before the server handles it (a command that timed out)."""

    async def run() -> list[LocalRequest]:
        delivered: list[LocalRequest] = []
        conn = _Connection(listener(delivered))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        transport = Transport(ours)
        conn.connection_made(transport)
        conn.data_received(framed(b"kept"))
        await settle()
        conn.data_received(framed(b"given up"))
        theirs.close()
        await settle()
        ours.close()
        return delivered

    assert [r.data for r in asyncio.run(run())] == [b"kept"]


def test_a_message_over_the_limit_is_refused_saying_why() -> None:
    async def run() -> tuple[Transport, list[LocalRequest]]:
        delivered: list[LocalRequest] = []
        conn = _Connection(listener(delivered))
        transport = Transport()
        conn.connection_made(transport)
        conn.data_received(framed(b"ok") + HEADER.pack(LIMIT + 1) + b"rest")
        conn.data_received(framed(b"after"))  # ignored: the connection is over
        await settle()
        return transport, delivered

    transport, delivered = asyncio.run(run())
    # Not even the request before it: its answer could no longer be sent.
    assert delivered == []
    assert transport.closed
    (size,) = HEADER.unpack_from(transport.written)
    refusal = decode(transport.written[HEADER.size : HEADER.size + size])
    assert refusal.re == 0 and isinstance(refusal.body, Error)
    assert f"{LIMIT + 1} bytes" in refusal.body.message
    assert "max_message_bytes" in refusal.body.message


def test_a_connection_over_its_users_cap_is_not_served() -> None:
    delivered: list[LocalRequest] = []
    owner = listener(delivered)
    owner.caps.per_user = 1
    first, second = _Connection(owner), _Connection(owner)
    t1, t2 = Transport(), Transport()
    first.connection_made(t1)
    second.connection_made(t2)
    assert not t1.closed and t2.closed
    # The command is told why, before its connection ends.
    (size,) = HEADER.unpack_from(t2.written)
    refusal = decode(t2.written[HEADER.size : HEADER.size + size]).body
    assert isinstance(refusal, Error)
    assert "max_connections_per_user" in refusal.message
    assert owner.caps.by_uid == {PEER[1]: 1}
    second.data_received(framed(b"x"))  # nothing is read from it
    assert owner._pending == []
    first.connection_lost(None)
    second.connection_lost(None)
    assert not owner.caps.conns and not owner.connections


def test_a_users_unfinished_messages_hold_at_most_about_one_largest() -> None:
    """Many connections each halfway through a large message would hold the
    server's memory: past one largest message in all, only the user's oldest
    unfinished message is read on; the others wait for its room."""

    async def run() -> None:
        delivered: list[LocalRequest] = []
        owner = listener(delivered)
        older, newer = _Connection(owner), _Connection(owner)
        t_old, t_new = Transport(), Transport()
        older.connection_made(t_old)
        newer.connection_made(t_new)
        first, second = b"a" * 900, b"b" * 900
        older.data_received(framed(first)[:500])
        assert not t_old.paused and owner.partial[PEER[1]] == 500
        newer.data_received(framed(second)[:600])  # 1,100 > 1,000 held
        assert t_new.paused and not t_old.paused
        older.data_received(framed(first)[500:])  # done: its room is back
        assert not t_new.paused and owner.partial[PEER[1]] == 600
        newer.data_received(framed(second)[600:])
        await settle()
        assert [r.data for r in delivered] == [first, second]
        assert not owner.partial
        # A connection that ends halfway gives its room back too.
        newer.data_received(framed(second)[:300])
        assert owner.partial[PEER[1]] == 300
        newer.connection_lost(None)
        assert not owner.partial

    asyncio.run(run())
