"""Many simulations at once: in this process, on local worker processes, or on
a Dask cluster, with the results in the order of the tasks.

A task is a picklable callable without arguments; :class:`SimTask` is one
simulation: its :class:`~minibatch.sim.runner.SimConfig` and how to build its
workload (a window of the trace, a relative load ...). Only the task travels:
each worker reads the trace itself and keeps the last two it read, as runs that
differ only in their policy share one. The simulator is deterministic, so where
a run happens changes its wall time and nothing else.

    with Pool(workers=4, progress=show) as pool:   # or Pool(cluster="tcp://h:8786")
        runs = pool.all([SimTask(replace(config, policy=p)) for p in names])

``workers=1`` runs everything here, one run after the other; a batch of one
task runs here too unless a cluster is named. The local processes are started
by a fork server (no copy of this process's threads, such as a progress bar's)
at the first batch that needs them and live until the pool is closed, so that
later batches find the traces already read; like any spawned process, they
import the main module (a script needs the ``if __name__ == "__main__"``
guard). ``cluster`` is a Dask scheduler's address: its workers need minibatch
installed and the traces at the same paths (``dask.distributed`` is the
optional extra ``minibatch[dask]``).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, TypeVar

from minibatch.errors import InvalidArgument, Unavailable
from minibatch.sim.engine import Progress
from minibatch.sim.runner import SimConfig, SimRun, Workload, load, simulate

T = TypeVar("T")

#: Workloads a process keeps read (see :func:`shared`).
KEPT = 2
_kept: dict[str, Workload] = {}


def shared(config: SimConfig) -> Workload:
    """``config``'s workload, read once per process for the runs that share it."""
    # Policies never change their jobs: runs that differ only in the policy
    # share the workload (compare does the same within one process).
    key = repr(replace(config, policy="", params={}))
    work = _kept.pop(key, None) or load(config)
    _kept[key] = work
    while len(_kept) > KEPT:
        del _kept[next(iter(_kept))]
    return work


@dataclass(frozen=True)
class SimTask:
    """One simulation, to run wherever a worker is.

    ``workload`` builds the jobs from the config where the run happens (a
    module-level function or a :func:`functools.partial` of one, so that it
    pickles); by default, the config's trace as :func:`shared` reads it.
    """

    config: SimConfig
    workload: Callable[[SimConfig], Workload] = shared

    def __call__(self) -> SimRun:
        return simulate(self.config, self.workload(self.config))


def cores() -> int:
    """The CPUs this process may run on (a container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Pool:
    """Where a batch of tasks runs: ``workers`` local processes (None: one per
    core; 1: this process) or the Dask scheduler at ``cluster``. ``progress``
    hears (runs done, runs submitted) over all the pool's batches.

    The processes and the connection are made at the first batch that needs
    them; closing the pool (``with``) ends them.
    """

    def __init__(
        self,
        workers: int | None = None,
        cluster: str | None = None,
        progress: Progress | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise InvalidArgument("--workers must be at least 1")
        if workers is not None and cluster is not None:
            raise InvalidArgument("give --workers or --cluster, not both")
        self.workers = cores() if workers is None else workers
        self.cluster = cluster
        self.progress = progress
        self._submitted = 0
        self._done = itertools.count(1)
        self._processes: ProcessPoolExecutor | None = None
        self._client: Any = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._processes is not None:
            self._processes.shutdown(cancel_futures=True)
            self._processes = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def all(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Every task's result, in the tasks' order."""
        return list(self.each(tasks))

    def each(self, tasks: Sequence[Callable[[], T]]) -> Iterator[T]:
        """The tasks' results in their order, each as soon as it and those
        before it are done (a caller that writes a run and drops it holds few)."""
        self._submitted += len(tasks)
        if not tasks:
            return iter(())
        if self.cluster is not None:
            if self._client is None:
                self._client = _connect(self.cluster)
            return self._collect(
                [self._client.submit(task, pure=False) for task in tasks]
            )
        if self.workers == 1 or len(tasks) == 1:
            return self._here(tasks)
        if self._processes is None:
            self._processes = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("forkserver"),
                initializer=_interruptible,
            )
        return self._collect([self._processes.submit(task) for task in tasks])

    def _tick(self, _: object = None) -> None:
        if self.progress is not None:
            self.progress(next(self._done), self._submitted)

    def _here(self, tasks: Sequence[Callable[[], T]]) -> Iterator[T]:
        # This process keeps a workload for one batch only: its caller goes
        # on after the runs, with the memory.
        try:
            for task in tasks:
                result = task()
                self._tick()
                yield result
        finally:
            _kept.clear()

    def _collect(self, futures: list[Any]) -> Iterator[Any]:
        # Local and Dask futures alike: done callbacks (run on another thread)
        # count finished runs; results are taken in order and then dropped.
        pending: deque[Any] = deque(futures)
        for future in pending:
            future.add_done_callback(self._tick)
        try:
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _interruptible() -> None:
    # Ctrl-C reaches the workers too (one process group): they end at once and
    # the executor, its pool broken, ends the rest. With Python's handler a
    # worker would return the interrupt as a failed run and wait for the next.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _connect(address: str) -> Any:
    try:
        from distributed import Client
    except ImportError as exc:
        raise InvalidArgument(
            "--cluster needs dask.distributed: pip install 'minibatch[dask]'"
        ) from exc
    try:
        return Client(address, timeout="10s")  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as exc:
        raise Unavailable(f"no Dask scheduler answers at {address}: {exc}") from exc
