"""``Submit`` and its reply, apart from the other messages.

``qsub`` and ``sbatch`` send nothing else; in a module of their own, a
submission creates these two classes rather than every message's (~80, with
the snapshot's and the reservations': ~1.5 ms of a ``qsub`` that should answer
in 40, docs/benchmarks.md, "Commands"). :mod:`minibatch.protocol.messages`
names them with the others.
"""

# No ``from __future__ import annotations`` here: see minibatch.protocol.base.

from minibatch.core.job import JobSpec
from minibatch.protocol.base import Msg


class Submit(Msg, frozen=True, kw_only=True, tag="submit"):
    """-> Submitted. ``qsub``: one job, or one per index of ``spec.array``;
    ``test_only``: every check, nothing queued (no ids)."""

    spec: JobSpec
    test_only: bool = False


class Submitted(Msg, frozen=True, kw_only=True, tag="submitted"):
    ids: list[int]
    display: str
    #: What the server changed or ignored and why (an unknown queue, say): one
    #: line each, printed by qsub on stderr.
    notes: list[str] = []
