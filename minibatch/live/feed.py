"""Keeping a :class:`~minibatch.live.model.LiveCluster` current: MQTT events in,
and the server's word after scheduling passes.

The feed subscribes to every event under the cluster's topic prefix first and
asks the server second, so nothing falls between the two (the model drops events
the answer already covers). After a pass, or a submission, it asks the server
again for the priority order, reasons and predicted starts, at most once per
``refresh`` seconds and never more than a fifth of the time: a deep queue makes
the answers slower, and then they come less often.

A broker that goes away is reported (``problem``) and retried with backoff;
after a reconnection the feed asks the server again, since events published
meanwhile are gone. Neither the broker nor the server ever notices a view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from minibatch.config import Config, Paths, mqtt_url
from minibatch.errors import MinibatchError
from minibatch.events.publisher import parse_url
from minibatch.live.model import LiveCluster

log = logging.getLogger(__name__)
_client_log = logging.getLogger(f"{__name__}.client")
_client_log.setLevel(logging.ERROR)

#: Reconnection backoff: first delay, ceiling (seconds).
BACKOFF_START, BACKOFF_MAX = 0.2, 5.0


class NoEvents(MinibatchError):
    """The cluster publishes no events a view could follow."""


def broker_url(paths: Paths, config: Config) -> str:
    """The cluster's MQTT URL.

    Raises:
        NoEvents: No broker is configured and ``mb up`` started none.
    """
    url = mqtt_url(paths, config)
    if not url:
        raise NoEvents(
            f"the cluster in {paths.home} publishes no events "
            "(no [mqtt] url and no broker started by mb up): run mb up"
        )
    return url


def fetch(endpoint: str, model: LiveCluster, timeout: float = 10.0) -> None:
    """Load ``model`` from the server: its jobs, nodes, priority order and
    reservations."""
    from minibatch.cli.ranking import rank
    from minibatch.net.client import Client
    from minibatch.protocol.messages import Diagnose, QueryNodes, QueryReservations

    at = time.time()
    with Client(endpoint, timeout) as client:
        reply = client.call(Diagnose())
        nodes = client.call(QueryNodes()).nodes
        reservations = client.call(QueryReservations()).reservations
    order = [p.id for p in rank(reply).order]
    model.load(reply.jobs, nodes, at, order, reply.policy, reply.params)
    model.load_reservations(reservations, at)


class Feed:
    """Follows one cluster into ``model``.

    Args:
        paths, config: The cluster (``MB_HOME``) and its configuration.
        model: What to keep current.
        on_change: Called (in the loop) after each change, to redraw.
        refresh: Fewest seconds between two loads from the server.
    """

    def __init__(
        self,
        paths: Paths,
        config: Config,
        model: LiveCluster,
        on_change: Callable[[], None] = lambda: None,
        refresh: float = 1.0,
    ) -> None:
        self.url = broker_url(paths, config)
        self.address = parse_url(self.url)
        self.endpoint = config.client_endpoint(paths)
        self.prefix = config.mqtt.topic_prefix.rstrip("/") + "/"
        self.model = model
        self.on_change = on_change
        self.refresh = refresh
        #: What is wrong now ("" when all is well), for the view to show.
        self.problem = ""
        self._wanted = asyncio.Event()
        #: Seconds the last load took.
        self._spent = 0.0

    async def run(self) -> None:
        """Follow until cancelled."""
        refresher = asyncio.ensure_future(self._refresher())
        try:
            await self._follow()
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher

    async def _follow(self) -> None:
        import aiomqtt

        delay = BACKOFF_START
        while True:
            try:
                async with aiomqtt.Client(
                    self.address.host,
                    self.address.port,
                    keepalive=15,
                    logger=_client_log,
                ) as client:
                    await client.subscribe(self.prefix + "#")
                    delay = BACKOFF_START
                    self._tell("")
                    await self._load()
                    async for message in client.messages:
                        self._on_message(str(message.topic), message.payload)
            except aiomqtt.MqttError as exc:
                self._tell(
                    f"event broker {self.url} unreachable ({exc or 'refused'}); "
                    f"retrying in {delay:g} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    def _on_message(self, topic: str, payload: Any) -> None:
        if not topic.startswith(self.prefix) or not isinstance(payload, bytes):
            return
        try:
            body = json.loads(payload)
        except ValueError:
            return  # not ours: the broker lets only the server publish
        if not isinstance(body, dict):
            return
        self.model.apply(topic[len(self.prefix) :], body, time.time())
        if self.model.stale:
            self._wanted.set()
        self.on_change()

    async def _load(self) -> None:
        started = time.monotonic()
        try:
            await asyncio.to_thread(fetch, self.endpoint, self.model)
        except MinibatchError as exc:
            self._tell(f"server {self.endpoint} does not answer ({exc})")
            self._wanted.set()  # try again at the next turn of the refresher
            return
        if self.problem.startswith("server"):
            self._tell("")
        self._spent = time.monotonic() - started
        self.on_change()

    async def _refresher(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            await self._load()
            await asyncio.sleep(max(self.refresh, 5 * self._spent))

    def _tell(self, problem: str) -> None:
        if problem != self.problem:
            self.problem = problem
            if problem:
                log.warning("%s", problem)
            self.on_change()
