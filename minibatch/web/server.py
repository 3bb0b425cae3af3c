"""``mb web``: the page, its assets, and ``/events`` on 127.0.0.1, in one event loop
with the :class:`~minibatch.live.feed.Feed` that keeps the model current.

Routes (GET or HEAD, none takes a query unless said):

* ``/``: the page; ``/app.js``, ``/style.css``: its script and style (package data).
* ``/state``: the view (:mod:`minibatch.web.state`) once, as JSON.
* ``/events``: server-sent events: the view on connect, then again after each
  change, at most every :data:`MIN_INTERVAL` seconds; a comment line when
  nothing changed for :data:`KEEPALIVE` seconds, so a vanished client is noticed.
* ``/whatif?policy=NAME``: the queue simulated under NAME and under the policy
  in force (:mod:`minibatch.web.whatif`), as JSON.

The view is encoded once per change and shared by every client; a client that
reads slowly skips versions rather than queueing them. The page acts on nothing:
no route changes the cluster, so whoever reaches 127.0.0.1 gets no more than
``qstat`` gives them, and never the rights of the user who started ``mb web``.
Requests naming another host than this one are refused, so a web site cannot
read the page through a name that resolves here (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from importlib import resources

from minibatch.config import Config, Paths
from minibatch.errors import MinibatchError
from minibatch.live.model import LiveCluster
from minibatch.web import http, state, whatif
from minibatch.web.http import HttpError, Request
from minibatch.web.whatif import WhatIfs

#: Fewest seconds between two views pushed.
MIN_INTERVAL = 0.25
#: Seconds of silence after which a stream gets a comment line.
KEEPALIVE = 15.0
#: Seconds a client may take to take in one message before it is dropped.
WRITE_TIMEOUT = 30.0
#: Connections served at once; more are told to come back later.
MAX_CLIENTS = 32
#: Seconds between the model's samples (it forgets jobs ended before its history).
SAMPLE_EVERY = 1.0
#: What the browser should wait before reconnecting a dropped stream (ms).
RETRY_MS = 2000

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


class PortInUse(MinibatchError):
    """Another program listens on the port asked for."""


def _assets() -> dict[str, tuple[bytes, str]]:
    """The static files by route, read once: a missing one fails at start."""
    folder = resources.files("minibatch.web") / "static"
    return {
        route: ((folder / name).read_bytes(), kind)
        for route, (name, kind) in STATIC.items()
    }


class Hub:
    """The latest view, encoded once for every client, and a way to wait for
    the next one."""

    def __init__(self) -> None:
        self.data = b""
        #: What the view shows: the model's version and the feed's problem.
        self.key: tuple[int, str] = (-1, "")
        self.seq = 0
        self._next = asyncio.Event()

    def publish(self, data: bytes, key: tuple[int, str]) -> None:
        self.data, self.key = data, key
        self.seq += 1
        self._next.set()
        self._next = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Wait until a view newer than ``seen`` is out; False on timeout."""
        if self.seq == seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next.wait(), timeout)
        return self.seq != seen


