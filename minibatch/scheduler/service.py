"""mb-scheduler: event-driven, coalesced scheduling passes over a pure policy.

After a state change (submit, job end, node change) the server pushes a ``Wake``
carrying a fresh snapshot; the scheduler plans it and sends the plan back. The
server keeps one snapshot out at a time, so changes made during a pass fold into
the next one, and pushes at most one per ``coalesce_ms``: an isolated event is
planned at once, a burst of 1,000 submissions costs a few passes (Flux coalesces
the same way). The scheduler says hello every second, so a restarted
server learns of it at once, and runs a pass of its own every ``interval``
seconds: the safety net for anything missed. The queue comes as changes to the
copy the scheduler keeps (:mod:`minibatch.scheduler.mirror`), whole when the
copy is missing or out of step.

The server validates every start against its current state, so a plan made from a
snapshot that has since gone stale cannot over-allocate: stale starts are just
rejected. The scheduler keeps no state between passes but that copy, which
the server can always replace.

The policy is the server's to choose (``mb policy set``): each wake and snapshot
names it, and the scheduler loads a new one by name (``registry.load_named``:
never a ``module:callable`` the configuration does not name) before the pass
that first names it. The configuration's policy is only where it starts. A
choice that fails to load, or raises while planning, is refused: the scheduler
goes back to the policy it ran before, logs why, and says why in its hello, so
``mb policy show`` does too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from minibatch import config as configuration
from minibatch import native
from minibatch.core.snapshot import ClusterSnapshot, Plan
from minibatch.daemon import notify_ready, run_daemon
from minibatch.errors import RemoteError, Unavailable
from minibatch.net.aio import AsyncClient
from minibatch.net.limits import raise_fd_limit
from minibatch.policy import registry
from minibatch.policy.base import Policy
from minibatch.protocol.messages import Message
from minibatch.protocol.scheduling import (
    ApplyPlan,
    GetSnapshot,
    PlanResult,
    SchedHello,
    SnapshotReply,
    Wake,
)
from minibatch.scheduler.mirror import QueueMirror

log = logging.getLogger("minibatch.scheduler")

#: Seconds between attempts to reach the server while unregistered.
RETRY = 0.1
#: Seconds between hellos (how fast a restarted server hears of us).
HELLO_EVERY = 1.0


class Scheduler:
    def __init__(
        self,
        endpoint: str,
        policy: Policy,
        policy_label: str,
        interval: float,
        params: dict[str, Any] | None = None,
        modules: dict[str, str] | None = None,
    ) -> None:
        self.policy, self.policy_label = policy, policy_label
        self.params: dict[str, Any] = dict(params or {})
        #: The configuration's names for policies (``[scheduler.policy_modules]``),
        #: and its own choice, the one ``module:callable`` we may load as such.
        self.modules = dict(modules or {})
        self.configured = policy_label
        #: What ran before the last switch, back in force if the new one raises.
        self.previous: tuple[Policy, str, dict[str, Any]] | None = None
        self.interval = interval
        self.wanted = asyncio.Event()
        self.pushed: ClusterSnapshot | None = None
        self.mirror = QueueMirror()
        self.client = AsyncClient(endpoint, self._on_message)
        self.passes = 0
        #: A choice refused here (it failed to load or to plan), so it is not
        #: tried again at every wake, and why ("NAME: why", told in hellos).
        self._refused: tuple[str, dict[str, Any]] | None = None
        self.refused_why = ""
        #: A refusal the server has not heard of yet: say hello at once.
        self._tell = False

    async def _on_message(self, msg: Message) -> None:
        if isinstance(msg, Wake):
            # Applied now, in the order the server sent them: a later wake may
            # replace this one before the pass, but not skip its delta. None
            # (the copy is out of step) makes the pass fetch the whole queue.
            self.pushed = None
            if msg.snapshot is not None:
                self.pushed = self.mirror.apply(msg.snapshot, msg.delta)
            self.switch(msg.policy, msg.params)
            self.wanted.set()

    def switch(self, name: str, params: dict[str, Any]) -> None:
        """Plan with policy ``name`` from now on ("" or the current: no change)."""
        if not name or (name, params) == (self.policy_label, self.params):
            return
        if (name, params) == self._refused:
            return
        try:
            if name == self.configured:
                policy = registry.load(name, params, self.modules)
            else:
                policy = registry.load_named(name, params, self.modules)
        except Exception as exc:
            # The server loaded it before accepting it; failing here means the
            # two processes differ (e.g. a package installed in between).
            self._refuse(name, params, f"cannot load it ({exc})")
            return
        log.info("policy switched from %s to %s %s", self.policy_label, name, params)
        self.previous = (self.policy, self.policy_label, self.params)
        self.policy, self.policy_label, self.params = policy, name, dict(params)
        self._refused, self.refused_why = None, ""

    def _refuse(self, name: str, params: dict[str, Any], why: str) -> None:
        self._refused = (name, params)
        self.refused_why = f"{name}: {why}; running {self.policy_label}"
        self._tell = True
        log.error("policy %s refused: %s; keeping %s", name, why, self.policy_label)

    def plan(self, snap: ClusterSnapshot) -> Plan:
        """The policy's plan; if a newly chosen policy raises, the previous
        one's (the failed choice is refused until the server names another)."""
        try:
            return self.policy.plan(snap)
        except Exception as exc:
            if self.previous is None:
                raise
            log.exception("policy %s failed to plan", self.policy_label)
            failed = (self.policy_label, self.params)
            self.policy, self.policy_label, self.params = self.previous
            self.previous = None
            self._refuse(*failed, f"it failed to plan ({type(exc).__name__}: {exc})")
            return self.policy.plan(snap)

    async def hello(self) -> None:
        self._tell = False
        await self.client.call(
            SchedHello(
                pid=os.getpid(), policy=self.policy_label, refused=self.refused_why
            )
        )

    async def one_pass(self, snap: ClusterSnapshot | None = None) -> PlanResult:
        """Plan ``snap`` (or a snapshot fetched now) and send the plan back."""
        while snap is None:  # twice at most: a copy out of step gets it whole
            reply: SnapshotReply = await self.client.call(
                GetSnapshot(base=self.mirror.version)
            )
            snap = self.mirror.apply(reply.snapshot, reply.delta)
            self.switch(reply.policy, reply.params)
        t0 = time.perf_counter()
        # Called inline, not in a thread: the scheduler has nothing else to do
        # meanwhile, and wakes that arrive during the pass just set the event.
        # No await before it either: a wake's delta would change the queue the
        # snapshot views (it would refuse to be read).
        plan = self.plan(snap)
        elapsed = time.perf_counter() - t0
        pending = len(snap.pending)
        result: PlanResult = await self.client.call(
            ApplyPlan(plan=plan, elapsed=elapsed, pending=pending)
        )
        self.passes += 1
        if result.rejected:
            log.info(
                "server rejected %d starts: %s", len(result.rejected), result.rejected
            )
        log.debug(
            "pass %d: %d pending, %d started, %.1f ms",
            self.passes,
            pending,
            len(result.started),
            elapsed * 1e3,
        )
        return result

    async def run(self, stop: asyncio.Event) -> None:
        self.client.start()
        registered = False
        last_pass = last_hello = time.monotonic()
        while not stop.is_set():
            due = time.monotonic() - last_hello >= HELLO_EVERY
            if not registered or self._tell or due:
                try:
                    # Registering makes the server push a snapshot; repeating it
                    # every second is how a restarted server learns of us quickly.
                    await self.hello()
                except Unavailable:
                    if registered:
                        log.warning("lost the server; retrying")
                    registered = False
                    await asyncio.sleep(RETRY)
                    continue
                last_hello = time.monotonic()
            if not registered:
                registered = True
                core = native.describe()
                log.log(
                    logging.INFO if native.compiled() else logging.WARNING,
                    "registered with the server (policy %s; planning core %s)",
                    self.policy_label,
                    core,
                )
                notify_ready()  # again after a lost server: systemd ignores it
            await self._wait(stop)
            if stop.is_set():
                break
            if self.wanted.is_set():
                snap, self.pushed = self.pushed, None
                self.wanted.clear()
            elif time.monotonic() - last_pass >= self.interval:
                snap = None  # the periodic pass: fetch a snapshot ourselves
            else:
                continue
            last_pass = time.monotonic()
            try:
                await self.one_pass(snap)
            except Unavailable as exc:
                log.warning("%s", exc)
            except RemoteError as exc:
                # The server refused the plan (its disk is full, say): it said
                # why, and the next pass tries again.
                log.warning("pass not applied: %s", exc)
            except Exception:
                # A policy bug must not stop scheduling: log it and go on.
                log.exception("pass failed")

    async def _wait(self, stop: asyncio.Event) -> None:
        waiters = [
            asyncio.create_task(self.wanted.wait()),
            asyncio.create_task(stop.wait()),
        ]
        await asyncio.wait(
            waiters, timeout=HELLO_EVERY, return_when=asyncio.FIRST_COMPLETED
        )
        for w in waiters:
            w.cancel()


async def _serve(paths: configuration.Paths, stop: asyncio.Event) -> None:
    raise_fd_limit()
    config = configuration.load(paths)
    sched = config.scheduler
    policy = registry.load(sched.policy, sched.params, sched.policy_modules)
    scheduler = Scheduler(
        config.server_endpoint(paths),
        policy,
        sched.policy,
        sched.interval,
        params=sched.params,
        modules=sched.policy_modules,
    )
    await scheduler.run(stop)


def main(argv: list[str] | None = None) -> None:
    run_daemon("mb-scheduler", _serve, argv, __doc__.splitlines()[0])
