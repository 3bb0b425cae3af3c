"""``qstat`` and ``qstat -a`` over a deep queue: their rows, encoded once per change.

Listing 100,000 jobs as :class:`Job` records made a 60 MB reply that took the
command 3.5 s to decode. A bare ``qstat`` prints six short fields per line, and
``qstat -a`` eleven, so the server sends those
(:class:`~minibatch.protocol.messages.JobRows`), built by the command's own
layout code (arrays summed up as ``qstat`` does), and keeps the encoded rows
until a job changes: many users listing a deep queue cost the server one
encoding, not one each. ``qstat -a``'s elapsed time is computed by the command
as it prints, from the start and end times in each row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from minibatch.cli import qlayouts, render

if TYPE_CHECKING:
    from minibatch.core.job import Job
    from minibatch.server.state import ServerState

#: What a cached listing depends on: writes queued (every change of a job is
#: one), state changes, and for ``qstat`` the CPU time of running jobs
#: (sampled, not stored).
Key = tuple[int, int, tuple[tuple[int, float | None], ...]]
#: No rows.
_NONE = msgspec.msgpack.encode([])


def _encode(jobs: Iterable[Job], row: Callable[[Job], Any]) -> bytes:
    # The command's own layout code: the table cannot drift from qstat's.
    lines = qlayouts.summarize(sorted(jobs, key=lambda j: j.id), lambda _: False)
    return msgspec.msgpack.encode([row(j) for j in lines])


class Listing:
    def __init__(self) -> None:
        self._key: Key | None = None
        self._rows = b""
        self._alt_key: tuple[int, int] | None = None
        #: ``qstat -a``'s rows by user (None: everyone's), since ``_alt_key``.
        self._alt: dict[str | None, bytes] = {}

    def rows(self, state: ServerState) -> msgspec.Raw:
        """The encoded ``qstat`` rows of every job not finished, in id order."""
        usage = tuple((j, state.jobs[j].used_cputime_s) for j in sorted(state.active))
        key = (state.store.writes, state.generation, usage)
        if key != self._key:
            self._rows = _encode(state.jobs.values(), render.qstat_default_row)
            self._key = key
        return msgspec.Raw(self._rows)

    def alt_rows(self, state: ServerState, user: str | None) -> msgspec.Raw:
        """The encoded ``qstat -a`` rows of the jobs not finished (of ``user``)."""
        key = (state.store.writes, state.generation)
        if key != self._alt_key:
            self._alt.clear()
            self._alt_key = key
        if user is not None and user not in state.by_user:
            # Not cached: anyone may ask for any name.
            return msgspec.Raw(_NONE)
        if user not in self._alt:
            jobs = (
                state.jobs.values()
                if user is None
                else (state.jobs[i] for i in state.by_user[user])
            )
            self._alt[user] = _encode(jobs, render.qstat_alt_row)
        return msgspec.Raw(self._alt[user])