Handler = Callable[
    [Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]


class WebServer:
    """Serves ``model`` on 127.0.0.1.

    Args:
        model: What the page shows (kept current by someone else: a Feed).
        problem: What is wrong with the feed now ("" when all is well).
        whatifs: Answers ``/whatif`` (None: no such page, no panel).
    """

    def __init__(
        self,
        model: LiveCluster,
        problem: Callable[[], str] = lambda: "",
        whatifs: WhatIfs | None = None,
    ) -> None:
        self.model = model
        self.problem = problem
        self.whatifs = whatifs
        self.assets = _assets()
        self.hub = Hub()
        self.port = 0
        #: Event streams open now.
        self.streams = 0
        self._server: asyncio.Server | None = None
        #: Open connections: their handlers, and their streams to close them.
        self._clients: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._routes: dict[str, Handler] = {
            "/state": self._state,
            "/events": self._stream,
        }
        if whatifs is not None:
            self._routes["/whatif"] = self._whatif

    def _key(self) -> tuple[int, str]:
        return self.model.version, self.problem()

    def _render(self) -> bytes:
        policies = self.whatifs.policies if self.whatifs else []
        return state.encode(self.model, self.problem(), time.time(), policies)

    def changed(self) -> None:
        """The model or the problem moved: push a new view soon."""
        self._dirty.set()

    async def start(self, port: int) -> int:
        """Listen on 127.0.0.1:``port`` (0: any free port); returns the port.

        Raises:
            PortInUse: Something else listens there.
            MinibatchError: The port cannot be had otherwise (e.g. privileged).
        """
        try:
            self._server = await asyncio.start_server(
                self._connection, "127.0.0.1", port, limit=http.LINE_LIMIT
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} is in use") from None
            raise MinibatchError(
                f"cannot listen on port {port}: {exc.strerror}"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        self._tasks = [
            asyncio.ensure_future(self._publisher()),
            asyncio.ensure_future(self._sampler()),
        ]
        return self.port

    async def close(self) -> None:
        """Stop listening and end every connection."""
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        # Dropping the connections ends their handlers as if the clients had
        # left (cancelling them instead makes Python 3.11's asyncio log an error).
        handlers = list(self._clients)
        for writer in self._clients.values():
            writer.transport.abort()
        await asyncio.gather(*self._tasks, *handlers, return_exceptions=True)

    async def _publisher(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._key() != self.hub.key:
                self.hub.publish(self._render(), self._key())
            await asyncio.sleep(MIN_INTERVAL)

    async def _sampler(self) -> None:
        while True:
            self.model.sample(time.time())
            await asyncio.sleep(SAMPLE_EVERY)

    # ------------------------------------------------------------- requests

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients[task] = writer
        # No buffering past the socket's: a drain returns once all was handed
        # over, so a client that stops reading is caught by the write timeout.
        writer.transport.set_write_buffer_limits(high=0)
        answered = False
        try:
            await self._serve(reader, writer)
            answered = True
        except (ConnectionError, TimeoutError, http.ClientGone):
            pass  # the client went away or stalled: nothing more to tell it
        finally:
            del self._clients[task]
            if answered:
                writer.close()
            else:  # gone, stalled, or mb web stopping: drop what it did not read
                writer.transport.abort()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        method = "GET"
        try:
            if len(self._clients) > MAX_CLIENTS:
                raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "too many clients")
            request = await asyncio.wait_for(
                http.read_request(reader), http.REQUEST_TIMEOUT
            )
            method = request.method
            self._check_host(request)
            await self._route(request, reader, writer)
        except HttpError as exc:
            writer.write(http.error_response(exc, with_body=method != "HEAD"))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

    def _check_host(self, request: Request) -> None:
        host = request.headers.get("host")
        if host is None:
            return  # HTTP/1.0 tools; every browser names the host
        if host not in (f"127.0.0.1:{self.port}", f"localhost:{self.port}"):
            raise HttpError(
                HTTPStatus.FORBIDDEN,
                f"this page answers at http://127.0.0.1:{self.port}/ only "
                f"(not host {http.shown(host)})",
            )

    async def _route(
        self,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        handler = self._routes.get(request.path)
        if handler is None and request.path not in self.assets:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no page {http.shown(request.path)}")
        if request.query and request.path != "/whatif":
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                f"{request.path} takes no query "
                f"(got {http.shown('&'.join(request.query))})",
            )
        if handler is not None:
            await handler(request, reader, writer)
        else:
            body, kind = self.assets[request.path]
            await self._send(writer, request, body, kind)

    async def _send(
        self, writer: asyncio.StreamWriter, request: Request, body: bytes, kind: str
    ) -> None:
        writer.write(http.head(HTTPStatus.OK, kind, len(body)))
        if request.method != "HEAD":
            writer.write(body)
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

    async def _state(
        self, request: Request, _: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._send(writer, request, self._render(), "application/json")

    async def _whatif(
        self, request: Request, _: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self.whatifs is not None
        body = await self.whatifs.answer(request.query)
        await self._send(writer, request, body, "application/json")

    async def _stream(
        self,
        request: Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        writer.write(http.head(HTTPStatus.OK, "text/event-stream", None))
        if request.method == "HEAD":
            return
        # A client sends nothing after its request, so the read ends when it
        # leaves: noticed at once, even while no view is due.
        gone = asyncio.ensure_future(_left(reader))
        self.streams += 1
        try:
            seq, shown = self.hub.seq, self._key()
            message = f"retry: {RETRY_MS}\n\n".encode() + _event(self._render())
            while True:
                writer.write(message)
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
                message = b": still here\n\n"
                fresh = asyncio.ensure_future(self.hub.wait(seq, KEEPALIVE))
                try:
                    await asyncio.wait([fresh, gone], return_when=FIRST_COMPLETED)
                finally:
                    fresh.cancel()
                if gone.done():
                    return
                if fresh.result():
                    seq = self.hub.seq
                    if self.hub.key != shown:  # not what it got on connecting
                        shown, message = self.hub.key, _event(self.hub.data)
        finally:
            self.streams -= 1
            gone.cancel()


async def _left(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        await reader.read(1)


def _event(data: bytes) -> bytes:
    """One server-sent event (the JSON is a single line)."""
    return b"event: state\ndata: " + data + b"\n\n"


def serve(paths: Paths, config: Config, port: int) -> None:
    """Run ``mb web`` for the cluster of ``paths`` until SIGTERM or SIGINT.

    Raises:
        NoEvents: The cluster publishes no events to follow.
        PortInUse: The port is taken (nothing was started then).
    """
    logging.basicConfig(format="mb web: %(message)s", level=logging.WARNING)
    asyncio.run(_main(paths, config, port))


async def _main(paths: Paths, config: Config, port: int) -> None:
    from minibatch.live.feed import Feed

    model = state.PublicCluster()
    web = WebServer(model, lambda: feed.problem, whatif.for_cluster(paths, config))
    feed = Feed(paths, config, model, on_change=web.changed)
    bound = await web.start(port)
    print(f"mb web: serving http://127.0.0.1:{bound}/ (Ctrl-C to stop)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    following = asyncio.ensure_future(feed.run())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([following, stopping], return_when=FIRST_COMPLETED)
    finally:
        for task in (following, stopping):
            task.cancel()
        await web.close()
        with contextlib.suppress(asyncio.CancelledError):
            await following  # re-raises what ended it otherwise: a bug, shown
