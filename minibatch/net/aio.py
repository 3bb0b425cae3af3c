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
from pathlib import Path
from typing import Any

import zmq

from minibatch.config import Paths
from minibatch.errors import PermissionDenied, ProtocolError, RemoteError, Unavailable
from minibatch.net import curve
from minibatch.net.client import unreachable
from minibatch.net.driver import Frames, SocketDriver
from minibatch.net.keys import load_client
from minibatch.net.ratelog import RateLimitedLog
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[None]]
#: Seconds before a client whose key the server refused connects again.
RETRY_REFUSED_S = 5.0


class AsyncClient:
    """A daemon's DEALER connection to the server.

    No identity is set: the server learns the routing id libzmq assigns from the
    daemon's authenticated hello, so a client cannot claim a daemon's messages.
    """

    def __init__(
        self, endpoint: str, on_message: Handler, keys: Path | None = None
    ) -> None:
        self.endpoint = endpoint
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # Reconnect fast after a server restart; queue nothing for a dead peer.
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        #: Over tcp: reports each handshake (see :mod:`minibatch.net.curve`).
        self._monitor: zmq.Socket[bytes] | None = None
        if curve.is_tcp(endpoint):
            folder = keys or Paths.from_env().keys
            self._monitor = curve.secure(sock, load_client(folder))
        sock.connect(endpoint)
        #: Why the server refused the last handshake ("" while it did not).
        self.refused = ""
        self._watch: SocketDriver | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._sock = sock
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._on_message = on_message
        self._driver: SocketDriver | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._malformed = RateLimitedLog(log, "malformed frames from the server")

    def start(self) -> None:
        self._driver = SocketDriver(self._sock, self._on_batch)
        if self._monitor is not None:
            self._watch = SocketDriver(self._monitor, self._on_handshakes)

    def _on_handshakes(self, batch: list[Frames]) -> None:
        for frames in batch:
            why = curve.failure_of(frames[0].bytes, self.endpoint)
            if why is None:
                if self.refused:
                    log.info("the server at %s accepts this client now", self.endpoint)
                self.refused = ""
                continue
            if str(why) != self.refused:
                log.error("%s", why)
            self.refused = str(why)
            if isinstance(why, PermissionDenied) and self._retry is None:
                # libzmq never reconnects after a refused key; the operator
                # may register it meanwhile, so try again now and then.
                loop = asyncio.get_running_loop()
                self._retry = loop.call_later(RETRY_REFUSED_S, self._reconnect)

    def _reconnect(self) -> None:
        self._retry = None
        with contextlib.suppress(zmq.ZMQError):  # already dropped by libzmq
            self._sock.disconnect(self.endpoint)
        self._sock.connect(self.endpoint)

    def _unreachable(self, timeout: float) -> Unavailable:
        if self.refused:
            return Unavailable(self.refused)
        return unreachable(self.endpoint, timeout)

    def _on_batch(self, batch: list[Frames]) -> None:
        for frames in batch:
            try:
                env = decode(frames[-1].bytes)
            except ProtocolError as exc:
                self._malformed.warning(
                    "dropping a malformed frame from the server: %s", exc
                )
                continue
            fut = self._waiting.pop(env.re, None) if env.re else None
            if fut is not None:
                if not fut.done():
                    fut.set_result(env.body)
                continue
            task = asyncio.get_running_loop().create_task(self._dispatch(env.body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, body: Message) -> None:
        try:
            await self._on_message(body)
        except Exception:
            log.exception("handling %s failed", type(body).__name__)

    def _send(self, data: bytes) -> bool:
        if self._driver is None:
            raise RuntimeError("AsyncClient.start() was not called")
        return self._driver.send([data])

    def notify(self, body: Message) -> bool:
        """Send a message that gets no reply, now; False if it could not be
        queued (no server connected)."""
        return self._send(encode(body, next(self._ids)))

    async def call(self, body: Message, timeout: float = 10.0) -> Any:
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        fut: asyncio.Future[Message] = loop.create_future()
        self._waiting[rid] = fut
        timer = loop.call_later(timeout, _expire, fut)
        try:
            if not self._send(encode(body, rid)):
                raise self._unreachable(timeout)
            reply = await fut
        except TimeoutError:
            raise self._unreachable(timeout) from None
        finally:
            timer.cancel()
            self._waiting.pop(rid, None)
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return reply

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._retry is not None:
            self._retry.cancel()
        if self._monitor is not None:
            self._sock.disable_monitor()
            if self._watch is not None:
                self._watch.close()
            else:
                self._monitor.close(0)
        if self._driver is not None:
            self._driver.close()
        else:
            self._sock.close(0)


def _expire(fut: asyncio.Future[Message]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())
