"""``pbsnodes`` layouts: Torque's node states, blocks and list, and the JSON
record, built from :class:`NodeInfo` records (tested from hand-built ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minibatch.core.units import format_cpu_list
from minibatch.protocol.messages import NodeInfo

_UP_STATES = frozenset({"up", "free", "idle", "busy", "online", "mixed", "allocated"})


def node_state(node: NodeInfo) -> str:
    """Torque's node state: free, job-exclusive (no free CPU), down or offline."""
    if node.state not in _UP_STATES:
        return node.state
    return "job-exclusive" if node.jobs and not node.free_cpus else "free"


def _node_jobs(node: NodeInfo) -> str:
    pairs = sorted((cpu, job) for job, cpus in node.jobs.items() for cpu in cpus)
    return ", ".join(f"{cpu}/{job}" for cpu, job in pairs)


def pbsnodes_full(nodes: Sequence[NodeInfo]) -> str:
    """``pbsnodes -a``: one Torque-style block per node."""
    blocks = []
    for node in nodes:
        state = node_state(node)
        status = [
            f"ncpus={len(node.cpus)}",
            f"availcpus={format_cpu_list(node.free_cpus)}",
        ]
        if node.last_heartbeat is not None:
            status.insert(0, f"rectime={int(node.last_heartbeat)}")
        if node.mem_kb is not None:
            status.append(f"physmem={node.mem_kb}kb")
        status += [f"state={state}", f"jobs={' '.join(map(str, sorted(node.jobs)))}"]
        if node.pid is not None:
            status.append(f"pid={node.pid}")
        lines = [
            node.name,
            f"     state = {state}",
            f"     np = {len(node.cpus)}",
            f"     cpus = {format_cpu_list(node.cpus)}",
            *(
                [f"     properties = {','.join(node.features)}"]
                if node.features
                else []
            ),
            "     ntype = cluster",
            f"     jobs = {_node_jobs(node)}".rstrip(),
            f"     status = {','.join(status)}",
        ]
        if node.gpus:
            lines.append(f"     gpus = {node.gpus}")
        if node.comment:
            lines.append(f"     note = {node.comment}")
        # Imported here: only pbsnodes needs the layouts.
        from minibatch.cluster.layout import carried

        if cores := carried(node.real_cpus):
            each = "; ".join(
                f"{format_cpu_list(cpus)} on core {core}"
                for core, cpus in sorted(cores.items())
            )
            lines.append(
                f"     virtual = CPUs {format_cpu_list(node.cpus)} are virtual, "
                f"carried by real cores {format_cpu_list(list(cores))}: {each}"
            )
        if node.shared_cpus:
            shared = ",".join(map(str, sorted(node.shared_cpus)))
            lines.append(
                f"     oversubscribed = CPUs {shared} are shared with other nodes"
            )
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def pbsnodes_list(nodes: Sequence[NodeInfo]) -> str:
    """``pbsnodes -l``: the nodes that are down or offline, with their comment."""
    lines = [
        f"{n.name:<20} {node_state(n):<15} {n.comment}".rstrip()
        for n in nodes
        if node_state(n) not in ("free", "job-exclusive")
    ]
    return "".join(line + "\n" for line in lines)


def node_record(node: NodeInfo) -> dict[str, Any]:
    """The JSON object ``pbsnodes --json`` prints for a node."""
    from minibatch.cluster.layout import carried

    return {
        "name": node.name,
        "state": node_state(node),
        "server_state": node.state,
        "np": len(node.cpus),
        "cpus": list(node.cpus),
        "free_cpus": list(node.free_cpus),
        "mem_kb": node.mem_kb,
        "jobs": {str(job): list(cpus) for job, cpus in sorted(node.jobs.items())},
        "shared_cpus": list(node.shared_cpus),
        "oversubscribed": bool(node.shared_cpus),
        # Real core -> the virtual CPUs it carries; {} when the CPUs are real.
        "real_cores": {str(c): v for c, v in carried(node.real_cpus).items()},
        "comment": node.comment,
        "last_heartbeat": node.last_heartbeat,
        "pid": node.pid,
    }
