"""The commands' socket on the server's host: where it is and how it frames.

A command lives for one request, and importing pyzmq and starting its context
was a third of its time (docs/benchmarks.md, "Commands"). So, like Flux's local
connector, the commands on the server's host speak over a plain unix stream
socket beside the server's ipc endpoint: each message is a 4-byte big-endian
length and then the same encoded envelope the ROUTER carries. The server reads
the peer's credentials from the socket (``SO_PEERCRED``) as it accepts it.
The daemons keep the ROUTER: its reconnects, its queues, CURVE over tcp.

Only the framing and the path live here, so that a command imports nothing
else for them: the server's side is :mod:`minibatch.net.local`, the client's
:class:`minibatch.net.client.Client`.
"""

from __future__ import annotations

import os
import struct

from minibatch.errors import InvalidArgument

#: Each message's length, in front of it.
HEADER = struct.Struct(">I")
#: What replaces ``.sock`` in the ipc endpoint's file name (or is added to it).
SUFFIX = ".commands"
#: The longest path a unix socket may have on Linux (``sun_path`` less its NUL).
MAX_PATH = 107


def command_path(endpoint: str) -> str | None:
    """The commands' socket of the server bound to ``endpoint``: beside its ipc
    socket (``run/server.sock`` -> ``run/server.commands``); None for tcp."""
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://") :]
    return path.removesuffix(".sock") + SUFFIX


def check_path(path: str) -> None:
    """Refuse a socket path the kernel cannot bind, naming it (a deep
    ``MB_HOME``): binding would fail with a bare "AF_UNIX path too long"."""
    size = len(os.fsencode(path))
    if size > MAX_PATH:
        raise InvalidArgument(
            f"the socket path {path} is {size} bytes, over the {MAX_PATH} a unix "
            "socket may have: use a shorter MB_HOME (or [server] endpoint)"
        )
