"""``pbsnodes``: show nodes, or take them offline and back.

    pbsnodes [-a] [--json] [NODE...]     one Torque-style block per node
    pbsnodes -l                          the nodes that are down or offline
    pbsnodes -o NODE... [-N COMMENT]     mark nodes offline (running jobs go on)
    pbsnodes -c NODE...                  clear the offline mark

Changing a node's state is for operators; the server checks who asks.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, noderender
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}


def pbsnodes_command(
    nodes: Annotated[
        list[str] | None,
        typer.Argument(help="Node names (default: all).", show_default=False),
    ] = None,
    # Torque spelling of the default; accepted so scripts keep working.
    all_nodes: Annotated[
        bool, typer.Option("-a", help="All nodes (the default).")
    ] = False,
    list_down: Annotated[
        bool, typer.Option("-l", help="List the nodes that are down or offline.")
    ] = False,
    offline: Annotated[bool, typer.Option("-o", help="Mark NODEs offline.")] = False,
    clear: Annotated[
        bool, typer.Option("-c", "-r", help="Clear the offline mark of NODEs.")
    ] = False,
    comment: Annotated[
        str | None, typer.Option("-N", help="Comment to record with -o.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list of nodes.")
    ] = False,
) -> None:
    """Show the cluster's nodes, or mark them offline (-o) and back (-c)."""
    names = list(nodes or [])
    with common.reporting("pbsnodes"):
        if offline and clear:
            raise InvalidArgument("-o and -c cannot be used together")
        if (offline or clear) and not names:
            raise InvalidArgument(
                f"{'-o' if offline else '-c'} needs at least one node"
            )
        if comment is not None and not offline:
            raise InvalidArgument("-N is only used with -o")
        from minibatch.protocol.messages import QueryNodes, SetNodeOffline

        if offline or clear:
            request = SetNodeOffline(
                names=names, offline=offline, comment=comment or ""
            )
            common.call(request)
            return
        found = common.call(QueryNodes(names=names)).nodes
    found.sort(key=lambda n: n.name)
    if as_json:
        sys.stdout.write(common.dump_json([noderender.node_record(n) for n in found]))
    elif list_down:
        sys.stdout.write(noderender.pbsnodes_list(found))
    else:
        sys.stdout.write(noderender.pbsnodes_full(found))
    missing = [n for n in names if n not in {f.name for f in found}]
    for name in missing:
        print(f"pbsnodes: Unknown node {name}", file=sys.stderr)
    if missing:
        raise SystemExit(common.ERROR_EXIT)


def main() -> None:
    """The ``pbsnodes`` entry point."""
    common.script(pbsnodes_command, "pbsnodes", context_settings=CONTEXT_SETTINGS)
