"""Property tests of the wire codec: every message type round-trips, and
whatever bytes arrive, ``decode`` answers with a message or ProtocolError.

Messages are generated from msgspec's own description of each type
(``msgspec.inspect``), so a field added to any message is fuzzed without
touching this file. Then what a submission may hold, and the parts the daemons
use against bad input and greedy clients (the rate-limited log, the guard's
look at a connection).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import typing
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch.core.job import JobSpec
from minibatch.errors import InvalidArgument, ProtocolError
from minibatch.net.guard import peer_uid, shut_down
from minibatch.net.ratelog import RateLimitedLog
from minibatch.protocol import PROTOCOL_VERSION, decode, decode_reply, encode
from minibatch.protocol.fields import check_spec_text
from minibatch.protocol.messages import Message, QueryJobs, Submit
from minibatch.server.submit import check_sizes

MESSAGE_TYPES = [
    typing.cast(mi.StructType, t).cls
    for t in typing.cast(mi.UnionType, mi.type_info(Message)).types
]
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: msgpack integers: int64 and uint64.
INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
#: What an ``Any`` field may hold and still decode as itself.
SCALARS = st.none() | st.booleans() | INTS | st.text(max_size=8)


def strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values of the msgspec type ``t`` (collections kept small)."""
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else -(2**63)
        return st.integers(min_value=low, max_value=2**63 - 1)
    simple: dict[type[mi.Type], st.SearchStrategy[Any]] = {
        mi.AnyType: SCALARS,
        mi.NoneType: st.none(),
        mi.BoolType: st.booleans(),
        mi.StrType: st.text(max_size=12),
        mi.FloatType: st.floats(allow_nan=False),
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy(u) for u in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(strategy(t.item_type), max_size=3)
    if isinstance(t, mi.VarTupleType):
        return st.lists(strategy(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.TupleType):
        return st.tuples(*[strategy(u) for u in t.item_types])
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy(t.key_type), strategy(t.value_type), max_size=3)
    if isinstance(t, mi.StructType):
        return struct_strategy(t)
    if isinstance(t, mi.RawType):  # JobRows: its rows, already encoded
        rows = st.lists(st.tuples(*[st.text(max_size=8)] * 6), max_size=3)
        return rows.map(lambda r: msgspec.Raw(msgspec.msgpack.encode(r)))
    raise NotImplementedError(f"no strategy for {t!r}")


def lazy(t: mi.Type) -> st.SearchStrategy[Any]:
    """``strategy(t)``, built when first drawn: a struct may contain itself."""

    def build() -> st.SearchStrategy[Any]:
        return strategy(t)

    return st.deferred(build)


def struct_strategy(t: mi.StructType) -> st.SearchStrategy[Any]:
    """Required fields always, optional ones sometimes (else their default)."""
    fields = {f.name: lazy(f.type) for f in t.fields}
    required = {f.name: fields[f.name] for f in t.fields if f.required}
    optional = {f.name: fields[f.name] for f in t.fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional).map(
        lambda kw: t.cls(**kw)
    )


def messages() -> st.SearchStrategy[Any]:
    return st.sampled_from(MESSAGE_TYPES).flatmap(
        lambda cls: struct_strategy(typing.cast(mi.StructType, mi.type_info(cls)))
    )


def decodes_or_refuses(frame: bytes) -> None:
    """``decode`` may only return an envelope or raise ProtocolError, and
    ``decode_reply`` (a command's, one type of reply at a time) the same."""
    try:
        env = decode(frame)
    except ProtocolError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        with pytest.raises(ProtocolError) as by_tag:
            decode_reply(frame)
        assert str(by_tag.value) == str(exc)
    else:
        assert env.v == PROTOCOL_VERSION
        # As bytes: a corrupted float may be a NaN, unequal to itself.
        same = msgspec.msgpack.encode(decode_reply(frame))
        assert same == msgspec.msgpack.encode(env)


# ------------------------------------------------------------ round trips


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@SETTINGS
@given(data=st.data())
def test_every_message_type_round_trips(cls: type, data: st.DataObject) -> None:
    info = typing.cast(mi.StructType, mi.type_info(cls))
    msg = data.draw(struct_strategy(info))
    env = decode(encode(msg, 7, 3))
    assert (env.v, env.id, env.re) == (PROTOCOL_VERSION, 7, 3)
    assert env.body == msg
    reply = decode_reply(encode(msg, 7, 3))
    assert (reply.v, reply.id, reply.re, reply.body) == (env.v, env.id, env.re, msg)


# ------------------------------------------------------------ bad input


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_are_a_protocol_error_or_a_message(frame: bytes) -> None:
    decodes_or_refuses(frame)


@SETTINGS
@given(messages(), st.data())
def test_truncated_encodings_are_protocol_errors(msg: Any, data: st.DataObject) -> None:
    frame = encode(msg, 1)
    cut = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    with pytest.raises(ProtocolError):
        decode(frame[:cut])
    with pytest.raises(ProtocolError):
        decode_reply(frame[:cut])


@SETTINGS
@given(messages(), st.data())
def test_corrupted_encodings_are_protocol_errors_or_messages(
    msg: Any, data: st.DataObject
) -> None:
    frame = bytearray(encode(msg, 1))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
        frame[at] = data.draw(st.sampled_from([0x00, 0x80, 0xC0, 0xC1, 0xDD, 0xFF]))
    decodes_or_refuses(bytes(frame))


# Invalid UTF-8: a lone continuation byte, an overlong form, a surrogate, a cut
# sequence, bytes no UTF-8 has.
BAD_UTF8 = st.sampled_from(
    [b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xff", b"\xfe\xfe"]
)


@SETTINGS
@given(st.text(max_size=10), BAD_UTF8, st.text(max_size=10))
def test_invalid_utf8_in_any_string_is_a_protocol_error(
    before: str, bad: bytes, after: str
) -> None:
    raw = before.encode() + bad + after.encode()
    string = bytes([0xD9, len(raw)]) + raw  # msgpack str8
    for frame in (
        # as the type tag, and as a selector
        b"\x94\x01\x01\x00\x81\xa4type" + string,
        b"\x94\x01\x01\x00\x82\xa4type\xaaquery_jobs\xa9selectors\x91" + string,
    ):
        with pytest.raises(ProtocolError, match="malformed message"):
            decode(frame)
    # As the name of a field no message has: skipped unread, as any unknown
    # field is (a newer sender's optional field).
    decodes_or_refuses(b"\x94\x01\x01\x00\x82\xa4type\xa6status" + string + b"\x01")


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_deep_nesting_is_a_protocol_error(depth: int) -> None:
    for frame in (
        b"\x94\x01\x01\x00" + b"\x91" * depth + b"\xc0",
        b"\x94\x01\x01\x00\x82\xa4type\xa6status\xa1x" + b"\x91" * depth + b"\xc0",
    ):
        decodes_or_refuses(frame)


def test_errors_quote_a_long_value_briefly_on_one_line() -> None:
    frame = msgspec.msgpack.encode(
        [1, 1, 0, {"type": "kill", "job": 1, "result": "x\n" * 10**5}]
    )
    with pytest.raises(ProtocolError) as err:
        decode(frame)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize(
    "body",
    [
        {"type": "query_jobs", "selectors": [1, 2]},
        {"type": "submit", "spec": "job.sh"},
        {"type": "heartbeat", "name": None, "running": {}},
        {"type": "kill", "job": "1", "result": "completed"},
        {"type": "job_ended", "job": 1.5},
        {"type": 7},
        {},
        [],
    ],
)
def test_well_formed_messages_with_wrong_field_types_are_refused(body: Any) -> None:
    with pytest.raises(ProtocolError, match="malformed message"):
        decode(msgspec.msgpack.encode([1, 1, 0, body]))


def test_another_version_is_named() -> None:
    with pytest.raises(ProtocolError, match="version 2 is not supported"):
        decode(msgspec.msgpack.encode([2, 1, 0, {"type": "status"}]))


def test_a_valid_message_survives_a_bad_neighbour() -> None:
    good = encode(QueryJobs(selectors=["1"]), 5)
    assert decode(good).body == QueryJobs(selectors=["1"])


# ----------------------------------------------- what a submission may hold


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "name": "job",
        "workdir": "/tmp",
        "request": {},
        "script": "true",
    }
    base.update(kw)
    return msgspec.convert(base, JobSpec)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("name", "a\nb", "job name"),
        ("name", "a\0b", "job name"),
        ("name", "a\x1b[31mb", "job name"),
        ("queue", "batch\n", "queue"),
        ("workdir", "/tmp/a\0", "working directory"),
        ("stdout_path", "/tmp/o\nx", "output path"),
        ("stderr_path", "/tmp/\x00e", "error path"),
        ("account", "a\rb", "account"),
    ],
)
def test_control_characters_in_names_and_paths_are_refused(
    field: str, value: str, named: str
) -> None:
    with pytest.raises(InvalidArgument, match=f"{named} .* control character"):
        check_spec_text(_spec(**{field: value}))


