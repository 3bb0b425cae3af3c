"""Turning a client's :class:`JobSpec` into job records, or refusing it.

Everything here is checked before anything changes: a refused submission leaves no
trace. Identity (user, uid, gid) comes from the socket's peer credentials, never
from the message.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from minibatch.core.job import Job, JobSpec, JobState
from minibatch.core.resize import check_range
from minibatch.errors import InvalidArgument

MAX_ARRAY = 100_000
MAX_WALLTIME = 365 * 86400


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int

    @property
    def user(self) -> str:
        return user_name(self.uid)

    @property
    def group(self) -> str:
        try:
            return grp.getgrgid(self.gid).gr_name
        except KeyError:
            return str(self.gid)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def parse_peer(address: str | None) -> Caller | None:
    """Peer credentials from libzmq's ``Peer-Address`` of an ipc connection.

    libzmq reads SO_PEERCRED when an ipc connection is accepted and appends
    ``:uid:gid:pid`` to the peer address; a tcp peer has none (returns None).
    """
    if not address:
        return None
    parts = address.rsplit(":", 3)
    if len(parts) != 4 or not all(p.lstrip("-").isdigit() for p in parts[1:]):
        return None
    return Caller(int(parts[1]), int(parts[2]), int(parts[3]))


def check_spec(spec: JobSpec) -> None:
    """Reject malformed values, naming the problem."""
    req = spec.request
    if req.nodes < 1 or req.ppn < 1:
        raise InvalidArgument(
            f"nodes and CPUs must be positive (got {req.nodes}:{req.ppn})"
        )
    if not 0 < req.walltime <= MAX_WALLTIME:
        raise InvalidArgument(
            f"walltime must be between 1 s and 365 days, got {req.walltime} s"
        )
    if req.mem_kb is not None and req.mem_kb <= 0:
        raise InvalidArgument("mem must be positive")
    check_range(req.malleable, req.ppn, req.nodes)
    if not spec.name or "/" in spec.name or len(spec.name) > 256:
        raise InvalidArgument(f"invalid job name {spec.name!r}")
    if (spec.script is None) == (spec.argv is None):
        raise InvalidArgument("a job needs exactly one of a script or a command")
    if spec.argv is not None and not spec.argv:
        raise InvalidArgument("empty command")
    if not os.path.isabs(spec.workdir):
        raise InvalidArgument(f"working directory must be absolute: {spec.workdir!r}")
    if spec.array is not None:
        if not spec.array:
            raise InvalidArgument("empty array range")
        if len(spec.array) > MAX_ARRAY:
            raise InvalidArgument(f"arrays are limited to {MAX_ARRAY} tasks")
        if any(i < 0 for i in spec.array) or len(set(spec.array)) != len(spec.array):
            raise InvalidArgument("array indices must be distinct and non-negative")


def _output_path(spec: JobSpec, given: str | None, kind: str) -> tuple[str, bool]:
    """The path given, or the default path's prefix (True) that each job's
    suffix completes (``NAME.o12``, ``NAME.o12-3`` for task 3 of array 12)."""
    if given:
        return given if os.path.isabs(given) else os.path.join(
            spec.workdir, given
        ), False
    return os.path.join(spec.workdir, f"{spec.name}.{kind}"), True


def build_jobs(
    spec: JobSpec, caller: Caller, first_id: int, now: float, state: JobState
) -> list[Job]:
    """One record, or one per array index with consecutive ids from ``first_id``."""
    indices: list[int | None] = list(spec.array) if spec.array else [None]
    user, group = caller.user, caller.group  # each is a passwd/group lookup
    out, out_prefix = _output_path(spec, spec.stdout_path, "o")
    err, err_prefix = _output_path(spec, spec.stderr_path, "e")
    jobs = []
    for offset, index in enumerate(indices):
        jid = first_id + offset
        suffix = f"{jid}" if index is None else f"{first_id}-{index}"
        jobs.append(
            Job(
                id=jid,
                name=spec.name,
                user=user,
                uid=caller.uid,
                gid=caller.gid,
                group=group,
                workdir=spec.workdir,
                request=spec.request,
                submit_time=now,
                state=state,
                script=spec.script,
                argv=spec.argv,
                env=spec.env,
                stdout_path=out + suffix if out_prefix else out,
                stderr_path=err + suffix if err_prefix else err,
                join=spec.join,
                depends=spec.depends,
                array_id=None if index is None else first_id,
                array_index=index,
                submit_args=spec.submit_args,
                account=spec.account,
                qos=spec.qos,
                advres=spec.advres,
                queued_since=now if state is JobState.QUEUED else None,
            )
        )
    return jobs
