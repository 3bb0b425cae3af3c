"""The blocking request/reply client the commands use.

One DEALER socket, ``LINGER=0``, a receive timeout, and a clean
:class:`Unavailable` error when the server does not answer. It imports nothing of
asyncio: ``qsub`` must start fast. The daemons use :mod:`minibatch.net.aio`.
"""

from __future__ import annotations

import itertools
from typing import Any

import zmq

from minibatch.errors import RemoteError, Unavailable
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Message


def unreachable(endpoint: str, timeout: float) -> Unavailable:
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
                raise unreachable(self.endpoint, self.timeout) from None
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
