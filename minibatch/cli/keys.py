"""``mb keys``: CURVE keys for commands and node daemons on other hosts.

On the server's host (as the cluster's owner, or root)::

    mb keys init                      # the server's keypair (also made at start)
    mb keys show                      # its public key, to give to clients
    mb keys add-user -- NAME KEY      # KEY may connect over tcp as user NAME
    mb keys add-node -- NODE KEY      # KEY may run node NODE's daemon
    mb keys list
    mb keys remove NAME|KEY

On another host (each user, and root for a node daemon)::

    mb keys init --client             # this client's keypair, in $MB_HOME/keys
    mb keys show --client
    mb keys trust -- SERVER_KEY       # the server's public key (from `mb keys show`)

A registration counts for the next connection at once, and a removal within
a second, without restarting the server. See docs/operations.md, "A cluster of
several machines".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from minibatch.cli import common
from minibatch.config import Paths
from minibatch.errors import MinibatchError
from minibatch.net import keys

keys_app = typer.Typer(
    help="CURVE keys: clients and nodes on other hosts (tcp).", no_args_is_help=True
)

ClientFlag = Annotated[
    bool,
    typer.Option("--client", help="This host's client keys ($MB_HOME/keys)."),
]


def _paths() -> Paths:
    return Paths.from_env()


@contextmanager
def _files() -> Iterator[None]:
    """A key file this user may not read or write: one line, no traceback
    (``state/keys`` is the cluster owner's)."""
    try:
        yield
    except OSError as exc:
        raise MinibatchError(f"{exc.filename}: {exc.strerror}") from None


@keys_app.command("init")
def init_command(client: ClientFlag = False) -> None:
    """Make the server's keypair (or with --client this client's); print its
    public key. An existing keypair is kept."""
    with common.reporting("mb keys init"), _files():
        paths = _paths()
        if client:
            public, made = keys.client_keypair(paths.keys)
        else:
            public, made = keys.server_keypair(paths.server_keys)
        typer.echo(public)
        if not made:
            typer.echo("(the keypair existed already; it was kept)", err=True)
        elif client:
            typer.echo(
                "give this key to the server's operator: mb keys add-user -- NAME "
                "KEY (or add-node -- NODE KEY); then run mb keys trust -- SERVER_KEY",
                err=True,
            )


@keys_app.command("show")
def show_command(client: ClientFlag = False) -> None:
    """Print the server's public key (or with --client this client's)."""
    with common.reporting("mb keys show"), _files():
        paths = _paths()
        folder, name = (
            (paths.keys, keys.CLIENT) if client else (paths.server_keys, keys.SERVER)
        )
        if not (folder / f"{name}.key_secret").exists():
            flag = " --client" if client else ""
            common.fail("mb keys show", f"no key in {folder}: run mb keys init{flag}")
        typer.echo(keys.read_keypair(folder, name)[0])


@keys_app.command("trust")
def trust_command(
    server_key: Annotated[str, typer.Argument(help="The server's public key.")],
) -> None:
    """Make this client talk to the server with this public key."""
    with common.reporting("mb keys trust"), _files():
        keys.trust(_paths().keys, server_key)


def _add(kind: str, name: str, key: str) -> None:
    with common.reporting(f"mb keys add-{kind}"), _files():
        entry = keys.Registered(_paths().server_keys).add(kind, name, key)
        typer.echo(f"registered {entry.kind} {entry.name}: {entry.key}")


@keys_app.command("add-user")
def add_user_command(
    name: Annotated[str, typer.Argument(help="A user of this host (not root).")],
    key: Annotated[str, typer.Argument(help="The client's public key.")],
) -> None:
    """Let KEY connect over tcp as user NAME (their jobs run as NAME here)."""
    _add("user", name, key)


@keys_app.command("add-node")
def add_node_command(
    node: Annotated[str, typer.Argument(help="The node's name.")],
    key: Annotated[str, typer.Argument(help="The node daemon's public key.")],
) -> None:
    """Let KEY run the daemon of node NODE (and no other node) over tcp."""
    _add("node", node, key)


@keys_app.command("list")
def list_command() -> None:
    """The keys this server accepts over tcp."""
    with common.reporting("mb keys list"), _files():
        for entry in keys.Registered(_paths().server_keys).entries():
            typer.echo(f"{entry.kind:<5} {entry.name:<16} {entry.key}")


@keys_app.command("remove")
def remove_command(
    what: Annotated[str, typer.Argument(help="A user or node name, or a key.")],
) -> None:
    """Stop accepting the keys of a user or node (or one key); connections
    already made with them are refused from their next request."""
    with common.reporting("mb keys remove"), _files():
        for entry in keys.Registered(_paths().server_keys).remove(what):
            typer.echo(f"removed {entry.kind} {entry.name}: {entry.key}")
