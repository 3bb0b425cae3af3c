"""mb-server: the asyncio shell around :class:`~minibatch.server.state.ServerState`.

One ROUTER socket serves the scheduler, the node daemons and remote commands
(on its ipc endpoint, and with CURVE on the tcp ones of ``[server] listen``);
the commands of this host come over a unix socket beside it
(:mod:`minibatch.net.stream`), and both feed the same batches.
The loop takes every request already waiting (up to :data:`BATCH`), handles them,
commits the resulting writes in **one** transaction, and only then sends replies,
daemon messages, MQTT events and the scheduler's wake-up. Acknowledged means
committed, and a burst of submissions costs one commit rather than one each.
A commit that fails (a full disk) sends none of that: the state goes back to the
database's (:mod:`~minibatch.server.rollback`) and the requests that wrote are
answered with the error at once; the others are handled again and answered.

Nothing a client sends can stop the loop: malformed frames get an error reply,
handler errors become coded error replies, and unexpected exceptions are logged
with their traceback and answered with ``INTERNAL``. Log lines about either are
rate-limited, so that no client can fill the disk through the log; the socket
caps message sizes and each user's connections (:mod:`minibatch.net.guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence

from minibatch import config as configuration
from minibatch.daemon import notify_ready, run_daemon
from minibatch.errors import ErrorCode, MinibatchError, ProtocolError, StorageError
from minibatch.events import credentials as mqtt_credentials
from minibatch.events.publisher import EventPublisher, is_state
from minibatch.net.curve import CurveServer
from minibatch.net.driver import Frames, SocketDriver
from minibatch.net.guard import listen
from minibatch.net.local import ROUTE_PREFIX, LocalListener, LocalRequest
from minibatch.net.ratelog import RateLimitedLog
from minibatch.net.stream import check_path, command_path
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import Error, Submit
from minibatch.server import acctlog, booking, dispatch, liveness, mail, rollback
from minibatch.server.access import need_remote_allowed
from minibatch.server.handlers import HANDLERS, Context
from minibatch.server.requests import Request, from_local, from_router
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.server.submit import check_sizes, remote_caller

log = logging.getLogger("minibatch.server")

#: Requests handled per commit at most; bounds reply latency under a flood.
BATCH = 512
#: Seconds after a reservation boundary that its pass runs (so it sees the change).
BOUNDARY_SLACK = 0.005
#: Seconds before the scheduler is woken after a failed commit: its pass would
#: fail the same way at once while the disk stays full.
WAKE_AFTER_FAILURE = 1.0


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
            policy_modules=dict(config.scheduler.policy_modules),
        )
        self.publisher = EventPublisher(
            url,
            config.mqtt.topic_prefix,
            credentials=mqtt_credentials.read(paths.mqtt_credentials),
        )
        self.ctx.event_stats = self.publisher.stats
        self.mailer = mail.Mailer(config.server.sendmail)
        self.acctlog = acctlog.AccountingFile(paths.state / "accounting")
        self.host = os.uname().nodename
        self.driver: SocketDriver | None = None
        #: The commands' unix socket, beside an ipc endpoint.
        self.local: LocalListener | None = None
        #: The tcp endpoints of ``[server] listen``, when there are any.
        self.tcp: CurveServer | None = None
        self.complaints = RateLimitedLog(log, "malformed requests and connections")
        self.bugs = RateLimitedLog(log, "internal errors")
        self.coalesce = config.scheduler.coalesce_ms / 1000
        self.full_coalesce = config.scheduler.full_coalesce_ms / 1000
        self._last_wake = 0.0
        self.trouble = rollback.CommitTrouble(log)
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_due = 0.0
        #: The next reservation start or end, and the timer armed for it.
        self._boundary: float | None = None
        self._boundary_timer: asyncio.TimerHandle | None = None

    def handle(self, request: Request) -> bytes | None:
        """One request in, at most one encoded reply out; never raises."""
        rid = 0
        try:
            if request.parts != 1:
                raise ProtocolError(f"expected one message frame, got {request.parts}")
            env = decode(request.data)
            rid = env.id
            handler = HANDLERS.get(type(env.body))
            if handler is None:
                err = ProtocolError(f"{type(env.body).__name__} is not a request")
                err.code = ErrorCode.UNKNOWN_TYPE
                raise err
            if isinstance(env.body, Submit):
                limits = self.config.server
                check_sizes(
                    env.body.spec, limits.max_script_bytes, limits.max_env_bytes
                )
            caller = request.peer
            if caller is None and self.tcp is not None and request.frame is not None:
                # No peer credentials: a tcp client, known by its CURVE key.
                key = self.tcp.entry(request.frame)
                caller = remote_caller(key.kind, key.name)
                need_remote_allowed(self.state, caller, env.body)
            self.state.requestor = caller
            reply = handler(self.state, self.ctx, caller, request.route, env.body)
        except ProtocolError as exc:
            self.complaints.warning("%s (from %s)", exc, _sender(request))
            reply = Error(code=int(exc.code), message=str(exc))
        except MinibatchError as exc:
            reply = Error(code=int(exc.code), message=str(exc))
        except Exception as exc:
            self.bugs.error("request failed", exc_info=True)
            reply = Error(
                code=int(ErrorCode.INTERNAL), message=f"internal error: {exc}"
            )
        finally:
            self.state.requestor = None
        return None if reply is None else encode(reply, re=rid)

    def flush(self, replies: Sequence[tuple[bytes, bytes | None]] = ()) -> Error | None:
        """Start what the last plan has next, commit, then send ``replies`` and
        perform everything the state queued.

        If the commit fails nothing is sent: the state goes back to the
        database's and the error for the requests that wrote is returned.
        """
        state = self.state
        if state.freed:
            state.freed = False
            dispatch.start_upcoming(state)
        wrote = state.store.dirty
        try:
            state.store.commit()
        except Exception as exc:
            return self._roll_back(exc)
        if wrote:  # only a real commit says the disk works again
            self.trouble.recovered()
        self.acctlog.write(state.accounting.take())
        for identity, reply in replies:
            if reply is not None:
                self._send(identity, reply)
        for identity, message in state.outbox:
            self._send(identity, encode(message))
        state.outbox.clear()
        if wrote:  # jobs started or ended: nodes may be busy or free now
            liveness.publish_changes(state)
        for topic, payload in state.events:
            self.publisher.publish(topic, payload, retain=is_state(topic))
        state.events.clear()
        self.mailer.send_all(state.mail, self.host)
        state.mail.clear()
        self._wake_scheduler()
        self._arm_boundary()
        return None

    def _roll_back(self, exc: Exception) -> Error:
        if isinstance(exc, StorageError):
            self.trouble.failure(exc)
            error = Error(code=int(exc.code), message=str(exc))
        else:  # a bug (a record that does not encode): nothing was kept either
            log.exception("commit failed")
            error = Error(
                code=int(ErrorCode.INTERNAL), message=f"internal error: {exc}"
            )
        try:
            self.state = rollback.restore(self.state, self.config)
        except Exception:
            # Serving a state the database does not hold would break the promise
            # that acknowledged means committed (and the reverse): stop instead.
            log.critical("cannot reload the state after a failed commit", exc_info=True)
            raise SystemExit(1) from None
        self._last_wake = time.monotonic() + WAKE_AFTER_FAILURE
        self._wake_scheduler()
        self._arm_boundary()
        return error

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

    def _send(self, route: bytes, data: bytes) -> None:
        # A peer that vanished is not an error here: nodes re-register, the
        # scheduler says hello again, and clients time out cleanly.
        if route.startswith(ROUTE_PREFIX):
            assert self.local is not None
            self.local.send(route, data)
        elif route:
            assert self.driver is not None
            self.driver.send([route, data])

    def on_batch(self, batch: list[Request]) -> None:
        """Handle every waiting request, commit once, then reply.

        When the commit fails, each request that wrote something is answered
        with the error (a notification, with nothing). The others changed
        nothing: they are handled again on the restored state, so that a qstat
        beside a refused qsub does not show its job, and answered as usual.
        """
        while batch:
            handled = [self._handle_noting_writes(request) for request in batch]
            error = self.flush([(r.route, reply) for r, reply, _ in handled])
            if error is None:
                return
            again = [request for request, _, wrote in handled if not wrote]
            if len(again) == len(batch):
                # Only the server's own writes failed (upcoming starts), made
                # after these replies: they describe what the database holds.
                for request, reply, _ in handled:
                    if reply is not None:
                        self._send(request.route, reply)
                return
            for request, reply, wrote in handled:
                if reply is not None and wrote:
                    # The reply is ours, so it decodes; it has the request's id.
                    self._send(request.route, encode(error, re=decode(reply).re))
            batch = again

    def _on_router(self, batch: list[Frames]) -> None:
        requests = []
        for frames in batch:
            request = from_router(frames)
            if request is None:
                self.complaints.warning(
                    "dropped a request from a peer with a reserved routing id"
                )
            else:
                requests.append(request)
        self.on_batch(requests)

    def _on_local(self, batch: list[LocalRequest]) -> None:
        self.on_batch([from_local(request) for request in batch])

    def _handle_noting_writes(
        self, request: Request
    ) -> tuple[Request, bytes | None, bool]:
        """:meth:`handle`, and whether the request queued a database write."""
        store = self.state.store
        before = store.writes
        reply = self.handle(request)
        return request, reply, store.writes != before

    async def serve(self, stop: asyncio.Event) -> None:
        limits = self.config.server
        local = command_path(self.endpoint)
        if local is not None:  # an ipc endpoint, and the commands' socket beside it
            check_path(self.endpoint.removeprefix("ipc://"))
            check_path(local)
        sock, guard = listen(
            self.endpoint,
            max_message_bytes=limits.max_message_bytes,
            per_user=limits.max_connections_per_user,
            complaints=self.complaints,
        )
        if self.endpoint.startswith("ipc://"):
            # Any local user may submit; identity comes from peer credentials.
            os.chmod(self.endpoint[len("ipc://") :], 0o777)
        if limits.listen:  # after the ipc bind: see minibatch.net.curve
            self.tcp = CurveServer(sock, limits.listen, self.paths.server_keys)
        self.driver = SocketDriver(sock, self._on_router, BATCH)
        guard.start()
        if local is not None:
            self.local = LocalListener(
                local,
                self._on_local,
                caps=guard.caps,
                max_message_bytes=limits.max_message_bytes,
                complaints=self.complaints,
                batch=BATCH,
            )
            await self.local.start()
        log.info(
            "serving on %s (%d active jobs, %d reservations, policy %s)",
            self.endpoint,
            len(self.state.jobs),
            len(self.state.reservations),
            self.state.policy.name,
        )
        booking.tick(self.state)  # reservations that ended while we were down
        booking.announce_policy(self.state)
        self.flush()
        notify_ready()
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
        with contextlib.suppress(StorageError):  # queued writes were not acknowledged
            self.state.store.commit()
        guard.close()
        self.driver.close()
        if self.local is not None:
            self.local.close()
        if self.tcp is not None:
            self.tcp.close()
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


def _sender(request: Request) -> str:
    """Who sent ``request``, for a log line."""
    caller = request.peer
    return "an unknown peer" if caller is None else f"uid {caller.uid} pid {caller.pid}"


async def _serve(paths: configuration.Paths, stop: asyncio.Event) -> None:
    await Server(paths, configuration.load(paths)).serve(stop)


def main(argv: list[str] | None = None) -> None:
    run_daemon("mb-server", _serve, argv, __doc__.splitlines()[0])
