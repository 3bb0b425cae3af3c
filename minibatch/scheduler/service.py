"""mb-scheduler: event-driven, coalesced scheduling passes over a pure policy.

The server sends ``Wake`` after every state change (submit, job end, node change).
A wake starts a pass at once unless the previous pass started less than
``coalesce_ms`` ago; events that arrive meanwhile are folded into the next pass, so
a burst costs a few passes, not one each (Flux coalesces the same way). A periodic
pass every ``interval`` seconds is the safety net for anything missed (and
re-registers after a server restart).

A pass: fetch a snapshot, run ``policy.plan`` on it, send the plan back. The server
validates every start against its current state, so a plan made from a snapshot
that has since gone stale cannot over-allocate: stale starts are just rejected.
The scheduler keeps no state between passes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

from minibatch import config as configuration
from minibatch.daemon import setup_logging, single_instance, stop_on_signals
from minibatch.errors import MinibatchError, Unavailable
from minibatch.net.aio import AsyncClient
from minibatch.policy import registry
from minibatch.policy.base import Policy
from minibatch.protocol.messages import (
    ApplyPlan,
    GetSnapshot,
    Message,
    PlanResult,
    SchedHello,
    SnapshotReply,
    Wake,
)

log = logging.getLogger("minibatch.scheduler")

#: Seconds between attempts to reach the server while unregistered.
RETRY = 0.1


class Scheduler:
    def __init__(
        self,
        endpoint: str,
        policy: Policy,
        policy_label: str,
        interval: float,
        coalesce: float,
    ) -> None:
        self.policy, self.policy_label = policy, policy_label
        self.interval, self.coalesce = interval, coalesce
        self.wanted = asyncio.Event()
        self.client = AsyncClient(endpoint, b"scheduler", self._on_message)
        self.passes = 0
        self.last_pass = 0.0

    async def _on_message(self, msg: Message) -> None:
        if isinstance(msg, Wake):
            self.wanted.set()

    async def hello(self) -> None:
        await self.client.call(SchedHello(pid=os.getpid(), policy=self.policy_label))

    async def one_pass(self) -> PlanResult:
        reply: SnapshotReply = await self.client.call(GetSnapshot())
        t0 = time.perf_counter()
        # Called inline, not in a thread: the scheduler has nothing else to do
        # meanwhile, and wakes that arrive during the pass just set the event.
        plan = self.policy.plan(reply.snapshot)
        elapsed = time.perf_counter() - t0
        result: PlanResult = await self.client.call(ApplyPlan(plan=plan))
        self.passes += 1
        if result.rejected:
            log.info(
                "server rejected %d starts: %s", len(result.rejected), result.rejected
            )
        log.debug(
            "pass %d: %d pending, %d started, %.1f ms",
            self.passes,
            len(reply.snapshot.pending),
            len(result.started),
            elapsed * 1e3,
        )
        return result

    async def run(self, stop: asyncio.Event) -> None:
        self.client.start()
        registered = False
        while not stop.is_set():
            try:
                if not registered:
                    await self.hello()
                    registered = True
                    log.info(
                        "registered with the server (policy %s)", self.policy_label
                    )
                await self.one_pass()
            except Unavailable as exc:
                if registered:
                    log.warning("%s", exc)
                registered = False
            except MinibatchError as exc:
                log.error("pass failed: %s", exc)
            if not registered:
                # Not yet connected (or the server is restarting): retry soon,
                # not after a whole periodic interval.
                await asyncio.sleep(RETRY)
                continue
            await self._wait(stop)
            if not self.wanted.is_set():
                registered = False  # periodic pass: re-register, the server may be new
            else:
                # Passes start at least ``coalesce`` apart: an isolated event is
                # handled at once, a burst (1,000 submissions) costs a few passes.
                gap = self.last_pass + self.coalesce - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
            self.wanted.clear()
            self.last_pass = time.monotonic()
        await self.client.close()

    async def _wait(self, stop: asyncio.Event) -> None:
        waiters = [
            asyncio.create_task(self.wanted.wait()),
            asyncio.create_task(stop.wait()),
        ]
        await asyncio.wait(
            waiters, timeout=self.interval, return_when=asyncio.FIRST_COMPLETED
        )
        for w in waiters:
            w.cancel()


async def _main(paths: configuration.Paths) -> None:
    config = configuration.load(paths)
    sched = config.scheduler
    policy = registry.load(sched.policy, sched.params)
    scheduler = Scheduler(
        config.server_endpoint(paths),
        policy,
        sched.policy,
        sched.interval,
        sched.coalesce_ms / 1000,
    )
    stop = asyncio.Event()
    stop_on_signals(stop)
    await scheduler.run(stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="mb-scheduler", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging("mb-scheduler", args.verbose)
    paths = configuration.Paths.from_env()
    paths.make()
    _lock = single_instance(paths.run / "scheduler.lock", "mb-scheduler")
    try:
        asyncio.run(_main(paths))
    except MinibatchError as exc:
        raise SystemExit(f"mb-scheduler: {exc}") from None
    finally:
        _lock.close()
