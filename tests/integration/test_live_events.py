"""Events a live view relies on, from real clusters on both brokers ``mb up``
starts (the embedded amqtt and Debian's mosquitto): one per scheduling pass,
states retained for late subscribers (and again after a broker restart), a
broker that dies costing nothing, and ``mb watch`` printing them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from typing import Any

import aiomqtt
import psutil
import pytest
from conftest import BIN, Cluster, ClusterFactory, wait_for
from test_cluster_events import Subscriber, sh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PREFIX = "minibatch/v1/"


def gone(pid: int) -> bool:
    """Dead, or a zombie its parent (the test, which started it) has not reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def broker_address(c: Cluster) -> tuple[str, int]:
    host, port = c.paths.mqtt_url_file.read_text().strip()[7:].rsplit(":", 1)
    return host, int(port)


async def retained(c: Cluster, topic: str) -> dict[str, Any]:
    """What a subscriber that arrives now gets at once on ``topic``, kept by
    the broker. A state published live just as we subscribe may come first
    (not retained: it was still on its way): then the broker has it by now,
    and a new subscriber must get it retained."""
    host, port = broker_address(c)

    async def first(client: aiomqtt.Client) -> dict[str, Any] | None:
        async for message in client.messages:
            if not message.topic.matches(topic):
                continue  # amqtt: another subscriber's retained message
            if not message.retain:
                return None
            assert isinstance(message.payload, bytes)
            return dict(json.loads(message.payload))
        raise AssertionError("the connection ended")

    for _ in range(3):
        async with aiomqtt.Client(host, port) as client:
            await client.subscribe(topic)
            found = await asyncio.wait_for(first(client), 10)
        if found is not None:
            return found
    raise AssertionError(f"{topic}: only live messages, never a retained one")


@pytest.mark.parametrize("broker", ["amqtt", "mosquitto"])
async def test_passes_are_published_and_states_retained(
    cluster: ClusterFactory, broker: str
) -> None:
    c = await asyncio.to_thread(
        cluster, nodes=1, cpus_per_node=2, mqtt={"broker": broker}
    )
    program = psutil.Process(c.pids()["broker"]).children()
    assert (broker == "mosquitto") == any(p.name() == "mosquitto" for p in program)
    # Subscribers that come after the fact learn the states at once.
    node = await retained(c, PREFIX + "nodes/node0/state")
    assert (node["name"], node["state"]) == ("node0", "free")
    assert (await retained(c, PREFIX + "sched/policy"))["name"] == "easy"

    host, port = broker_address(c)
    async with aiomqtt.Client(host, port) as client:
        await client.subscribe(PREFIX + "#")
        sub = Subscriber(client)
        try:
            gate = c.work / "go"
            long = await sh(
                c, "qsub", "-l", "walltime=300", "--", "sh", "-c",
                f"while [ ! -e {gate} ]; do sleep 0.05; done",
            )  # fmt: skip
            await asyncio.to_thread(c.wait_state, long, "running")
            wide = await sh(c, "qsub", "-l", "ncpus=2,walltime=60", "--", "true")
            start = len(sub.got)
            # Ends long before the wide job's reserved start: EASY backfills it.
            small = await sh(c, "qsub", "-l", "walltime=30", "--", "sleep", "1")
            got = await sub.wait(
                lambda g: any(
                    t == PREFIX + "sched/pass" and p["backfilled"] for t, p in g[start:]
                )
            )
            passes = [p for t, p in got[start:] if t == PREFIX + "sched/pass"]
            backfill = next(p for p in passes if p["backfilled"])
            assert backfill["policy"] == "easy"
            assert (backfill["started"], backfill["backfilled"]) == (1, 1)
            assert backfill["reserved"] == 1 and backfill["pending"] == 2
            assert backfill["duration_ms"] >= 0
            assert (await asyncio.to_thread(c.job, small))["state"] != "queued"
            last = await retained(c, PREFIX + "sched/pass")
            assert last["generation"] >= backfill["generation"]
            assert c.job(wide)["state"] == "queued"

            # A policy switch is an event, and the new retained state.
            await sh(c, "mb", "policy", "set", "fifo")
            await sub.wait_topic(PREFIX + "sched/policy")
            assert (await retained(c, PREFIX + "sched/policy"))["name"] == "fifo"
            gate.touch()
            await asyncio.to_thread(c.wait_state, wide, "finished")
        finally:
            await sub.close()


