"""What every daemon does the same way: logging, a single-instance lock, signals."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path
from typing import IO


def setup_logging(name: str, verbose: bool = False) -> logging.Logger:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return logging.getLogger(name)


def single_instance(lock: Path, what: str) -> IO[str]:
    """Hold an exclusive lock on ``lock`` for the life of the process, or exit.

    An ipc endpoint cannot be relied on for this: libzmq silently takes over an
    existing socket path, so two servers would both run and split the clients.
    """
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = lock.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"{what} is already running for this MB_HOME ({lock})")
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: None)
