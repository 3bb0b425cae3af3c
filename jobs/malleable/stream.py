#!/usr/bin/env python3
"""A malleable STREAM triad: memory bandwidth on however many CPUs the job has.

Each worker (one per CPU, pinned, as in ``kernel.py``, whose pool this reuses)
owns three arrays of ``--mib`` MiB of float64 and repeats the triad
``a = b + s * c`` on them; ``--reps`` triads are done in all, spread over the
workers the job has at each moment. Make the arrays at least four times the
last-level cache, or the cache is measured instead of memory.

Bytes are counted as STREAM counts them, 24 per element (read ``b`` and ``c``,
write ``a``); numpy does the triad in two passes (``a = s * c``, then
``a += b``), so the memory really moves more, and the figure is a lower bound.

Output, one line each, ``key=value``, flushed (GB = 10**9 bytes)::

    start cpus=0-1 reps=100 mib=64
    t=1.00 cpus=0-1 workers=2 reps=37 bandwidth=21.30GB/s   (every --interval s)
    resize t=2.13 cpus=0 workers=1                         (when the pool changes)
    done reps=100 elapsed=4.98 bandwidth=16.85GB/s cpu_seconds=9.71

``reps`` counts the triads done so far; ``bandwidth`` is the bytes of the triads
completed in the interval per second (for ``done``: in the whole run, including
the workers' start: importing numpy and filling their arrays).

Needs numpy (run it with the repository's ``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable

from kernel import WorkerDied, cpu_seconds, run_malleable

SCALAR = 3.0


def triad(elements: int) -> Callable[[int], int]:
    """In a worker: its arrays, and the function that does one triad on them."""
    import numpy as np  # here, so that the master never loads it

    a = np.zeros(elements)
    b = np.full(elements, 1.0)  # written now, so that no rep pays page faults
    c = np.full(elements, 2.0)

    def rep(_index: int) -> int:
        np.multiply(c, SCALAR, out=a)
        np.add(a, b, out=a)
        return 24 * elements

    return rep


def _describe(window: list[int], done: int, seconds: float) -> str:
    return f"reps={done} bandwidth={sum(window) / seconds / 1e9:.2f}GB/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per array")
    parser.add_argument("--reps", type=int, default=100, help="triads in all")
    parser.add_argument("--interval", type=float, default=1.0, help="s per report")
    args = parser.parse_args(argv)
    if min(args.mib, args.reps, args.interval) <= 0:
        parser.error("--mib, --reps and --interval must be positive")
    if importlib.util.find_spec("numpy") is None:
        print(f"error: {sys.executable} has no numpy", file=sys.stderr)
        return 2
    # One thread per worker, whatever OMP_NUM_THREADS the batch system set for
    # the job: the workers are the parallelism.
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    elements = args.mib * 2**20 // 8
    try:
        done, elapsed = run_malleable(
            lambda: triad(elements),
            args.reps,
            args.interval,
            _describe,
            header=f"reps={args.reps} mib={args.mib}",
        )
    except WorkerDied as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(
        f"done reps={args.reps} elapsed={elapsed:.2f} "
        f"bandwidth={sum(done) / elapsed / 1e9:.2f}GB/s "
        f"cpu_seconds={cpu_seconds():.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
