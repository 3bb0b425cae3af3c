"""What every message is: a frozen msgspec Struct tagged by ``type`` on the wire;
and the replies any request may get, ``Ok`` and ``Error`` (every command's
client reads them without importing :mod:`minibatch.protocol.messages`).

No ``from __future__ import annotations`` in the modules that define wire
Structs (these, core.job, core.snapshot, core.reservation, codec): msgspec
would have to compile and evaluate every field's annotation string when a
command builds its decoder, about 8 ms of each command's start-up.
"""

import msgspec


class Msg(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    pass


class Ok(Msg, frozen=True, kw_only=True, tag="ok"):
    pass


class Error(Msg, frozen=True, kw_only=True, tag="error"):
    code: int
    message: str
