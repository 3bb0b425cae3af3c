"""Publishing the resource manager's events to MQTT without ever waiting for it.

The server calls :meth:`EventPublisher.publish` from its event loop for every state
change. That call only encodes the payload and appends it to a bounded buffer, so
a slow, dead or absent broker can never delay a job. :meth:`EventPublisher.run`, a
background task in the same loop, owns the connection: it drains the buffer in
batches, and when the broker goes away it logs one warning, keeps buffering, and
reconnects with backoff, re-sending whatever was not written before the loss.

Delivery is at least once for what was buffered: an event whose write was
interrupted is sent again after the reconnection. QoS 0 events written to the
socket in the instant before a broker dies can still be lost (TCP accepted them);
pass ``qos=1`` for an event that must survive that.

States, as opposed to events (a node's state, the policy in force), are published
retained, so a subscriber that arrives later learns them at once. A broker that
restarts forgets retained messages, so each reconnection publishes the latest of
each again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

import msgspec

log = logging.getLogger(__name__)
#: aiomqtt's and paho's own messages. Their warnings ("could not gracefully
#: disconnect", ...) repeat on every failed reconnection, while this module logs
#: one warning per outage; so only their errors get through.
_client_log = logging.getLogger(f"{__name__}.client")
_client_log.setLevel(logging.ERROR)

#: Events kept while the broker is unreachable; the oldest are dropped beyond it.
DEFAULT_BUFFER = 100_000
#: Events written per drain step before yielding to the loop. At ~20 us each this
#: bounds one step to a few milliseconds of the server's loop.
DEFAULT_BATCH = 256
#: Reconnection backoff: first delay, factor, ceiling (seconds).
BACKOFF_START = 0.2
BACKOFF_FACTOR = 2.0
BACKOFF_MAX = 5.0
#: Seconds to wait for a batch to be written (or a QoS 1 ack) before giving up on
#: the connection.
WRITE_TIMEOUT = 10.0


def _cork(sock: Any, on: bool) -> socket.socket | None:
    """Hold back (``on``) or push out what is written to a TCP ``sock``; the
    socket when that worked (None for another kind of socket, or none)."""
    cork = getattr(socket, "TCP_CORK", None)  # Linux's
    if cork is None or not isinstance(sock, socket.socket):
        return None
    try:  # OSError: not a TCP socket (a unix one)
        sock.setsockopt(socket.IPPROTO_TCP, cork, int(on))
    except OSError:
        return None
    return sock


def job_topic(prefix: str, job_id: int | str, event: str) -> str:
    """The topic of a job event; ``+`` as ``job_id`` or ``event`` matches all."""
    return f"{prefix.rstrip('/')}/jobs/{job_id}/{event}"


def node_topic(prefix: str, name: str) -> str:
    """The topic of a node's state; ``+`` as ``name`` matches every node."""
    return f"{prefix.rstrip('/')}/nodes/{name}/state"


def is_state(topic_suffix: str) -> bool:
    """Whether a topic holds a state (published retained) rather than an event:
    a node's state, the policy in force, the last scheduling pass."""
    return topic_suffix.startswith("nodes/") or topic_suffix in _STATES


_STATES = frozenset({"sched/policy", "sched/pass"})


class BrokerAddress(NamedTuple):
    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool


def parse_url(url: str) -> BrokerAddress:
    """Split a broker URL such as ``mqtt://127.0.0.1:1883``.

    Args:
        url: ``mqtt://``, ``tcp://`` or ``mqtts://`` (TLS), optionally with
            ``user:password@``; the port defaults to 1883 (8883 for ``mqtts``).

    Returns:
        The address parts.

    Raises:
        ValueError: The URL has another scheme or no host.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("mqtt", "tcp", "mqtts", "ssl"):
        raise ValueError(f"unsupported MQTT URL {url!r} (expected mqtt://host:port)")
    if not parts.hostname:
        raise ValueError(f"MQTT URL {url!r} has no host")
    tls = scheme in ("mqtts", "ssl")
    return BrokerAddress(
        host=parts.hostname,
        port=parts.port or (8883 if tls else 1883),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        tls=tls,
    )


class _Event(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    retain: bool = False


class _BrokerLost(Exception):
    """The connection failed while draining; the caller reconnects."""


class EventPublisher:
    """Buffered, never-blocking MQTT publisher for one asyncio loop.

    Args:
        url: Broker URL (``mqtt://host:port``); empty disables the publisher, so
            :meth:`publish` is a no-op and :meth:`run` returns at once.
        prefix: Topic prefix, e.g. ``minibatch/v1``.
        buffer_size: Events kept while the broker is unreachable.
        batch_size: Events written per drain step.
        credentials: ``(user, password)`` to log in with, unless the URL has
            its own: a broker started by ``mb up`` takes events only from the
            server (see :mod:`minibatch.events.credentials`).

    Raises:
        ValueError: ``url`` is not an MQTT URL.

    Call :meth:`publish` only from the thread running the loop of :meth:`run`.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        buffer_size: int = DEFAULT_BUFFER,
        batch_size: int = DEFAULT_BATCH,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix.rstrip("/")
        self.address = parse_url(url) if url else None
        if self.address and credentials and self.address.username is None:
            user, password = credentials
            self.address = self.address._replace(username=user, password=password)
        self._buf: deque[_Event] = deque(maxlen=buffer_size)
        self._batch_size = batch_size
        self._inflight: list[_Event] = []
        self._wakeup = asyncio.Event()
        self._encoder = msgspec.json.Encoder()
        self._connected = False
        self._overflow_warned = False
        self._task: asyncio.Task[None] | None = None
        #: The latest event of each retained topic, published again after each
        #: reconnection (the broker may have restarted and forgotten it).
        self._states: dict[str, _Event] = {}
        self.sent = 0
        self.dropped = 0

    # ------------------------------------------------------------ producer side

    @property
    def enabled(self) -> bool:
        """Whether a broker URL was given."""
        return self.address is not None

    @property
    def connected(self) -> bool:
        """Whether :meth:`run` currently holds a broker connection."""
        return self._connected

    @property
    def pending(self) -> int:
        """Events buffered or being written, not yet known to be sent."""
        return len(self._buf) + len(self._inflight)

    def publish(
        self, topic_suffix: str, payload: Any, qos: int = 0, retain: bool = False
    ) -> None:
        """Queue one event; never blocks and never raises for a broker problem.

        Args:
            topic_suffix: Topic below the prefix, e.g. ``jobs/7/state``.
            payload: Anything msgspec can encode as JSON (dicts, Structs, ...);
                encoded now, so the caller may mutate it afterwards.
            qos: MQTT QoS; 0 is the cheap default, 1 waits for the broker's ack.
            retain: A state: the broker keeps the latest for new subscribers.

        Raises:
            TypeError: ``payload`` cannot be encoded as JSON (a caller bug).
        """
        if self.address is None:
            return
        topic = f"{self.prefix}/{topic_suffix}"
        event = _Event(topic, self._encoder.encode(payload), qos, retain)
        if retain:
            self._states[topic] = event
        if len(self._buf) == self._buf.maxlen:
            self._note_dropped(1)
        self._buf.append(event)
        # Setting an already-set Event is a flag check: a burst of publishes costs
        # one wake-up of the drain task.
        self._wakeup.set()

    def job_event(self, job_id: int | str, event: str, payload: Any) -> None:
        """Publish to ``{prefix}/jobs/<id>/<event>``."""
        self.publish(f"jobs/{job_id}/{event}", payload)

    def node_state(self, name: str, payload: Any) -> None:
        """Publish to ``{prefix}/nodes/<name>/state``, retained."""
        self.publish(f"nodes/{name}/state", payload, retain=True)

    def stats(self) -> dict[str, int]:
        """Counters for ``mb status``: sent, buffered, dropped, connected."""
        return {
            "sent": self.sent,
            "pending": self.pending,
            "dropped": self.dropped,
            "connected": int(self._connected),
        }

    def _note_dropped(self, count: int) -> None:
        self.dropped += count
        if not self._overflow_warned:
            self._overflow_warned = True
            log.warning(
                "MQTT event buffer full (%d events): dropping the oldest events "
                "until the broker at %s catches up",
                self._buf.maxlen,
                self.url,
            )

    # ------------------------------------------------------------ sender side

    async def run(self) -> None:
        """Connect, drain, and reconnect forever; cancel the task to stop it."""
        if self.address is None:
            return
        import aiomqtt  # imported lazily: a disabled publisher needs no MQTT stack

        delay = BACKOFF_START
        lost_at: float | None = None
        while True:
            try:
                client = self._client(aiomqtt)
                async with client:
                    self._connected = True
                    delay = BACKOFF_START
                    if lost_at is not None:
                        log.info(
                            "MQTT broker %s reachable again after %.1f s; "
                            "re-sending %d buffered events",
                            self.url,
                            time.monotonic() - lost_at,
                            self.pending,
                        )
                        lost_at = None
                    else:
                        log.info("publishing events to %s", self.url)
                    self._restate()
                    await self._session(client)
            except (aiomqtt.MqttError, _BrokerLost, OSError) as exc:
                if lost_at is None:
                    lost_at = time.monotonic()
                    # The one warning per outage: everything else keeps running.
                    log.warning(
                        "MQTT broker %s unavailable (%s); buffering events "
                        "(up to %d) and reconnecting",
                        self.url,
                        str(exc) or type(exc).__name__,
                        self._buf.maxlen,
                    )
                else:
                    log.debug("MQTT reconnect to %s failed: %s", self.url, exc)
            except Exception:
                # A bug here must not end event publishing for the server's life.
                if lost_at is None:
                    lost_at = time.monotonic()
                    log.exception("MQTT publisher failed; reconnecting to %s", self.url)
            finally:
                self._connected = False
                self._requeue_inflight()
            await asyncio.sleep(delay)
            delay = min(delay * BACKOFF_FACTOR, BACKOFF_MAX)

    def _restate(self) -> None:
        """Put the latest state of each retained topic at the head of the buffer,
        unless a newer one is already queued behind it."""
        queued = {e.topic for e in self._buf if e.retain}
        queued.update(e.topic for e in self._inflight if e.retain)
        stale = [e for t, e in self._states.items() if t not in queued]
        room = (self._buf.maxlen or 0) - len(self._buf)
        # Never at the cost of an event: states are re-sent only where there is room.
        self._buf.extendleft(reversed(stale[: max(room, 0)]))

    def _client(self, aiomqtt: Any) -> Any:
        assert self.address is not None
        kwargs: dict[str, Any] = {}
        if self.address.tls:
            kwargs["tls_params"] = aiomqtt.TLSParameters()
        return aiomqtt.Client(
            self.address.host,
            self.address.port,
            username=self.address.username,
            password=self.address.password,
            # Short keepalive so a hung (not closed) broker is noticed in seconds.
            keepalive=15,
            timeout=WRITE_TIMEOUT,
            logger=_client_log,
            **kwargs,
        )

    async def _session(self, client: Any) -> None:
        """Drain until the connection fails; return only by raising."""
        watcher = asyncio.ensure_future(self._watch(client))
        drainer = asyncio.ensure_future(self._drain(client))
        try:
            done, _ = await asyncio.wait(
                {watcher, drainer}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (watcher, drainer):
                task.cancel()
            for task in (watcher, drainer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        raise _BrokerLost("the connection ended")

    @staticmethod
    async def _watch(client: Any) -> None:
        # Nothing is subscribed, so the iterator yields nothing until the
        # connection drops, and then raises: broker loss is noticed even while
        # there is nothing to publish.
        async for _ in client.messages:
            pass

    async def _drain(self, client: Any) -> None:
        while True:
            if not self._buf:
                self._wakeup.clear()
                if not self._buf:
                    self._overflow_warned = False
                    await self._wakeup.wait()
                    continue
            n = min(self._batch_size, len(self._buf))
            self._inflight = [self._buf.popleft() for _ in range(n)]
            await self._write(client, self._inflight)
            self.sent += n
            self._inflight = []

    async def _write(self, client: Any, batch: list[_Event]) -> None:
        """Write ``batch`` in order; on failure leave the unsent part in flight."""
        # aiomqtt's publish() waits one loop turn per message (~60 us of CPU each).
        # For QoS 0 we hand all but the last message of the batch straight to the
        # paho client underneath (~15 us each) and await only the last through
        # aiomqtt: paho writes in order, so its confirmation covers the batch.
        paho: Any = getattr(client, "_client", None)
        fast = paho is not None and hasattr(paho, "publish")
        # paho sends each packet on its own: corked, the batch leaves in one
        # segment, and the broker wakes once for it rather than per event.
        corked = _cork(paho.socket(), True) if fast and len(batch) > 1 else None
        written = 0
        try:
            for i, event in enumerate(batch):
                last = i == len(batch) - 1
                if fast and event.qos == 0 and not last:
                    info = paho.publish(event.topic, event.payload, 0, event.retain)
                    if info.rc != 0:
                        raise _BrokerLost(f"paho publish returned {info.rc}")
                else:
                    await client.publish(
                        event.topic, event.payload, qos=event.qos, retain=event.retain
                    )
                    written = i + 1
        finally:
            if corked is not None:
                _cork(corked, False)
            # Keep only the unconfirmed tail for re-sending.
            del batch[:written]

    def _requeue_inflight(self) -> None:
        unsent, self._inflight = self._inflight, []
        if not unsent:
            return
        room = (self._buf.maxlen or 0) - len(self._buf)
        if len(unsent) > room:
            # extendleft on a full deque would drop the newest events; drop the
            # oldest instead, like publish() does.
            excess = len(unsent) - room
            self._note_dropped(excess)
            unsent = unsent[excess:]
        self._buf.extendleft(reversed(unsent))

    # ---------------------------------------------------------------- helpers

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task of the current loop and return it."""
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name="mqtt-events"
        )
        return self._task

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every buffered event was written, at most ``timeout`` s.

        Returns:
            Whether the buffer emptied in time (always true when disabled).
        """
        deadline = time.monotonic() + timeout
        while self.pending:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def aclose(self, timeout: float = 2.0) -> None:
        """Give buffered events ``timeout`` s to go out, then stop the task."""
        task, self._task = self._task, None
        if task is None:
            return
        if self._connected:
            await self.flush(timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
