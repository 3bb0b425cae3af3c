"""What the text of a submission may contain.

Checked by ``qsub``/``sbatch`` before sending, for a clear error at once, and
again by the server, which cannot trust a client. Names and paths end up in file
names, mail headers, logs and other users' terminals (``qstat``): a newline or
an escape sequence in one could forge a line of any of them, and a NUL cannot
even be passed to the kernel. Commands and the environment may hold any
character the kernel can pass to ``execve``: anything but NUL.
"""

from __future__ import annotations

import re

from minibatch.core.job import JobSpec
from minibatch.errors import InvalidArgument

#: C0 and C1 control characters, and DEL.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: How much of a refused value an error message quotes.
_SHOWN = 60


def shown(value: str) -> str:
    """``value`` quoted for an error message, cut if long."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def check_utf8(value: str, what: str) -> None:
    """Refuse text the protocol cannot carry: strings are UTF-8 on the wire, and
    Python holds undecodable bytes from the system (a file name, a variable) as
    lone surrogates."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {shown(value)} is not valid UTF-8") from None


def check_text(value: str, what: str) -> None:
    """Refuse a name or path with a control character in it."""
    check_utf8(value, what)
    m = _CONTROL.search(value)
    if m is not None:
        raise InvalidArgument(
            f"{what} {shown(value)} contains the control character "
            f"{m.group()!r}; names and paths may not"
        )


def _check_args(values: list[str], what: str) -> None:
    for value in values:
        check_utf8(value, what)
        if "\0" in value:
            raise InvalidArgument(f"{what} {shown(value)} contains a NUL byte")


def check_spec_text(spec: JobSpec) -> None:
    """Refuse control characters in the names and paths of ``spec``, and NUL
    in its command and environment, naming the value."""
    if _clean(spec):
        return
    _check_each(spec)


def _clean(spec: JobSpec) -> bool:
    """Whether ``spec`` passes every check, seen whole: one scan of each kind
    instead of one per value (the server runs this on every submission)."""
    options = spec.options
    names = "/".join(
        [
            spec.name,
            spec.workdir,
            spec.stdout_path or "",
            spec.stderr_path or "",
            spec.queue,
            spec.account,
            spec.qos,
            spec.advres,
            options.shell,
            options.group,
            options.project,
            *options.mail_users,
            *options.features,
        ]
    )
    free = "".join([*(spec.argv or []), *options.script_args, *spec.env.values()])
    keys = "".join(spec.env)
    try:
        (names + free + keys).encode()
    except UnicodeEncodeError:
        return False
    return (
        _CONTROL.search(names) is None
        and "\0" not in free
        and "\0" not in keys
        and "=" not in keys
        and all(spec.env)
    )


def _check_each(spec: JobSpec) -> None:
    options = spec.options
    named = [
        (spec.name, "job name"),
        (spec.workdir, "working directory"),
        (spec.stdout_path or "", "output path"),
        (spec.stderr_path or "", "error path"),
        (spec.queue, "queue"),
        (spec.account, "account"),
        (spec.qos, "qos"),
        (spec.advres, "reservation"),
        (options.shell, "shell"),
        (options.group, "group"),
        (options.project, "project"),
    ]
    named += [(user, "mail user") for user in options.mail_users]
    named += [(feature, "node feature") for feature in options.features]
    for value, what in named:
        check_text(value, what)
    _check_args(spec.argv or [], "command argument")
    _check_args(options.script_args, "script argument")
    for name, value in spec.env.items():
        if not name or "=" in name or "\0" in name:
            raise InvalidArgument(f"invalid environment variable name {shown(name)}")
        check_utf8(name, "environment variable")
        _check_args([value], f"environment variable {shown(name)}")
