"""The policy contract and the free-resource pool every policy plans with.

A policy is a pure function of a snapshot: no IO, no wall clock (``snap.now`` is the
only time), no state carried between calls, deterministic for a snapshot and its
parameters. Its decisions are proposals: the server (live) or the simulator
validates each one against current state and may drop one that no longer fits.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, Plan
from minibatch.core.units import humanize_duration


class Policy(Protocol):
    name: ClassVar[str]

    def plan(self, snap: ClusterSnapshot) -> Plan: ...


class Pool:
    """Free CPUs and memory per node, mutated as a pass places jobs.

    Placement is first fit in node order: a job takes the first ``request.nodes``
    nodes (in the snapshot's order) that each have ``ppn`` free CPUs and the job's
    per-node memory. Ties go to the earlier node, so placement is deterministic.
    """

    __slots__ = ("order", "cpus", "mem")

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.order = [n.name for n in snap.nodes]
        self.cpus = {n.name: n.free_cpus for n in snap.nodes}
        self.mem = {n.name: n.free_mem_kb for n in snap.nodes}

    def copy(self) -> Pool:
        other = Pool.__new__(Pool)
        other.order, other.cpus, other.mem = self.order, dict(self.cpus), dict(self.mem)
        return other

    def fit(
        self, req: JobRequest, limit: dict[str, int] | None = None
    ) -> tuple[str, ...] | None:
        """Nodes for ``req`` now, or None. ``limit`` caps the CPUs usable per node."""
        mem = mem_per_node(req)
        chosen: list[str] = []
        for name in self.order:
            free = self.cpus[name]
            if limit is not None:
                free = min(free, limit.get(name, 0))
            if free < req.ppn:
                continue
            free_mem = self.mem[name]
            if mem is not None and free_mem is not None and free_mem < mem:
                continue
            chosen.append(name)
            if len(chosen) == req.nodes:
                return tuple(chosen)
        return None

    def take(self, nodes: tuple[str, ...], req: JobRequest) -> None:
        self.give(nodes, -req.ppn, -(mem_per_node(req) or 0))

    def give(self, nodes: tuple[str, ...] | list[str], cpus: int, mem: int) -> None:
        for name in nodes:
            if name not in self.cpus:
                continue  # the node went down or offline: nothing comes back to it
            self.cpus[name] += cpus
            free_mem = self.mem[name]
            if free_mem is not None:
                self.mem[name] = free_mem + mem

    def free_cpus(self) -> int:
        return sum(self.cpus.values())


def mem_per_node(req: JobRequest) -> int | None:
    return None if req.mem_kb is None else -(-req.mem_kb // req.nodes)


def waiting_reason(req: JobRequest, pool: Pool) -> str:
    """Why a job does not fit now, in the user's terms."""
    cpus = "1 CPU" if req.ppn == 1 else f"{req.ppn} CPUs"
    if req.nodes == 1:
        return f"waiting for {cpus} ({max(pool.cpus.values(), default=0)} free)"
    return f"waiting for {req.nodes} nodes with {cpus} each"


def reserved_reason(base: str, start: float, now: float) -> str:
    return f"{base}; reserved to start in {humanize_duration(start - now)}"
