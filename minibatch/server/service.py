"""mb-server: the asyncio shell around :class:`~minibatch.server.state.ServerState`.

One ROUTER socket serves everyone: commands, the scheduler and the node daemons.
The loop takes every request already waiting (up to :data:`BATCH`), handles them,
commits the resulting writes in **one** transaction, and only then sends replies,
daemon messages, MQTT events and the scheduler's wake-up. Acknowledged means
committed, and a burst of submissions costs one commit rather than one each.

Nothing a client sends can stop the loop: malformed frames get an error reply,
handler errors become coded error replies, and unexpected exceptions are logged
with their traceback and answered with ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence

import zmq

from minibatch import config as configuration
from minibatch.daemon import run_daemon
from minibatch.errors import ErrorCode, MinibatchError, ProtocolError
from minibatch.events.publisher import EventPublisher
from minibatch.net.driver import Frames, SocketDriver
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error
from minibatch.server import booking, dispatch, liveness, mail
from minibatch.server.handlers import HANDLERS, Context
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import parse_peer

log = logging.getLogger("minibatch.server")

#: Requests handled per commit at most; bounds reply latency under a flood.
BATCH = 512
#: Seconds after a reservation boundary that its pass runs (so it sees the change).
BOUNDARY_SLACK = 0.005


class Server:
    def __init__(
        self, paths: configuration.Paths, config: configuration.Config
    ) -> None:
        self.paths, self.config = paths, config
        self.endpoint = config.server_endpoint(paths)
        store = Store(paths.database, config.server.sqlite_synchronous)
        self.state = ServerState(store, config=config)
        url = configuration.mqtt_url(paths, config)
        fs = config.fairshare.usage_config()
        self.ctx = Context(
            operators=frozenset(config.server.operators),
            endpoint=self.endpoint,
            mqtt_url=url,
            fairshare={
                "policy": fs.policy.value,
                "interval": fs.interval,
                "depth": fs.depth,
                "decay": fs.decay,
            },
        )
        self.publisher = EventPublisher(url, config.mqtt.topic_prefix)
        self.mailer = mail.Mailer(config.server.sendmail)
        self.host = os.uname().nodename
        self.driver: SocketDriver | None = None
        self.coalesce = config.scheduler.coalesce_ms / 1000
        self.full_coalesce = config.scheduler.full_coalesce_ms / 1000
        self._last_wake = 0.0
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_due = 0.0
        #: The next reservation start or end, and the timer armed for it.
        self._boundary: float | None = None
        self._boundary_timer: asyncio.TimerHandle | None = None

    def handle(self, frames: Frames) -> bytes | None:
        """One request in, at most one encoded reply out; never raises."""
        rid = 0
        try:
            if len(frames) != 2:
                raise ProtocolError(
                    f"expected one message frame, got {len(frames) - 1}"
                )
            env = decode(frames[1].bytes)
            rid = env.id
            handler = HANDLERS.get(type(env.body))
            if handler is None:
                err = ProtocolError(f"{type(env.body).__name__} is not a request")
                err.code = ErrorCode.UNKNOWN_TYPE
                raise err
            caller = parse_peer(str(frames[1].get("Peer-Address")))
            reply = handler(self.state, self.ctx, caller, frames[0].bytes, env.body)
        except MinibatchError as exc:
            reply = Error(code=int(exc.code), message=str(exc))
        except Exception as exc:
            log.exception("request failed")
            reply = Error(
                code=int(ErrorCode.INTERNAL), message=f"internal error: {exc}"
            )
        return None if reply is None else encode(reply, re=rid)

    def flush(self, replies: Sequence[tuple[bytes, bytes | None]] = ()) -> None:
        """Start what the last plan has next, commit, then send ``replies`` and
        perform everything the state queued."""
        state = self.state
        if state.freed:
            state.freed = False
            dispatch.start_upcoming(state)
        state.store.commit()
        for identity, reply in replies:
            if reply is not None:
                self._send(identity, reply)
        for identity, message in state.outbox:
            self._send(identity, encode(message))
        state.outbox.clear()
        for topic, payload in state.events:
            self.publisher.publish(topic, payload)
        state.events.clear()
        for job, letter in state.mail:
            self.mailer.send(mail.message(job, letter, self.host))
        state.mail.clear()
        self._wake_scheduler()
        self._arm_boundary()

    def _arm_boundary(self) -> None:
        """Keep a timer on the next reservation start or end: a pass is due then
        (jobs may start in a reservation that begins, or on CPUs one frees)."""
        when = self.state.reservations.next_boundary(time.time())
        if when == self._boundary:
            return
        if self._boundary_timer is not None:
            self._boundary_timer.cancel()
            self._boundary_timer = None
        self._boundary = when
        if when is not None:
            delay = max(0.0, when - time.time()) + BOUNDARY_SLACK
            loop = asyncio.get_running_loop()
            self._boundary_timer = loop.call_later(delay, self._on_boundary)

    def _on_boundary(self) -> None:
        self._boundary_timer, self._boundary = None, None
        booking.tick(self.state)
        self.flush()

    def _wake_scheduler(self) -> None:
        """Push a snapshot to the scheduler, at most one per ``coalesce`` seconds
        (``full_coalesce`` while every CPU is allocated).

        An isolated change is planned at once; a burst (1,000 submissions) is
        folded into a few passes instead of one each. While the cluster is full a
        pass cannot start anything, so it waits longer; a CPU freed meanwhile
        brings it forward.
        """
        state = self.state
        if not state.wake or state.scheduler is None:
            return
        urgent = state.nodes.any_free_cpu()
        due = self._last_wake + (self.coalesce if urgent else self.full_coalesce)
        if self._wake_timer is not None:
            if self._wake_due <= due:
                return
            self._wake_timer.cancel()
            self._wake_timer = None
        gap = due - time.monotonic()
        if gap > 0:
            loop = asyncio.get_running_loop()
            self._wake_due = due
            self._wake_timer = loop.call_later(gap, self._rewake)
            return
        wake = state.take_wake()
        if wake is not None:
            self._last_wake = time.monotonic()
            self._send(state.scheduler, encode(wake))

    def _rewake(self) -> None:
        self._wake_timer = None
        self._wake_scheduler()

    def _send(self, identity: bytes, data: bytes) -> None:
        # A peer that vanished is not an error here: nodes re-register, the
        # scheduler says hello again, and clients time out cleanly.
        assert self.driver is not None
        if identity:
            self.driver.send([identity, data])

    def on_batch(self, batch: list[Frames]) -> None:
        """Handle every waiting request, commit once, then reply."""
        self.flush([(frames[0].bytes, self.handle(frames)) for frames in batch])

    async def serve(self, stop: asyncio.Event) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        if self.endpoint.startswith("ipc://"):
            # Any local user may submit; identity comes from peer credentials.
            os.chmod(self.endpoint[len("ipc://") :], 0o777)
        self.driver = SocketDriver(sock, self.on_batch, BATCH)
        log.info(
            "serving on %s (%d active jobs, %d reservations, policy %s)",
            self.endpoint,
            len(self.state.jobs),
            len(self.state.reservations),
            self.state.policy.name,
        )
        booking.tick(self.state)  # reservations that ended while we were down
        self.flush()
        tasks = [
            asyncio.create_task(self.publisher.run()),
            asyncio.create_task(self._watch_nodes()),
        ]
        await stop.wait()
        if self._boundary_timer is not None:
            self._boundary_timer.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.state.store.commit()
        self.driver.close()
        if self.endpoint.startswith("ipc://"):
            # No socket file tells the commands at once that no server is up.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.endpoint[len("ipc://") :])
        self.state.store.close()
        log.info("stopped")

    async def _watch_nodes(self) -> None:
        interval = min(1.0, self.config.server.node_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            liveness.check_nodes(self.state, self.config.server.node_timeout)
            booking.tick(self.state)  # the boundary timer's safety net
            self.state.begin_due()
            # Also retries a wake held back by a plan that never came back.
            self.flush()


async def _serve(paths: configuration.Paths, stop: asyncio.Event) -> None:
    await Server(paths, configuration.load(paths)).serve(stop)


def main(argv: list[str] | None = None) -> None:
    run_daemon("mb-server", _serve, argv, __doc__.splitlines()[0])
