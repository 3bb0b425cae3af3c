"""The server's node registry: what each node has, what is allocated, who is up.

Mechanism only: the scheduler says *which nodes* and how many CPUs; this module
picks the concrete CPU ids (lowest free first, so allocations are compact and
predictable) and refuses anything that does not fit right now.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

import msgspec

from minibatch.core.job import Allocation, JobRequest
from minibatch.core.snapshot import NodeView
from minibatch.core.units import format_size_kb
from minibatch.policy.base import mem_per_node
from minibatch.protocol.messages import NodeInfo


class NodeState(StrEnum):
    FREE = "free"
    BUSY = "job-exclusive"
    DOWN = "down"
    OFFLINE = "offline"


class Node(msgspec.Struct, kw_only=True):
    """A node as the server knows it. ``pid`` identifies the daemon's incarnation."""

    name: str
    cpus: list[int]
    mem_kb: int | None = None
    shared_cpus: list[int] = []
    #: CPU id -> real core when the CPUs are virtual (told by the node).
    real_cpus: dict[int, int] = {}
    #: Its daemon runs on another host (tcp): its cores are not this machine's.
    remote: bool = False
    #: Its daemon runs a multi-node job with the other nodes' cores
    #: (``NodeHello.lends``).
    lends: bool = False
    offline: bool = False
    comment: str = ""
    pid: int | None = None
    up: bool = False
    last_heartbeat: float | None = None
    #: CPU id -> job id holding it.
    used: dict[int, int] = {}
    #: job id -> memory it holds on this node (KB).
    mem_used: dict[int, int] = {}
    #: GPUs (from the server's config, by node name), and job id -> the GPU
    #: ids it holds.
    gpus: int = 0
    gpus_used: dict[int, list[int]] = {}
    #: Properties (``nodes=1:bigmem``, ``-C bigmem``), from the server's config.
    features: list[str] = []
    #: job id -> consecutive heartbeats that did not list it (lost-job detection).
    misses: dict[int, int] = {}
    #: The ZeroMQ routing id of the daemon's connection, learnt from its last
    #: authenticated hello or heartbeat. Ids are never chosen by clients, so no
    #: one can claim a node's connection by naming it.
    route: bytes = b""
    #: Its daemon said it is stopping (``mb down``): nothing more starts here.
    stopping: bool = False
    #: How its daemon enforces CPUs and memory (``cgroup v1``, or why not).
    enforcement: str = ""
    #: Why its daemon can start no job now (a full spool), or "": offline.
    trouble: str = ""

    @property
    def state(self) -> NodeState:
        if not self.up or self.stopping:
            return NodeState.DOWN
        if self.offline or self.trouble:
            return NodeState.OFFLINE
        return NodeState.BUSY if len(self.used) >= len(self.cpus) else NodeState.FREE

    @property
    def usable(self) -> bool:
        return self.up and not self.offline and not self.stopping and not self.trouble

    def free_cpus(self) -> list[int]:
        return [c for c in self.cpus if c not in self.used]

    def free_mem_kb(self) -> int | None:
        if self.mem_kb is None:
            return None
        return self.mem_kb - sum(self.mem_used.values())

    def view(self) -> NodeView:
        return NodeView(
            name=self.name,
            cpus=len(self.cpus),
            free_cpus=len(self.cpus) - len(self.used),
            mem_kb=self.mem_kb,
            free_mem_kb=self.free_mem_kb(),
            gpus=self.gpus,
            free_gpus=self.gpus - sum(len(g) for g in self.gpus_used.values()),
            features=tuple(self.features),
        )

    def free_gpus(self) -> list[int]:
        held = {g for ids in self.gpus_used.values() for g in ids}
        return [g for g in range(self.gpus) if g not in held]

    def info(self) -> NodeInfo:
        jobs: dict[int, list[int]] = {}
        for cpu, job in sorted(self.used.items()):
            jobs.setdefault(job, []).append(cpu)
        return NodeInfo(
            name=self.name,
            state=self.state.value,
            cpus=self.cpus,
            free_cpus=self.free_cpus(),
            mem_kb=self.mem_kb,
            jobs=jobs,
            shared_cpus=self.shared_cpus,
            comment=self.comment or self.trouble,
            last_heartbeat=self.last_heartbeat,
            pid=self.pid,
            features=self.features,
            gpus=self.gpus,
            enforcement=self.enforcement,
            real_cpus=self.real_cpus,
        )


