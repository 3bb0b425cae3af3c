"""Turning a client's :class:`JobSpec` into job records, or refusing it.

Everything here is checked before anything changes: a refused submission leaves no
trace. Identity (user, uid, gid) comes from the socket's peer credentials, or on
tcp from the CURVE key the client was registered with, never from the message.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from minibatch.core.job import MAX_NAME, Job, JobSpec, JobState
from minibatch.core.resize import check_range
from minibatch.errors import InvalidArgument, PermissionDenied
from minibatch.protocol.fields import check_spec_text, shown

MAX_ARRAY = 100_000
#: The largest array index: Slurm's and Torque's are far smaller; this one
#: keeps an index a 32-bit number in file names and environment variables.
MAX_ARRAY_INDEX = (1 << 31) - 1
MAX_WALLTIME = 365 * 86400


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int
    #: A tcp client, known by its registered CURVE key (:func:`remote_caller`):
    #: never a daemon of this host, nor an operator unless ``server.operators``
    #: names its user.
    remote: bool = False
    #: For a node daemon's key: the one node it may speak for.
    node: str | None = None

    @property
    def user(self) -> str:
        return user_name(self.uid)

    @property
    def group(self) -> str:
        return _groups.name(self.gid)


class _IdNames:
    """Names of ids, each kept for :data:`NAME_TTL` seconds, as nscd keeps them:
    every request needs its caller's name, and a lookup reads ``/etc/passwd``
    (2 % of the server's time at 300 jobs/s before this)."""

    def __init__(self, lookup: Callable[[int], str]) -> None:
        self._lookup = lookup
        self._names: dict[int, tuple[float, str]] = {}

    def name(self, number: int) -> str:
        now = time.monotonic()
        hit = self._names.get(number)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            name = self._lookup(number)
        except KeyError:
            return str(number)  # an id nobody has: not kept, any id could grow it
        if len(self._names) >= 4096:
            self._names.clear()
        self._names[number] = (now + NAME_TTL, name)
        return name


#: How long a user's or group's name is kept (nscd's default for passwd is 600 s).
NAME_TTL = 60.0
_users = _IdNames(lambda uid: pwd.getpwuid(uid).pw_name)
_groups = _IdNames(lambda gid: grp.getgrgid(gid).gr_name)


def user_name(uid: int) -> str:
    return _users.name(uid)


def parse_peer(address: str | None) -> Caller | None:
    """Peer credentials from libzmq's ``Peer-Address`` of an ipc connection.

    libzmq reads SO_PEERCRED when an ipc connection is accepted and appends
    ``:uid:gid:pid`` to the peer address; a tcp peer has none (returns None).
    A tcp peer's address has no colon (IPv4) or more than three (IPv6), so an
    address such as ``1::0:0:0`` can never pass for root's credentials.
    """
    if not address:
        return None
    parts = address.rsplit(":", 3)
    if (
        len(parts) != 4
        or ":" in parts[0]
        or not all(p.lstrip("-").isdigit() for p in parts[1:])
    ):
        return None
    return Caller(int(parts[1]), int(parts[2]), int(parts[3]))


def remote_caller(kind: str, name: str) -> Caller:
    """The caller a registered CURVE key stands for (``mb keys add-user`` or
    ``add-node``): that user as this host knows them (never root), or the node
    daemon of node ``name`` (acting for the cluster's owner, but only as that
    node: see :func:`~minibatch.server.access.need_remote_allowed`)."""
    if kind == "node":
        return Caller(os.getuid(), os.getgid(), 0, remote=True, node=name)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise PermissionDenied(
            f"this client's key stands for user {name}, who does not exist on "
            "the server's host"
        ) from None
    if entry.pw_uid == 0:
        raise PermissionDenied("a client's key never stands for root")
    return Caller(entry.pw_uid, entry.pw_gid, 0, remote=True)


def check_spec(spec: JobSpec) -> None:
    """Reject malformed values, naming the problem."""
    check_spec_text(spec)
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
    if not spec.name or "/" in spec.name:
        raise InvalidArgument(f"invalid job name {shown(spec.name)}")
    if len(spec.name) > MAX_NAME:
        raise InvalidArgument(
            f"job name too long ({len(spec.name)} characters, at most {MAX_NAME})"
        )
    if (spec.script is None) == (spec.argv is None):
        raise InvalidArgument("a job needs exactly one of a script or a command")
    if spec.argv is not None and not (spec.argv and spec.argv[0].strip()):
        raise InvalidArgument("empty command")
    if not os.path.isabs(spec.workdir):
        raise InvalidArgument(
            f"working directory must be absolute: {shown(spec.workdir)}"
        )
    if spec.array is not None:
        if not spec.array:
            raise InvalidArgument("empty array range")
        if len(spec.array) > MAX_ARRAY:
            raise InvalidArgument(f"arrays are limited to {MAX_ARRAY} tasks")
        if any(i < 0 for i in spec.array) or len(set(spec.array)) != len(spec.array):
            raise InvalidArgument("array indices must be distinct and non-negative")
        if max(spec.array) > MAX_ARRAY_INDEX:
            raise InvalidArgument(
                f"array indices are limited to {MAX_ARRAY_INDEX}, got {max(spec.array)}"
            )


def check_sizes(spec: JobSpec, max_script: int, max_env: int) -> None:
    """Refuse a script (or command) over ``max_script`` bytes or an environment
    over ``max_env`` (each variable counted as ``NAME=value`` and its NUL, as
    ``execve`` counts it), naming the limit and the size."""
    if spec.script is not None:
        what, size = "job script", len(spec.script.encode())
    else:
        what, size = "job command", sum(len(a.encode()) + 1 for a in spec.argv or [])
    if size > max_script:
        raise InvalidArgument(
            f"{what} is too large: {size} bytes, over the limit of {max_script} "
            "([server] max_script_bytes)"
        )
    env = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in spec.env.items())
    if env > max_env:
        raise InvalidArgument(
            f"job environment is too large: {env} bytes in {len(spec.env)} "
            f"variables, over the limit of {max_env} ([server] max_env_bytes)"
        )


