"""A simulation that starts from a machine already at work, not an idle one.

A :class:`Backlog` is the jobs running and queued at an instant (as
:mod:`minibatch.sim.whatif` takes them from a live cluster's snapshot). The
engine (:class:`~minibatch.sim.engine.Simulator`, ``backlog=``) puts them in
place with :func:`seed` before its first event: the running jobs hold their CPUs
and memory until their expected end, the queued jobs are in the queue in the
backlog's order, and the first pass runs at the backlog's ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from minibatch.core.snapshot import PendingView, QosView, RunningView
from minibatch.sim.swf import TraceJob


class Backlog(NamedTuple):
    """The machine at work at the instant ``now``, where a simulation starts."""

    now: float
    #: Jobs running at ``now``: each holds its CPUs and memory until its
    #: expected end (``RunningView.expected_end``), and is resized by nobody.
    running: Sequence[RunningView] = ()
    #: Jobs queued at ``now``, in queue order: the view the policy sees, and
    #: the trace job whose run time it runs for (its outcome's job).
    queued: Sequence[tuple[PendingView, TraceJob]] = ()
    #: The QOS definitions every snapshot carries (priorities, limits).
    qos: Mapping[str, QosView] = {}


def seed(
    backlog: Backlog,
    free: dict[str, int],
    free_mem: dict[str, int | None],
    running: dict[int, RunningView],
    queue: dict[int, PendingView],
    ends: list[tuple[float, int]],
) -> list[TraceJob]:
    """Put the backlog in the engine's structures (changed in place); return
    its queued jobs' trace jobs.

    ``ends`` is the engine's heap of (time, job id); the id -1 makes
    ``backlog.now`` an instant, so the first pass runs then.
    """
    heapq.heappush(ends, (backlog.now, -1))
    for r in backlog.running:
        running[r.id] = r
        mem = r.mem_kb_per_node
        for name, cpus in r.nodes:
            free[name] -= cpus
            held = free_mem[name]
            if mem is not None and held is not None:
                free_mem[name] = held - mem
        heapq.heappush(ends, (r.expected_end(backlog.now), r.id))
    queue.update((view.id, view) for view, _ in backlog.queued)
    return [job for _, job in backlog.queued]
