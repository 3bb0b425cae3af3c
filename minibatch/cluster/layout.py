"""Which real CPUs and how much memory each node of a local cluster gets.

Pure functions: the caller passes in what the machine has (the CPU ids this
process may use, the physical memory), so every case can be tested anywhere.

By default nodes get disjoint real cores, because a batch system that promises a
job two CPUs must deliver two CPUs. When a demo asks for more CPUs than the
machine has, ``oversubscribe`` maps the nodes round-robin onto the real cores and
every node is told which of its CPUs another node also uses, so ``pbsnodes`` and
the accounting can say so instead of pretending.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable

import msgspec
import psutil

from minibatch.config import Config
from minibatch.core.units import format_cpu_list, format_size_kb, parse_size_kb
from minibatch.errors import InvalidArgument

#: Node names end up in file names (pid files, logs) and on command lines.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class NodeLayout(msgspec.Struct, frozen=True, kw_only=True):
    """One node: its name, its real CPU ids, and its memory.

    Attributes:
        name: ``node0``, ``node1``, ... or the configured name.
        cpus: Real CPU ids, sorted, distinct.
        shared_cpus: The ids of ``cpus`` that another node also uses.
        mem: Memory limit as a PBS size (``4gb``), or None for no limit.
    """

    name: str
    cpus: list[int]
    shared_cpus: list[int] = []
    mem: str | None = None

    def daemon_args(self) -> list[str]:
        """``mb-node`` arguments: ``--name N --cpus 0,1 [--mem X] [--shared-cpus]``."""
        args = ["--name", self.name, "--cpus", ",".join(map(str, self.cpus))]
        if self.mem:
            args += ["--mem", self.mem]
        if self.shared_cpus:
            args += ["--shared-cpus", ",".join(map(str, self.shared_cpus))]
        return args


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _mark_shared(nodes: list[tuple[str, list[int], str | None]]) -> list[NodeLayout]:
    uses = Counter(cpu for _, cpus, _ in nodes for cpu in cpus)
    return [
        NodeLayout(
            name=name,
            cpus=cpus,
            shared_cpus=[c for c in cpus if uses[c] > 1],
            mem=mem,
        )
        for name, cpus, mem in nodes
    ]


def mem_share(mem_total_kb: int | None, nodes: int) -> str | None:
    """An equal share of ``mem_total_kb`` per node, rounded down, as a PBS size."""
    if mem_total_kb is None or mem_total_kb <= 0:
        return None
    # Rounded down to whole megabytes (never promise more than exists), and shown
    # in gigabytes when that is exact: "4gb" reads better than "4096mb".
    kb = mem_total_kb // nodes
    mb = kb // 1024
    if mb == 0:
        return f"{kb}kb"
    return f"{mb // 1024}gb" if mb % 1024 == 0 else f"{mb}mb"


def plan_nodes(
    nodes: int,
    cpus_per_node: int,
    available: Iterable[int],
    oversubscribe: bool,
    mem_total_kb: int | None,
) -> list[NodeLayout]:
    """Lay out ``nodes`` nodes of ``cpus_per_node`` CPUs on the given real CPUs.

    Args:
        nodes: Number of nodes, named ``node0`` ... ``node{nodes-1}``.
        cpus_per_node: CPUs each node gets.
        available: Real CPU ids this machine lets us use (e.g. the affinity mask).
        oversubscribe: Allow nodes to share cores when there are too few.
        mem_total_kb: Physical memory to split equally; None gives no limits.

    Returns:
        One layout per node. Without oversubscription the CPU sets are disjoint
        and taken in increasing id order.

    Raises:
        InvalidArgument: Non-positive counts, no CPUs, or more CPUs asked for
            than exist without ``oversubscribe``, or more CPUs for one node than
            the machine has (a node cannot hold the same core twice).
    """
    real = sorted(set(available))
    if nodes < 1:
        raise InvalidArgument(f"a cluster needs at least one node, not {nodes}")
    if cpus_per_node < 1:
        raise InvalidArgument(f"a node needs at least one CPU, not {cpus_per_node}")
    if not real:
        raise InvalidArgument("no CPUs available to lay nodes out on")
    need = nodes * cpus_per_node
    mem = mem_share(mem_total_kb, nodes)
    if need <= len(real):
        return [
            NodeLayout(
                name=f"node{i}",
                cpus=real[i * cpus_per_node : (i + 1) * cpus_per_node],
                mem=mem,
            )
            for i in range(nodes)
        ]
    if not oversubscribe:
        raise InvalidArgument(
            f"{_plural(nodes, 'node')} x {_plural(cpus_per_node, 'CPU')} need "
            f"{need} CPUs but this machine has {len(real)} "
            "(use --oversubscribe to share cores)"
        )
    if cpus_per_node > len(real):
        raise InvalidArgument(
            f"a node of {cpus_per_node} CPUs needs {cpus_per_node} distinct cores "
            f"but this machine has {len(real)}, even with --oversubscribe "
            "(ask for more nodes with fewer CPUs each)"
        )
    # Slot k of the cluster runs on core k mod n: consecutive slots are distinct
    # cores, so no node gets a core twice, and every core carries either
    # floor(need/n) or ceil(need/n) slots: the load is as even as it can be.
    planned = [
        (
            f"node{i}",
            sorted(
                real[k % len(real)]
                for k in range(i * cpus_per_node, (i + 1) * cpus_per_node)
            ),
            mem,
        )
        for i in range(nodes)
    ]
    return _mark_shared(planned)


def from_config(
    config: Config,
    available: Iterable[int] | None = None,
    mem_total_kb: int | None = None,
) -> list[NodeLayout]:
    """The layout of the ``[[nodes]]`` of ``config``, validated.

    Args:
        config: A configuration with ``nodes`` set.
        available: Real CPU ids of this machine; default :func:`usable_cpus`.
        mem_total_kb: Physical memory; when given, configured memory beyond it
            is refused.

    Returns:
        One layout per configured node, in configuration order, with the CPUs
        shared between nodes marked.

    Raises:
        InvalidArgument: No nodes, a bad or duplicate name, an empty or repeated
            CPU list, a CPU id this machine does not have or two nodes on one
            CPU (both allowed with ``oversubscribe``), or a malformed memory size.
    """
    if not config.nodes:
        raise InvalidArgument("the configuration has no [[nodes]]")
    real = set(usable_cpus() if available is None else available)
    seen: set[str] = set()
    owner: dict[int, str] = {}
    planned: list[tuple[str, list[int], str | None]] = []
    for node in config.nodes:
        if not _NAME.match(node.name):
            raise InvalidArgument(
                f"bad node name {node.name!r} (letters, digits, '_', '.', '-')"
            )
        if node.name in seen:
            raise InvalidArgument(f"node {node.name!r} is configured twice")
        seen.add(node.name)
        if not node.cpus:
            raise InvalidArgument(f"node {node.name!r} has no CPUs")
        if len(set(node.cpus)) != len(node.cpus):
            raise InvalidArgument(f"node {node.name!r} lists a CPU twice: {node.cpus}")
        if min(node.cpus) < 0:
            raise InvalidArgument(f"node {node.name!r} has a negative CPU id")
        if not config.oversubscribe:
            missing = sorted(set(node.cpus) - real)
            if missing:
                raise InvalidArgument(
                    f"node {node.name!r} uses CPU {', '.join(map(str, missing))} "
                    f"but this machine has only {sorted(real)} "
                    "(set oversubscribe = true to allow it)"
                )
            for cpu in node.cpus:
                if cpu in owner:
                    raise InvalidArgument(
                        f"nodes {owner[cpu]!r} and {node.name!r} both use CPU {cpu} "
                        "(set oversubscribe = true to share cores)"
                    )
                owner[cpu] = node.name
        if node.mem is not None:
            kb = parse_size_kb(node.mem)
            if mem_total_kb is not None and kb > mem_total_kb:
                raise InvalidArgument(
                    f"node {node.name!r} has mem = {node.mem!r} but this machine "
                    f"has {format_size_kb(mem_total_kb)}"
                )
        planned.append((node.name, sorted(node.cpus), node.mem))
    return _mark_shared(planned)


def encode(layout: list[NodeLayout]) -> bytes:
    """JSON for ``run/layout.json``."""
    return msgspec.json.encode({"nodes": layout})


def decode(data: bytes) -> list[NodeLayout]:
    """The inverse of :func:`encode`.

    Raises:
        InvalidArgument: ``data`` is not a layout.
    """
    try:
        return msgspec.json.decode(data, type=dict[str, list[NodeLayout]])["nodes"]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        raise InvalidArgument(f"malformed layout: {exc}") from exc


def usable_cpus() -> list[int]:
    """The CPU ids this process may run on (its affinity mask), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def physical_mem_kb() -> int:
    """Total physical memory in KiB."""
    return int(psutil.virtual_memory().total // 1024)


def layout_for_up(
    config: Config,
    nodes: int | None,
    cpus_per_node: int | None,
    oversubscribe: bool,
    running: list[NodeLayout] | None,
) -> list[NodeLayout]:
    """The layout ``mb up`` starts: a running cluster's own (``running``, the
    layout it was started with) so that only what is missing starts again, with
    the CPUs it had; else :func:`choose_layout`.

    Raises:
        InvalidArgument: flags asking for another layout than the running one.
    """
    flags = nodes is not None or cpus_per_node is not None or oversubscribe
    if running is None:
        return choose_layout(config, nodes, cpus_per_node, oversubscribe)
    if flags and choose_layout(config, nodes, cpus_per_node, oversubscribe) != running:
        shape = ", ".join(f"{n.name}: CPUs {format_cpu_list(n.cpus)}" for n in running)
        raise InvalidArgument(
            f"the cluster is running with another layout ({shape}); "
            "run mb up without flags to start what is missing, or mb down first"
        )
    return running


def choose_layout(
    config: Config,
    nodes: int | None,
    cpus_per_node: int | None,
    oversubscribe: bool,
) -> list[NodeLayout]:
    """The layout ``mb up`` starts: from its flags, else the config, else one node.

    Flags win over ``[[nodes]]`` in the config; with neither, the cluster is one
    node holding every CPU this process may use.
    """
    for flag, value in (("--nodes", nodes), ("--cpus-per-node", cpus_per_node)):
        if value is not None and value < 1:
            raise InvalidArgument(f"{flag} must be at least 1, got {value}")
    share = oversubscribe or config.oversubscribe
    cpus = usable_cpus()
    if nodes is not None or cpus_per_node is not None:
        count = nodes or 1
        per_node = cpus_per_node or max(1, len(cpus) // count)
        return plan_nodes(count, per_node, cpus, share, physical_mem_kb())
    if config.nodes:
        return from_config(config, cpus, physical_mem_kb())
    return plan_nodes(1, len(cpus), cpus, share, physical_mem_kb())
