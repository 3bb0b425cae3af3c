"""Driving a plain (synchronous) ZeroMQ socket from an asyncio loop.

``zmq.asyncio`` wraps every send and receive in a Future and re-polls the socket
after each; profiling the server showed a third of its time there. Instead we
register the socket's file descriptor with the loop and drain it ourselves. That
descriptor is *edge-triggered*: it signals when the socket's state changes, not
while messages wait. So every drain reads until the socket is empty (or a batch
is full, in which case it re-schedules itself so timers still run), and after
sending we check again, because a send can swallow the edge of an arrival.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

Frames = list[zmq.Frame]

#: Bytes read per batch at most (besides the message that crosses it): a batch
#: of hundreds of large messages must not sit in memory all at once.
BATCH_BYTES = 64 << 20


class SocketDriver:
    def __init__(
        self,
        sock: zmq.Socket[bytes],
        on_batch: Callable[[list[Frames]], None],
        batch: int = 512,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        self.sock, self.on_batch, self.batch = sock, on_batch, batch
        self.batch_bytes = batch_bytes
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self._fd = int(sock.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self._readable)
        self.poke()

    def poke(self) -> None:
        """Check for messages soon (after a send, or when first started)."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._readable)

    def _readable(self) -> None:
        self._scheduled = False
        sock = self.sock
        if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            return
        frames: list[Frames] = []
        size = 0
        while len(frames) < self.batch and size < self.batch_bytes:
            try:
                message = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            frames.append(message)
            size += sum(len(part) for part in message)
        if frames:
            self.on_batch(frames)
        # More may be waiting (full batch, or arrivals while handling): come back
        # after the loop has run what else is due.
        self.poke()

    def send(self, frames: list[bytes]) -> bool:
        """Send without blocking; False if the peer cannot take it now."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        finally:
            self.poke()
        return True

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        self.sock.close(0)
