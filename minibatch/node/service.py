"""``mb-node``: the node daemon (like pbs_mom / slurmd).

One asyncio loop, one thread. The daemon registers with the server (``NodeHello``,
retried every heartbeat interval until it is answered), then sends a ``Heartbeat``
every ``config.node.heartbeat`` seconds listing the jobs it runs; a heartbeat
answered NOT_FOUND means the server restarted and forgot the node, so it says
hello again (each heartbeat also carries the running jobs' CPU time and memory,
for ``qstat``). ``Launch``, ``ResizeJob``, ``Kill`` and ``Signal`` arrive
unsolicited and go to the :class:`~minibatch.node.tracker.Tracker`.

**Reports.** ``JobEnded`` and ``JobResized`` are requests, kept until the server
answers and re-sent every heartbeat until then (the server treats repeats as
no-ops), so a job's end or resize survives a server restart. ``JobStarted``
(the process's pid and real start time) is a notification, sent at once with no
reply: one round trip less per job, and if the server is down at that instant
it keeps the start time it planned. It leaves before any report made after it,
so a job's start is never delivered after its end.

**Stopping** (SIGTERM/SIGINT): the server hears first that the node is stopping
(it starts nothing more here), then every job is killed (TERM, grace, KILL) and
reported ``node_fail`` "node daemon stopped", which puts it back in the queue when
it may run again; the reports get a short best-effort flush; the daemon exits 0.
SIGUSR2 stops the daemon the same way but leaves the jobs running in their
cgroups (``mb down --keep-running``), for the next daemon of this node, and
then the process becomes their reaper (:mod:`.reaper`), so that how they end
is kept for that daemon.

On start the daemon becomes a child subreaper (orphans of jobs come back to it),
re-adopts the jobs an earlier daemon of this node left running in their cgroups
(:meth:`Tracker.recover`), and kills everything else such a daemon left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal

import msgspec

from minibatch import config as mbconfig
from minibatch.cluster import layout as layouts
from minibatch.config import Config, Paths
from minibatch.core.job import JobResult
from minibatch.core.units import format_cpu_list, parse_cpu_list, parse_size_kb
from minibatch.daemon import (
    notify_ready,
    setup_logging,
    single_instance,
    stop_on_signals,
)
from minibatch.errors import (
    ErrorCode,
    InvalidArgument,
    MinibatchError,
    RemoteError,
    Unavailable,
)
from minibatch.net.aio import AsyncClient
from minibatch.net.keys import load_client
from minibatch.net.limits import raise_fd_limit
from minibatch.node import procfs, reaper
from minibatch.node.cgroup import Cgroups
from minibatch.node.launcher import Launcher
from minibatch.node.tracker import Report, Tracker
from minibatch.protocol.messages import (
    Heartbeat,
    JobEnded,
    JobResized,
    JobStarted,
    Kill,
    Launch,
    Message,
    NodeHello,
    ResizeJob,
    Signal,
)

log = logging.getLogger("minibatch.node")

#: A report the server answered with an error this many times is dropped.
_MAX_REPORT_ERRORS = 3
_FLUSH_S = 2.0
#: Free bytes in the spool after which a node that found it full takes jobs again.
_SPOOL_FREE = 16 << 20
#: How long a start report waits for company. A job that ends by then (a
#: trivial one ends 1-3 ms after its start) has its start and end reach the
#: server together, handled and committed as one batch instead of two; nothing
#: waits for the start report (the server counts the job as started when it
#: sends the launch), which only tells the pid and the real start time.
_STARTED_HOLD_S = 0.01


def cpu_map(cpus: list[int], available: set[int]) -> dict[int, int]:
    """Node CPU id -> machine CPU id, for a node given no ``--real-cpus``.

    A node may name CPUs the machine does not have (a layout written before
    ``--real-cpus`` existed); those wrap around the available ones by id, so
    nodes ``0-3`` and ``4-7`` on a 4-core machine share cores 0-3 the same way.
    """
    allowed = sorted(available)
    return {c: c if c in available else allowed[c % len(allowed)] for c in cpus}


class NodeDaemon:
    def __init__(
        self,
        name: str,
        cpus: list[int],
        mem_kb: int | None,
        shared_cpus: list[int],
        paths: Paths,
        config: Config,
        server: str = "",
        cores: dict[int, int] | None = None,
    ) -> None:
        """``cores``: node CPU id -> the real core that runs it, when the
        node's CPUs are virtual (default: :func:`cpu_map`)."""
        self.name = name
        self.cpus = cpus
        self.mem_kb = mem_kb
        self.shared_cpus = shared_cpus
        self.paths = paths
        self.config = config
        self.endpoint = server or config.client_endpoint(paths)
        mapping = cores or cpu_map(cpus, os.sched_getaffinity(0))
        #: The real core behind each virtual CPU, told to the server for
        #: pbsnodes and mb status (empty when every id is its own core).
        self.real_cpus: dict[int, int] = {}
        if cores or any(c != p for c, p in mapping.items()):
            self.real_cpus = dict(mapping)
        self.launcher = Launcher(
            name,
            str(paths.home),
            paths.spool,
            mapping,
            resize_signal=config.node.resize_signal,
        )
        self.cgroups = Cgroups(
            name, str(paths.home), config.node.pids_max, config.node.cgroups
        )
        self.tracker = Tracker(
            self.launcher, config.node, self._report, cgroups=self.cgroups
        )
        self._client: AsyncClient | None = None
        #: Unanswered reports in the order they were made, with error counts
        #: (a job's newer resize report replaces an older one).
        self._unacked: dict[tuple[str, int], tuple[JobEnded | JobResized, int]] = {}
        self._wake_sender = asyncio.Event()
        #: Start reports held back (see _STARTED_HOLD_S), and their timer.
        self._started: list[JobStarted] = []
        self._started_timer: asyncio.TimerHandle | None = None
        self._beat_now = asyncio.Event()
        self._told_trouble = False
        self._registered = False
        #: Whether the last request was answered (None: none sent yet); logs
        #: are written only when this changes.
        self._reachable: bool | None = None
        #: Jobs left running by ``mb down --keep-running`` that are our
        #: children (top pid -> job): this process becomes their reaper.
        self.reap_after: dict[int, int] = {}

    async def run(self) -> None:
        raise_fd_limit()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        stop_on_signals(stop)
        keep = asyncio.Event()

        def keep_running() -> None:
            keep.set()
            stop.set()

        loop.add_signal_handler(signal.SIGUSR2, keep_running)
        procfs.set_child_subreaper(True)
        self.tracker.start()
        adopted, _ = self.tracker.recover()
        spare = self.tracker.adopted_pids()
        killed = procfs.kill_leftovers(self.name, str(self.paths.home), spare)
        if killed:
            log.warning("killed %d process(es) left by an earlier daemon", len(killed))
        self._client = AsyncClient(self.endpoint, self._on_message)
        self._client.start()
        log.info(
            "node %s (pid %d) serving CPUs %s, server %s; limits by %s%s; %d "
            "job(s) re-adopted",
            self.name,
            os.getpid(),
            format_cpu_list(self.cpus),
            self.endpoint,
            self.cgroups.describe(),
            f"; {layouts.virtual_note(self.real_cpus)}" if self.real_cpus else "",
            len(adopted),
        )
        tasks = [
            loop.create_task(self._heartbeats()),
            loop.create_task(self._sender()),
        ]
        await stop.wait()
        self._send_started()
        # Before any job ends: the server must start nothing more here.
        self.tracker.stopping = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._beat(), _FLUSH_S)
        if keep.is_set() and self.tracker.cgroups is not None:
            kept = len(self.tracker.running())
            self.reap_after = self.tracker.detach()
            log.info("stopping: leaving %d job(s) running in their cgroups", kept)
        else:
            if keep.is_set():
                log.warning("cannot keep jobs running without cgroups: killing them")
            log.info("stopping: killing %d job(s)", len(self.tracker.running()))
            await self.tracker.stop_all(JobResult.NODE_FAIL, "node daemon stopped")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._flush(), _FLUSH_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.tracker.close()
        await self._client.close()
        self.cgroups.close()  # kept jobs' cgroups keep it in place
        log.info("stopped")

    # ------------------------------------------------------------- server

    async def _on_message(self, body: Message) -> None:
        try:
            if isinstance(body, Launch):
                self.tracker.launch(body.spec)
            elif isinstance(body, Kill):
                self.tracker.kill(body.job, body.result)
            elif isinstance(body, Signal):
                self.tracker.signal(body.job, body.signal)
            elif isinstance(body, ResizeJob):
                self.tracker.resize(body.job, body.cpus, body.time_limit, body.seq)
            else:
                log.warning("ignoring an unexpected %s", type(body).__name__)
        except Exception:
            log.exception("handling %s failed", type(body).__name__)
        # Queued frames are read without yielding; let reaping and timers run
        # between them during a burst of launches.
        await asyncio.sleep(0)

    def _hello(self) -> NodeHello:
        return NodeHello(
            name=self.name,
            cpus=self.cpus,
            mem_kb=self.mem_kb,
            pid=os.getpid(),
            shared_cpus=self.shared_cpus,
            running=self._claimed(),
            enforcement=self.cgroups.describe(),
            real_cpus=self.real_cpus,
            lends=True,
        )

    async def _call(self, body: Message) -> bool:
        """Send a request; True when answered Ok. Logs reachability changes."""
        assert self._client is not None
        try:
            await self._client.call(body, timeout=max(2.0, self._interval * 2))
        except Unavailable as exc:
            if self._reachable is None:
                log.info("waiting for the server at %s", self.endpoint)
            elif self._reachable:
                log.warning("%s", exc)
            self._reachable = False
            return False
        if self._reachable is False and self._registered:
            log.info("the server answers again")
        self._reachable = True
        return True

    @property
    def _interval(self) -> float:
        return self.config.node.heartbeat

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self._beat()
            except Exception:
                log.exception("heartbeat failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_now.wait(), self._interval)
            self._beat_now.clear()

    async def _beat(self) -> None:
        try:
            if not self._registered:
                if await self._call(self._hello()):
                    self._registered = True
                    log.info("registered with the server at %s", self.endpoint)
                    notify_ready()
            elif not await self._call(
                Heartbeat(
                    name=self.name,
                    running=self._claimed(),
                    usage=self.tracker.usage(),
                    stopping=self.tracker.stopping,
                    trouble=self._trouble(),
                )
            ):
                return
        except RemoteError as exc:
            if exc.code is ErrorCode.NOT_FOUND and self._registered:
                log.info("the server forgot this node (%s); saying hello again", exc)
                self._registered = False
                await self._beat()
            else:
                log.warning("the server refused %s: %s", self.name, exc)
            return
        if self._registered:
            self._wake_sender.set()  # retry whatever is still unanswered

    def _claimed(self) -> list[int]:
        """The jobs to list as ours: running, or ended with the end report not
        yet taken (the server must not think them lost, and queue them again,
        before it hears how they ended)."""
        ended = {job for kind, job in self._unacked if kind == "ended"}
        return sorted(ended.union(self.tracker.running()))

    def _trouble(self) -> str:
        """The tracker's trouble, cleared once the spool takes writes again."""
        if self.tracker.trouble:
            spool = self.launcher.spool
            with contextlib.suppress(OSError):
                free = shutil.disk_usage(spool).free
                if free > _SPOOL_FREE and os.access(spool, os.W_OK):
                    log.info("the spool %s can be written again", spool)
                    self.tracker.trouble = ""
                    self._told_trouble = False
        return self.tracker.trouble

    # ------------------------------------------------------------- reports

    def _report(self, report: Report) -> None:
        if self.tracker.trouble and not self._told_trouble:
            # Tell the server now, before it sends more jobs here.
            self._told_trouble = True
            self._beat_now.set()
        if isinstance(report, JobStarted):
            self._started.append(report)
            if self._started_timer is None:
                loop = asyncio.get_running_loop()
                self._started_timer = loop.call_later(
                    _STARTED_HOLD_S, self._send_started
                )
            return
        key = ("resized" if isinstance(report, JobResized) else "ended", report.job)
        self._unacked.pop(key, None)  # keep the order reports were made in
        self._unacked[key] = (report, 0)
        self._wake_sender.set()

    def _send_started(self) -> None:
        if self._started_timer is not None:
            self._started_timer.cancel()
            self._started_timer = None
        started, self._started = self._started, []
        if self._client is not None:
            for report in started:
                self._client.notify(report)

    async def _sender(self) -> None:
        """Deliver unanswered reports, oldest first, pipelined."""
        while True:
            await self._wake_sender.wait()
            self._wake_sender.clear()
            # A job's start before its end (the server ignores a start
            # report of a job it knows ended).
            self._send_started()
            if not self._registered:
                continue
            batch = list(self._unacked.items())
            results = await asyncio.gather(
                *(self._call(report) for _, (report, _) in batch),
                return_exceptions=True,
            )
            for (key, (report, errors)), result in zip(batch, results, strict=True):
                # A newer report of the job may have replaced this one meanwhile:
                # it is still to be sent.
                current = self._unacked.get(key)
                if current is None or current[0] is not report:
                    continue
                if result is True:
                    del self._unacked[key]
                elif isinstance(result, RemoteError):
                    if result.code is ErrorCode.STORAGE:
                        # The server could not save it (disk full): not the
                        # report's fault; it is sent again until saved.
                        continue
                    if errors + 1 >= _MAX_REPORT_ERRORS:
                        log.error("dropping %s: %s", report, result)
                        del self._unacked[key]
                    else:
                        self._unacked[key] = (report, errors + 1)
                elif isinstance(result, BaseException):
                    log.error("sending %s failed: %r", report, result)

    async def _flush(self) -> None:
        while self._unacked and self._registered:
            self._wake_sender.set()
            await asyncio.sleep(0.05)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="mb-node", description="minibatch node daemon (runs and supervises jobs)"
    )
    p.add_argument("--name", required=True, help="node name, as the server knows it")
    p.add_argument("--cpus", help="CPU ids this node owns, e.g. 0-3")
    p.add_argument("--mem", help="memory for jobs, e.g. 4gb (default: unlimited)")
    p.add_argument(
        "--real-cpus",
        help="the real core behind each CPU of --cpus, in increasing CPU order, "
        "e.g. 0,1,0,1 for --cpus 0-3 on 2 cores: the node's CPUs are virtual "
        "(default: each CPU id is its own core)",
    )
    p.add_argument(
        "--shared-cpus", help="CPU ids whose cores other nodes also use, e.g. 0,1"
    )
    p.add_argument(
        "--server",
        default="",
        help="the server on another host, tcp://HOST:PORT (CURVE keys in "
        "$MB_HOME/keys; default: $MB_SERVER, [client] server, else this MB_HOME's)",
    )
    p.add_argument(
        "--from-config",
        action="store_true",
        help="take what is not given from the [[nodes]] entry of this name",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def node_settings(
    args: argparse.Namespace, config: Config
) -> tuple[list[int], int | None, list[int]]:
    """CPUs, memory (kb) and shared CPUs from the command line, else the config."""
    entry = None
    if args.from_config or args.cpus is None:
        entry = config.node_named(args.name)  # raises when there is none
    cpus = parse_cpu_list(args.cpus) if args.cpus else list(entry.cpus if entry else [])
    if not cpus:
        raise InvalidArgument(f"node {args.name} has no CPUs")
    mem = args.mem if args.mem is not None else (entry.mem if entry else None)
    if args.shared_cpus is not None:
        shared = parse_cpu_list(args.shared_cpus) if args.shared_cpus else []
    else:
        others = {c for n in config.nodes if n.name != args.name for c in n.cpus}
        shared = sorted(others.intersection(cpus))
    return cpus, parse_size_kb(mem) if mem else None, shared


def virtual_layout(
    args: argparse.Namespace,
    config: Config,
    cpus: list[int],
    shared: list[int],
    available: set[int],
) -> layouts.NodeLayout | None:
    """This node when its CPUs are virtual: on the cores ``--real-cpus``
    names, or (CPUs from ``[[nodes]]`` that this machine lacks) on the cores
    ``mb up`` would give them. None when its CPU ids are real ones (or ids the
    machine lacks with no cores named, which :func:`cpu_map` wraps).

    Raises:
        InvalidArgument: ``--real-cpus`` malformed, of another length than the
            CPUs, or naming a core this process may not use.
    """
    if args.real_cpus:
        try:
            cores = [int(c) for c in args.real_cpus.split(",")]
        except ValueError:
            raise InvalidArgument(
                f"malformed --real-cpus {args.real_cpus!r} (core ids, e.g. 0,1,0,1)"
            ) from None
        if len(cores) != len(cpus):
            raise InvalidArgument(
                f"--real-cpus names {len(cores)} cores for the {len(cpus)} CPUs "
                f"{format_cpu_list(cpus)}: one core per CPU, in increasing CPU order"
            )
        outside = sorted(set(cores) - available)
        if outside:
            raise InvalidArgument(
                f"--real-cpus names core {format_cpu_list(outside)}, which this "
                f"process may not use (it may use {format_cpu_list(sorted(available))})"
            )
        return layouts.NodeLayout(
            name=args.name, cpus=cpus, real_cpus=cores, shared_cpus=shared
        )
    if args.cpus is not None or not config.oversubscribe:
        return None
    if available.issuperset(cpus):
        return None  # no virtual CPU: every id is its own core
    # Started from the config alone (systemd): the cores mb up would give.
    node = next(
        n for n in layouts.from_config(config, available) if n.name == args.name
    )
    if args.shared_cpus is not None:
        return msgspec.structs.replace(node, shared_cpus=shared)
    return node


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    setup_logging("mb-node", args.verbose)
    try:
        paths = Paths.from_env()
        config = mbconfig.load(paths)
        cpus, mem_kb, shared = node_settings(args, config)
        cores = None
        virtual = virtual_layout(args, config, cpus, shared, os.sched_getaffinity(0))
        if virtual is not None:
            cores = dict(zip(virtual.cpus, virtual.real_cpus, strict=True))
            shared = virtual.shared_cpus
        daemon = NodeDaemon(
            args.name,
            cpus,
            mem_kb,
            shared,
            paths,
            config,
            server=args.server,
            cores=cores,
        )
        if daemon.endpoint.startswith("tcp://"):
            load_client(paths.keys)  # missing keys: one line now, not a traceback
    except (MinibatchError, OSError) as exc:
        log.error("mb-node %s cannot start: %s", args.name, exc)
        return 1
    lock = single_instance(paths.run / f"node-{args.name}.lock", f"mb-node {args.name}")
    status = 0
    try:
        asyncio.run(daemon.run())
    except Exception:
        log.exception("mb-node %s failed", args.name)
        status = 1
    finally:
        lock.close()
    if daemon.reap_after:
        # The next daemon may start now (the lock is free); the jobs left
        # running are still our children: keep their ends for it.
        log.info("waiting for %d job(s) as their reaper", len(daemon.reap_after))
        try:
            reaper.become(paths.spool, daemon.reap_after)
        except OSError as exc:
            log.error("cannot become the jobs' reaper: %s", exc)
    return status
