"""Envelope encoding: ``{v, id, re, body}`` as msgpack.

``id`` numbers a request per sender; a reply carries the request's id in ``re``
(as jupyter's parent header does), so a client can match replies to requests.

This module imports no message but the base: a command that sends one kind of
request creates that one's classes, not every message's (~80 classes, ~1.5 ms
of its start; docs/benchmarks.md, "Commands"). :func:`decode` reads every
message, so its decoder is made, with :mod:`minibatch.protocol.messages`, on
first use.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
import functools
import re
from typing import TYPE_CHECKING, Any

import msgspec

from minibatch.errors import ErrorCode, ProtocolError
from minibatch.protocol.base import Msg

if TYPE_CHECKING:
    from minibatch.protocol.messages import Envelope, Message

PROTOCOL_VERSION = 1


class _Version(msgspec.Struct, array_like=True):
    v: int


class Received(msgspec.Struct, frozen=True, array_like=True):
    """An envelope as :func:`decode_reply` reads it: the body is the message
    its tag names."""

    v: int
    id: int
    re: int
    body: Any


class _Unread(msgspec.Struct, frozen=True, array_like=True):
    """An envelope whose body is left encoded (:func:`decode_reply`)."""

    v: int
    id: int
    re: int
    body: msgspec.Raw


class _Tag(msgspec.Struct):
    """A body's tag, its other fields passed over."""

    type: str


#: Each message class imported so far, by its tag (:func:`_kind`).
_TAGGED: dict[str | int | None, type[Msg]] = {}

_encoder = msgspec.msgpack.Encoder()
_version = msgspec.msgpack.Decoder(_Version)
_unread = msgspec.msgpack.Decoder(_Unread)
_tag = msgspec.msgpack.Decoder(_Tag)


@functools.cache
def _decoder(kind: type) -> msgspec.msgpack.Decoder[Any]:
    """A decoder for one message class, made on first use."""
    return msgspec.msgpack.Decoder(kind)


@functools.cache
def _whole() -> "msgspec.msgpack.Decoder[Envelope]":
    """The envelope's decoder: it reads the type of every message and what
    they carry, made once, when first needed."""
    from minibatch.protocol.messages import Envelope

    return msgspec.msgpack.Decoder(Envelope)


def encode(body: "Message", id: int = 0, re: int = 0) -> bytes:
    # A tuple is the array an Envelope (array_like) is encoded as.
    return _encoder.encode((PROTOCOL_VERSION, id, re, body))


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


def decode(frame: bytes) -> "Envelope":
    """Decode one frame; raise :class:`ProtocolError` naming what is wrong."""
    decoder = _whole()
    try:
        env = decoder.decode(frame)
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


def decode_reply(frame: bytes) -> Received:
    """:func:`decode` for a command, which gets one or two kinds of reply: only
    the reply's own class is read (a decoder for each, on first use), and the
    class must have been imported (the request's module names its replies).
    The same message and errors as :func:`decode`."""
    try:
        unread = _unread.decode(frame)
        body = _decoder(_kind(_tag.decode(unread.body).type)).decode(unread.body)
    except (*_INVALID, KeyError):
        # decode() says what is wrong, or reads a class not imported yet.
        env = decode(frame)
        return Received(env.v, env.id, env.re, env.body)
    if unread.v != PROTOCOL_VERSION:
        raise _version_error(unread.v)
    return Received(unread.v, unread.id, unread.re, body)


def _kind(tag: str) -> type[Msg]:
    """The message class tagged ``tag``; KeyError if none is imported."""
    if tag not in _TAGGED:
        _TAGGED.update((m.__struct_config__.tag, m) for m in Msg.__subclasses__())
    return _TAGGED[tag]


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
