"""Log lines about bad input, at a rate no client can turn into a full disk.

A daemon answers every malformed frame, and any local user can send millions a
second. One line each would let them fill the disk through our log, so lines
about one kind of trouble go through a :class:`RateLimitedLog`: at most
``burst`` per ``window`` seconds, then one line saying how many were left out.
The standard library has nothing like it (``logging`` filters see one record at
a time and cannot say what they dropped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

#: Lines per window, and the window in seconds, unless a caller says otherwise.
BURST = 10
WINDOW = 10.0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        burst: int = BURST,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``what`` names the lines in the summary ("malformed requests")."""
        self.logger, self.what = logger, what
        self.burst, self.window, self.clock = burst, window, clock
        self._start = -window  # so that the first line opens a window
        self._written = 0
        self._suppressed = 0
        self._level = logging.WARNING
        self._timer: asyncio.TimerHandle | None = None

    def warning(self, msg: str, *args: object, exc_info: bool = False) -> None:
        self.log(logging.WARNING, msg, *args, exc_info=exc_info)

    def error(self, msg: str, *args: object, exc_info: bool = False) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=exc_info)

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> None:
        now = self.clock()
        if now - self._start >= self.window:
            self.summarize()
            self._start, self._written = now, 0
        if self._written < self.burst:
            self._written += 1
            self.logger.log(level, msg, *args, exc_info=exc_info)
            return
        self._suppressed += 1
        self._level = max(self._level, level)
        if self._suppressed == 1:
            self._arm(self._start + self.window - now)

    def summarize(self) -> None:
        """Write the line about what was left out, if anything was."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._suppressed:
            self.logger.log(
                self._level,
                "%s: suppressed %d more in the last %g s",
                self.what,
                self._suppressed,
                self.window,
            )
        self._suppressed, self._level = 0, logging.WARNING

    def _arm(self, delay: float) -> None:
        # In a daemon the summary comes when the window closes, even if the
        # flood stopped; without a loop (a command), with the next line.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(max(0.0, delay), self.summarize)
