"""MQTT events of a real cluster, as a subscriber on its broker receives them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiomqtt
import pytest
from conftest import Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Event = tuple[str, dict[str, Any]]


class Subscriber:
    """Collects every message under ``minibatch/v1/#`` in the background."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.got: list[Event] = []
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def _collect(self) -> None:
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            self.got.append((str(message.topic), json.loads(message.payload)))

    async def wait(
        self, predicate: Callable[[list[Event]], bool], timeout: float = 10.0
    ) -> list[Event]:
        async def poll() -> None:
            while not predicate(self.got):
                await asyncio.sleep(0.02)

        try:
            await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"events not seen in {timeout} s: {self.got}"
            ) from None
        return list(self.got)

    async def wait_topic(self, topic: str, timeout: float = 10.0) -> dict[str, Any]:
        got = await self.wait(lambda g: any(t == topic for t, _ in g), timeout)
        return next(p for t, p in got if t == topic)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def sh(c: Cluster, *args: str, check: bool = True) -> str:
    """Run a command without blocking the event loop; its stdout."""
    proc = await asyncio.to_thread(c.run, *args, check=check)
    return proc.stdout.strip()


async def test_job_and_node_events(cluster: ClusterFactory) -> None:
    c = await asyncio.to_thread(cluster)
    url = c.paths.mqtt_url_file.read_text().strip()
    assert url.startswith("mqtt://127.0.0.1:")
    host, port = url.removeprefix("mqtt://").rsplit(":", 1)
    async with aiomqtt.Client(host, int(port)) as client:
        await client.subscribe("minibatch/v1/#")
        sub = Subscriber(client)
        try:
            await check_job_events(c, sub)
            await check_node_events(c, sub)
        finally:
            await sub.close()


async def check_job_events(c: Cluster, sub: Subscriber) -> None:
    jid = await sh(c, "qsub", "-N", "evented", "--", "sh", "-c", "sleep 0.3")
    prefix = f"minibatch/v1/jobs/{jid}/"
    finished = await sub.wait_topic(prefix + "finished")
    mine = [(t.removeprefix(prefix), p) for t, p in sub.got if t.startswith(prefix)]
    kinds = [k for k, _ in mine]
    assert kinds == ["submitted", "started", "finished"], mine
    submitted, started = mine[0][1], mine[1][1]
    assert (submitted["id"], submitted["name"]) == (jid, "evented")
    assert (submitted["state"], submitted["result"]) == ("queued", None)
    assert (started["state"], started["result"]) == ("running", None)
    assert started["node"] in {n.name for n in c.layout} and started["cpus"]
    assert (finished["state"], finished["result"]) == ("finished", "completed")
    assert finished["exit_status"] == 0
    assert submitted["time"] <= started["time"] <= finished["time"]
    # Its node (one CPU) was busy while it ran and is free again: the live
    # views see a node's load change, not only its registration.
    topic = f"minibatch/v1/nodes/{started['node']}/state"

    def busy_then_free(got: list[Event]) -> bool:
        states = [p["state"] for t, p in got if t == topic]
        return (
            "job-exclusive" in states
            and "free" in states[states.index("job-exclusive") :]
        )

    await sub.wait(busy_then_free)


async def check_node_events(c: Cluster, sub: Subscriber) -> None:
    topic = "minibatch/v1/nodes/node0/state"
    start = len(sub.got)
    await sh(c, "pbsnodes", "-o", "node0", "-N", "maintenance")
    offline = await sub.wait(
        lambda g: any(t == topic and p["state"] == "offline" for t, p in g[start:])
    )
    payload = next(p for t, p in offline[start:] if t == topic)
    assert payload["name"] == "node0" and payload["state"] == "offline"
    [node0] = json.loads(await sh(c, "pbsnodes", "--json", "node0"))
    assert node0["state"] == "offline" and node0["comment"] == "maintenance"
    assert "node0" in await sh(c, "pbsnodes", "-l")

    # Only node1 takes jobs now: the second job waits even though node0 is idle.
    first = await sh(c, "qsub", "--", "sleep", "30")
    second = await sh(c, "qsub", "--", "true")
    assert (await asyncio.to_thread(c.wait_state, first, "running"))["node"] == "node1"
    await asyncio.sleep(1.0)
    assert c.job(second)["state"] == "queued"
    assert c.nodes()["node0"].jobs == {}

    start = len(sub.got)
    await sh(c, "pbsnodes", "-c", "node0")
    await sub.wait(
        lambda g: any(t == topic and p["state"] == "free" for t, p in g[start:])
    )
    done = await asyncio.to_thread(c.wait_state, second, "finished")
    assert done["result"] == "completed" and done["node"] == "node0"
    await sh(c, "qdel", first)
