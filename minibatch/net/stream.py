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

import struct

#: Each message's length, in front of it.
HEADER = struct.Struct(">I")
#: What replaces ``.sock`` in the ipc endpoint's file name (or is added to it).
SUFFIX = ".commands"


def command_path(endpoint: str) -> str | None:
    """The commands' socket of the server bound to ``endpoint``: beside its ipc
    socket (``run/server.sock`` -> ``run/server.commands``); None for tcp."""
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://") :]
    return path.removesuffix(".sock") + SUFFIX
