"""tcp between hosts: CURVE on every tcp connection, keys checked by ZAP.

On a tcp connection there are no peer credentials, so the key is the identity.
The server's ROUTER listens on its ipc socket first, then becomes a CURVE
server and binds the tcp endpoints: libzmq copies a socket's options into each
listener when it binds, so the ipc listener keeps the NULL mechanism (and no
ZAP domain: NULL connections never reach the handler) and the tcp listeners
get CURVE. pyzmq's :class:`~zmq.auth.thread.ThreadAuthenticator` answers ZAP
requests: a key registered with ``mb keys add-user``/``add-node`` passes and
becomes the connection's ``User-Id``, which the server reads on each frame and
looks up again (:meth:`CurveServer.entry`), so removing a key also cuts
connections made before.

Clients set the server's public key and their own keypair before connecting
and watch the handshake on a monitor socket: libzmq reports a refused key
(``EVENT_HANDSHAKE_FAILED_AUTH``) and, after one, never reconnects by itself,
so a command says at once that its key was refused instead of timing out, and
a daemon connects again a little later (its key may be registered by then).
"""

from __future__ import annotations

import logging
import struct
import time
from pathlib import Path

import zmq

from minibatch.errors import (
    InvalidArgument,
    MinibatchError,
    PermissionDenied,
    Unavailable,
)
from minibatch.net import keys
from minibatch.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

DOMAIN = "minibatch"
#: Milliseconds a tcp peer has to finish its handshake: a connection that
#: never authenticates holds a descriptor no longer than this.
HANDSHAKE_MS = 5000
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
)
_EVENT = struct.Struct("=Hi")  # libzmq's first monitor frame: event id, value


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


class _Checker:
    """The ZAP handler's question: may this key connect? (In the ZAP thread.)"""

    def __init__(self, registered: keys.Registered) -> None:
        self.registered = registered
        self.refusals = RateLimitedLog(log, "refused tcp clients")

    def callback(self, domain: str, key: bytes) -> bool:
        text = key.decode()
        entry = self.registered.lookup(text, fresh=True)
        if entry is None:
            self.refusals.warning(
                "refused a tcp client: its key %s is not registered "
                "(mb keys add-user / add-node)",
                text,
            )
            return False
        try:
            keys.check_entry(entry.kind, entry.name)
        except InvalidArgument as exc:
            self.refusals.warning("refused the key of %s: %s", entry.name, exc)
            return False
        return True


class CurveServer:
    """The server's tcp endpoints on ``sock``, bound after its ipc one."""

    def __init__(
        self, sock: zmq.Socket[bytes], endpoints: list[str], key_dir: Path
    ) -> None:
        keys.require_curve()
        public, made = keys.server_keypair(key_dir)
        if made:
            log.info("made the server's CURVE keypair; its public key: %s", public)
        _, secret = keys.read_keypair(key_dir, keys.SERVER)
        self.registered = keys.Registered(key_dir)
        # Imported here: it brings in asyncio, which commands need not load.
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(sock.context)
        self._auth.start()
        self._auth.configure_curve_callback(DOMAIN, _Checker(self.registered))
        sock.curve_server = True
        sock.curve_secretkey = secret.encode()
        sock.zap_domain = DOMAIN.encode()
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        try:
            for endpoint in endpoints:
                sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise Unavailable(f"cannot listen on {endpoint}: {exc}") from None
        log.info("listening on %s (CURVE, server key %s)", ", ".join(endpoints), public)

    def entry(self, frame: zmq.Frame) -> keys.Entry:
        """Who sent ``frame``, received on a tcp endpoint: its key's entry."""
        try:
            key = str(frame.get("User-Id"))
        except zmq.ZMQError:  # an ipc peer whose credentials libzmq lacks
            raise PermissionDenied(
                "requests need the local socket's peer credentials or a "
                "registered CURVE key"
            ) from None
        entry = self.registered.lookup(key)
        if entry is None:
            raise PermissionDenied(
                "this client's key is no longer registered with the server"
            )
        return entry

    def close(self) -> None:
        self._auth.stop()


def secure(sock: zmq.Socket[bytes], client: keys.ClientKeys) -> zmq.Socket[bytes]:
    """Make ``sock`` (not yet connected) a CURVE client with ``client``'s keys;
    a monitor socket that reports its handshakes."""
    sock.curve_serverkey = client.server.encode()
    sock.curve_publickey = client.public.encode()
    sock.curve_secretkey = client.secret.encode()
    return sock.get_monitor_socket(HANDSHAKE_EVENTS)


def handshake_failure(
    monitor: zmq.Socket[bytes], endpoint: str
) -> MinibatchError | None:
    """Read ``monitor``'s waiting events: why the latest handshake failed, or
    None when none did (or one succeeded since)."""
    why: MinibatchError | None = None
    while True:
        try:
            frames = monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return why
        if len(frames) == 2:
            why = failure_of(frames[0], endpoint)


def failure_of(header: bytes, endpoint: str) -> MinibatchError | None:
    """Why the handshake a monitor event (its first frame) reports failed;
    None for a handshake that succeeded."""
    if len(header) != _EVENT.size:
        return None
    event = _EVENT.unpack(header)[0]
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return PermissionDenied(
            f"the server at {endpoint} refused this client's key: its operator "
            "must register it (`mb keys add-user NAME KEY` or `mb keys add-node "
            "NODE KEY`; this key is `mb keys show --client`)"
        )
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return Unavailable(
            f"{endpoint} does not speak CURVE: is it a minibatch server's "
            "[server] listen endpoint?"
        )
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return Unavailable(
            f"the secure handshake with {endpoint} failed: is the server key this "
            "client trusts the server's? (`mb keys show` there, `mb keys trust "
            "KEY` here)"
        )
    return None  # a handshake succeeded


def wait_readable(
    sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes], endpoint: str, timeout: float
) -> bool:
    """Wait until ``sock`` has a message (True) or ``timeout`` passes (False);
    raise as soon as the handshake fails, saying why."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready = dict(poller.poll(int(left * 1000) + 1))
        if sock in ready:
            return True
        if monitor in ready and (why := handshake_failure(monitor, endpoint)):
            raise why
    return False
