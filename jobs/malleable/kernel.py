#!/usr/bin/env python3
"""A malleable CPU-bound kernel: a fixed amount of work on however many CPUs it has.

The work is ``--work`` chunks of a Monte Carlo estimate of pi, each about
``--chunk-ms`` milliseconds on one CPU (calibrated at start). The master runs one
worker process per CPU of the job, each pinned to its own CPU, and hands out
chunks one at a time; when the job is resized (``minibatch.malleable``) the
master grows or shrinks the pool to the new CPUs between chunks. A worker being
retired finishes its chunk first, so no work is lost or done twice, and the
estimate does not depend on the resizes (chunk ``i`` always draws the same
numbers).

Output, one line each, ``key=value``, flushed::

    start cpus=0-1 work=2000 samples_per_chunk=41000
    t=1.00 cpus=0-1 workers=2 chunks=190 rate=190.0/s     (every --interval s)
    resize t=4.31 cpus=0 workers=1                       (when the pool changes)
    done chunks=2000 elapsed=12.40 cpu_seconds=21.95 pi=3.141593

``chunks`` counts the chunks done so far, ``rate`` those of the last interval per
second, ``cpu_seconds`` the CPU time of the master and all its workers.

The worker pool (:class:`Pool`, :func:`run_malleable`) also serves ``stream.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Generic, TypeVar

# A job may run under any python3 (jobs get a minimal PATH); the API imports only
# the standard library, so the source tree is enough to find it.
sys.path.append(str(Path(__file__).resolve().parents[2]))
from minibatch.malleable import Resizes, format_cpu_list  # noqa: E402

R = TypeVar("R")
#: Builds, in a fresh worker, the function that does task ``i`` and returns its result.
TaskFactory = Callable[[], Callable[[int], R]]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_FORK = get_context("fork")


def _serve(conn: Connection, make_task: TaskFactory[R], ignore: Sequence[int]) -> None:
    """A worker's life: do the tasks the master sends until it sends None."""
    master = os.getppid()
    # Only the master adapts to resizes; a worker must not die of the resize
    # signal (nor of the terminal's ^C, which the master handles for it).
    for signum in ignore:
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the master's handler
    # Die with the master even if it is SIGKILLed; check once, as it may have
    # died before the request was made.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != master:
        os._exit(1)
    task = make_task()
    while (index := conn.recv()) is not None:
        conn.send(task(index))


@dataclass
class _Worker:
    process: BaseProcess
    pid: int
    conn: Connection
    cpu: int
    task: int | None = None  # the task it is doing
    retiring: bool = False  # stops after its current task


class WorkerDied(RuntimeError):
    """A worker ended without being asked to."""


class Pool(Generic[R]):
    """One worker process per CPU, each pinned there, doing tasks ``0..total-1``.

    Args:
        make_task: called once in each new worker (see :data:`TaskFactory`).
        total: the number of tasks.
        ignore: signals a worker ignores (the resize signal, SIGINT).
    """

    def __init__(self, make_task: TaskFactory[R], total: int, ignore: Sequence[int]):
        self._make_task = make_task
        self._ignore = ignore
        self._next = 0
        self.total = total
        self.done = 0
        self._workers: list[_Worker] = []

    @property
    def cpus(self) -> list[int]:
        """The CPUs of the workers that will take more tasks."""
        return sorted(w.cpu for w in self._workers if not w.retiring)

    def resize(self, cpus: list[int]) -> None:
        """Have exactly one worker per CPU of ``cpus``, each pinned to its CPU."""
        active = [w for w in self._workers if not w.retiring]
        free = [c for c in cpus if c not in {w.cpu for w in active}]
        for worker in active:
            if worker.cpu not in cpus:
                # Moving a worker is cheaper than ending one and starting another.
                if free:
                    worker.cpu = free.pop(0)
                else:
                    self._retire(worker)
        for worker in self._workers:
            # Always re-pin: a resize set every thread of the job to the whole set.
            if not worker.retiring:
                self._pin(worker)
        for cpu in free[: self.total - self._next]:  # no more than tasks left
            self._spawn(cpu)

    def collect(self, timeout: float) -> list[R]:
        """Results that arrive within ``timeout`` s; idle workers get new tasks."""
        ready = wait([w.conn for w in self._workers], timeout)
        results: list[R] = []
        for worker in [w for w in self._workers if w.conn in ready]:
            try:
                results.append(worker.conn.recv())
            except EOFError:
                worker.process.join()
                raise WorkerDied(
                    f"worker on CPU {worker.cpu} (pid {worker.pid}) ended "
                    f"with status {worker.process.exitcode}"
                ) from None
            self.done += 1
            worker.task = None
            if worker.retiring:
                self._stop(worker)
            else:
                self._dispatch(worker)
        return results

    def close(self) -> None:
        """Kill the workers still there and reap them all."""
        for worker in self._workers:
            worker.process.kill()
        for worker in self._workers:
            worker.process.join()
        self._workers.clear()

    def _spawn(self, cpu: int) -> None:
        here, there = _FORK.Pipe()
        process = _FORK.Process(
            target=_serve, args=(there, self._make_task, self._ignore), daemon=True
        )
        process.start()
        there.close()
        assert process.pid is not None  # set by start()
        # The master pins its workers, the workers never do: one writer, no race
        # with a resize that arrives while a worker starts.
        worker = _Worker(process, process.pid, here, cpu)
        self._workers.append(worker)
        self._pin(worker)
        self._dispatch(worker)

    def _pin(self, worker: _Worker) -> None:
        with suppress(ProcessLookupError):  # it died: collect() will say so
            os.sched_setaffinity(worker.pid, {worker.cpu})

    def _dispatch(self, worker: _Worker) -> None:
        if self._next == self.total:
            self._stop(worker)
            return
        worker.task = self._next
        self._next += 1
        worker.conn.send(worker.task)

    def _retire(self, worker: _Worker) -> None:
        worker.retiring = True
        if worker.task is None:
            self._stop(worker)

    def _stop(self, worker: _Worker) -> None:
        worker.conn.send(None)
        worker.process.join()
        worker.conn.close()
        self._workers.remove(worker)


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Unwinds through the ``with`` blocks, which kill the workers.
    sys.exit(128 + signum)


