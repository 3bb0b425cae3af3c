"""``mb-broker``: the embedded MQTT broker ``mb up`` starts when none is configured.

It is an amqtt broker with one plain TCP listener on a loopback address, anonymous
clients allowed (to subscribe only, given ``--credentials``: then only the server
publishes, see :mod:`minibatch.events.brokerauth`), and nothing else: no
websockets, no ``$SYS`` topics (their timer
and psutil sampling would cost CPU for nobody), and no persistence plugin. amqtt
0.12 writes no file by default (its SQLite session store is an opt-in plugin), so
the broker keeps all state in memory and writes only its log (stderr, which
``mb up`` appends to ``$MB_HOME/log/broker.log``). Events are a live feed: a
restarted broker starts empty, and the publishers re-send what they buffered.

Run it as ``mb-broker --port 1883 [--host 127.0.0.1] [--credentials FILE]
[--mosquitto]``; SIGTERM or SIGINT stops it cleanly. ``--mosquitto`` runs
Debian's mosquitto with the same rules instead (:mod:`minibatch.events.mosquitto`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("minibatch.broker")

#: Seconds allowed for amqtt's shutdown (closing sessions, listeners) on SIGTERM.
SHUTDOWN_TIMEOUT = 5.0


def broker_config(
    host: str, port: int, credentials: Path | None = None
) -> dict[str, Any]:
    """The amqtt configuration of the embedded broker.

    Args:
        host: Address to bind; loopback unless remote nodes must subscribe.
        port: TCP port of the only listener.
        credentials: The server's ``user:password`` file: only it may publish.
            None: anyone may (a broker for tests).

    Returns:
        A dict accepted by ``amqtt.broker.Broker``.
    """
    # Listing the plugins explicitly replaces amqtt's defaults, which add the
    # $SYS publisher (a periodic timer) and two debug-logging plugins.
    plugins: dict[str, Any] = {
        "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
    }
    if credentials is not None:
        only = {"credentials": str(credentials)}
        plugins = {
            "minibatch.events.brokerauth.ServerOnlyAuth": only,
            "minibatch.events.brokerauth.ServerOnlyPublish": only,
        }
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": plugins,
    }


class _DropBareProbes(logging.Filter):
    """Drop amqtt's complaints about connections that closed before CONNECT.

    ``mb up`` (and any TCP health check) opens and closes a connection to learn
    that the broker listens; amqtt logs that as an ERROR and a WARNING.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "No data" not in record.getMessage()


def _quiet_logging(level: int) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # amqtt logs every connection at INFO and every packet at DEBUG; the transitions
    # state machines it uses log each transition. Only problems belong in our log.
    for name in ("amqtt", "transitions"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    logging.getLogger("amqtt.broker").addFilter(_DropBareProbes())
    log.setLevel(level)


async def serve(
    host: str, port: int, stop: asyncio.Event, credentials: Path | None = None
) -> None:
    """Run the broker until ``stop`` is set.

    Args:
        host: Address to bind.
        port: TCP port to listen on.
        stop: Set it to shut the broker down.
        credentials: See :func:`broker_config`.

    Raises:
        OSError: The address could not be bound (e.g. the port is taken).
    """
    # Imported here so that `--help` and argument errors stay instant.
    from amqtt.broker import Broker
    from amqtt.errors import BrokerError

    broker = Broker(broker_config(host, port, credentials))
    try:
        await broker.start()
    except BrokerError as exc:
        # amqtt wraps the bind error; unwrap it so the log says what happened.
        cause = exc.__cause__
        raise OSError(f"cannot listen on {host}:{port}: {cause or exc}") from exc
    log.info("listening on mqtt://%s:%d (pid %d)", host, port, os.getpid())
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        try:
            await asyncio.wait_for(broker.shutdown(), SHUTDOWN_TIMEOUT)
        except Exception as exc:  # a messy shutdown must not hide the exit
            log.warning("broker shutdown did not complete cleanly: %s", exc)


async def _main(host: str, port: int, credentials: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(host, port, stop, credentials)


def _mosquitto(host: str, port: int, credentials: Path) -> int:
    from minibatch.events import credentials as creds
    from minibatch.events import mosquitto

    program = mosquitto.executable()
    if program is None:
        log.error("mosquitto is not installed (apt-get install mosquitto)")
        return 1
    found = creds.read(credentials)
    if found is None:
        log.error("no credentials file %s", credentials)
        return 1
    conf = mosquitto.write_config(credentials.parent, host, port, found)
    log.info("running %s -c %s (pid %d)", program, conf, os.getpid())
    return mosquitto.run(program, conf)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the ``mb-broker`` command line."""
    parser = argparse.ArgumentParser(
        prog="mb-broker",
        description="Run minibatch's embedded MQTT broker (amqtt) until SIGTERM.",
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--credentials",
        type=Path,
        help="the server's user:password file; only it may publish "
        "(default: anyone may)",
    )
    parser.add_argument(
        "--mosquitto",
        action="store_true",
        help="run Debian's mosquitto, with its files beside --credentials",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of minibatch's own messages (amqtt logs warnings only)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, not {args.port}")
    if args.mosquitto and args.credentials is None:
        parser.error("--mosquitto needs --credentials")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mb-broker``.

    Returns:
        The process exit status: 0 after a clean stop, 1 when the broker could
        not start.
    """
    args = parse_args(argv)
    _quiet_logging(getattr(logging, args.log_level))
    if args.mosquitto:
        return _mosquitto(args.host, args.port, args.credentials)
    # amqtt 0.12 emits DeprecationWarnings about its own internals at start-up.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        asyncio.run(_main(args.host, args.port, args.credentials))
    except OSError as exc:
        log.error("%s", exc)
        return 1
    with contextlib.suppress(Exception):
        logging.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
