"""``sinfo``: the nodes by partition and state, as Slurm's sinfo shows them.

    sinfo [-N] [-l] [-s] [-R] [-h] [-p PARTITIONS] [-n NODES] [-t STATES]
          [-o '%P %.5a %.10l %.6D %.6t %N']

A partition is a queue (``qstat -Q``): every queue holds every node, so a
cluster with the one default queue shows one partition, named with a ``*``.
Its AVAIL is ``up`` when the queue takes and starts jobs, ``inact`` when it
takes them but starts none, ``down`` otherwise; TIMELIMIT is its longest
walltime. A node's state is Slurm's: ``idle`` (no job), ``mix`` (some CPUs
free), ``alloc`` (none free), ``down*`` (its daemon does not answer), ``drain``
(offline, ``pbsnodes -o``) or ``drng`` (offline with jobs still running).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, slurmfmt, squeuefmt
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer

    from minibatch.protocol.messages import NodeInfo, QueueInfo
else:
    from minibatch.cli.fastargs import typer

#: ``-h`` is --noheader, as in Slurm: help is --help only.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}
STATES = ("idle", "mix", "alloc", "down*", "drain", "drng")


def node_state(node: NodeInfo) -> str:
    """Slurm's short state of ``node`` (see the module docstring)."""
    if node.state == "offline":
        return "drng" if node.jobs else "drain"
    if node.state in ("down", "unknown"):
        return "down*"
    if not node.jobs:
        return "idle"
    return "alloc" if not node.free_cpus else "mix"


def avail(queue: QueueInfo) -> str:
    if queue.enabled and queue.started:
        return "up"
    return "inact" if queue.enabled else "down"


def time_limit(queue: QueueInfo) -> str:
    if queue.max_walltime is None:
        return "infinite"
    return slurmfmt.clock(queue.max_walltime)


def partition(queue: QueueInfo) -> str:
    return queue.name + ("*" if queue.default else "")


#: The long state names (``-l``, Slurm's ``%T``).
LONG_STATES = {
    "idle": "idle",
    "mix": "mixed",
    "alloc": "allocated",
    "down*": "down*",
    "drain": "drained",
    "drng": "draining",
}

#: A column: its header and Slurm's width (None: as wide as its widest value;
#: negative: left-aligned). The last column is never padded.
Column = tuple[str, int | None]


def _by_state(nodes: Sequence[NodeInfo]) -> list[tuple[str, list[str]]]:
    """Node names per state, in Slurm's order of states."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(node_state(node), []).append(node.name)
    rank = {s: i for i, s in enumerate(STATES)}
    return sorted(groups.items(), key=lambda kv: rank.get(kv[0], len(rank)))


def _lines(columns: Sequence[Column], rows: list[list[str]], header: bool) -> str:
    """Rows in Slurm's fixed widths (``%.6D`` is 6 wide, right-aligned)."""
    cells = [[h for h, _ in columns], *rows] if header else rows
    specs = []
    for i, (_, width) in enumerate(columns):
        if width is None:
            specs.append(f"<{max((len(r[i]) for r in cells), default=0)}")
        else:
            specs.append(f"<{-width}" if width < 0 else f">{width}")
    specs[-1] = ""
    return "".join(
        " ".join(f"{c:{spec}}" for c, spec in zip(r, specs, strict=True)).rstrip()
        + "\n"
        for r in cells
    )


