"""Request/reply clients for the server's ROUTER socket.

:class:`Client` is the blocking client the commands use: one DEALER socket,
``LINGER=0``, a receive timeout, and a clean :class:`Unavailable` error when the
server does not answer. :class:`AsyncClient` is the daemons' version: requests are
matched to replies by id, and unsolicited messages (``Wake``, ``Launch``, ``Kill``)
go to a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

from minibatch.errors import ProtocolError, RemoteError, Unavailable
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Message

log = logging.getLogger(__name__)


def _unreachable(endpoint: str, timeout: float) -> Unavailable:
    return Unavailable(
        f"no answer from the minibatch server at {endpoint} within {timeout:g} s "
        "(is the cluster up? try `mb up`)"
    )


class Client:
    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)

    def call(self, body: Message) -> Any:
        """Send ``body`` and return the reply body; raise on an error reply."""
        rid = next(self._ids)
        self._sock.send(encode(body, rid))
        while True:
            try:
                frame = self._sock.recv()
            except zmq.Again:
                raise _unreachable(self.endpoint, self.timeout) from None
            env = decode(frame)
            if env.re == rid:
                break
        if isinstance(env.body, Error):
            raise RemoteError(env.body.code, env.body.message)
        return env.body

    def close(self) -> None:
        self._sock.close(0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Handler = Callable[[Message], Awaitable[None]]


class AsyncClient:
    """A DEALER connection for a daemon, with an identity the server can address."""

    def __init__(self, endpoint: str, identity: bytes, on_message: Handler) -> None:
        self.endpoint = endpoint
        self._sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IDENTITY, identity)
        # Reconnect fast after a server restart; queue nothing for a dead peer.
        self._sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._on_message = on_message
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            frame = await self._sock.recv()
            try:
                env = decode(frame)
            except ProtocolError as exc:
                log.warning("dropping a malformed frame from the server: %s", exc)
                continue
            fut = self._waiting.pop(env.re, None) if env.re else None
            if fut is not None:
                if not fut.done():
                    fut.set_result(env.body)
                continue
            try:
                await self._on_message(env.body)
            except Exception:
                log.exception("handling %s failed", type(env.body).__name__)

    async def send(self, body: Message) -> None:
        """Send without waiting for a reply (the reply, if any, is dropped)."""
        await self._sock.send(encode(body, next(self._ids)))

    async def call(self, body: Message, timeout: float = 10.0) -> Any:
        rid = next(self._ids)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            await self._sock.send(encode(body, rid), flags=zmq.NOBLOCK)
            reply = await asyncio.wait_for(fut, timeout)
        except (TimeoutError, zmq.Again):
            raise _unreachable(self.endpoint, timeout) from None
        finally:
            self._waiting.pop(rid, None)
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return reply

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._sock.close(0)
