"""``mb bench resize``: how soon a running job learns it has new CPUs.

A resize (:mod:`minibatch.node.resizer`) moves every thread of the job to its new
CPUs, rewrites ``$MB_CPUSET_FILE``, and only then signals the job; the job's
handler running is therefore the moment it may act on its new CPUs, and the time
from the decision to that moment is what a malleable application waits for
(target: p50 under 20 ms).

The job is a Python program with ``threads`` threads (64 by default) that sleep in
short loops, so the resize is not measured on CPUs the job itself keeps busy. Its
main thread alone takes ``SIGUSR1``; on each one it reads ``time.monotonic()``
first, then the mask of each of its threads, and sends both in one datagram to a
Unix socket of the bench. CLOCK_MONOTONIC is one clock for every process of the
machine, so the job's time and the bench's subtract.

Each measure is ``resizes`` resizes alternating between 1 and 2 CPUs, each waiting
for the job's report before the next:

* ``e2e``: on a fresh cluster of one 2-CPU node, from just before the ``Alter``
  request (what ``qalter -l ncpus=N`` sends) to the handler: the request,
  validation and commit in the server, ``ResizeJob`` to the node daemon, then the
  node's work. ``e2e_recorded``: how many of them the server recorded (the
  node's answers), which should be all.
* ``node``: the same job under a :class:`~minibatch.node.tracker.Tracker` in this
  process, from the call of :meth:`~minibatch.node.tracker.Tracker.resize` to the
  handler: the mask, the file and the signal alone, without messages.

A thread whose mask is not the new CPU set when the job is told is a
*mismatch*, and any mismatch makes the run a failure: the signal must never
arrive before the change it announces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from minibatch.bench.throughput import fresh_cluster, percentile
from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.config import NodeDaemonConfig
from minibatch.core.job import JobRequest, JobSpec
from minibatch.errors import InvalidArgument, MinibatchError
from minibatch.net.client import Client
from minibatch.node.launcher import Launcher
from minibatch.node.procfs import set_child_subreaper
from minibatch.node.tracker import Report, Tracker
from minibatch.protocol.messages import (
    Alter,
    JobList,
    JobResized,
    JobStarted,
    LaunchSpec,
    QueryJobs,
    Submit,
    Submitted,
)

#: Seconds to wait for the job to start (an interpreter and its threads).
START_TIMEOUT = 60.0
#: Seconds to wait for the job's report of one resize.
REPORT_TIMEOUT = 10.0
#: Seconds the server gets to record the last resizes (a node re-sends an
#: unanswered report every heartbeat, 1 s).
RECORD_WAIT = 2.5
#: Long enough never to end the job, however slow the machine.
WALLTIME = 3600

#: The job: ``python -c JOB THREADS SOCKET``. Every report is one JSON datagram:
#: the signal's number (0: ready), the handler's time, the pid, and how many
#: threads have each mask (``"0,1": 64``).
JOB = textwrap.dedent(
    """
    import json, os, signal, socket, sys, threading, time

    threads, address = int(sys.argv[1]), sys.argv[2]
    out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    told = 0

    def report(now):
        masks = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                cpus = sorted(os.sched_getaffinity(int(tid)))
            except ProcessLookupError:
                continue
            key = ",".join(map(str, cpus))
            masks[key] = masks.get(key, 0) + 1
        body = {"seq": told, "time": now, "pid": os.getpid(), "masks": masks}
        out.sendto(json.dumps(body).encode(), address)

    def on_resize(sig, frame):
        global told
        now = time.monotonic()
        told += 1
        report(now)

    def idle():
        while True:
            time.sleep(0.02)

    signal.signal(signal.SIGUSR1, on_resize)
    # Python runs handlers in the main thread only; one delivered to a sleeping
    # worker would wait for the main thread's next wake-up. The workers inherit
    # the blocked signal, so the kernel always picks the main thread.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    for _ in range(threads - 1):
        threading.Thread(target=idle, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    report(time.monotonic())
    while True:
        signal.pause()
    """
)


class BenchFailed(MinibatchError):
    """The job did not answer as it should, so there is nothing to measure."""


@dataclass(frozen=True, slots=True)
class Told:
    """One report of the job: when its handler ran, and its threads' masks then."""

    seq: int
    time: float
    pid: int
    #: CPU list (``"0,1"``) -> how many threads had it.
    masks: dict[str, int]

    @property
    def threads(self) -> int:
        return sum(self.masks.values())

    def mismatches(self, cpus: list[int]) -> int:
        """How many threads were not confined to exactly ``cpus``."""
        want = ",".join(map(str, sorted(cpus)))
        return sum(n for mask, n in self.masks.items() if mask != want)


class Channel:
    """The job's line to the bench: a Unix datagram socket in ``directory``.

    The job's pid comes with its first report; :meth:`close` kills it if it still
    runs, whoever started it.
    """

    def __init__(self, directory: Path) -> None:
        #: Also the job's working directory.
        self.directory = directory
        self.address = str(directory / "told.sock")
        #: The job's stderr, quoted when it fails to report.
        self.stderr = directory / "job.err"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        self._job: psutil.Process | None = None

    def argv(self, threads: int) -> list[str]:
        return [sys.executable, "-c", JOB, str(threads), self.address]

    def receive(self, timeout: float, what: str) -> Told:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(1 << 16)
        except TimeoutError:
            raise BenchFailed(
                f"no report of {what} from the job within {timeout:g} s"
                + self._stderr_tail()
            ) from None
        told = Told(**json.loads(data))
        if self._job is None:
            self._job = psutil.Process(told.pid)
        return told

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            text = self.stderr.read_text(errors="replace").strip()
            if text:
                return "; its stderr ends: " + text[-500:]
        return ""

    def close(self) -> None:
        self._sock.close()
        if self._job is not None:
            with contextlib.suppress(psutil.Error):
                self._job.kill()
                self._job.wait(5)


@contextlib.contextmanager
def _channel() -> Iterator[Channel]:
    """A channel in a new temporary directory; the job is killed on leaving."""
    with tempfile.TemporaryDirectory(prefix="mb-resize-") as tmp:
        channel = Channel(Path(tmp))
        try:
            yield channel
        finally:
            channel.close()


def ready(channel: Channel, threads: int) -> None:
    """Wait until the job runs all its threads and catches the signal."""
    told = channel.receive(START_TIMEOUT, "its start")
    if told.seq != 0 or told.threads != threads:
        raise BenchFailed(f"the job started {told.threads} threads, not {threads}")


def measure(
    channel: Channel, resize: Callable[[int], list[int]], count: int, threads: int
) -> tuple[list[float], int]:
    """``count`` resizes of a job on 2 CPUs to 1, 2, 1, ...: latencies (s) and
    mismatched threads. ``resize(ncpus)`` makes one and returns the CPU ids the
    job must be confined to."""
    latencies: list[float] = []
    mismatches = 0
    for i in range(count):
        t0 = time.monotonic()
        cpus = resize(1 if i % 2 == 0 else 2)
        told = channel.receive(REPORT_TIMEOUT, f"resize {i + 1}")
        if told.seq != i + 1:
            raise BenchFailed(f"resize {i + 1}: the job reported signal {told.seq}")
        if told.threads != threads:
            raise BenchFailed(f"resize {i + 1}: the job has {told.threads} threads")
        latencies.append(told.time - t0)
        mismatches += told.mismatches(cpus)
    return latencies, mismatches


def summary(prefix: str, latencies: list[float], mismatches: int) -> dict[str, Any]:
    ms = [1000 * s for s in latencies]
    return {
        f"{prefix}_p50_ms": round(statistics.median(ms), 2),
        f"{prefix}_p95_ms": round(percentile(ms, 0.95), 2),
        f"{prefix}_mismatches": mismatches,
    }


# ------------------------------------------------------------- end to end


def end_to_end(cpus: list[int], count: int, threads: int) -> dict[str, Any]:
    """The ``e2e`` measure on a fresh cluster of one node holding ``cpus``."""
    layout = plan_nodes(1, len(cpus), cpus, False, None)
    # Left in this order: the client, the cluster (its node daemon kills the
    # job), then the channel (the job again, should it have survived).
    with (
        _channel() as channel,
        fresh_cluster(layout) as (_, report),
        Client(report.server_endpoint, timeout=30) as client,
    ):
        spec = JobSpec(
            name="resize-bench",
            workdir=str(channel.directory),
            request=JobRequest(ppn=2, walltime=WALLTIME, malleable=(1, 2)),
            argv=channel.argv(threads),
            stdout_path="/dev/null",
            stderr_path=str(channel.stderr),
        )
        submitted: Submitted = client.call(Submit(spec=spec))
        (job,) = submitted.ids
        ready(channel, threads)

        def alter(ncpus: int) -> list[int]:
            reply: JobList = client.call(Alter(selector=str(job), ncpus=ncpus))
            return list(reply.jobs[0].alloc[0].cpus)

        latencies, mismatches = measure(channel, alter, count, threads)
        done = recorded(client, job, count)
    return {**summary("e2e", latencies, mismatches), "e2e_recorded": done}


def recorded(client: Client, job: int, count: int) -> int:
    """How many resizes of ``job`` the server has recorded (the node's answers),
    once it has all ``count`` or after :data:`RECORD_WAIT` seconds."""
    deadline = time.monotonic() + RECORD_WAIT
    while True:
        (record,) = client.call(QueryJobs(selectors=[str(job)])).jobs
        if len(record.resizes) >= count or time.monotonic() > deadline:
            return len(record.resizes)
        time.sleep(0.01)


# -------------------------------------------------------------- node only


def node_only(cpus: list[int], count: int, threads: int) -> dict[str, Any]:
    """The ``node`` measure: the job under a tracker in this process."""
    with _channel() as channel:
        return asyncio.run(_node_only(channel, cpus, count, threads))


async def _node_only(
    channel: Channel, cpus: list[int], count: int, threads: int
) -> dict[str, Any]:
    tmp = channel.directory
    reports: list[Report] = []
    launcher = Launcher(f"bench-{os.getpid()}", str(tmp), tmp / "spool")
    # Not exclusive: this process may have other children (the cluster's
    # daemons, a test runner's), which are none of the tracker's business.
    tracker = Tracker(launcher, NodeDaemonConfig(), reports.append, exclusive=False)
    # As in the daemon, so the tracker owns whatever the job leaves behind.
    set_child_subreaper(True)
    tracker.start()
    try:
        tracker.launch(launch_spec(channel, cpus, threads))
        if not isinstance(reports[0], JobStarted):
            raise BenchFailed(f"the job did not start: {reports[0]}")
        ready(channel, threads)

        def resize(ncpus: int) -> list[int]:
            tracker.resize(1, cpus[:ncpus], float(WALLTIME))
            return cpus[:ncpus]

        # Synchronous on purpose: nothing else of the event loop runs meanwhile.
        latencies, mismatches = measure(channel, resize, count, threads)
        refused = [r.error for r in reports if isinstance(r, JobResized) and r.error]
        if refused:
            raise BenchFailed(f"the tracker refused a resize: {refused[0]}")
    finally:
        await tracker.close()
        set_child_subreaper(False)
    return summary("node", latencies, mismatches)


def launch_spec(channel: Channel, cpus: list[int], threads: int) -> LaunchSpec:
    """What the server would send the node to start the job on ``cpus``."""
    return LaunchSpec(
        malleable=True,
        job=1,
        display_id="1",
        name="resize-bench",
        user=os.environ.get("USER", "bench"),
        uid=os.geteuid(),
        gid=os.getegid(),
        workdir=str(channel.directory),
        script=None,
        argv=channel.argv(threads),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        stdout_path="/dev/null",
        stderr_path=str(channel.stderr),
        join=False,
        cpus=list(cpus),
        hosts=[],
        walltime=WALLTIME,
        mem_kb=None,
    )


# ---------------------------------------------------------------- report


def run(resizes: int = 200, threads: int = 64) -> dict[str, Any]:
    """Both measures, end to end first (see the module docstring)."""
    if resizes < 1 or threads < 1:
        raise InvalidArgument("--resizes and --threads must be at least 1")
    cpus = usable_cpus()[:2]
    if len(cpus) < 2:
        raise InvalidArgument("resizing between 1 and 2 CPUs needs 2 usable CPUs")
    result: dict[str, Any] = {"threads": threads, "resizes": resizes, "cpus": cpus}
    result.update(end_to_end(cpus, resizes, threads))
    result.update(node_only(cpus, resizes, threads))
    result["mismatches"] = result["e2e_mismatches"] + result["node_mismatches"]
    return result


def render(result: dict[str, Any]) -> str:
    """The result as a short table for people."""
    cpus = ",".join(map(str, result["cpus"]))
    lines = [
        f"{result['resizes']} resizes of a {result['threads']}-thread job, "
        f"1 <-> 2 CPUs ({cpus}); decision to the job's signal handler",
        f"{'':<24}{'p50':>10}{'p95':>10}{'mismatched threads':>20}",
    ]
    for key, label in (("e2e", "end to end (Alter)"), ("node", "node only (Tracker)")):
        lines.append(
            f"{label:<24}{result[f'{key}_p50_ms']:>7} ms{result[f'{key}_p95_ms']:>7} ms"
            f"{result[f'{key}_mismatches']:>20}"
        )
    lines.append(
        f"resizes the server recorded: {result['e2e_recorded']} of {result['resizes']}"
    )
    return "\n".join(lines)
