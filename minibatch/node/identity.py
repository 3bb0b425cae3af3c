"""Who a job runs as, and what its user is told when it cannot start.

The node daemon starts a job as the user who submitted it (when the daemon is
root), opens the user's files with the user's effective ids, and turns an
exec failure into the line the user sees (``bad interpreter`` for a script
whose ``#!`` program is missing, as a shell says it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from minibatch.protocol.messages import LaunchSpec


class LaunchError(Exception):
    """The job could not be started; the message is the comment the user sees.

    ``node_trouble``: the node, not the job, is at fault (its spool is full or
    read-only): the job may run elsewhere and the node should take no more."""

    def __init__(self, message: str, node_trouble: bool = False) -> None:
        super().__init__(message)
        self.node_trouble = node_trouble


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    user: str
    home: str
    shell: str
    groups: list[int]
    #: Whether the child must change uid (the daemon is root, the user is not).
    switch: bool


def resolve_identity(spec: LaunchSpec, euid: int) -> Identity:
    """Who the job runs as, or :class:`LaunchError` when the daemon cannot do it."""
    switch = spec.uid != euid
    if switch and euid != 0:
        raise LaunchError(
            f"cannot run a job of user {spec.user} (uid {spec.uid}): mb-node runs "
            f"as uid {euid} without root privileges, so it can only run its own "
            "user's jobs"
        )
    try:
        pw = pwd.getpwuid(spec.uid)
    except KeyError:
        # Not in the passwd database (a container's ad-hoc uid): run it anyway.
        groups = [spec.gid] if switch else []
        return Identity(spec.uid, spec.gid, spec.user, "/", "/bin/sh", groups, switch)
    groups = os.getgrouplist(pw.pw_name, spec.gid) if switch else []
    return Identity(
        spec.uid, spec.gid, pw.pw_name, pw.pw_dir, pw.pw_shell, groups, switch
    )


@contextlib.contextmanager
def effective_identity(ident: Identity) -> Iterator[None]:
    """Act with the user's effective ids (file access checks use them)."""
    if not ident.switch:
        yield
        return
    groups, egid = os.getgroups(), os.getegid()
    os.setgroups(ident.groups)
    os.setegid(ident.gid)
    os.seteuid(ident.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)


def describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {where}" if where else exc.strerror
    return str(exc)


def describe_exec_error(
    exc: BaseException, argv: list[str], workdir: str, ident: Identity
) -> str:
    """Why ``argv`` could not start. A script whose ``#!`` names a missing
    interpreter fails with ENOENT on the script itself; say which program is
    missing, as a shell says "bad interpreter". The script is the user's: read
    as the user, only if it is a regular file, never waiting (it may have
    become a FIFO since the exec failed)."""
    if not (isinstance(exc, FileNotFoundError) and exc.filename == argv[0]):
        return describe_os_error(exc)
    line = b""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        with effective_identity(ident):
            fd = os.open(os.path.join(workdir, argv[0]), flags)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                line = os.read(fd, 256).split(b"\n", 1)[0]
        finally:
            os.close(fd)
    words = line[2:].split() if line.startswith(b"#!") else []
    program = words[0].decode(errors="replace") if words else ""
    if program and not os.path.exists(program):
        return f"{program}: bad interpreter: No such file or directory"
    return describe_os_error(exc)
