"""Envelope encoding: ``{v, id, re, body}`` as msgpack.

``id`` numbers a request per sender; a reply carries the request's id in ``re``
(as jupyter's parent header does), so a client can match replies to requests.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
import functools
import re
from collections.abc import Callable
from typing import Any

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


class _Unread(msgspec.Struct, frozen=True, array_like=True):
    """An envelope whose body is left encoded (:func:`decode_reply`)."""

    v: int
    id: int
    re: int
    body: msgspec.Raw


class _Tag(msgspec.Struct):
    """A body's tag, its other fields passed over."""

    type: str


#: Each message class by its tag.
_TAGGED: dict[str, type] = {msg.__struct_config__.tag: msg for msg in Message.__args__}

_encoder = msgspec.msgpack.Encoder()
_version = msgspec.msgpack.Decoder(_Version)
_unread = msgspec.msgpack.Decoder(_Unread)
_tag = msgspec.msgpack.Decoder(_Tag)


@functools.cache
def _decoder(kind: type) -> msgspec.msgpack.Decoder[Any]:
    """A decoder for ``kind``, made on first use: making the envelope's reads
    the type of every message and what they carry, ~80 classes, ~1.5 ms of a
    command's start."""
    return msgspec.msgpack.Decoder(kind)


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
    return _checked(frame, _decoder(Envelope).decode)


def decode_reply(frame: bytes) -> Envelope:
    """:func:`decode` for a command, which gets one or two kinds of reply: only
    the reply's own type is read (a decoder for each, on first use), not every
    message's. The result and the errors are :func:`decode`'s."""
    return _checked(frame, _by_tag)


def _by_tag(frame: bytes) -> Envelope:
    try:
        unread = _unread.decode(frame)
        kind = _TAGGED[_tag.decode(unread.body).type]
        body = _decoder(kind).decode(unread.body)
    except (*_INVALID, KeyError):
        # The whole envelope's decoder says what is wrong, as decode() does.
        env: Envelope = _decoder(Envelope).decode(frame)
        return env
    return Envelope(unread.v, unread.id, unread.re, body)


def _checked(frame: bytes, read: Callable[[bytes], Envelope]) -> Envelope:
    try:
        env = read(frame)
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