async def test_a_dead_broker_stops_nothing_and_loses_nothing(
    cluster: ClusterFactory,
) -> None:
    c = await asyncio.to_thread(cluster, nodes=1, cpus_per_node=1)
    broker = c.pids()["broker"]
    before = json.loads(await sh(c, "mb", "status", "--json"))["events"]
    assert before["connected"] == 1 and before["dropped"] == 0
    os.kill(broker, signal.SIGKILL)
    await asyncio.to_thread(wait_for, lambda: gone(broker), 10.0)

    # The cluster carries on: a job runs to its end while nobody hears of it.
    job = await sh(c, "qsub", "--", "true")
    assert (await asyncio.to_thread(c.wait_state, job, "finished"))["exit_status"] == 0

    def buffered() -> dict[str, int] | None:
        events = json.loads(c.run("mb", "status", "--json", check=False).stdout)
        counts: dict[str, int] = events["events"]
        return counts if not counts["connected"] and counts["pending"] >= 3 else None

    down = await asyncio.to_thread(wait_for, buffered, 10.0)
    assert "broker unreachable" in (await sh(c, "mb", "status", check=False))

    await asyncio.to_thread(c.up)  # starts the broker again, on the same port

    def resent() -> dict[str, int] | None:
        counts: dict[str, int] = json.loads(c.run("mb", "status", "--json").stdout)[
            "events"
        ]
        return counts if counts["connected"] and not counts["pending"] else None

    after = await asyncio.to_thread(wait_for, resent, 30.0)
    assert after["sent"] >= down["sent"] + down["pending"]
    assert after["dropped"] == 0
    # The restarted broker knew nothing; the server told it the states again.
    node = await retained(c, PREFIX + "nodes/node0/state")
    assert node["state"] == "free"
    assert (await retained(c, PREFIX + "sched/policy"))["name"] == "easy"


def test_mb_watch_prints_the_events(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    watch = subprocess.Popen(
        [str(BIN / "mb"), "watch", "--json"],
        env=c.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        # The states the broker retains come first: then it is subscribed.
        first = json.loads(watch.stdout.readline())
        assert first["retained"] and first["topic"].startswith(("nodes/", "sched/"))
        job = c.qsub("-N", "watched", "--", "true")
        seen: list[dict[str, Any]] = []
        while not any(e["topic"] == f"jobs/{job}/finished" for e in seen):
            seen.append(json.loads(watch.stdout.readline()))
        mine = [e["topic"] for e in seen if e["topic"].startswith(f"jobs/{job}/")]
        assert mine == [f"jobs/{job}/{e}" for e in ("submitted", "started", "finished")]
        assert any(e["topic"] == "sched/pass" for e in seen)
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=10)
        assert watch.returncode == 0 and "Traceback" not in err, err
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(5)
    # Readable lines, and a filter: only the node's retained state, then it stops.
    nodes = c.run("mb", "watch", "--nodes", "-n", "1", timeout=30).stdout
    assert nodes.endswith("node  node node0 is free (now)\n"), nodes
    assert len(nodes.splitlines()) == 1


def test_mb_watch_without_a_broker_says_so(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    broker = c.pids()["broker"]
    os.kill(broker, signal.SIGKILL)
    wait_for(lambda: gone(broker), 10.0)
    proc = c.run("mb", "watch", check=False, timeout=30)
    assert proc.returncode != 0
    assert "cannot reach the event broker" in proc.stderr
    assert "mb status" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The cluster never noticed.
    job = c.qsub("--", "true")
    assert c.wait_state(job, "finished")["exit_status"] == 0
