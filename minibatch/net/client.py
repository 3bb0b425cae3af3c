"""The blocking request/reply client the commands use.

On the server's host, the commands' unix socket (:mod:`minibatch.net.stream`);
from another host, one DEALER socket with CURVE. A receive timeout, and a clean
:class:`Unavailable` error when the server does not answer. It imports nothing
of asyncio, and zmq only for tcp: ``qsub`` must start fast. The daemons use
:mod:`minibatch.net.aio`.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any, Protocol, Self

from minibatch.errors import InvalidArgument, RemoteError, Unavailable
from minibatch.net.stream import HEADER, command_path
from minibatch.protocol import decode_reply, encode
from minibatch.protocol.base import Error

if TYPE_CHECKING:
    import _socket
    from pathlib import Path

    import zmq

    from minibatch.protocol.messages import Message

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


def unanswered(endpoint: str, timeout: float) -> Unavailable:
    """No answer on the commands' socket, whose server is there (it took the
    connection) but busy or stopped."""
    return Unavailable(
        f"no answer from the minibatch server at {endpoint} within {timeout:g} s: "
        "it is running but busy; a request it had not read yet is dropped, one "
        "it had may still be carried out (look, e.g. with qstat, before trying "
        "again)"
    )


def _secure(sock: zmq.Socket[bytes], keys: Path | None) -> zmq.Socket[bytes]:
    """CURVE for a tcp connection, and its handshake monitor. Imported here
    only: commands on the server's host (ipc) start as fast as before."""
    from minibatch.config import Paths
    from minibatch.net import curve
    from minibatch.net.keys import load_client

    return curve.secure(sock, load_client(keys or Paths.from_env().keys))


class Client:
    """A connection to ``endpoint``: the commands' unix socket beside an ipc
    endpoint (:mod:`minibatch.net.stream`), or a DEALER over tcp with the
    CURVE keys in ``keys`` (default ``$MB_HOME/keys``, see
    :mod:`minibatch.net.keys`)."""

    def __init__(
        self, endpoint: str, timeout: float = 10.0, keys: Path | None = None
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._ids = itertools.count(1)
        path = command_path(endpoint)
        self._wire: _Wire = (
            _Stream(path, endpoint, timeout)
            if path is not None
            else _Dealer(endpoint, timeout, keys)
        )

    def call(self, body: Message) -> Any:
        """Send ``body`` and return the reply body; raise on an error reply."""
        rid = next(self._ids)
        try:
            request = encode(body, rid)
        except OverflowError:
            # A number typed on the command line (a job id, a size, a count)
            # past what msgpack carries: the server would refuse it anyway.
            raise InvalidArgument(
                "a number in the request is out of range (the largest is "
                f"{(1 << 64) - 1}): check the ids, sizes and counts given"
            ) from None
        self._wire.send(request)
        while True:
            env = decode_reply(self._wire.recv(len(request)))
            # A reply to an earlier call that timed out is passed over; an
            # error that names no request is about this one (the server could
            # not read its id, or refused its size).
            if env.re == rid or (env.re == 0 and isinstance(env.body, Error)):
                break
        if isinstance(env.body, Error):
            raise RemoteError(env.body.code, env.body.message)
        return env.body

    def close(self) -> None:
        self._wire.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Wire(Protocol):
    def send(self, request: bytes) -> None: ...

    def recv(self, sent: int) -> bytes:
        """The next message; :class:`Unavailable` when none comes within the
        timeout (``sent``: the request's size, which may be why)."""
        ...

    def close(self) -> None: ...


class _Stream:
    """The commands' unix socket: no pyzmq to import, and a server that is
    not there (or dies) is known at once, not after the timeout. Like a
    DEALER it connects when there is something to send, and again after the
    server went away, so a client may be made before the server is up."""

    def __init__(self, path: str, endpoint: str, timeout: float) -> None:
        self.path, self.endpoint, self.timeout = path, endpoint, timeout
        self._deadline = 0.0
        self._sock: _socket.socket | None = None

    def _connect(self) -> _socket.socket:
        # The C socket type that socket.socket wraps: the stdlib's socket
        # module turns its constants into enums as it loads, and imports
        # selectors, ~2 ms of a command (docs/benchmarks.md, "Commands").
        # A connect, sends and receives need none of the wrapper.
        import _socket

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        while True:
            try:
                sock.connect(self.path)
                return sock
            except BlockingIOError:  # its backlog is full: it is busy, not gone
                if time.monotonic() > self._deadline:
                    sock.close()
                    raise unanswered(self.endpoint, self.timeout) from None
                time.sleep(0.01)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                raise Unavailable(
                    f"no minibatch server at {self.endpoint} (is the cluster up? "
                    "try `mb up`)"
                ) from None
            except OSError as exc:
                sock.close()
                raise Unavailable(
                    f"cannot reach the minibatch server at {self.endpoint}: {exc}"
                ) from None

    def send(self, request: bytes) -> None:
        self._deadline = time.monotonic() + self.timeout
        if self._sock is None:
            self._sock = self._connect()
        self._sock.settimeout(self.timeout)
        try:
            self._sock.sendall(HEADER.pack(len(request)) + request)
        except TimeoutError:
            # Half a message may have gone: the next one must not follow it.
            self.close()
            raise unanswered(self.endpoint, self.timeout) from None
        except OSError:
            # The server closed the connection: a refusal may be waiting to be
            # read, or the end of the connection, which recv reports.
            pass

    def recv(self, sent: int) -> bytes:
        try:
            (size,) = HEADER.unpack(self._read(HEADER.size))
            return bytes(self._read(size))
        except Unavailable:
            self.close()  # the next call connects again
            raise

    def _read(self, size: int) -> bytearray:
        assert self._sock is not None
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise unanswered(self.endpoint, self.timeout)
            self._sock.settimeout(left)
            try:
                n = self._sock.recv_into(view[got:])
            except TimeoutError:
                raise unanswered(self.endpoint, self.timeout) from None
            except ConnectionResetError:
                n = 0
            except OSError as exc:
                raise Unavailable(
                    f"the minibatch server at {self.endpoint}: {exc}"
                ) from None
            if not n:
                raise Unavailable(
                    f"the minibatch server at {self.endpoint} closed the "
                    "connection without an answer (did it stop?)"
                )
            got += n
        return data

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class _Dealer:
    """A DEALER socket, with CURVE over tcp."""

    def __init__(self, endpoint: str, timeout: float, keys: Path | None) -> None:
        import zmq

        self.endpoint, self.timeout = endpoint, timeout
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
        #: Reports the tcp handshake, so that a refused key is said at once.
        self._monitor: zmq.Socket[bytes] | None = None
        if endpoint.startswith("tcp://"):
            try:
                self._monitor = _secure(self._sock, keys)
            except BaseException:
                self._sock.close(0)
                raise
        self._sock.connect(endpoint)

    def send(self, request: bytes) -> None:
        self._sock.send(request)

    def recv(self, sent: int) -> bytes:
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
