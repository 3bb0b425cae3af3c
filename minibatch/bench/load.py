"""``mb bench load``: the server with a deep queue and many clients at once.

It starts a fresh cluster in a temporary ``MB_HOME`` (one 1-CPU node per usable
core, the embedded broker publishing every event, as ``mb bench throughput``)
and:

1. queues ``jobs`` held jobs (20,000 by default) through the API, from
   :data:`QUEUERS` clients at once, and reads the server's RSS before and after
   (``kb_per_queued_job``) and the CPU time it spent;
2. times one idle client's full listing of that queue (``full_listing``): until
   the reply is in (the server's work and the transfer), and its decoding;
3. runs ``clients`` concurrent clients (50 by default) for ``seconds`` (60):
   each is a :class:`~minibatch.net.client.Client` of its own on the real
   socket, looping over what ``qsub -h`` sends (``Submit``, one held job) and
   what ``qstat ID`` sends (``QueryJobs`` of that job), and every
   ``full_every`` rounds (:data:`FULL_EVERY`, 50) what a bare ``qstat`` sends
   (``QueryJobs`` of every queued job: the whole queue in one reply). Each
   client is a process of its own, as each user's commands are.

It reports the requests done, the errors (a refusal or a timeout; there must be
none), p50/p95/p99 latency per request type (from sending the request to
having decoded its reply, so a client's own wait for a CPU counts: on a
machine with fewer cores than clients, that is what a user would see), and the
server's CPU time and RSS.

The submissions are held, like the queue, so nothing runs and the queue only
grows: this measures the server's request path under a deep queue, not job
execution (``mb bench throughput`` does that).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import psutil
import zmq

from minibatch.bench.throughput import fresh_cluster, percentile, trivial_spec
from minibatch.cluster import layout as layouts
from minibatch.errors import MinibatchError, Unavailable
from minibatch.net.client import Client
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import JobList, Message, QueryJobs, Status, Submit

#: Clients that queue the held jobs before the measure (one request each).
QUEUERS = 8
#: A client's every FULL_EVERY-th round also lists the whole queue (default).
FULL_EVERY = 50
#: Clients per process: one, as each user's qsub and qstat are processes of
#: their own (threads would also wait for each other's interpreter lock).
CLIENTS_PER_PROCESS = 1
#: Seconds a client waits for a reply before counting an error.
TIMEOUT = 60.0
#: Request types, in the order they are reported.
KINDS = ("submit", "qstat", "qstat_all")
#: Error messages kept in the result (the first ones).
KEEP_MESSAGES = 5


def queue_held(endpoint: str, workdir: str, count: int, hold: bool = True) -> None:
    """Submit ``count`` held jobs (eligible ones if not ``hold``) from
    :data:`QUEUERS` clients at once."""
    spec = trivial_spec(workdir, hold=hold, name="load")
    failures: list[BaseException] = []

    def submit(n: int) -> None:
        try:
            with Client(endpoint, timeout=TIMEOUT) as client:
                for _ in range(n):
                    client.call(Submit(spec=spec))
        except BaseException as exc:  # re-raised below, in the caller's thread
            failures.append(exc)

    shares = [count // QUEUERS + (i < count % QUEUERS) for i in range(QUEUERS)]
    threads = [threading.Thread(target=submit, args=(n,)) for n in shares if n]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


def full_listing(endpoint: str, runs: int = 5) -> dict[str, float]:
    """One idle client's full ``qstat`` of the queue: median ms until the reply
    is in (the server's work and the transfer) and to decode it, and its MB."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
    sock.connect(endpoint)
    replies, decodes, size = [], [], 0
    try:
        for rid in range(1, runs + 1):
            t0 = time.perf_counter()
            sock.send(encode(QueryJobs(), rid))
            frame = sock.recv()
            t1 = time.perf_counter()
            if not isinstance(decode(frame).body, JobList):
                raise RuntimeError(f"qstat of the whole queue failed: {frame[:200]!r}")
            decodes.append((time.perf_counter() - t1) * 1000)
            replies.append((t1 - t0) * 1000)
            size = len(frame)
    finally:
        sock.close(0)
    return {
        "reply_ms": round(statistics.median(replies), 1),
        "decode_ms": round(statistics.median(decodes), 1),
        "mb": round(size / 2**20, 1),
    }


class Tally:
    """What one client saw: latencies (ms) per request type, and errors."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.errors = 0
        self.messages: list[str] = []

    def merge(self, other: dict[str, Any]) -> None:
        for kind in KINDS:
            self.latency[kind] += other["latency"][kind]
        self.errors += other["errors"]
        self.messages += other["messages"][: KEEP_MESSAGES - len(self.messages)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "latency": self.latency,
            "errors": self.errors,
            "messages": self.messages,
        }


def client_loop(
    endpoint: str, workdir: str, seconds: float, full_every: int, tally: Tally
) -> None:
    """One client: submit, query that job, every ``full_every`` rounds list the
    queue (0: never)."""
    spec = trivial_spec(workdir, hold=True, name="load")
    client = Client(endpoint, timeout=TIMEOUT)

    def timed(kind: str, request: Message) -> Any:
        nonlocal client
        t0 = time.perf_counter()
        try:
            reply = client.call(request)
        except MinibatchError as exc:
            tally.errors += 1
            if len(tally.messages) < KEEP_MESSAGES:
                tally.messages.append(f"{kind}: {exc}")
            if isinstance(exc, Unavailable):  # a late reply must not be taken
                client.close()
                client = Client(endpoint, timeout=TIMEOUT)
            return None
        tally.latency[kind].append((time.perf_counter() - t0) * 1000)
        return reply

    deadline = time.monotonic() + seconds
    rounds = 0
    try:
        while time.monotonic() < deadline:
            rounds += 1
            reply = timed("submit", Submit(spec=spec))
            if reply is not None:
                timed("qstat", QueryJobs(selectors=[str(reply.ids[0])]))
            if full_every and rounds % full_every == 0:
                timed("qstat_all", QueryJobs())
    finally:
        client.close()


def worker(
    endpoint: str,
    workdir: str,
    threads: int,
    seconds: float,
    full_every: int,
    conn: Connection,
) -> None:
    """A process of ``threads`` clients (the target of a spawned process): says
    it is ready on ``conn``, waits for the word to start, sends its tally."""
    tallies = [Tally() for _ in range(threads)]
    pool = [
        threading.Thread(
            target=client_loop, args=(endpoint, workdir, seconds, full_every, t)
        )
        for t in tallies
    ]
    conn.send(os.getpid())
    conn.recv()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    total = Tally()
    for tally in tallies:
        total.merge(tally.as_dict())
    conn.send(total.as_dict())


def _receive(conn: Connection, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise RuntimeError(f"a client process was silent for {timeout:g} s")
    return conn.recv()


def run_clients(
    endpoint: str,
    workdir: str,
    clients: int,
    seconds: float,
    full_every: int,
    on_start: Callable[[], None],
) -> tuple[Tally, int]:
    """``clients`` client loops in worker processes; their merged tally and the
    number of processes. ``on_start`` runs once every worker is ready, just
    before they start.

    Spawned (a fork would copy the zmq context) and told what to do through
    pipes: multiprocessing's queues and events are named semaphores in
    /dev/shm, which a node daemon of any cluster of this user may remove
    when one of its jobs ends (see minibatch/node/shm.py)."""
    ctx = multiprocessing.get_context("spawn")
    processes = -(-clients // CLIENTS_PER_PROCESS)
    shares = [
        clients // processes + (i < clients % processes) for i in range(processes)
    ]
    pipes = [ctx.Pipe() for _ in shares]
    procs = [
        ctx.Process(
            target=worker,
            args=(endpoint, workdir, n, seconds, full_every, child),
            daemon=True,
        )
        for n, (_, child) in zip(shares, pipes, strict=True)
    ]
    total = Tally()
    try:
        for p in procs:
            p.start()
        for _, child in pipes:
            child.close()  # the worker has its copy
        for conn, _ in pipes:
            _receive(conn, 120)
        on_start()
        for conn, _ in pipes:
            conn.send("start")
        for conn, _ in pipes:
            total.merge(_receive(conn, seconds + 2 * TIMEOUT + 60))
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        for conn, _ in pipes:
            conn.close()
    return total, processes


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    return {
        "count": len(values),
        "p50": round(percentile(values, 0.50), 2),
        "p95": round(percentile(values, 0.95), 2),
        "p99": round(percentile(values, 0.99), 2),
    }


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def rss(proc: psutil.Process) -> int:
    return int(proc.memory_info().rss)


def run(
    jobs: int = 20_000,
    clients: int = 50,
    seconds: float = 60.0,
    full_every: int = FULL_EVERY,
) -> dict[str, Any]:
    """Every measure on a fresh cluster (see the module's docstring)."""
    cpus = layouts.usable_cpus()
    layout = layouts.plan_nodes(len(cpus), 1, cpus, False, None)
    with fresh_cluster(layout) as (paths, report):
        endpoint, workdir = report.server_endpoint, str(paths.home)
        server = psutil.Process(report.pids["server"])
        result: dict[str, Any] = {
            "nodes": len(layout),
            "jobs": jobs,
            "clients": clients,
            "seconds": seconds,
            "full_every": full_every,
        }
        time.sleep(1.0)  # let start-up settle before the first reading
        rss0, cpu0 = rss(server), cpu_s(server)
        t0 = time.perf_counter()
        queue_held(endpoint, workdir, jobs)
        elapsed = time.perf_counter() - t0
        rss1, cpu1 = rss(server), cpu_s(server)
        result["queue_s"] = round(elapsed, 2)
        result["queue_per_s"] = round(jobs / elapsed)
        result["server_cpu_s_queuing"] = round(cpu1 - cpu0, 2)
        result["server_rss_mb_before"] = round(rss0 / 2**20, 1)
        result["server_rss_mb_queued"] = round(rss1 / 2**20, 1)
        result["kb_per_queued_job"] = round((rss1 - rss0) / 1024 / max(jobs, 1), 2)
        result["full_listing"] = full_listing(endpoint)

        begun: list[float] = []

        def on_start() -> None:
            begun.extend([cpu_s(server), time.perf_counter()])

        tally, result["processes"] = run_clients(
            endpoint, workdir, clients, seconds, full_every, on_start
        )
        cpu2, wall = cpu_s(server), time.perf_counter() - begun[1]
        done = sum(len(v) for v in tally.latency.values())
        result["requests"] = done
        result["requests_per_s"] = round(done / wall, 1)
        result["errors"] = tally.errors
        result["error_messages"] = tally.messages
        result["latency_ms"] = {k: summary(tally.latency[k]) for k in KINDS}
        result["server_cpu_s_load"] = round(cpu2 - begun[0], 2)
        result["server_cpu_pct_load"] = round(100 * (cpu2 - begun[0]) / wall, 1)
        result["server_rss_mb_after"] = round(rss(server) / 2**20, 1)
        with Client(endpoint, timeout=TIMEOUT) as client:
            result["jobs_after"] = sum(client.call(Status()).jobs.values())
    return result


def render(result: dict[str, Any]) -> str:
    """The result as a short table for people."""
    lines = [
        f"cluster: {result['nodes']} nodes x 1 CPU; {result['jobs']} held jobs "
        f"queued in {result['queue_s']} s ({result['queue_per_s']}/s)",
        f"server RSS {result['server_rss_mb_before']} MB empty, "
        f"{result['server_rss_mb_queued']} MB queued: "
        f"{result['kb_per_queued_job']} KB per queued job; "
        f"CPU {result['server_cpu_s_queuing']} s to queue them",
        "one idle client's full qstat of the queue: reply in "
        f"{result['full_listing']['reply_ms']} ms ({result['full_listing']['mb']} "
        f"MB), decoded in {result['full_listing']['decode_ms']} ms",
        f"{result['clients']} clients ({result['processes']} processes) for "
        f"{result['seconds']:g} s, a full listing every {result['full_every']} "
        f"rounds: {result['requests']} requests "
        f"({result['requests_per_s']}/s), {result['errors']} errors",
        f"  {'request':<10} {'count':>8} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}",
    ]
    for kind, s in result["latency_ms"].items():
        lines.append(
            f"  {kind:<10} {s['count']:>8} {s['p50']:>9} {s['p95']:>9} {s['p99']:>9}"
        )
    lines.append(
        f"server CPU {result['server_cpu_s_load']} s under load "
        f"({result['server_cpu_pct_load']} %), RSS {result['server_rss_mb_after']} "
        f"MB with {result['jobs_after']} jobs queued"
    )
    lines += [f"error: {m}" for m in result["error_messages"]]
    return "\n".join(lines)
