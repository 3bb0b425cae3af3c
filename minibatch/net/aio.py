"""The daemons' asyncio client: a DEALER connection the server can address.

Requests are matched to replies by id; unsolicited messages from the server
(``Wake`` for the scheduler, ``Launch`` and ``Kill`` for nodes) go to a handler.
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

from minibatch.errors import ProtocolError, RemoteError
from minibatch.net.client import unreachable
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Message

log = logging.getLogger(__name__)

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
            raise unreachable(self.endpoint, timeout) from None
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
