"""Changing the CPUs of a running job: every thread of every process, then tell it.

A resize is three steps, in this order, so that when a job hears of it the change
has already happened:

1. **The mask.** ``sched_setaffinity`` on every thread (``/proc/PID/task/TID``) of
   every process of the job's tree. A thread or process created meanwhile by a
   thread not yet moved would keep the old mask, so the tree and its threads are
   read again until a round finds nothing new; anything created after that
   inherits the new mask from its creator. A thread that exits meanwhile is
   skipped. If the kernel refuses the mask (``EINVAL``: CPUs offline or outside
   the daemon's cpuset), the threads already moved go back to their old mask and
   the resize fails with the kernel's words.
2. **The file.** The new list, in the kernel's list format (``0-2,5``) and nothing
   else but a newline, replaces ``$MB_CPUSET_FILE`` atomically (a new file renamed
   over the old), so a job never reads half a list.
3. **The signal** (``SIGUSR1`` unless configured otherwise, or none) goes to each
   process of the job that *catches* it (``SigCgt`` in ``/proc/PID/status``). A
   process that left it at its default action would be killed by it; a resize must
   never end a job, so such a process is left alone, confined to its new CPUs.

Module functions take pids and paths only, so they are tested on real processes
without a daemon.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from minibatch.core.units import format_cpu_list

#: Rounds of "read the tree again" before giving up on a job that forks non-stop.
_MAX_ROUNDS = 20


class ResizeRefused(Exception):
    """The kernel would not confine the job to the CPUs: nothing changed."""


def threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (empty when it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def set_mask(tree: Callable[[], Iterable[int]], cpus: list[int]) -> int:
    """Confine every thread of the processes ``tree()`` names to ``cpus``.

    ``tree`` is called again after each round (see the module docstring). Returns
    the number of threads moved; raises :class:`ResizeRefused` after putting the
    moved threads back when the kernel refuses the mask.
    """
    target = set(cpus)
    moved: dict[int, set[int]] = {}
    for _ in range(_MAX_ROUNDS):
        fresh = [t for pid in tree() for t in threads(pid) if t not in moved]
        if not fresh:
            break
        for tid in fresh:
            try:
                before = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, target)
            except ProcessLookupError:
                continue  # the thread ended meanwhile
            except OSError as exc:
                _restore(moved)
                raise ResizeRefused(
                    f"the kernel refused CPUs {format_cpu_list(cpus)}: "
                    f"{exc.strerror or exc}"
                ) from exc
            moved[tid] = before
    return len(moved)


def _restore(moved: dict[int, set[int]]) -> None:
    for tid, mask in moved.items():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, mask)


def write_cpuset(path: Path, cpus: list[int]) -> None:
    """Replace ``path`` with the one line ``0-2,5\\n``, atomically."""
    tmp = path.with_name(path.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (format_cpu_list(cpus) + "\n").encode())
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt``)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def notify(pids: Iterable[int], sig: int | None) -> list[int]:
    """Send ``sig`` to those of ``pids`` that catch it; the pids signalled."""
    if sig is None:
        return []
    sent = []
    for pid in pids:
        if catches(pid, sig):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                sent.append(pid)
    return sent
