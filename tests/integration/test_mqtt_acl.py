"""Only the server publishes a cluster's events; anyone may listen.

Both brokers ``mb up`` can start (the embedded amqtt and Debian's mosquitto)
are run for real, as ``mb up`` runs them (``mb-broker --credentials``), on a
free loopback port, and stopped by PID. An anonymous client's publications,
retained or not, never reach a subscriber nor stay retained; the server's do;
a wrong password and an anonymous will are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomqtt
import psutil
import pytest
from conftest import ClusterFactory

from minibatch.events import EventPublisher, credentials, mosquitto

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PREFIX = "minibatch/v1"
FORGED = f"{PREFIX}/jobs/1/finished"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    def __init__(self, port: int, cred: credentials.Credentials) -> None:
        self.port, self.cred = port, cred

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def client(self, **kw: object) -> aiomqtt.Client:
        return aiomqtt.Client("127.0.0.1", self.port, timeout=10, **kw)  # type: ignore[arg-type]

    def server(self) -> aiomqtt.Client:
        return self.client(username=self.cred.user, password=self.cred.password)


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    if request.param == "mosquitto" and mosquitto.executable() is None:
        pytest.fail("mosquitto is not installed (make test installs it)")
    cred = credentials.ensure(tmp_path / "mqtt.credentials")
    port = free_port()
    command = [sys.executable, "-m", "minibatch.events.broker", "--port", str(port)]
    command += ["--credentials", str(tmp_path / "mqtt.credentials")]
    if request.param == "mosquitto":
        command.append("--mosquitto")
    log = tmp_path / "broker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=tmp_path
        )
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Broker(port, cred)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def first_message(client: aiomqtt.Client, timeout: float = 10.0) -> tuple:
    async def one() -> tuple[str, bytes, bool]:
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            return str(message.topic), message.payload, message.retain
        raise AssertionError("the connection ended")

    return await asyncio.wait_for(one(), timeout)


@contextlib.asynccontextmanager
async def publisher(broker: Broker) -> AsyncIterator[EventPublisher]:
    pub = EventPublisher(broker.url, PREFIX, credentials=broker.cred)
    pub.start()
    try:
        yield pub
    finally:
        await pub.aclose(timeout=1.0)


async def test_only_the_server_publishes_and_nothing_forged_is_retained(
    broker: Broker,
) -> None:
    async with broker.client() as listener:
        await listener.subscribe(f"{PREFIX}/#")
        async with broker.client() as forger:
            for qos in (0, 1):
                await forger.publish(FORGED, b'{"forged": true}', qos=qos, retain=True)
            # A QoS 1 publication is acknowledged once the broker handled it,
            # so anything it let through is queued ahead of the server's event.
            await forger.publish(f"{PREFIX}/nodes/x/state", b"{}", qos=1)
        async with publisher(broker) as pub:
            pub.job_event(2, "started", {"id": "2"})
            topic, payload, _ = await first_message(listener)
    assert (topic, json.loads(payload)) == (f"{PREFIX}/jobs/2/started", {"id": "2"})

    # The server's retained message stays; the forged one never did. Retained
    # messages come with each subscription's acknowledgement, in order.
    async with broker.server() as server:
        await server.publish(f"{PREFIX}/sched/policy", b'{"name": "easy"}', retain=True)
        await server.publish(f"{PREFIX}/sched/done", b"{}", qos=1)
    async with broker.client() as late:
        await late.subscribe(FORGED)
        await late.subscribe(f"{PREFIX}/sched/policy")
        topic, payload, retained = await first_message(late)
    assert (topic, payload, retained) == (
        f"{PREFIX}/sched/policy",
        b'{"name": "easy"}',
        True,
    )


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def dying_client(
    broker: Broker, will_topic: str, user: str = "", password: str = ""
) -> None:
    """Connect with a retained will on ``will_topic``, then drop the connection
    without DISCONNECT, so the broker sends the will (if it accepted it)."""
    flags = 0x02 | 0x04 | 0x08 | 0x20  # clean session, will, will QoS 1, retained
    payload = _string(f"will-{os.getpid()}-{len(will_topic)}".encode())
    payload += _string(will_topic.encode()) + _string(b'{"will": true}')
    if user:
        flags |= 0x80 | 0x40
        payload += _string(user.encode()) + _string(password.encode())
    body = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x3c" + payload
    length, size = b"", len(body)
    while True:  # MQTT's variable-length "remaining length"
        size, digit = divmod(size, 128)
        length += bytes([digit | (0x80 if size else 0)])
        if not size:
            break
    with socket.create_connection(("127.0.0.1", broker.port), 10) as sock:
        sock.sendall(b"\x10" + length + body)
        sock.recv(4)  # CONNACK, or nothing when refused: the will is gone either way


async def test_an_anonymous_will_is_never_delivered(broker: Broker) -> None:
    async with broker.client() as listener:
        await listener.subscribe(f"{PREFIX}/#")
        await asyncio.to_thread(dying_client, broker, FORGED)
        # The server's will, sent once the broker saw the first client go:
        # a forged one would be queued ahead of it.
        sentinel = f"{PREFIX}/nodes/sentinel/state"
        cred = broker.cred
        await asyncio.to_thread(dying_client, broker, sentinel, *cred)
        topic, payload, _ = await first_message(listener)
    assert (topic, payload) == (sentinel, b'{"will": true}')


async def test_a_wrong_password_is_refused(broker: Broker) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with broker.client(username=broker.cred.user, password="guess"):
            pass


async def test_a_cluster_on_mosquitto_publishes_its_events(
    cluster: ClusterFactory,
) -> None:
    if mosquitto.executable() is None:
        pytest.fail("mosquitto is not installed (make test installs it)")
    c = await asyncio.to_thread(cluster, nodes=1, mqtt={"broker": "mosquitto"})
    (child,) = psutil.Process(c.pids()["broker"]).children()
    assert child.name() == "mosquitto"
    port = int(c.paths.mqtt_url_file.read_text().strip().rsplit(":", 1)[1])
    async with aiomqtt.Client("127.0.0.1", port, timeout=10) as sub:
        await sub.subscribe(f"{PREFIX}/jobs/+/finished")
        job = await asyncio.to_thread(c.qsub, "--", "true")
        topic, payload, _ = await first_message(sub)
    assert topic == f"{PREFIX}/jobs/{job}/finished"
    assert json.loads(payload)["result"] == "completed"