def test_nul_in_the_command_or_environment_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="NUL"):
        check_spec_text(_spec(script=None, argv=["echo", "a\0b"]))
    with pytest.raises(InvalidArgument, match="NUL"):
        check_spec_text(_spec(env={"A": "x\0y"}))
    with pytest.raises(InvalidArgument, match="variable name"):
        check_spec_text(_spec(env={"A=B": "x"}))
    # Newlines are legal in arguments and values (exported shell functions).
    check_spec_text(_spec(env={"BASH_FUNC_f%%": "() { echo\n}"}, argv=None))


def test_oversized_scripts_and_environments_name_the_limit_and_size() -> None:
    with pytest.raises(
        InvalidArgument,
        match=r"job script is too large: 2001 bytes.*1000.*max_script_bytes",
    ):
        check_sizes(_spec(script="x" * 2001), 1000, 1000)
    with pytest.raises(
        InvalidArgument,
        match=r"environment is too large: 1006 bytes in 1 var.*max_env_bytes",
    ):
        check_sizes(_spec(env={"ABCD": "x" * 1000}), 1000, 1000)
    with pytest.raises(InvalidArgument, match="job command is too large"):
        check_sizes(_spec(script=None, argv=["x" * 600, "y" * 600]), 1000, 1000)
    check_sizes(_spec(script="x" * 1000, env={"A": "x" * 997}), 1000, 1000)


