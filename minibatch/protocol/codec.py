"""Envelope encoding: ``{v, id, re, body}`` as msgpack.

``id`` numbers a request per sender; a reply carries the request's id in ``re``
(as jupyter's parent header does), so a client can match replies to requests.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
import re

import msgspec

from minibatch.errors import ErrorCode, ProtocolError
from minibatch.protocol.messages import Message

PROTOCOL_VERSION = 1


class Envelope(msgspec.Struct, frozen=True, array_like=True):
    v: int
    id: int
    re: int
    body: Message


class _Version(msgspec.Struct, array_like=True):
    v: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)
_version = msgspec.msgpack.Decoder(_Version)


def encode(body: Message, id: int = 0, re: int = 0) -> bytes:
    return _encoder.encode(Envelope(PROTOCOL_VERSION, id, re, body))


#: What msgspec raises for bytes that are not a valid envelope: besides its own
#: errors, invalid UTF-8 in a string and nesting too deep for the stack.
_INVALID = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    UnicodeDecodeError,
    RecursionError,
)
#: An error quotes the sender's values; it goes into a reply and a log line,
#: so it is cut short and its control characters (a newline) are escaped.
_MAX_DETAIL = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def decode(frame: bytes) -> Envelope:
    """Decode one frame; raise :class:`ProtocolError` naming what is wrong."""
    try:
        env = _decoder.decode(frame)
    except _INVALID as exc:
        try:
            v = _version.decode(frame).v
        except _INVALID:
            v = PROTOCOL_VERSION
        if v != PROTOCOL_VERSION:
            raise _version_error(v) from exc
        raise ProtocolError(f"malformed message: {_detail(exc)}") from exc
    if env.v != PROTOCOL_VERSION:
        raise _version_error(env.v)
    return env


def _version_error(v: int) -> ProtocolError:
    err = ProtocolError(
        f"protocol version {v} is not supported (this daemon speaks {PROTOCOL_VERSION})"
    )
    err.code = ErrorCode.VERSION
    return err


def _detail(exc: Exception) -> str:
    """msgspec's explanation on one line of bounded length."""
    text = str(exc) or type(exc).__name__
    cut = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text[:_MAX_DETAIL])
    return cut + "..." if len(text) > _MAX_DETAIL else cut
