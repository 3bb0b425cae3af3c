"""The policy contract and the free-resource pool every policy plans with.

A policy is a pure function of a snapshot: no IO, no wall clock (``snap.now`` is the
only time), no state carried between calls, deterministic for a snapshot and its
parameters. Its decisions are proposals: the server (live) or the simulator
validates each one against current state and may drop one that no longer fits.
"""

from __future__ import annotations

from functools import lru_cache
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
        self.order: list[str] = []
        self.cpus: dict[str, int] = {}
        self.mem: dict[str, int | None] = {}
        for n in snap.nodes:
            self.order.append(n.name)
            self.cpus[n.name] = n.free_cpus
            self.mem[n.name] = n.free_mem_kb

    def copy(self) -> Pool:
        other = Pool.__new__(Pool)
        other.order, other.cpus, other.mem = self.order, dict(self.cpus), dict(self.mem)
        return other

    def fit(self, req: JobRequest) -> tuple[str, ...] | None:
        """Nodes for ``req`` now, or None."""
        mem = mem_per_node(req)
        ppn, count = req.ppn, req.nodes
        cpus, mems = self.cpus, self.mem
        chosen: list[str] = []
        for name in self.order:
            if cpus[name] < ppn:
                continue
            if mem is not None:
                free_mem = mems[name]
                if free_mem is not None and free_mem < mem:
                    continue
            chosen.append(name)
            if len(chosen) == count:
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
    return _waiting_text(req.nodes, req.ppn, max(pool.cpus.values(), default=0))


@lru_cache(maxsize=4096)
def _waiting_text(nodes: int, ppn: int, widest: int) -> str:
    # Memoised: a pure function of three small numbers, asked for on every pass.
    cpus = "1 CPU" if ppn == 1 else f"{ppn} CPUs"
    if nodes == 1:
        return f"waiting for {cpus} ({widest} free)"
    return f"waiting for {nodes} nodes with {cpus} each"


def reserved_reason(base: str, start: float, now: float) -> str:
    return f"{base}; reserved to start in {humanize_duration(start - now)}"
