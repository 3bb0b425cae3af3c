"""A request as the server handles it, whichever socket brought it.

The ROUTER's (:mod:`minibatch.net.driver`) and the commands' unix socket's
(:mod:`minibatch.net.local`) are read into the same shape here, with the
caller's credentials where the kernel gives them.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import zmq

from minibatch.net.driver import Frames
from minibatch.net.local import ROUTE_PREFIX, LocalRequest
from minibatch.server.submit import Caller, parse_peer


class Request(NamedTuple):
    #: Where its reply goes (a ROUTER routing id or a command connection's).
    route: bytes
    #: The encoded envelope.
    data: bytes
    #: Peer credentials; None over tcp, where the CURVE key says who it is.
    peer: Caller | None
    #: Over tcp: the frame the server reads the CURVE key of.
    frame: zmq.Frame | None = None
    #: Message frames: one, or the request is malformed.
    parts: int = 1


def from_router(frames: Frames) -> Request | None:
    """None for a peer that set a routing id of the commands' socket: its
    replies would go to another user's command (libzmq reserves routing ids
    that start with a zero byte, but a peer speaking ZMTP by hand can send
    one)."""
    if frames[0].bytes.startswith(ROUTE_PREFIX):
        return None
    last = frames[-1]
    peer = None
    with contextlib.suppress(zmq.ZMQError):  # a frame without properties
        peer = parse_peer(str(last.get("Peer-Address")))
    return Request(frames[0].bytes, last.bytes, peer, last, len(frames) - 1)


def from_local(request: LocalRequest) -> Request:
    uid, gid, pid = request.peer
    return Request(request.route, request.data, Caller(uid, gid, pid))