def render(
    queues: Sequence[QueueInfo],
    nodes: Sequence[NodeInfo],
    *,
    node_oriented: bool = False,
    long: bool = False,
    summarize: bool = False,
    header: bool = True,
) -> str:
    """The default layout, ``-N``, ``-l`` (with either) or ``-s``."""
    rows: list[list[str]] = []
    columns: list[Column]
    if node_oriented:
        columns = [("NODELIST", None), ("NODES", 6), ("PARTITION", None)]
        if long:
            columns += [("STATE", -11), ("CPUS", 4), ("S:C:T", 8), ("MEMORY", 6)]
            columns += [("TMP_DISK", 8), ("WEIGHT", 6), ("AVAIL_FE", 8)]
            columns += [("REASON", None)]
        else:
            columns += [("STATE", None)]
        for node in nodes:
            for q in queues:
                state = node_state(node)
                row = [node.name, "1", partition(q)]
                if long:
                    mem = 1 if node.mem_kb is None else node.mem_kb // 1024
                    row += [LONG_STATES.get(state, state), str(len(node.cpus))]
                    row += [f"1:{len(node.cpus)}:1", str(mem), "0", "1"]
                    row += [",".join(node.features) or "(null)", node.comment or "none"]
                else:
                    row.append(state)
                rows.append(row)
        return _lines(columns, rows, header)
    if summarize:
        columns = [("PARTITION", None), ("AVAIL", 5), ("TIMELIMIT", 10)]
        columns += [("NODES(A/I/O/T)", 16), ("NODELIST", None)]
        states = [node_state(n) for n in nodes]
        busy = sum(s in ("mix", "alloc") for s in states)
        idle = states.count("idle")
        counts = f"{busy}/{idle}/{len(states) - busy - idle}/{len(states)}"
        hosts = slurmfmt.compress_hostlist(n.name for n in nodes)
        for q in queues:
            rows.append([partition(q), avail(q), time_limit(q), counts, hosts])
        return _lines(columns, rows, header)
    columns = [("PARTITION", None), ("AVAIL", 5), ("TIMELIMIT", 10)]
    if long:
        columns += [("JOB_SIZE", 10), ("ROOT", 4), ("OVERSUBS", 8), ("GROUPS", 10)]
        columns += [("NODES", 6), ("STATE", 11), ("NODELIST", None)]
    else:
        columns += [("NODES", 6), ("STATE", 6), ("NODELIST", None)]
    for q in queues:
        for state, names in _by_state(nodes):
            row = [partition(q), avail(q), time_limit(q)]
            if long:
                row += ["1-infinite", "no", "NO", "all" if not q.users else "some"]
                state = LONG_STATES.get(state, state)
            rows.append(
                [*row, str(len(names)), state, slurmfmt.compress_hostlist(names)]
            )
    return _lines(columns, rows, header)


@dataclass(frozen=True)
class Group:
    """One line of ``sinfo -o``: a partition's nodes in one state (or, with
    ``-N``, one node)."""

    queue: QueueInfo
    state: str
    nodes: list[NodeInfo]


def _counts(states: list[str]) -> str:
    busy = sum(s in ("mix", "alloc") for s in states)
    idle = states.count("idle")
    return f"{busy}/{idle}/{len(states) - busy - idle}/{len(states)}"


def _cpu_counts(nodes: list[NodeInfo]) -> str:
    total = sum(len(n.cpus) for n in nodes)
    up = [n for n in nodes if node_state(n) not in ("down*", "drain", "drng")]
    idle = sum(len(n.free_cpus) for n in up)
    busy = sum(len(n.cpus) - len(n.free_cpus) for n in up)
    return f"{busy}/{idle}/{total - busy - idle}/{total}"


