"""What every daemon does the same way: logging, a single-instance lock, signals,
and telling systemd (``Type=notify``) when it is ready and when it stops."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO

from minibatch.config import Paths
from minibatch.errors import MinibatchError


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


def _notify(state: str) -> None:
    """Send ``state`` to systemd's notification socket (``sd_notify(3)``).

    A no-op outside systemd (no ``$NOTIFY_SOCKET``). A name starting with ``@``
    is in the abstract namespace. A failure is logged, never raised: the unit's
    start timeout is what reports a daemon that never said it was ready.
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot notify systemd: %s", exc)


def notify_ready() -> None:
    """Tell systemd the daemon serves (``READY=1``); call it once it really does:
    the server bound and its state loaded, a scheduler or node registered."""
    _notify("READY=1")


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (and tell systemd ``STOPPING=1``)."""

    def stopping() -> None:
        _notify("STOPPING=1")
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    loop.add_signal_handler(signal.SIGHUP, lambda: None)


def run_daemon(
    name: str,
    serve: Callable[[Paths, asyncio.Event], Awaitable[None]],
    argv: list[str] | None,
    description: str,
) -> None:
    """The whole life of a daemon without options of its own.

    Parses ``-v``, sets up logging, takes the daemon's lock in ``$MB_HOME/run``,
    and runs ``serve(paths, stop)`` until SIGTERM or SIGINT sets ``stop``. A
    :class:`MinibatchError` (a bad config, say) ends it with one line.
    """
    parser = argparse.ArgumentParser(prog=name, description=description)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(name, args.verbose)
    paths = Paths.from_env()
    paths.make()
    lock = single_instance(paths.run / f"{name.removeprefix('mb-')}.lock", name)

    async def life() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        await serve(paths, stop)

    try:
        asyncio.run(life())
    except MinibatchError as exc:
        raise SystemExit(f"{name}: {exc}") from None
    finally:
        lock.close()