_SLURM_PATTERN = re.compile(r"%(\d*)([AajJxuNnst%])")
_PBS_VARIABLE = re.compile(r"\$\{?(PBS_\w+|HOME|USER)\}?")


def _home(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


class _Names:
    """What output paths are made of, for one job: the rules of the tool the
    job came from (Slurm's ``%j`` patterns, or PBS's ``^array_index^`` and
    ``$PBS_JOBID`` names) and the default file names."""

    def __init__(self, spec: JobSpec, user: str, uid: int) -> None:
        self.spec, self.user, self.uid = spec, user, uid

    def slurm(self, text: str, jid: int, array: int | None, index: int | None) -> str:
        def fill(m: re.Match[str]) -> str:
            width, key = m.group(1), m.group(2)
            value = {
                "j": jid,
                "J": f"{jid}.batch",
                "A": array if array is not None else jid,
                "a": index if index is not None else 4294967294,
                "x": self.spec.name,
                "u": self.user,
                "s": "batch",
                "n": 0,
                "t": 0,
                "%": "%",
                "N": "%N",  # the node's name: filled in by the node at launch
            }[key]
            if width and isinstance(value, int):
                return str(value).zfill(int(width))
            return str(value)

        return _SLURM_PATTERN.sub(fill, text)

    def pbs(self, text: str, display: str, index: int | None) -> str:
        text = text.replace("^array_index^", "" if index is None else str(index))
        env = self.spec.env
        values = {
            "PBS_JOBID": display,
            "PBS_JOBNAME": self.spec.name,
            "PBS_ARRAYID": "" if index is None else str(index),
            "PBS_ARRAY_INDEX": "" if index is None else str(index),
            "HOME": env.get("PBS_O_HOME") or _home(self.uid),
            "USER": self.user,
        }
        return _PBS_VARIABLE.sub(
            lambda m: values.get(m.group(1), env.get(m.group(1), m.group(0))), text
        )

    def path(
        self,
        given: str | None,
        kind: str,
        jid: int,
        array: int | None,
        index: int | None,
    ) -> str:
        """The job's ``kind`` ("o" or "e") file."""
        spec = self.spec
        display = str(jid) if index is None else f"{array}[{index}]"
        suffix = str(jid) if index is None else f"{array}-{index}"
        keep = spec.options.keep
        if spec.options.slurm:
            default = f"slurm-{array}_{index}.out" if index is not None else ""
            default = default or f"slurm-{jid}.out"
        else:
            default = f"{spec.name}.{kind}{suffix}"
        if not given:
            if kind in keep and "d" not in keep:
                # Torque -k: kept in the home directory as it is written.
                return os.path.join(_home(self.uid), default)
            return os.path.join(spec.workdir, default)
        # A #PBS -o line read by sbatch keeps its PBS names; Slurm's % names
        # are only filled in for jobs submitted the Slurm way. Most paths
        # have neither (an array's 1,000 tasks: no pattern matching then).
        path = given
        shared = index is not None and not spec.options.slurm
        if "^" in path or "$" in path:
            path = self.pbs(path, display, index)
            if shared and index is not None:
                other = f"{array}[{index + 1}]"
                shared = self.pbs(given, other, index + 1) == path
        if spec.options.slurm and "%" in path:
            path = self.slurm(path, jid, array, index)
        if path.endswith("/"):
            path += default
            shared = False  # the default name has the task's index already
        path = os.path.join(spec.workdir, path)
        if shared and not _device(path):
            # One file named for a whole Torque array: each task gets its own,
            # "-<index>" added as Torque's job_clone does, or the tasks would
            # overwrite each other's output (sbatch shares it, as Slurm does).
            # Not /dev/null: nothing is kept there to overwrite.
            path += f"-{index}"
        return path


def _device(path: str) -> bool:
    """Whether ``path`` is there and not a regular file (``/dev/null``)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def build_jobs(
    spec: JobSpec, caller: Caller, first_id: int, now: float, state: JobState
) -> list[Job]:
    """One record, or one per array index with consecutive ids from ``first_id``."""
    indices: list[int | None] = list(spec.array) if spec.array else [None]
    user, group = caller.user, caller.group  # each is a passwd/group lookup
    names = _Names(spec, user, caller.uid)
    jobs = []
    for offset, index in enumerate(indices):
        jid = first_id + offset
        array = None if index is None else first_id
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
                stdout_path=names.path(spec.stdout_path, "o", jid, array, index),
                stderr_path=names.path(spec.stderr_path, "e", jid, array, index),
                join=spec.join,
                depends=spec.depends,
                array_id=None if index is None else first_id,
                array_index=index,
                submit_args=spec.submit_args,
                account=spec.account,
                qos=spec.qos,
                advres=spec.advres,
                queued_since=now if state is JobState.QUEUED else None,
                queue=spec.queue,
                options=spec.options,
            )
        )
    return jobs
