"""The simulated machine: its nodes, and how a trace job's size becomes a request.

Traces give a job's size as a number of processors. ``--procs N`` models the
machine as the classic simulators do, one flat pool of N processors (one node).
``--nodes N --cpus-per-node C`` places jobs on nodes, so a job's size must become
a :class:`~minibatch.core.job.JobRequest` (nodes x CPUs per node):

* a job that fits on the largest node takes one node (``nodes=1, ppn=procs``);
* a wider job is spread evenly over ``n = ceil(procs / C_max)`` nodes with
  ``ppn = ceil(procs / n)`` each, so it may hold up to ``n - 1`` CPUs more than it
  asked for (a request is the same number of CPUs on every node, as in PBS).

A request whose shape no set of nodes could ever hold is infeasible
(:meth:`Machine.request` returns None) and the trace filter drops the job.
"""

from __future__ import annotations

import msgspec

from minibatch.core.job import JobRequest
from minibatch.errors import InvalidArgument

#: Name of the single node of a flat pool.
POOL = "pool"


class NodeSpec(msgspec.Struct, frozen=True):
    """One simulated node. ``mem_kb`` None means memory is not modelled."""

    name: str
    cpus: int
    mem_kb: int | None = None


class Machine(msgspec.Struct, frozen=True):
    """The nodes of a simulated machine, in placement order."""

    nodes: tuple[NodeSpec, ...]

    @classmethod
    def pool(cls, procs: int, mem_kb: int | None = None) -> Machine:
        """One flat pool of ``procs`` processors (and ``mem_kb`` memory)."""
        if procs < 1:
            raise InvalidArgument(
                f"the machine needs at least 1 processor, not {procs}"
            )
        return cls(nodes=(NodeSpec(POOL, procs, mem_kb),))

    @classmethod
    def uniform(
        cls, nodes: int, cpus_per_node: int, mem_kb: int | None = None
    ) -> Machine:
        """``nodes`` identical nodes ``n0, n1, ...`` with these CPUs and memory."""
        if nodes < 1 or cpus_per_node < 1:
            raise InvalidArgument(
                f"need at least 1 node of 1 CPU, not {nodes} x {cpus_per_node}"
            )
        return cls(
            nodes=tuple(NodeSpec(f"n{i}", cpus_per_node, mem_kb) for i in range(nodes))
        )

    @property
    def procs(self) -> int:
        """Total processors (CPUs) of the machine."""
        return sum(n.cpus for n in self.nodes)

    @property
    def mem_kb(self) -> int | None:
        """Total memory, or None when memory is not modelled on every node."""
        if any(n.mem_kb is None for n in self.nodes):
            return None
        return sum(n.mem_kb or 0 for n in self.nodes)

    def describe(self) -> str:
        """A short text for tables and logs: ``128 procs`` or ``4 x 32 CPUs``."""
        cpus = {n.cpus for n in self.nodes}
        mem = self.nodes[0].mem_kb
        mem_text = "" if mem is None else f", {mem // 1024**2} GiB"
        if len(self.nodes) == 1 and self.nodes[0].name == POOL:
            return f"{self.procs} procs (flat pool{mem_text})"
        if len(cpus) == 1:
            return f"{len(self.nodes)} nodes x {cpus.pop()} CPUs{mem_text} per node"
        return f"{len(self.nodes)} nodes, {self.procs} CPUs"

    def request(
        self, procs: int, mem_kb: int | None, walltime: int
    ) -> JobRequest | None:
        """The request a job of ``procs`` processors makes, or None if it never fits.

        Args:
            procs: processors the job asks for (at least 1).
            mem_kb: memory for the whole job, or None when not modelled.
            walltime: the requested time in seconds (what the policy sees).
        """
        widest = max(n.cpus for n in self.nodes)
        if procs <= widest:
            count, ppn = 1, procs
        else:
            count = -(-procs // widest)
            ppn = -(-procs // count)
        mem_node = None if mem_kb is None else -(-mem_kb // count)
        usable = sum(
            1
            for n in self.nodes
            if n.cpus >= ppn
            and (mem_node is None or n.mem_kb is None or n.mem_kb >= mem_node)
        )
        if usable < count:
            return None
        # Memory is a requirement only where the machine models it.
        mem = mem_kb if self.mem_kb is not None else None
        return JobRequest(nodes=count, ppn=ppn, mem_kb=mem, walltime=walltime)
