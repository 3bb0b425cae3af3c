"""File descriptors for daemons that hold one per connection.

Every client connection to the server's ipc socket is a file descriptor, and
the usual soft limit is 1,024: about that many connections, from anyone, used
to kill the server (libzmq aborts when ``accept`` fails with EMFILE, in
``ipc_listener.cpp``). The hard limit is usually far higher (systemd: 524,288)
and raising the soft one up to it needs no privilege, so every daemon does so
at start, as slurmd and pbs_server do.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

#: The limits this process started with, once raised: what the jobs a node
#: daemon starts get back (:func:`give_back`), as they would have without us.
_started_with: tuple[int, int] | None = None


def give_back(pid: int) -> None:
    """Set process ``pid``'s open file limit to what this process started with."""
    if _started_with is not None:
        try:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, _started_with)
        except OSError as exc:  # it may have ended already
            log.debug("cannot reset the open file limit of %d: %s", pid, exc)


def raise_fd_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit and
    return the soft limit now in force (Linux caps the hard limit at
    ``fs.nr_open``, so it is never infinite)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open file limit %d to %d: %s", soft, hard, exc)
        return soft
    global _started_with
    _started_with = (soft, hard)
    return hard
