"""Which CPUs and how much memory each node of a local cluster gets.

Pure functions: the caller passes in what the machine has (the CPU ids this
process may use, the physical memory), so every case can be tested anywhere.

By default nodes get disjoint real cores, because a batch system that promises a
job two CPUs must deliver two CPUs. When a demo asks for more CPUs than the
machine has, ``oversubscribe`` gives the nodes *virtual* CPUs: each node numbers
its CPUs 0..N-1, as a node of a real cluster does, and every virtual CPU is
carried by one real core (round-robin, so the cores carry equal loads and a
node's consecutive CPUs are on distinct cores). The node daemon binds a job to
the real cores behind its virtual CPUs, and every node is told which of its CPUs
share a core with another node's, so ``pbsnodes`` and the accounting can say so
instead of pretending.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable

import msgspec

from minibatch.config import Config
from minibatch.core.units import (
    format_cpu_list,
    format_size_kb,
    parse_size_kb,
)
from minibatch.errors import InvalidArgument

#: Node names end up in file names (pid files, logs) and on command lines.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class NodeLayout(msgspec.Struct, frozen=True, kw_only=True):
    """One node: its name, its CPU ids, the real cores behind them, its memory.

    Attributes:
        name: ``node0``, ``node1``, ... or the configured name.
        cpus: The node's CPU ids as the batch system sees them, sorted, distinct.
        real_cpus: The real core carrying each CPU of ``cpus`` (aligned with
            it) when they are virtual; empty when ``cpus`` are real ids.
        shared_cpus: The ids of ``cpus`` whose real core another node also uses.
        mem: Memory limit as a PBS size (``4gb``), or None for no limit.
    """

    name: str
    cpus: list[int]
    real_cpus: list[int] = []
    shared_cpus: list[int] = []
    mem: str | None = None

    def __post_init__(self) -> None:
        # Raised as a validation error when run/layout.json is decoded.
        if self.real_cpus and len(self.real_cpus) != len(self.cpus):
            raise ValueError(
                f"node {self.name} has {_plural(len(self.real_cpus), 'real core')} "
                f"for {_plural(len(self.cpus), 'CPU')}"
            )

    def real_map(self) -> dict[int, int]:
        """CPU id -> the real core that runs it (empty: each id is its own)."""
        if not self.real_cpus:
            return {}
        return dict(zip(self.cpus, self.real_cpus, strict=True))

    def daemon_args(self) -> list[str]:
        """``mb-node`` arguments: ``--name N --cpus 0,1 [--real-cpus 0,0]
        [--mem X] [--shared-cpus 0,1]``."""
        args = ["--name", self.name, "--cpus", ",".join(map(str, self.cpus))]
        if self.real_cpus:
            args += ["--real-cpus", ",".join(map(str, self.real_cpus))]
        if self.mem:
            args += ["--mem", self.mem]
        if self.shared_cpus:
            args += ["--shared-cpus", ",".join(map(str, self.shared_cpus))]
        return args


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def carried(real: dict[int, int]) -> dict[int, list[int]]:
    """Real core -> the virtual CPUs it carries, from CPU -> core."""
    cores: dict[int, list[int]] = {}
    for cpu, core in sorted(real.items()):
        cores.setdefault(core, []).append(cpu)
    return cores


def virtual_note(real: dict[int, int]) -> str:
    """``virtual CPUs 0-3 on real cores 0-1 (0,2 on core 0; 1,3 on core 1)``."""
    cores = carried(real)
    each = "; ".join(
        f"{format_cpu_list(v)} on core {core}" for core, v in sorted(cores.items())
    )
    return (
        f"virtual CPUs {format_cpu_list(sorted(real))} on real cores "
        f"{format_cpu_list(sorted(cores))} ({each})"
    )


def _mark_shared(
    nodes: list[tuple[str, list[int], list[int], str | None]],
) -> list[NodeLayout]:
    """Layouts of (name, CPU ids, their real cores or [], mem), each with the
    CPUs whose core another node also uses marked shared."""
    users: dict[int, set[str]] = {}
    for name, cpus, real, _ in nodes:
        for core in real or cpus:
            users.setdefault(core, set()).add(name)
    return [
        NodeLayout(
            name=name,
            cpus=cpus,
            real_cpus=real,
            shared_cpus=[
                cpu
                for cpu, core in zip(cpus, real or cpus, strict=True)
                if len(users[core]) > 1
            ],
            mem=mem,
        )
        for name, cpus, real, mem in nodes
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
        oversubscribe: Give the nodes virtual CPUs when there are too few cores.
        mem_total_kb: Physical memory to split equally; None gives no limits.

    Returns:
        One layout per node. When the cores suffice, the nodes get disjoint real
        CPU ids in increasing order. Else (with ``oversubscribe``) every node
        gets the virtual CPUs ``0..cpus_per_node-1`` on real cores round-robin.

    Raises:
        InvalidArgument: Non-positive counts, no CPUs, or more CPUs asked for
            than exist without ``oversubscribe``.
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
            "(use --oversubscribe to give the nodes virtual CPUs)"
        )
    # Slot k of the cluster runs on core k mod n: every core carries either
    # floor(need/n) or ceil(need/n) slots, the load as even as it can be, and any
    # n consecutive CPUs of a node are on n distinct cores, so a job given
    # consecutive CPUs (the server hands out the lowest free ones) gets as many
    # distinct cores as it has CPUs, up to n.
    planned = [
        (
            f"node{i}",
            list(range(cpus_per_node)),
            [real[(i * cpus_per_node + v) % len(real)] for v in range(cpus_per_node)],
            mem,
        )
        for i in range(nodes)
    ]
    return _mark_shared(planned)


def _carry_virtual(
    nodes: list[tuple[str, list[int]]], real: list[int]
) -> dict[str, list[int]]:
    """The real core of each CPU of the nodes (name, CPU ids) that name CPUs the
    machine lacks; nodes on real ids only are left out.

    A CPU id the machine has is its own core; the others take the cores in turn,
    each the least loaded one (counting every node's CPUs), the next in the turn
    among equals. When no id is real this is :func:`plan_nodes`' round-robin.
    """
    have = set(real)
    load = Counter(c for _, cpus in nodes for c in cpus if c in have)
    turn = 0
    carried: dict[str, list[int]] = {}
    for name, cpus in nodes:
        if have.issuperset(cpus):
            continue
        cores = []
        for cpu in cpus:
            if cpu in have:
                cores.append(cpu)
                continue
            # min() keeps the first of equals: the next core in the turn.
            core = min(real[turn:] + real[:turn], key=load.__getitem__)
            load[core] += 1
            turn = (real.index(core) + 1) % len(real)
            cores.append(core)
        carried[name] = cores
    return carried


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
        shared between nodes marked. With ``oversubscribe``, the CPU ids this
        machine does not have are virtual, on real cores round-robin (see
        :func:`_carry_virtual`); the ids it has are their own cores.

    Raises:
        InvalidArgument: No nodes, a bad or duplicate name, an empty or repeated
            CPU list, a CPU id this machine does not have or two nodes on one
            CPU (both allowed with ``oversubscribe``), no CPUs to carry virtual
            ones, or a malformed memory size.
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
                    f"but this machine has only CPUs {format_cpu_list(sorted(real))} "
                    "(set oversubscribe = true to make such CPUs virtual)"
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
    virtual = [n for n, cpus, _ in planned if not real.issuperset(cpus)]
    if virtual and not real:
        raise InvalidArgument(
            f"no CPUs available to carry the virtual CPUs of {', '.join(virtual)}"
        )
    carried = _carry_virtual([(n, cpus) for n, cpus, _ in planned], sorted(real))
    return _mark_shared(
        [(n, cpus, carried.get(n, []), mem) for n, cpus, mem in planned]
    )


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
    # Imported here: the commands that render nodes import this module too.
    import psutil

    return int(psutil.virtual_memory().total // 1024)


def layout_for_up(
    config: Config,
    nodes: int | None,
    cpus_per_node: int | None,
    oversubscribe: bool,
    running: list[NodeLayout] | None,
    last: list[NodeLayout] | None = None,
) -> list[NodeLayout]:
    """The layout ``mb up`` starts: a running cluster's own (``running``, the
    layout it was started with) so that only what is missing starts again, with
    the CPUs it had; a stopped cluster started again without flags (and without
    ``[[nodes]]`` in the config), the one it last ran with (``last``), while this
    machine still has its cores: the jobs it queued were admitted for those
    nodes, and would wait for ever for a node that never comes back; else
    :func:`choose_layout`.

    Raises:
        InvalidArgument: flags asking for another layout than the running one.
    """
    flags = nodes is not None or cpus_per_node is not None or oversubscribe
    if running is None:
        if not flags and not config.nodes and last and _cores_here(last):
            return last
        return choose_layout(config, nodes, cpus_per_node, oversubscribe)
    if flags and choose_layout(config, nodes, cpus_per_node, oversubscribe) != running:
        shape = ", ".join(
            f"{n.name}: {'virtual ' if n.real_cpus else ''}CPUs "
            f"{format_cpu_list(n.cpus)}"
            for n in running
        )
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


def _cores_here(layout: list[NodeLayout]) -> bool:
    """Whether every core ``layout`` runs on may be used by this process."""
    usable = set(usable_cpus())
    return all(set(n.real_cpus or n.cpus) <= usable for n in layout)