#: ``-o`` letters: header, value of a group.
FIELDS: dict[str, tuple[str, Callable[[Group], str]]] = {
    "P": ("PARTITION", lambda g: partition(g.queue)),
    "R": ("PARTITION", lambda g: g.queue.name),
    "a": ("AVAIL", lambda g: avail(g.queue)),
    "l": ("TIMELIMIT", lambda g: time_limit(g.queue)),
    "D": ("NODES", lambda g: str(len(g.nodes))),
    "t": ("STATE", lambda g: g.state),
    "T": ("STATE", lambda g: LONG_STATES.get(g.state, g.state)),
    "N": ("NODELIST", lambda g: slurmfmt.compress_hostlist(n.name for n in g.nodes)),
    "n": ("HOSTNAMES", lambda g: slurmfmt.compress_hostlist(n.name for n in g.nodes)),
    "c": ("CPUS", lambda g: str(max(len(n.cpus) for n in g.nodes))),
    "C": ("CPUS(A/I/O/T)", lambda g: _cpu_counts(g.nodes)),
    "F": ("NODES(A/I/O/T)", lambda g: _counts([node_state(n) for n in g.nodes])),
    "m": ("MEMORY", lambda g: str(min((n.mem_kb or 1024) // 1024 for n in g.nodes))),
    "f": ("AVAIL_FEATURES", lambda g: ",".join(g.nodes[0].features) or "(null)"),
    "E": ("REASON", lambda g: g.nodes[0].comment or "none"),
}


def formatted(
    spec: str,
    queues: Sequence[QueueInfo],
    nodes: Sequence[NodeInfo],
    node_oriented: bool = False,
    header: bool = True,
) -> str:
    """``-o``: a line per partition and state (per node with ``-N``)."""
    items = squeuefmt.parse_format(spec, FIELDS, "node")
    if node_oriented:
        groups = [Group(q, node_state(n), [n]) for n in nodes for q in queues]
    else:
        groups = [
            Group(q, state, [n for n in nodes if n.name in names])
            for q in queues
            for state, names in _by_state(nodes)
        ]

    def value_of(group: Group) -> Callable[[squeuefmt.Field], str]:
        return lambda f: FIELDS[f.letter][1](group)

    lines = [squeuefmt.format_line(items, lambda f: FIELDS[f.letter][0])]
    lines = lines if header else []
    lines += [squeuefmt.format_line(items, value_of(g)) for g in groups]
    return "".join(line + "\n" for line in lines)


def wanted_states(text: str) -> set[str]:
    """``-t``: short or long names (``drain`` also means draining, as in
    Slurm); an unknown one is refused."""
    names = {**{s: s for s in STATES}, **{v: k for k, v in LONG_STATES.items()}}
    names.update({"down": "down*", "allocated": "alloc", "mixed": "mix"})
    out: set[str] = set()
    for word in text.lower().split(","):
        state = names.get(word.strip().rstrip("*"))
        if state is None:
            raise InvalidArgument(f"Bad state string {word.strip()!r}")
        out |= {state, "drng"} if state == "drain" else {state}
    return out


def reasons(nodes: Sequence[NodeInfo], header: bool = True) -> str:
    """``-R``: why nodes are down or drained, as Slurm lists them."""
    rows = []
    for node in nodes:
        state = node_state(node)
        if state in ("down*", "drain", "drng"):
            why = node.comment or ("Not responding" if state == "down*" else "none")
            rows.append([why, "root", "Unknown", node.name])
    columns: list[Column] = [("REASON", -20), ("USER", -9), ("TIMESTAMP", -19)]
    return _lines([*columns, ("NODELIST", None)], rows, header)


def sinfo_command(
    node_oriented: Annotated[
        bool, typer.Option("-N", "--Node", help="A line per node.")
    ] = False,
    long: Annotated[bool, typer.Option("-l", "--long", help="More columns.")] = False,
    summarize: Annotated[
        bool, typer.Option("-s", "--summarize", help="Node counts per partition.")
    ] = False,
    list_reasons: Annotated[
        bool, typer.Option("-R", "--list-reasons", help="Why nodes are down.")
    ] = False,
    noheader: Annotated[
        bool, typer.Option("-h", "--noheader", help="No header.")
    ] = False,
    partitions: Annotated[
        str | None, typer.Option("-p", "--partition", help="Partitions (comma list).")
    ] = None,
    node_names: Annotated[
        str | None, typer.Option("-n", "--nodes", help="Nodes (node[0-3],gpu1).")
    ] = None,
    states: Annotated[
        str | None, typer.Option("-t", "--states", help="States: idle,mix,alloc,...")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("-o", "--format", help="Fields: '%P %.6t %N'.")
    ] = None,
) -> None:
    """Show the nodes by partition and state, as Slurm's sinfo."""
    from minibatch.protocol.messages import QueryNodes, QueryQueues

    with common.reporting("sinfo: error"):
        queues: list[Any] = common.call(QueryQueues()).queues
        nodes: list[Any] = list(common.call(QueryNodes()).nodes)
        if partitions:
            wanted = [p.strip() for p in partitions.split(",") if p.strip()]
            unknown = set(wanted) - {q.name for q in queues}
            if unknown:
                raise InvalidArgument(f"invalid partition name {sorted(unknown)[0]}")
            queues = [q for q in queues if q.name in wanted]
        if node_names:
            named = set(slurmfmt.expand_hostlist(node_names))
            nodes = [n for n in nodes if n.name in named]
        if states:
            allowed = wanted_states(states)
            nodes = [n for n in nodes if node_state(n) in allowed]
        if fmt is not None:
            text = formatted(fmt, queues, nodes, node_oriented, not noheader)
        elif list_reasons:
            text = reasons(nodes, header=not noheader)
        else:
            text = render(
                queues,
                nodes,
                node_oriented=node_oriented,
                long=long,
                summarize=summarize,
                header=not noheader,
            )
        if long and not noheader:
            text = time.strftime("%a %b %d %H:%M:%S %Y\n") + text
        print(text, end="")


def main() -> None:
    common.script(sinfo_command, "sinfo", context_settings=CONTEXT_SETTINGS)
