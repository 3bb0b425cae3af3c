"""What a node daemon knows about each running job, kept where its successor finds it.

A daemon killed with SIGKILL takes its memory with it; its jobs do not die with
it (they are their own sessions). So each launch leaves ``<job>.run`` in the
spool: the launch spec, the top process, its start, the job's cgroup
directories, and its CPUs and time limit as resizes change them. A restarted
daemon reads these files before it says hello: a job whose cgroup still holds
processes is re-adopted, anything else of it is killed (:mod:`.tracker`).

The first version of a record is written just before the fork, with no pid;
the pid is appended after it (a line of its own) once the fork returned. Later
versions (a resize changes the CPUs or the time limit) replace the file
atomically (written aside, renamed over), so a crash in the middle of a write
leaves the previous version. Why not two atomic replaces at launch: on ext4 a
rename over a file forces the new file's blocks to be allocated at once
(``auto_da_alloc``), so a record that had been replaced made its launch and its
removal cost ~10x more than one written once and appended to, on the path of
every job.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from minibatch.node import reaper
from minibatch.protocol.messages import LaunchSpec

if TYPE_CHECKING:
    from minibatch.node.cgroup import JobCgroup

log = logging.getLogger(__name__)

_SUFFIX = ".run"


class RunRecord(msgspec.Struct, kw_only=True):
    #: The node that runs it: nodes of one cluster share its spool.
    node: str
    spec: LaunchSpec
    #: The top process; 0 in the record written just before the fork.
    pid: int
    #: Wall-clock start (the job's walltime counts from it).
    start: float
    #: Controller ('' on cgroup v2) -> the job's cgroup directory.
    cgroup: dict[str, str] = {}
    cpus: list[int] = []
    limit: float = 0.0
    seq: int = 0


class Swept(msgspec.Struct, kw_only=True):
    """A job ``mb down`` found while no daemon of its node ran (its record
    went with it): what that node's next daemon reports (:func:`mark_swept`)."""

    record: RunRecord
    #: How it had ended by itself, if its keeper or reaper saw it; None for
    #: a job the sweep killed.
    ended: reaper.ExitRecord | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunRecord)
_swept_decoder = msgspec.json.Decoder(Swept)
_SWEPT = ".swept"


def dirs_of(cg: JobCgroup | None) -> dict[str, str]:
    return dict(cg.dirs) if cg is not None else {}


def path(spool: Path, job: int) -> Path:
    return spool / f"{job}{_SUFFIX}"


def _write(target: Path, data: bytes, flags: int = os.O_CREAT | os.O_TRUNC) -> None:
    # Root-only: it holds the job's environment.
    fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | flags, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def begin(spool: Path, record: RunRecord) -> None:
    """The record written before the fork (``record.pid`` 0). A crash in the
    middle leaves a record that cannot be read: nothing was started yet, and
    :func:`load_all` discards it. How an earlier run of the job ended (a
    reaper's file, a sweep's mark) goes: it is not this run's."""
    reaper.remove(spool, record.spec.job)
    with contextlib.suppress(OSError):
        (spool / f"{record.spec.job}{_SWEPT}").unlink()
    _write(path(spool, record.spec.job), _encoder.encode(record))


def started(spool: Path, job: int, pid: int) -> None:
    """Add the job's top process to the record :func:`begin` wrote."""
    _write(path(spool, job), b"\n%d" % pid, os.O_APPEND)


def save(spool: Path, record: RunRecord) -> None:
    """Replace the job's record with ``record``, atomically."""
    target = path(spool, record.spec.job)
    aside = target.with_suffix(".run-new")
    _write(aside, _encoder.encode(record))
    os.replace(aside, target)


def parse(data: bytes) -> RunRecord:
    """A record as :func:`begin` and :func:`started` (or :func:`save`) left it."""
    body, _, pid = data.partition(b"\n")
    rec = _decoder.decode(body)
    if pid:
        try:
            rec.pid = int(pid)
        except ValueError:
            raise msgspec.DecodeError(f"bad pid line {pid[:32]!r}") from None
    return rec


def remove(spool: Path, job: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        path(spool, job).unlink()


def load_all(spool: Path, node: str | None = None) -> list[RunRecord]:
    """Every record in the spool (of ``node`` only, when given); unreadable ones
    are logged and removed."""
    found: list[RunRecord] = []
    for entry in sorted(spool.glob(f"*{_SUFFIX}")):
        try:
            rec = parse(entry.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("ignoring the unreadable job record %s: %s", entry, exc)
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        if node is None or rec.node == node:
            found.append(rec)
    return found


def tops(spool: Path, node: str) -> dict[int, tuple[int, float]]:
    """Top process -> (job, start) for every readable record of ``node`` with
    a pid. Only reads: whoever calls this (a keeper whose daemon is gone)
    owns no record."""
    found: dict[int, tuple[int, float]] = {}
    for entry in spool.glob(f"*{_SUFFIX}"):
        with contextlib.suppress(OSError, msgspec.DecodeError):
            rec = parse(entry.read_bytes())
            if rec.pid > 0 and rec.node == node:
                found[rec.pid] = (rec.spec.job, rec.start)
    return found


def mark_swept(spool: Path, record: RunRecord, ended: reaper.ExitRecord | None) -> None:
    """Leave word of ``record``'s job for its node's next daemon
    (:func:`take_swept`): it ended by itself (``ended``), or ``mb down``
    killed it, which the server takes as any stopping node's end of a job
    (requeued, or with ``-r n`` cancelled). Root-only, as the record is."""
    swept = Swept(record=record, ended=ended)
    _write(spool / f"{record.spec.job}{_SWEPT}", msgspec.json.encode(swept))


def take_swept(spool: Path, node: str) -> list[Swept]:
    """The marks :func:`mark_swept` left for ``node``; they go (unreadable
    ones too)."""
    found: list[Swept] = []
    for entry in spool.glob(f"*{_SWEPT}"):
        try:
            swept = _swept_decoder.decode(entry.read_bytes())
        except (OSError, msgspec.DecodeError):
            swept = None
        if swept is None or swept.record.node == node:
            with contextlib.suppress(OSError):
                entry.unlink()
        if swept is not None and swept.record.node == node:
            found.append(swept)
    return found
