"""The job side of malleable jobs: learn that the batch system changed your CPUs.

A resize reaches a running job in three steps, always in this order: the node
daemon moves every thread of the job to the new CPUs, replaces the file named by
``$MB_CPUSET_FILE`` with the new list (one line in the kernel's list format,
``0-2,5``, swapped in atomically), then sends ``$MB_RESIZE_SIGNAL`` (``USR1``
unless configured otherwise, or ``none``) to each process of the job that
catches it. A process that does not catch it is never signalled.

A program that adapts creates one :class:`Resizes` at its start, in the main
thread, and asks it at its safe points (``if resizes.changed(): use(resizes.cpus())``).
Only the standard library is imported here, so any job program can use this file
without the rest of minibatch.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

CPUSET_FILE_VAR = "MB_CPUSET_FILE"
SIGNAL_VAR = "MB_RESIZE_SIGNAL"

_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
_WAIT_STEP = 0.05  # seconds; see Resizes.wait

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def parse_cpu_list(text: str) -> list[int]:
    """Parse the kernel's CPU list format: ``"0-2,5\\n"`` -> ``[0, 1, 2, 5]``.

    Whitespace around numbers is ignored; a blank text is no CPUs.

    Raises:
        ValueError: if ``text`` is not a CPU list.
    """
    if not text.strip():
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"not a CPU list: {text!r}")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first:
            raise ValueError(f"descending CPU range {part.strip()!r} in {text!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int]) -> str:
    """Format CPU ids (any order) as the kernel does: ``[5, 0, 1, 2]`` -> ``"0-2,5"``.

    Raises:
        ValueError: if an id is negative.
    """
    ids = sorted(set(cpus))
    if ids and ids[0] < 0:
        raise ValueError(f"negative CPU id {ids[0]}")
    runs: list[list[int]] = []
    for cpu in ids:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def current_cpus() -> list[int]:
    """The job's CPUs now.

    The list in ``$MB_CPUSET_FILE`` if readable, else the calling thread's affinity.
    """
    # The file, not the affinity, comes first: a program may have narrowed its own
    # threads' masks (pinning), but the file always holds the job's whole set.
    path = os.environ.get(CPUSET_FILE_VAR)
    if path:
        try:
            with open(path, encoding="ascii") as f:
                cpus = parse_cpu_list(f.read())
        except (OSError, ValueError):
            cpus = []  # the affinity is set before the file, so never staler
        if cpus:
            return cpus
    return sorted(os.sched_getaffinity(0))


def signal_named(name: str) -> signal.Signals | None:
    """``USR1``, ``SIGUSR2`` or ``12`` -> the signal; ``none`` or "" -> None.

    The node daemon reads its ``resize_signal`` setting with this too.

    Raises:
        ValueError: if ``name`` names no signal.
    """
    text = name.strip().upper()
    if text in ("", "NONE"):
        return None
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise ValueError(f"unknown signal {name!r} (e.g. USR1, USR2 or none)") from None


def resize_signal() -> signal.Signals | None:
    """The signal that announces a resize, from ``$MB_RESIZE_SIGNAL`` (unset:
    ``SIGUSR1``; see :func:`signal_named`).

    Raises:
        ValueError: if the variable names no signal.
    """
    name = os.environ.get(SIGNAL_VAR, "USR1")
    try:
        return signal_named(name)
    except ValueError:
        raise ValueError(f"{SIGNAL_VAR}={name.strip()!r} names no signal") from None


class Resizes:
    """Notices resizes of this job, by signal and by the CPU list file.

    Create it once, in the main thread (Python runs signal handlers only there),
    and call :meth:`changed`, :meth:`poll` or :meth:`wait` at safe points.
    Callbacks never run inside the signal handler, only in those calls.

    Raises:
        ValueError: from the constructor, if ``$MB_RESIZE_SIGNAL`` names no
            signal, or if not called from the main thread.
    """

    def __init__(self) -> None:
        self.signum = resize_signal()
        #: Resize signals received so far.
        self.count = 0
        self._pending = False
        self._seen = current_cpus()
        self._callbacks: list[Callable[[list[int]], object]] = []
        self._previous: _Handler = None  # what close() gives back, if anything
        if self.signum is not None:
            # A handler set outside Python reads as None: the default is the best
            # that can be given back for it.
            previous = signal.signal(self.signum, self._on_signal)
            self._previous = previous or signal.SIG_DFL

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # The handler interrupts the program anywhere, even inside a lock it
        # holds: it only sets two fields, and the program acts at a safe point.
        self._pending = True
        self.count += 1

    def changed(self) -> bool:
        """Whether the CPUs changed since :meth:`cpus` last returned them.

        Cheap enough for every safe point: a flag, else one read of a small file
        (which catches a resize without a signal too).
        """
        return self._pending or current_cpus() != self._seen

    def cpus(self) -> list[int]:
        """The job's CPUs now, marked as seen."""
        # Clear the flag before reading, so a signal that lands in between is
        # kept for the next check instead of lost.
        self._pending = False
        self._seen = current_cpus()
        return list(self._seen)

    def on_resize(self, callback: Callable[[list[int]], object]) -> None:
        """Call ``callback(cpus)`` from :meth:`poll` and :meth:`wait` on a resize."""
        self._callbacks.append(callback)

    def poll(self) -> list[int] | None:
        """The new CPUs if they changed (after running the callbacks), else None."""
        if not self.changed():
            return None
        cpus = self.cpus()
        for callback in self._callbacks:
            callback(list(cpus))
        return cpus

    def wait(self, timeout: float | None = None) -> list[int] | None:
        """The new CPUs (as :meth:`poll`) once they change; None after ``timeout``."""
        # Sleeping in short steps rather than on an Event: setting an Event takes
        # a lock, which the handler could find held by the very code it
        # interrupted, and deadlock.
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while (cpus := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(left, _WAIT_STEP))
        return cpus

    def close(self) -> None:
        """Give the signal back to the handler that had it before."""
        if self.signum is not None and self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def __enter__(self) -> Resizes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
