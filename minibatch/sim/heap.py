"""Keep CPython's garbage collector off the heap a simulation starts with.

The cyclic collector runs a full collection, through every object the process
tracks, about every hundred young ones. A simulation keeps some objects per job
(its running view while it runs, its outcome at the end), so a run on a whole
trace triggers one or two full collections, and each goes through the trace's
records and jobs, ~115,000 objects for SDSC-SP2, for nothing: none of them is
garbage. That was ~5 % of EASY's simulation of the log (docs/benchmarks.md,
"Simulator"). Frozen (``gc.freeze``), they are left out of collections until
the run ends; what the run itself makes is collected as usual, so a policy
that makes reference cycles (Maui's does) is no concern.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Leave the objects that exist now out of garbage collections while the
    block runs. Not if something else froze objects (a process about to fork
    does): thawing at the end would thaw those too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
