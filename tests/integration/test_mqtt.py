"""The embedded broker (``mb-broker``) and the server's EventPublisher, for real.

Each test starts the broker as a subprocess on a free loopback port, and kills it
by PID when done, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
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

from minibatch.events import EventPublisher, job_topic, node_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PREFIX = "test/v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_command(port: int) -> list[str]:
    script = Path(sys.executable).with_name("mb-broker")
    if script.exists():
        return [str(script), "--port", str(port)]
    return [sys.executable, "-m", "minibatch.events.broker", "--port", str(port)]


class BrokerProcess:
    """One ``mb-broker`` subprocess; restartable on the same port."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.log = workdir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                broker_command(self.port),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited:\n{self.log.read_text()}")
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            time.sleep(0.05)
        raise AssertionError(f"broker did not listen:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    workdir = tmp_path / "broker"
    workdir.mkdir()
    b = BrokerProcess(free_port(), workdir)
    b.start()
    try:
        yield b
    finally:
        b.stop(signal.SIGKILL)


@contextlib.asynccontextmanager
async def subscriber(url: str, topic: str) -> AsyncIterator[aiomqtt.Client]:
    port = int(url.rsplit(":", 1)[1])
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.subscribe(topic)
        yield client


async def receive(client: aiomqtt.Client, n: int, timeout: float = 10.0) -> list:
    got: list[tuple[str, object]] = []

    async def collect() -> None:
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            got.append((str(message.topic), json.loads(message.payload)))
            if len(got) == n:
                return

    await asyncio.wait_for(collect(), timeout)
    return got


@contextlib.asynccontextmanager
async def running(pub: EventPublisher) -> AsyncIterator[EventPublisher]:
    pub.start()
    try:
        yield pub
    finally:
        await pub.aclose(timeout=1.0)


async def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_events_reach_a_subscriber(broker: BrokerProcess) -> None:
    async with (
        subscriber(broker.url, f"{PREFIX}/#") as sub,
        running(EventPublisher(broker.url, PREFIX)) as pub,
    ):
        pub.job_event(7, "state", {"id": 7, "state": "R", "cpus": [0, 1]})
        pub.node_state("node0", {"name": "node0", "state": "free"})
        pub.publish("jobs/8/submitted", {"id": 8}, qos=1)
        got = await receive(sub, 3)
    assert got == [
        (job_topic(PREFIX, 7, "state"), {"id": 7, "state": "R", "cpus": [0, 1]}),
        (node_topic(PREFIX, "node0"), {"name": "node0", "state": "free"}),
        (f"{PREFIX}/jobs/8/submitted", {"id": 8}),
    ]
    assert pub.sent == 3 and pub.pending == 0 and pub.dropped == 0


async def test_a_burst_arrives_complete_and_in_order(broker: BrokerProcess) -> None:
    n = 5000
    async with (
        subscriber(broker.url, f"{PREFIX}/jobs/+/state") as sub,
        running(EventPublisher(broker.url, PREFIX)) as pub,
    ):
        for i in range(n):
            pub.job_event(i, "state", {"id": i})
        got = await receive(sub, n, timeout=30)
    assert [payload for _, payload in got] == [{"id": i} for i in range(n)]


class GatedPublisher(EventPublisher):
    """Holds each new connection until the test's subscriber is ready.

    Without the gate the publisher could reconnect and re-send in the moment
    between the broker's restart and the subscriber's SUBSCRIBE, and QoS 0
    messages to a topic nobody subscribes to are simply discarded.
    """

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()

    async def _session(self, client) -> None:  # type: ignore[no-untyped-def]
        await self.gate.wait()
        await super()._session(client)


async def test_events_buffered_while_broker_down_are_resent(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="minibatch.events.publisher")
    pub = GatedPublisher(broker.url, PREFIX)
    pub.gate.set()
    async with running(pub):
        async with subscriber(broker.url, f"{PREFIX}/#") as sub:
            pub.job_event(1, "state", {"id": 1, "state": "Q"})
            assert await receive(sub, 1) == [
                (f"{PREFIX}/jobs/1/state", {"id": 1, "state": "Q"})
            ]
        pub.gate.clear()
        assert broker.stop() == 0, broker.log.read_text()
        await wait_for(lambda: not pub.connected)

        # The server goes on publishing while the broker is down.
        for state in ("R", "E", "C"):
            pub.job_event(1, "state", {"id": 1, "state": state})
        pub.node_state("node0", {"state": "free"})
        await asyncio.sleep(1.0)  # a few failed reconnection attempts
        assert pub.pending == 4 and not pub.connected

        broker.start()
        async with subscriber(broker.url, f"{PREFIX}/#") as sub:
            pub.gate.set()
            got = await receive(sub, 4, timeout=20)
    assert got == [
        (f"{PREFIX}/jobs/1/state", {"id": 1, "state": "R"}),
        (f"{PREFIX}/jobs/1/state", {"id": 1, "state": "E"}),
        (f"{PREFIX}/jobs/1/state", {"id": 1, "state": "C"}),
        (f"{PREFIX}/nodes/node0/state", {"state": "free"}),
    ]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unavailable" in warnings[0].getMessage()


async def test_no_broker_nothing_blocks_and_the_oldest_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="minibatch.events.publisher")
    url = f"mqtt://127.0.0.1:{free_port()}"  # nobody listens there
    async with running(EventPublisher(url, PREFIX, buffer_size=5)) as pub:
        started = time.perf_counter()
        for i in range(8):
            pub.job_event(i, "state", {"id": i})
        assert time.perf_counter() - started < 0.1
        await asyncio.sleep(1.5)  # several reconnection attempts
        assert pub.pending == 5 and pub.dropped == 3 and not pub.connected
        assert [json.loads(e.payload)["id"] for e in pub._buf] == [3, 4, 5, 6, 7]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # one for the outage, one for the overflow
    assert any("buffer full" in m for m in messages)


async def test_empty_url_disables_the_publisher() -> None:
    pub = EventPublisher("", PREFIX)
    assert not pub.enabled
    pub.job_event(1, "state", {"id": 1})
    assert pub.pending == 0
    await asyncio.wait_for(pub.run(), 1.0)  # returns at once


def test_bad_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="unsupported MQTT URL"):
        EventPublisher("http://127.0.0.1:1883", PREFIX)


def test_broker_is_quiet_small_and_clean(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    proc = psutil.Process(broker.proc.pid)
    socket.create_connection(("127.0.0.1", broker.port), 1).close()  # a bare probe
    proc.cpu_percent(None)
    time.sleep(2.0)
    cpu = proc.cpu_percent(None)
    rss_mb = proc.memory_info().rss / 2**20
    # Targets are < 1 % and < 60 MB; the bounds leave room for a loaded CI host.
    assert cpu < 5.0, f"idle broker uses {cpu:.1f}% CPU"
    assert rss_mb < 100, f"idle broker uses {rss_mb:.0f} MB"
    assert broker.stop() == 0  # SIGTERM: clean exit
    # Nothing written in its working directory but the log the test gave it.
    assert sorted(p.name for p in broker.workdir.iterdir()) == ["broker.log"]
    log = broker.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log and "WARNING" not in log, log


def test_broker_reports_a_taken_port(broker: BrokerProcess) -> None:
    result = subprocess.run(
        broker_command(broker.port), capture_output=True, timeout=20, check=False
    )
    assert result.returncode == 1
    assert b"cannot listen on 127.0.0.1" in result.stderr