def cpu_seconds() -> float:
    """CPU time of this process and of its children reaped so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_malleable(
    make_task: TaskFactory[R],
    total: int,
    interval: float,
    describe: Callable[[list[R], int, float], str],
    header: str,
) -> tuple[list[R], float]:
    """Do ``total`` tasks on a pool that follows the job's resizes, and report.

    Args:
        make_task: see :data:`TaskFactory`.
        total: the number of tasks.
        interval: seconds between report lines.
        describe: ``(results of the interval, tasks done, its seconds)`` -> the
            program's own ``key=value`` fields of a report line.
        header: the program's own fields of the ``start`` line.

    Returns:
        All results (in completion order) and the elapsed seconds.
    """
    signal.signal(signal.SIGTERM, _terminate)
    results: list[R] = []
    with Resizes() as resizes:
        ignore = [signal.SIGINT] + ([resizes.signum] if resizes.signum else [])
        pool = Pool(make_task, total, ignore)
        try:
            cpus = resizes.cpus()
            print(f"start cpus={format_cpu_list(cpus)} {header}", flush=True)
            start = last = time.monotonic()
            pool.resize(cpus)
            window: list[R] = []
            while pool.done < total:
                window += pool.collect(max(0.0, last + interval - time.monotonic()))
                now = time.monotonic()
                if resizes.changed():
                    # Re-pin even if the list is the same; report only a change
                    # (the file and then the signal may tell of the same resize).
                    before = pool.cpus
                    pool.resize(resizes.cpus())
                    if pool.cpus != before:
                        print(_fields("resize", now - start, pool), flush=True)
                if now - last >= interval:
                    fields = describe(window, pool.done, now - last)
                    print(_fields("", now - start, pool), fields, flush=True)
                    results += window
                    window, last = [], now
            results += window
            return results, time.monotonic() - start
        finally:
            pool.close()


def _fields(event: str, t: float, pool: Pool[R]) -> str:
    cpus = format_cpu_list(pool.cpus)
    line = f"t={t:.2f} cpus={cpus} workers={len(pool.cpus)}"
    return f"{event} {line}" if event else line


def count_hits(samples: int, chunk: int) -> int:
    """Points of chunk ``chunk`` that fall inside the quarter circle."""
    draw = random.Random(chunk).random  # the same numbers whoever runs the chunk
    return sum(draw() ** 2 + draw() ** 2 < 1.0 for _ in range(samples))


def calibrate(chunk_ms: float) -> int:
    """Samples per chunk for about ``chunk_ms`` milliseconds on one CPU."""
    samples, elapsed = 1000, 0.0
    while elapsed < 0.05:  # long enough for the clock and a warm interpreter
        samples *= 2
        begin = time.perf_counter()
        count_hits(samples, -1)
        elapsed = time.perf_counter() - begin
    return max(1, round(samples * chunk_ms / 1000 / elapsed))


def _describe(window: list[int], done: int, seconds: float) -> str:
    return f"chunks={done} rate={len(window) / seconds:.1f}/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=int, default=1000, help="chunks in all")
    parser.add_argument("--chunk-ms", type=float, default=10.0, help="ms per chunk")
    parser.add_argument("--interval", type=float, default=1.0, help="s per report")
    args = parser.parse_args(argv)
    if min(args.work, args.chunk_ms, args.interval) <= 0:
        parser.error("--work, --chunk-ms and --interval must be positive")
    samples = calibrate(args.chunk_ms)
    try:
        hits, elapsed = run_malleable(
            lambda: partial(count_hits, samples),
            args.work,
            args.interval,
            _describe,
            header=f"work={args.work} samples_per_chunk={samples}",
        )
    except WorkerDied as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    pi = 4 * sum(hits) / (samples * args.work)
    print(
        f"done chunks={args.work} elapsed={elapsed:.2f} "
        f"cpu_seconds={cpu_seconds():.2f} pi={pi:.6f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
