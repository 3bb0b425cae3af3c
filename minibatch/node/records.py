"""What a node daemon knows about each running job, kept where its successor finds it.

A daemon killed with SIGKILL takes its memory with it; its jobs do not die with
it (they are their own sessions). So each launch leaves ``<job>.run`` in the
spool: the launch spec, the top process, its start, the job's cgroup
directories, and its CPUs and time limit as resizes change them. A restarted
daemon reads these files before it says hello: a job whose cgroup still holds
processes is re-adopted, anything else of it is killed (:mod:`.tracker`).

Files are replaced atomically (written aside, renamed over), so a crash in the
middle of a write leaves the previous version.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

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


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunRecord)


def dirs_of(cg: JobCgroup | None) -> dict[str, str]:
    return {c: str(d) for c, d in cg.dirs.items()} if cg is not None else {}


def path(spool: Path, job: int) -> Path:
    return spool / f"{job}{_SUFFIX}"


def save(spool: Path, record: RunRecord) -> None:
    target = path(spool, record.spec.job)
    aside = target.with_suffix(".run-new")
    # Root-only: it holds the job's environment.
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _encoder.encode(record))
    finally:
        os.close(fd)
    os.replace(aside, target)


def remove(spool: Path, job: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        path(spool, job).unlink()


def load_all(spool: Path, node: str | None = None) -> list[RunRecord]:
    """Every record in the spool (of ``node`` only, when given); unreadable ones
    are logged and removed."""
    found: list[RunRecord] = []
    for entry in sorted(spool.glob(f"*{_SUFFIX}")):
        try:
            rec = _decoder.decode(entry.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("ignoring the unreadable job record %s: %s", entry, exc)
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        if node is None or rec.node == node:
            found.append(rec)
    return found
