"""``mb watch``: the cluster's events as they happen, one readable line each.

    mb watch                  every event
    mb watch --jobs --sched   job events, scheduling passes and reservations
    mb watch --json           one JSON object per line: topic, payload, retained

States the broker keeps (each node's, the policy in force) come first, marked
``(now)``: they say where things stand before the first event. A broker that goes
away is reported on stderr and retried; the events published meanwhile are gone
(the broker does not keep them for a subscriber), and the line says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Annotated

import typer

from minibatch.cli import common
from minibatch.errors import Unavailable

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
#: Reconnection backoff ceiling (seconds).
BACKOFF_MAX = 5.0


def _filters(prefix: str, jobs: bool, nodes: bool, sched: bool) -> list[str]:
    if not (jobs or nodes or sched):
        return [f"{prefix}#"]
    topics = []
    if jobs:
        topics.append(f"{prefix}jobs/#")
    if nodes:
        topics.append(f"{prefix}nodes/#")
    if sched:
        topics += [f"{prefix}sched/#", f"{prefix}reservations/#"]
    return topics


def format_line(topic: str, payload: object, retained: bool, as_json: bool) -> str:
    """One output line for an event (topic below the prefix)."""
    from minibatch.live.model import describe

    if as_json:
        return json.dumps({"topic": topic, "payload": payload, "retained": retained})
    if not isinstance(payload, dict):
        return f"{time.strftime('%H:%M:%S')} ?     {topic} {payload!r}"
    when = payload.get("time")
    stamp = time.strftime("%H:%M:%S", time.localtime(when if when else None))
    kind, text = describe(topic, payload)
    return f"{stamp} {kind:<5} {text}{' (now)' if retained else ''}"


async def _watch(
    url: str, prefix: str, topics: list[str], as_json: bool, count: int
) -> None:
    import aiomqtt

    from minibatch.events.publisher import parse_url

    address = parse_url(url)
    # Ctrl-C ends it at once: a reader has nothing to tidy up, and a graceful
    # MQTT disconnect from a cancelled task waits for the broker's goodbye for
    # up to aiomqtt's timeout (10 s) on a busy machine.
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, _leave)
    shown, delay, connected_once = 0, 0.2, False
    while True:
        try:
            async with aiomqtt.Client(address.host, address.port, keepalive=15) as mq:
                for topic in topics:
                    await mq.subscribe(topic)
                if connected_once:
                    typer.echo(
                        f"mb watch: reconnected to {url}; events published while "
                        "it was away are missed",
                        err=True,
                    )
                connected_once, delay = True, 0.2
                async for message in mq.messages:
                    # amqtt hands a new subscriber retained messages of topics it
                    # did not subscribe to (those of the client before it).
                    if not any(message.topic.matches(t) for t in topics):
                        continue
                    try:
                        payload = json.loads(message.payload)
                    except (TypeError, ValueError):
                        continue  # not an event: only the server may publish
                    topic = str(message.topic).removeprefix(prefix)
                    line = format_line(topic, payload, message.retain, as_json)
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                    shown += 1
                    if count and shown >= count:
                        return
        except aiomqtt.MqttError as exc:
            if not connected_once:
                raise Unavailable(
                    f"cannot reach the event broker at {url} ({exc}); "
                    "is the cluster up? (mb status)"
                ) from None
            typer.echo(f"mb watch: lost {url} ({exc}); reconnecting", err=True)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX)


def _leave() -> None:
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    os._exit(0)


def watch_command(
    jobs: Annotated[bool, typer.Option("--jobs", help="Job events.")] = False,
    nodes: Annotated[bool, typer.Option("--nodes", help="Node states.")] = False,
    sched: Annotated[
        bool,
        typer.Option("--sched", help="Scheduling passes, the policy, reservations."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per event.")
    ] = False,
    count: Annotated[
        int,
        typer.Option("--count", "-n", min=0, help="Stop after N events (0: never)."),
    ] = 0,
) -> None:
    """Print the cluster's events as they happen (all of them without a filter)."""
    from minibatch.live.feed import broker_url

    with common.reporting("mb watch"):
        paths, config = common.home()
        url = broker_url(paths, config)
        prefix = config.mqtt.topic_prefix.rstrip("/") + "/"
        topics = _filters(prefix, jobs, nodes, sched)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it ends
            asyncio.run(_watch(url, prefix, topics, as_json, count))
