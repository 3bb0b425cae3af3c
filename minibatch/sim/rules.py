"""The server's rules for a start, as the simulator checks every plan against them.

A start that breaks one is a policy bug (:class:`PlanRejected`): the job needs
its CPUs and memory free now on distinct nodes that exist
(``NodeRegistry.allocate``), and, by its requested time, CPUs outside every
downtime (:func:`room`).
"""

from __future__ import annotations

from minibatch.core.snapshot import ReservationView, RunningView
from minibatch.sim.machine import NodeSpec
from minibatch.sim.malleable import PlanRejected

__all__ = ["check_downtimes", "check_start", "room"]


def check_start(
    jid: int,
    names: tuple[str, ...],
    count: int,
    ppn: int,
    mem: int | None,
    free: dict[str, int],
    free_mem: dict[str, int | None],
) -> None:
    """The server's rules for a start (``NodeRegistry.allocate``), or raise."""
    if len(names) != count or (count > 1 and len(set(names)) != count):
        raise PlanRejected(f"job {jid} needs {count} distinct nodes, plan gave {names}")
    for name in names:
        cpus = free.get(name)
        if cpus is None:
            raise PlanRejected(f"job {jid}: node {name} does not exist")
        if cpus < ppn:
            raise PlanRejected(f"job {jid}: node {name} has {cpus} free CPUs < {ppn}")
        held = free_mem[name]
        if mem is not None and held is not None and held < mem:
            raise PlanRejected(f"job {jid}: node {name} has {held} KB free < {mem}")


def check_downtimes(
    jid: int,
    names: tuple[str, ...],
    ppn: int,
    span: tuple[float, float],
    downtimes: tuple[ReservationView, ...],
    running: dict[int, RunningView],
    free: dict[str, int],
    spec: dict[str, NodeSpec],
) -> None:
    """The server's rule for reserved CPUs, by count: over its requested time,
    the job must find its CPUs outside every downtime, or raise."""
    for name in names:
        left, when = room(name, span, downtimes, running, free, spec)
        if left < ppn:
            raise PlanRejected(
                f"job {jid}: node {name} would run into a downtime (at {when:.0f})"
            )


def room(
    name: str,
    span: tuple[float, float],
    downtimes: tuple[ReservationView, ...],
    running: dict[int, RunningView],
    free: dict[str, int],
    spec: dict[str, NodeSpec],
    exclude: int = -1,
) -> tuple[int, float]:
    """The fewest CPUs of node ``name`` outside every downtime over ``span``
    that no running job holds (``exclude``'s own count as free), and when.

    Now, that is the free CPUs less those a downtime holds. Later, busy CPUs
    only drop (jobs end by their requested times, an overdue one counts as
    ending now, as policies count it), so it is enough to look again at each
    downtime start inside the span.
    """
    now, until = span
    own = sum(c for n, c in running[exclude].nodes if n == name) if exclude >= 0 else 0
    windows = [
        (r.start, r.end, cpus)
        for r in downtimes
        for node, cpus in r.nodes
        if node == name and r.start < until and r.end > now
    ]
    least, when = free[name] + own, now
    for t in {now, *(start for start, _, _ in windows if start > now)}:
        held = sum(c for start, end, c in windows if start <= t < end)
        if t == now:
            left = free[name] + own - held
        else:
            busy = sum(
                cpus
                for r in running.values()
                if r.id != exclude and r.expected_end(now) > t
                for node, cpus in r.nodes
                if node == name
            )
            left = spec[name].cpus - busy - held
        if left < least:
            least, when = left, t
    return least, when