def test_submit_round_trips_a_large_script() -> None:
    msg = Submit(spec=_spec(script="#!/bin/sh\n" + "echo é\n" * 100_000))
    assert decode(encode(msg)).body == msg


# ------------------------------------------ what the daemons do with bad input


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bad_input_is_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    logger = logging.getLogger("test.ratelog")
    lines = RateLimitedLog(logger, "bad frames", burst=3, window=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        for i in range(1000):
            lines.warning("bad frame %d", i)
        clock.now = 10.0
        lines.warning("bad frame %d", 1000)
    assert [r.getMessage() for r in caplog.records] == [
        "bad frame 0",
        "bad frame 1",
        "bad frame 2",
        "bad frames: suppressed 997 more in the last 10 s",
        "bad frame 1000",
    ]


async def test_a_daemon_summarises_when_the_window_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = RateLimitedLog(logging.getLogger("test.ratelog"), "bad", 1, 0.05)
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        for _ in range(5):
            lines.warning("bad frame")
        await asyncio.sleep(0.2)
    assert (
        caplog.records[-1].getMessage() == "bad: suppressed 4 more in the last 0.05 s"
    )


def test_the_guard_reads_the_peer_and_shuts_down_only_the_connection() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX)
    with ours, theirs:
        assert peer_uid(ours.fileno()) == os.getuid()
        shut_down(ours.fileno())
        assert theirs.recv(1) == b""  # the peer sees the end
        ours.getsockname()  # our descriptor is still open
    with tempfile.TemporaryFile() as f:
        assert peer_uid(f.fileno()) is None  # not a socket
    assert peer_uid(10**6) is None  # not open
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("\0minibatch-guard-test")
        listener.listen()
        assert peer_uid(listener.fileno()) is None  # accepts, has no peer
