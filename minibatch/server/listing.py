"""A bare ``qstat`` over a deep queue: its rows, encoded once per change.

Listing 100,000 jobs as :class:`Job` records made a 60 MB reply that took the
command 3.5 s to decode. A bare ``qstat`` prints six short fields per line, so
the server sends those (:class:`~minibatch.protocol.messages.JobRows`), built
by the command's own layout code (arrays summed up as ``qstat`` does), and
keeps the encoded rows until a job changes: many users listing a deep queue
cost the server one encoding, not one each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from minibatch.cli import qlayouts, render

if TYPE_CHECKING:
    from minibatch.server.state import ServerState

#: What a cached listing depends on: writes queued (every change of a job is
#: one), state changes, and the CPU time of running jobs (sampled, not stored).
Key = tuple[int, int, tuple[tuple[int, float | None], ...]]


class Listing:
    def __init__(self) -> None:
        self._key: Key | None = None
        self._rows = b""

    def rows(self, state: ServerState) -> msgspec.Raw:
        """The encoded rows of every job not finished, in id order."""
        usage = tuple((j, state.jobs[j].used_cputime_s) for j in sorted(state.active))
        key = (state.store.writes, state.generation, usage)
        if key != self._key:
            # The command's own layout code: the table cannot drift from qstat's.
            jobs = sorted(state.jobs.values(), key=lambda j: j.id)
            lines = qlayouts.summarize(jobs, lambda _: False)
            rows = [render.qstat_default_row(j) for j in lines]
            self._rows = msgspec.msgpack.encode(rows)
            self._key = key
        return msgspec.Raw(self._rows)
