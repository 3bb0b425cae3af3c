"""The blocking request/reply client the commands use.

One DEALER socket, ``LINGER=0``, a receive timeout, and a clean
:class:`Unavailable` error when the server does not answer. It imports nothing of
asyncio: ``qsub`` must start fast. The daemons use :mod:`minibatch.net.aio`.
zmq is imported when a :class:`Client` opens, not with this module.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Self

from minibatch.errors import RemoteError, Unavailable
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Message

if TYPE_CHECKING:
    from pathlib import Path

    import zmq

#: Requests this large may have been dropped for their size: a timeout says so.
LARGE_REQUEST = 1 << 20


def unreachable(endpoint: str, timeout: float, size: int = 0) -> Unavailable:
    why = "is the cluster up? try `mb up`"
    if size >= LARGE_REQUEST:
        # libzmq drops a message over the server's [server] max_message_bytes
        # without a word: the only sign is that no answer comes.
        why = (
            f"the request was {size} bytes: the server drops requests over its "
            f"[server] max_message_bytes unanswered; or {why}"
        )
    return Unavailable(
        f"no answer from the minibatch server at {endpoint} within {timeout:g} s "
        f"({why})"
    )


def _secure(sock: zmq.Socket[bytes], keys: Path | None) -> zmq.Socket[bytes]:
    """CURVE for a tcp connection, and its handshake monitor. Imported here
    only: commands on the server's host (ipc) start as fast as before."""
    from minibatch.config import Paths
    from minibatch.net import curve
    from minibatch.net.keys import load_client

    return curve.secure(sock, load_client(keys or Paths.from_env().keys))


class Client:
    """A connection to ``endpoint``; over tcp with the CURVE keys in ``keys``
    (default ``$MB_HOME/keys``, see :mod:`minibatch.net.keys`).

    :meth:`call` does not depend on how frames travel: a subclass may carry
    them otherwise (:meth:`_open`, :meth:`_send`, :meth:`_recv`, :meth:`close`).
    """

    def __init__(
        self, endpoint: str, timeout: float = 10.0, keys: Path | None = None
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._open(keys)

    def call(self, body: Message) -> Any:
        """Send ``body`` and return the reply body; raise on an error reply."""
        rid = next(self._ids)
        request = encode(body, rid)
        self._send(request)
        while True:
            env = decode(self._recv(len(request)))
            if env.re == rid:
                break
        if isinstance(env.body, Error):
            raise RemoteError(env.body.code, env.body.message)
        return env.body

    def _open(self, keys: Path | None) -> None:
        import zmq

        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, int(self.timeout * 1000))
        #: Reports the tcp handshake, so that a refused key is said at once.
        self._monitor: zmq.Socket[bytes] | None = None
        if self.endpoint.startswith("tcp://"):
            try:
                self._monitor = _secure(self._sock, keys)
            except BaseException:
                self._sock.close(0)
                raise
        self._sock.connect(self.endpoint)

    def _send(self, request: bytes) -> None:
        self._sock.send(request)

    def _recv(self, sent: int) -> bytes:
        """The next frame; :func:`unreachable` (``sent``: the request's size)
        when none comes within the timeout."""
        import zmq

        try:
            if self._monitor is None:
                return self._sock.recv()
            from minibatch.net.curve import wait_readable

            if not wait_readable(
                self._sock, self._monitor, self.endpoint, self.timeout
            ):
                raise zmq.Again
            return self._sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            raise unreachable(self.endpoint, self.timeout, sent) from None

    def close(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
        self._sock.close(0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
