"""Connection caps without a cluster: the test's own uid, made not exempt.

The ROUTER's guard and the commands' unix socket share one budget per user
(:class:`minibatch.net.guard.Caps`). Also the commands' client against a
socket nobody serves, or a server that hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from minibatch.errors import InvalidArgument, Unavailable
from minibatch.net.client import Client
from minibatch.net.driver import SocketDriver
from minibatch.net.guard import Caps, listen
from minibatch.net.local import LocalListener
from minibatch.net.ratelog import RateLimitedLog
from minibatch.net.stream import check_path, command_path
from minibatch.protocol.messages import Status

pytestmark = pytest.mark.timeout(60)


def raw_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} not reached")


async def test_the_guard_caps_each_user_not_exempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a cluster or root: the test's own uid, not exempt here, may
    hold 3 connections; the others are shut down, and a connection that
    ends is no longer counted."""
    endpoint = f"ipc://{tmp_path / 'guarded.sock'}"
    complaints = RateLimitedLog(logging.getLogger("test.guard"), "refused")
    sock, guard = listen(
        endpoint, max_message_bytes=1024, per_user=3, complaints=complaints
    )
    guard.caps.exempt = frozenset()
    driver = SocketDriver(sock, lambda batch: None)
    guard.start()
    uid = os.getuid()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    clients = [raw_socket(ctx, endpoint) for _ in range(10)]
    try:

        def refused() -> int:
            return sum("closed a connection" in r.getMessage() for r in caplog.records)

        await until(lambda: refused() >= 7, "7 connections refused")
        assert guard.caps.by_uid == {uid: 3} and len(guard.caps.conns) == 3
        for client in clients:
            client.setsockopt(zmq.RECONNECT_IVL, -1)  # no more attempts
            client.close()
        await until(lambda: not guard.caps.conns, "every connection forgotten")
    finally:
        ctx.destroy(linger=0)
        guard.close()
        driver.close()


async def test_the_commands_socket_counts_in_the_same_caps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "server.commands")
    complaints = RateLimitedLog(logging.getLogger("test.local"), "refused")
    caps = Caps(per_user=3, total=100, exempt=frozenset(), complaints=complaints)
    listener = LocalListener(
        path,
        lambda batch: None,
        caps=caps,
        max_message_bytes=1024,
        complaints=complaints,
    )
    await listener.start()
    uid = os.getuid()
    loop = asyncio.get_running_loop()
    clients = []
    try:
        for _ in range(10):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            await loop.sock_connect(sock, path)
            clients.append(sock)

        def refused() -> int:
            return sum("closed a connection" in r.getMessage() for r in caplog.records)

        await until(lambda: refused() >= 7, "7 connections refused")
        assert caps.by_uid == {uid: 3} and len(listener.connections) == 3
        # The refused ones were told why, then ended.
        told = 0
        for sock in clients:
            with contextlib.suppress(TimeoutError):  # an admitted one
                data = await asyncio.wait_for(loop.sock_recv(sock, 4096), 0.5)
                told += b"max_connections_per_user" in data
        assert told == 7
        for sock in clients:
            sock.close()
        await until(lambda: not caps.conns, "every connection forgotten")
    finally:
        for sock in clients:
            sock.close()
        listener.close()
    assert not os.path.exists(path)


def test_a_client_knows_at_once_that_no_server_serves(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path / 'server.sock'}"
    path = command_path(endpoint)
    assert path == str(tmp_path / "server.commands")
    client = Client(endpoint, timeout=60)  # made before any server, as mb up does
    with pytest.raises(Unavailable, match="no minibatch server"):
        client.call(Status())
    # A socket file left by a server that died: refused, not a timeout.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()
    with pytest.raises(Unavailable, match="no minibatch server"):
        client.call(Status())
    os.unlink(path)
    # A server that reads the request and hangs up without an answer.
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()

    def hang_up() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1 << 16)

    thread = threading.Thread(target=hang_up)
    thread.start()
    try:
        with pytest.raises(Unavailable, match="closed the connection"):
            client.call(Status())
    finally:
        thread.join()
        server.close()
        client.close()


def test_a_socket_path_too_long_to_bind_is_named() -> None:
    fits = "/tmp/" + "d" * 80 + "/s.commands"
    check_path(fits)
    deep = "/tmp/" + "d" * 92 + "/s.commands"
    with pytest.raises(InvalidArgument, match=r"is 108 bytes, over the 107"):
        check_path(deep)
