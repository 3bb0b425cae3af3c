"""The exit statuses of re-adopted jobs, from the kernel's process events.

A restarted node daemon re-adopts the jobs its predecessor left running
(:mod:`.records`), but it is not their parent: when a job's top process exits,
its wait status goes to whoever inherited it (the reaper a daemon stopped by
``mb down --keep-running`` became, or the keeper ``mb up`` started a killed
daemon under, which write it down: :mod:`.reaper`, :mod:`.keeper`; else init),
and the daemon alone could only say
"ended, exit status unknown". The kernel's process connector (netlink,
``NETLINK_CONNECTOR``/``CN_IDX_PROC``, the interface of ``forkstat`` and of
systemd's and Slurm's process trackers) announces every process's exit with
its wait status. A daemon that may listen (root; in a container, only in the
host's pid and user namespaces, elsewhere the kernel sends nothing) does so
from before it looks at the re-adopted jobs' processes (so no exit falls between
that look and the subscription) until its last re-adopted job ended, and hands
each re-adopted top process's status to the supervisor. It hears every process
of the machine meanwhile (~16 us of Python per event).

Elsewhere (an unprivileged daemon, or a lost event when the socket's buffer
overflowed) the status is the reaper's or keeper's file, if there is one,
or unknown.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import struct
from collections.abc import Callable

log = logging.getLogger(__name__)

_NETLINK_CONNECTOR = 11
_CN_IDX_PROC = 1
_CN_VAL_PROC = 1
_LISTEN, _IGNORE = 1, 2
_PROC_EVENT_EXIT = 0x80000000
_NLMSG_DONE = 3
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # root: past rmem_max
# struct nlmsghdr, struct cn_msg, then struct proc_event: what, cpu,
# timestamp; for an exit: pid, tgid, exit_code (a wait status), exit_signal.
_NLMSGHDR = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT = struct.Struct("=IIQ")
_EXIT = struct.Struct("=IIII")
_EVENT_AT = _NLMSGHDR.size + _CN_MSG.size
_EXIT_AT = _EVENT_AT + _EVENT.size
#: Exits of the whole machine arrive here while a re-adopted job runs.
_BUFFER = 4 << 20


def _control(op: int) -> bytes:
    body = _CN_MSG.pack(_CN_IDX_PROC, _CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", op)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _NLMSG_DONE, 0, 0, 0) + body


def parse(data: bytes) -> list[tuple[int, int]]:
    """(pid, wait status) of every process exit in one datagram (threads
    other than a process's main one are left out)."""
    found = []
    at = 0
    while at + _EXIT_AT + _EXIT.size <= len(data):
        length = _NLMSGHDR.unpack_from(data, at)[0]
        what = _EVENT.unpack_from(data, at + _EVENT_AT)[0]
        if what == _PROC_EVENT_EXIT:
            pid, tgid, status, _ = _EXIT.unpack_from(data, at + _EXIT_AT)
            if pid == tgid:
                found.append((pid, status))
        if length < _NLMSGHDR.size:
            break
        at += (length + 3) & ~3
    return found


class ExitWatch:
    """Process exits, as they happen, of the pids :meth:`watch` names."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pids: set[int] = set()
        #: Events were lost (the buffer overflowed): said once in the log.
        self.lossy = False

    @classmethod
    def open(cls) -> ExitWatch | None:
        """Listen, or None where this process may not (logged)."""
        try:
            sock = socket.socket(
                socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR
            )
        except OSError as exc:
            log.info(
                "no process events (%s): exit statuses of re-adopted jobs "
                "will be unknown",
                exc.strerror,
            )
            return None
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _BUFFER)
            sock.bind((0, _CN_IDX_PROC))
            sock.send(_control(_LISTEN))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            log.info(
                "no process events (%s): exit statuses of re-adopted jobs "
                "will be unknown",
                exc.strerror,
            )
            return None
        return cls(sock)

    def fileno(self) -> int:
        return self._sock.fileno()

    def watch(self, pid: int) -> None:
        self._pids.add(pid)

    def drain(self, on_exit: Callable[[int, int], None]) -> None:
        """Read what arrived; pass each watched pid's wait status to
        ``on_exit``, once everything was read (``on_exit`` may close this)."""
        seen: list[tuple[int, int]] = []
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                if not self.lossy:
                    log.warning("process events were lost (too many at once)")
                self.lossy = True
                continue
            for pid, status in parse(data):
                if pid in self._pids:
                    self._pids.discard(pid)
                    seen.append((pid, status))
        for pid, status in seen:
            on_exit(pid, status)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(_control(_IGNORE))
        self._sock.close()
