"""PSP, the Penalty Scheduling Policy: accurate estimators go first.

Rocchetti, Iturriaga, Nesmachnow, "Including accurate user estimates in HPC
schedulers: an empirical analysis" (seed 000). A finished job's accuracy is
A = run time / requested time (in [0, 1]); a user's accuracy is the mean over
their last 10 finished jobs (``snap.accuracy``, kept by the resource manager with
:mod:`minibatch.core.usage`), and Table 1 maps it to a priority:

====== ============ ========
tag    accuracy     priority
====== ============ ========
a1     [0.0, 0.2)   1
a2     [0.2, 0.4)   2
a3     [0.4, 0.6)   3
a4     [0.6, 0.8)   4
a5     [0.8, 1.0]   5
====== ============ ========

A user with no finished job yet gets ``default_bin`` (3, the middle bin). The
paper recomputes priorities on every submission and job end; here every pass
reads the history afresh, and the server and the simulator run a pass at exactly
those events.

:class:`Psp` is the ``psp`` preset: EASY (the paper's SLURM/Maui setting, FCFS +
EASY backfilling) over the jobs ordered by PSP priority, highest first, ties in
submission order (the paper's priority replaces SLURM's FIFO priority). The bin is
also a Maui priority component (``PSPWEIGHT``/``PSPBINWEIGHT`` in
:mod:`minibatch.policy.priority`), to combine with fairshare or queue time.
Guarantee: the order is a permutation of the queue, a pure function of the
snapshot.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.policy.ordered import OrderedPolicy

#: Lower bounds of bins 2..5 (Table 1); bin 1 starts at 0.0, bin 5 includes 1.0.
BOUNDS: Final = (0.2, 0.4, 0.6, 0.8)
#: Table 1's tag names, by bin.
TAGS: Final = {1: "a1", 2: "a2", 3: "a3", 4: "a4", 5: "a5"}
DEFAULT_BIN: Final = 3


def accuracy_bin(mean: float) -> int:
    """Table 1: the priority 1..5 of a mean accuracy (clamped into [0, 1])."""
    return 1 + bisect_right(BOUNDS, min(1.0, max(0.0, mean)))


def mean_accuracy(history: Sequence[float]) -> float | None:
    """Mean of a user's recorded accuracies, None without any."""
    if not history:
        return None
    return sum(history) / len(history)


def user_bin(
    accuracy: Mapping[str, Sequence[float]], user: str, default_bin: int = DEFAULT_BIN
) -> tuple[int, float | None]:
    """``checkjob``: (PSP priority, mean accuracy or None) of ``user``."""
    mean = mean_accuracy(accuracy.get(user, ()))
    return (default_bin if mean is None else accuracy_bin(mean)), mean


def bins(snap: ClusterSnapshot, default_bin: int = DEFAULT_BIN) -> dict[str, int]:
    """PSP priority of every user with a pending job."""
    out: dict[str, int] = {}
    for job in snap.pending:
        if job.user not in out:
            out[job.user] = user_bin(snap.accuracy, job.user, default_bin)[0]
    return out


def psp_order(
    snap: ClusterSnapshot, default_bin: int = DEFAULT_BIN
) -> list[PendingView]:
    """Pending jobs by PSP priority, highest first; ties in snapshot order."""
    prio = bins(snap, default_bin)
    return sorted(snap.pending, key=lambda j: prio[j.user], reverse=True)


class Psp(OrderedPolicy):
    """``psp``: EASY (or FIFO) ordered by Table 1's priority.

    Args:
        backfill: EASY (True) or strict FIFO (False) over the PSP order.
        default_bin: the priority of a user with no finished job (1..5).
    """

    name: ClassVar[str] = "psp"
    needs = frozenset({"accuracy"})

    def __init__(self, backfill: bool = True, default_bin: int = DEFAULT_BIN) -> None:
        super().__init__(backfill)
        if default_bin not in TAGS:
            raise ValueError(f"default_bin must be 1..5, not {default_bin}")
        self.default_bin = default_bin

    def order(self, snap: ClusterSnapshot) -> list[PendingView]:
        return psp_order(snap, self.default_bin)