class CpuChooser(Protocol):
    """Which free CPUs of a node one job may take (e.g. outside reservations)."""

    def cpus(self, node: Node) -> list[int]:
        """The CPUs the job may use, in order of preference."""
        ...

    def shortfall(self, node: Node, ppn: int, usable: int) -> str:
        """Why ``node`` cannot take the job: only ``usable`` of ``ppn`` CPUs."""
        ...


class NodeRegistry:
    def __init__(
        self,
        nodes: list[Node],
        gpus: dict[str, int] | None = None,
        features: dict[str, list[str]] | None = None,
    ) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in nodes}
        #: The state last published for each node (``nodes/<name>/state``).
        self.published: dict[str, NodeState] = {}
        self.gpus = gpus or {}
        self.features = features or {}
        for node in nodes:
            self.configure(node)

    def named_by_route(self, route: bytes) -> str | None:
        """The node whose daemon's connection is ``route``, if any."""
        if not route:
            return None
        return next((n.name for n in self.nodes.values() if n.route == route), None)

    def configure(self, node: Node) -> None:
        """Give ``node`` the GPUs and features the config names for it."""
        node.gpus = self.gpus.get(node.name, 0)
        node.features = list(self.features.get(node.name, []))

    def all_features(self) -> set[str]:
        return {f for fs in self.features.values() for f in fs}

    def feasible(self, req: JobRequest, features: Sequence[str] = ()) -> str | None:
        """Why no configuration of known nodes could ever run ``req``, or None."""
        if not self.nodes:
            return "the cluster has no nodes"
        mem = mem_per_node(req)
        need = set(features)
        fitting = [
            n
            for n in self.nodes.values()
            if len(n.cpus) >= req.ppn
            and (mem is None or n.mem_kb is None or n.mem_kb >= mem)
            and n.gpus >= req.gpus
            and need <= set(n.features)
        ]
        if len(fitting) >= req.nodes:
            return None
        nodes = self.nodes.values()
        with_gpus = [n for n in nodes if n.gpus >= req.gpus]
        if req.gpus and len(with_gpus) < req.nodes:
            most = max(n.gpus for n in nodes)
            if not with_gpus:
                return (
                    f"{req.gpus} gpus per node requested but the most a node has "
                    f"is {most}"
                )
            return (
                f"{req.nodes} nodes with {req.gpus} gpus each requested but only "
                f"{len(with_gpus)} node{'s have' if len(with_gpus) > 1 else ' has'} "
                "that many"
            )
        if (
            need
            and len([n for n in self.nodes.values() if need <= set(n.features)])
            < req.nodes
        ):
            return (
                f"{req.nodes} nodes with features {', '.join(sorted(need))} "
                "requested but fewer nodes have them"
            )
        biggest = max(len(n.cpus) for n in self.nodes.values())
        if req.nodes == 1 and req.ppn > biggest:
            return f"{req.ppn} CPUs requested but the largest node has {biggest}"
        if mem is not None and all(
            n.mem_kb is not None and n.mem_kb < mem for n in self.nodes.values()
        ):
            most = max(n.mem_kb or 0 for n in self.nodes.values())
            return (
                f"{format_size_kb(mem)} of memory per node requested but the "
                f"largest node has {format_size_kb(most)}"
            )
        return (
            f"{req.nodes} nodes with {req.ppn} CPUs each requested but only "
            f"{len(fitting)} of the {len(self.nodes)} nodes are that large"
        )

    def allocate(
        self,
        job: int,
        names: tuple[str, ...],
        req: JobRequest,
        chooser: CpuChooser | None = None,
        features: Sequence[str] = (),
    ) -> list[Allocation] | str:
        """Allocate ``req.ppn`` CPUs on each named node, or say why not (no change).

        CPUs come from ``chooser`` (in its order) when given, else lowest free first.
        """
        if len(names) != req.nodes or len(set(names)) != len(names):
            return f"needs {req.nodes} distinct nodes, plan gave {list(names)}"
        mem = mem_per_node(req)
        for name in names:
            node = self.nodes.get(name)
            if node is None:
                return f"node {name} is not available"
            why = _shortage(node, req.ppn, mem, req.gpus)
            if why is not None:
                return why
            if not set(features) <= set(node.features):
                return f"node {name} lacks feature {', '.join(features)}"
        picked: dict[str, list[int]] = {}
        for name in names:
            node = self.nodes[name]
            usable = node.free_cpus() if chooser is None else chooser.cpus(node)
            if len(usable) < req.ppn:
                assert chooser is not None
                return chooser.shortfall(node, req.ppn, len(usable))
            picked[name] = usable[: req.ppn]
        allocs = []
        for name in names:
            node = self.nodes[name]
            cpus = sorted(picked[name])
            for cpu in cpus:
                node.used[cpu] = job
            if mem is not None:
                node.mem_used[job] = mem
            gpus = node.free_gpus()[: req.gpus] if req.gpus else []
            if gpus:
                node.gpus_used[job] = gpus
            allocs.append(Allocation(name, cpus, gpus))
        return allocs

    def first_fit(
        self,
        req: JobRequest,
        chooser: CpuChooser | None = None,
        features: Sequence[str] = (),
    ) -> tuple[str, ...] | None:
        """The first ``req.nodes`` nodes, in order, on which :meth:`allocate`
        would find the job's CPUs (those ``chooser`` allows), memory, GPUs and
        features."""
        mem = mem_per_node(req)
        names: list[str] = []
        need = set(features)
        for node in self.nodes.values():
            if _shortage(node, req.ppn, mem, req.gpus) is not None:
                continue
            if need and not need <= set(node.features):
                continue
            if chooser is not None and len(chooser.cpus(node)) < req.ppn:
                continue
            names.append(node.name)
            if len(names) == req.nodes:
                return tuple(names)
        return None

    def release(self, job: int, allocs: list[Allocation]) -> None:
        for alloc in allocs:
            node = self.nodes.get(alloc.node)
            if node is None:
                continue
            for cpu in alloc.cpus:
                if node.used.get(cpu) == job:
                    del node.used[cpu]
            node.mem_used.pop(job, None)
            node.gpus_used.pop(job, None)
            node.misses.pop(job, None)

    def any_free_cpu(self) -> bool:
        """Whether some usable node has an unallocated CPU."""
        return any(n.usable and len(n.used) < len(n.cpus) for n in self.nodes.values())

    def totals(self) -> tuple[int, int | None]:
        """CPUs and memory (KB, None if any node is unlimited) of the usable nodes."""
        usable = [n for n in self.nodes.values() if n.usable]
        mems = [n.mem_kb for n in usable]
        mem = None if None in mems or not mems else sum(m for m in mems if m)
        return sum(len(n.cpus) for n in usable), mem

    def views(self) -> tuple[NodeView, ...]:
        return tuple(n.view() for n in self.nodes.values() if n.usable)


def _shortage(node: Node, ppn: int, mem: int | None, gpus: int = 0) -> str | None:
    """Why ``node`` cannot take ``ppn`` CPUs, ``mem`` KB and ``gpus`` now, or None."""
    if not node.usable:
        return f"node {node.name} is not available"
    if gpus and len(node.free_gpus()) < gpus:
        return f"node {node.name} has fewer than {gpus} free GPUs"
    if len(node.cpus) - len(node.used) < ppn:
        return f"node {node.name} has fewer than {ppn} free CPUs"
    free_mem = node.free_mem_kb()
    if mem is not None and free_mem is not None and free_mem < mem:
        return f"node {node.name} has less than {mem} KB of free memory"
    return None
