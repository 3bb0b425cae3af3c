"""``mb web``'s HTTP layer and view, against a LiveCluster built by hand: status
codes for bad requests, the event stream's framing, clients that leave or stall,
and what the view holds (and keeps out)."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from minibatch.errors import InvalidArgument, Unavailable
from minibatch.live.model import LiveCluster, LiveJob, LiveNode
from minibatch.sim.whatif import WhatIf, WhatIfRow
from minibatch.web import http, server, state
from minibatch.web.server import PortInUse, WebServer
from minibatch.web.whatif import WhatIfs

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


def job(id: str, job_state: str, **kw: Any) -> LiveJob:
    return LiveJob(id=id, name=f"job{id}", user="ann", state=job_state, **kw)


def cluster() -> LiveCluster:
    """Two 2-CPU nodes; job 1 runs on node0's CPU 0, job 2 waits for 3 CPUs."""
    model = LiveCluster()
    model.nodes = {
        "node10": LiveNode(name="node10", state="free", cpus=[2, 3]),
        "node0": LiveNode(name="node0", state="free", cpus=[0, 1]),
    }
    model.jobs = {
        "1": job("1", "running", walltime=120.0, start_time=NOW - 50,
                 alloc={"node0": [0]}),
        "2": job("2", "queued", ncpus=3, walltime=60.0, predicted_start=NOW + 50,
                 rank=0, reason="waiting for 3 CPUs"),
    }  # fmt: skip
    return model


@pytest.fixture
async def errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler (a traceback, for a user)."""
    seen: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _loop, context: seen.append(context)
    )
    yield seen


@pytest.fixture
async def web(errors: list[dict[str, Any]]) -> AsyncIterator[WebServer]:
    web = WebServer(cluster(), lambda: "")
    await web.start(0)
    try:
        yield web
    finally:
        await web.close()
    assert errors == []


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read until the server closes: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def get(port: int, target: str, method: str = "GET", host: str | None = None) -> bytes:
    host = host or f"127.0.0.1:{port}"
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


# ------------------------------------------------------------ status codes


@pytest.mark.parametrize(
    ("target", "status", "says"),
    [
        ("/nope", 404, "no page '/nope'"),
        ("/static/app.js", 404, "no page"),
        ("/?x=1", 400, "/ takes no query"),
        ("/events?since=3", 400, "/events takes no query"),
        ("/state?a=%ff", 400, "malformed query"),
        ("/state?a", 400, "malformed query"),
        ("/state?a=1&a=2", 400, "'a' given twice"),
        ("/state?" + "&".join(f"k{i}=1" for i in range(20)), 400, "malformed query"),
    ],
)
async def test_a_bad_path_or_query_gets_a_plain_status(
    web: WebServer, target: str, status: int, says: str
) -> None:
    code, headers, body = await exchange(web.port, get(web.port, target))
    assert code == status
    assert headers["Content-Type"].startswith("text/plain")
    assert says in body.decode()
    assert body.count(b"\n") == 1


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"POST / HTTP/1.1\r\n\r\n", 405, "the page is read-only"),
        (b"DELETE /state HTTP/1.1\r\n\r\n", 405, "not allowed"),
        (b"GET /\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/2.0\r\n\r\n", 505, "unsupported version"),
        (b"GET http://x/ HTTP/1.1\r\n\r\n", 400, "malformed target"),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "malformed header"),
        (b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n", 400, "non-ASCII"),
        (b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403, "127.0.0.1"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 431, "too long"),
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 70 + b"\r\n", 431, "too many"),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1", 400, "incomplete request"),
    ],
)
async def test_a_malformed_request_gets_a_plain_status(
    web: WebServer, raw: bytes, status: int, says: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    writer.write(raw)
    writer.write_eof()  # the incomplete request ends there
    data = await reader.read()
    writer.close()
    assert data.startswith(f"HTTP/1.1 {status} ".encode()), data[:80]
    assert says in data.decode(errors="replace")
    if status == 405:
        assert b"\r\nAllow: GET, HEAD\r\n" in data


async def test_the_page_and_its_assets_are_served_self_contained(
    web: WebServer,
) -> None:
    for target, kind in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/style.css", "text/css"),
        ("/state", "application/json"),
    ]:
        code, headers, body = await exchange(web.port, get(web.port, target))
        assert code == 200 and headers["Content-Type"].startswith(kind)
        assert int(headers["Content-Length"]) == len(body) > 0
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert headers["Connection"] == "close"
    _, _, page = await exchange(web.port, get(web.port, "/"))
    assert b"http://" not in page.replace(b"http://www.w3.org/2000/svg", b"")
    assert b"https://" not in page
    code, headers, body = await exchange(web.port, get(web.port, "/", "HEAD"))
    assert code == 200 and int(headers["Content-Length"]) > 0 and body == b""
    for name in ("localhost", "127.0.0.1"):
        host = f"{name}:{web.port}"
        assert (await exchange(web.port, get(web.port, "/state", host=host)))[0] == 200


async def test_a_port_in_use_is_named(web: WebServer) -> None:
    other = WebServer(LiveCluster())
    with pytest.raises(PortInUse, match=rf"^port {web.port} is in use$"):
        await other.start(web.port)
    await other.close()


async def test_more_clients_than_allowed_are_told_to_come_back(
    web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MAX_CLIENTS", 1)
    stream = await Stream.open(web.port)
    code, _, body = await exchange(web.port, get(web.port, "/state"))
    assert code == 503 and body == b"too many clients\n"
    stream.close()


async def test_a_client_that_sends_nothing_is_dropped(
    web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "REQUEST_TIMEOUT", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
    writer.write(b"GET / HT")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    assert (await exchange(web.port, get(web.port, "/state")))[0] == 200


# ------------------------------------------------------------ event stream


class Stream:
    """An ``/events`` client reading raw bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Stream:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get(port, "/events"))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nContent-Type: text/event-stream\r\n" in head
        assert b"Content-Length" not in head
        return cls(reader, writer)

    async def block(self) -> bytes:
        """One block: the lines up to a blank one."""
        return await asyncio.wait_for(self.reader.readuntil(b"\n\n"), 10)

    async def state(self) -> dict[str, Any]:
        """The next ``state`` event's view (comments and the retry skipped)."""
        while (block := await self.block()).startswith((b":", b"retry:")):
            pass
        event, data = block.rstrip(b"\n").split(b"\n")
        assert event == b"event: state"
        assert data.startswith(b"data: {")
        result: dict[str, Any] = json.loads(data[len(b"data: ") :])
        return result

    def close(self, reset: bool = False) -> None:
        if reset:  # RST rather than FIN, as a killed browser may
            sock = self.writer.get_extra_info("socket")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        self.writer.close()


async def until(predicate: Any, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} not reached")


async def test_the_stream_sends_the_state_then_each_change(web: WebServer) -> None:
    stream = await Stream.open(web.port)
    assert await stream.block() == b"retry: 2000\n\n"
    first = await stream.state()
    assert [n["name"] for n in first["nodes"]] == ["node0", "node10"]
    assert first["queue"][0]["id"] == "2"
    web.model.apply(
        "jobs/2/started",
        {"id": "2", "name": "job2", "user": "ann", "state": "running",
         "start_time": NOW, "alloc": {"node0": [1], "node10": [2, 3]}, "time": NOW},
        NOW,
    )  # fmt: skip
    web.changed()
    second = await stream.state()
    assert second["version"] > first["version"]
    assert [j["id"] for j in second["running"]] == ["1", "2"]
    assert second["queue"] == []
    cells = {n["name"]: n["cells"] for n in second["nodes"]}
    assert cells == {"node0": [[0, "1"], [1, "2"]], "node10": [[2, "2"], [3, "2"]]}
    stream.close()


async def test_a_change_is_pushed_once_to_every_client(web: WebServer) -> None:
    streams = [await Stream.open(web.port) for _ in range(3)]
    versions = [(await s.state())["version"] for s in streams]
    web.model.apply("nodes/node0/state", {"name": "node0", "state": "down"}, NOW)
    web.changed()
    web.changed()  # a burst is one push
    for stream in streams:
        view = await stream.state()
        assert view["version"] == versions[0] + 1
        assert view["nodes"][0]["state"] == "down"
    for stream in streams:
        stream.close()


async def test_a_problem_alone_is_pushed(web: WebServer) -> None:
    problem = ""
    web.problem = lambda: problem
    stream = await Stream.open(web.port)
    assert (await stream.state())["problem"] == ""
    problem = "event broker mqtt://127.0.0.1:1 unreachable (refused)"
    web.changed()
    assert (await stream.state())["problem"] == problem
    stream.close()


async def test_idle_streams_get_comments(
    web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "KEEPALIVE", 0.05)
    stream = await Stream.open(web.port)
    await stream.block()
    await stream.state()
    assert await stream.block() == b": still here\n\n"
    stream.close()


@pytest.mark.parametrize("reset", [False, True])
async def test_a_client_leaving_mid_stream_ends_quietly(
    web: WebServer, errors: list[dict[str, Any]], reset: bool
) -> None:
    staying, leaving = await Stream.open(web.port), await Stream.open(web.port)
    await staying.state()
    await leaving.state()
    await until(lambda: web.streams == 2, "two streams")
    leaving.close(reset)
    await until(lambda: web.streams == 1, "the leaver's stream ended")
    web.model.apply("nodes/node0/state", {"name": "node0", "state": "offline"}, NOW)
    web.changed()
    assert (await staying.state())["nodes"][0]["state"] == "offline"
    assert (await exchange(web.port, get(web.port, "/state")))[0] == 200
    staying.close()
    await until(lambda: web.streams == 0, "every stream ended")
    assert errors == []


async def test_closing_ends_open_streams(errors: list[dict[str, Any]]) -> None:
    web = WebServer(cluster())
    await web.start(0)
    stream = await Stream.open(web.port)
    await stream.state()
    await web.close()
    assert await asyncio.wait_for(stream.reader.read(), 10) == b""
    assert web.streams == 0
    stream.close()
    assert errors == []


# -------------------------------------------------------------------- view


def test_the_chart_packs_waiting_jobs_where_cpus_free_up() -> None:
    model = cluster()
    model.jobs["0"] = job("0", "finished", start_time=NOW - 90, end_time=NOW - 60,
                          alloc={"node10": [3]})  # fmt: skip
    bars = state.bars(model, model.queue(), NOW)
    rows = state.rows(model)
    assert rows == [("node0", 0), ("node0", 1), ("node10", 2), ("node10", 3)]
    by_kind = {(b.kind, b.job, b.row) for b in bars}
    assert by_kind == {
        ("ended", "0", 3),
        ("running", "1", 0),
        # 3 CPUs at NOW + 50: the three rows free then, not job 1's (until + 70).
        ("planned", "2", 1),
        ("planned", "2", 2),
        ("planned", "2", 3),
    }
    running = next(b for b in bars if b.kind == "running")
    assert (running.start, running.end, running.limit) == (NOW - 50, None, NOW + 70)
    planned = next(b for b in bars if b.kind == "planned")
    assert (planned.start, planned.end) == (NOW + 50, NOW + 110)


def test_a_waiting_job_wider_than_the_free_rows_takes_those_freed_first() -> None:
    model = cluster()
    model.jobs["2"].ncpus = 4
    model.jobs["3"] = job("3", "queued", ncpus=1, walltime=10.0,
                          predicted_start=NOW + 200, rank=1)  # fmt: skip
    bars = state.bars(model, model.queue(), NOW)
    assert sorted(b.row for b in bars if b.job == "2") == [0, 1, 2, 3]
    # Job 2 ends at NOW + 110 everywhere: job 3 goes on the first row.
    assert [b.row for b in bars if b.job == "3"] == [0]


def test_the_view_is_one_json_line_of_public_fields() -> None:
    model = cluster()
    model.jobs["2"].name = "<script>\nalert(1)</script>"
    data = state.encode(model, "", NOW)
    assert b"\n" not in data
    view = json.loads(data)
    assert set(view) >= {"now", "nodes", "rows", "bars", "running", "queue", "log"}
    assert view["queue"][0]["name"] == "<script>\nalert(1)</script>"
    fields = set(view["queue"][0])
    assert not fields & {"script", "env", "argv", "submit_args"}


def test_the_queue_sent_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "QUEUE_SHOWN", 2)
    model = cluster()
    for i in range(3, 8):
        model.jobs[str(i)] = job(str(i), "queued", submit_time=float(i))
    view = state.view(model, "", NOW)
    assert [j.id for j in view["queue"]] == ["2", "3"]
    assert view["queued"] == 6


def test_the_log_leaves_out_the_submission_arguments() -> None:
    model = state.PublicCluster()
    payload = {"id": "9", "name": "x", "user": "ann", "state": "queued",
               "event": "submitted", "time": NOW, "ncpus": 1,
               "detail": "-v TOKEN=secret -- ./run"}  # fmt: skip
    model.apply("jobs/9/submitted", payload, NOW)
    model.apply("jobs/9/finished", {**payload, "state": "finished",
                                    "detail": "killed: walltime"}, NOW)  # fmt: skip
    lines = [line.text for line in model.log]
    assert lines[0] == "job 9 (x, ann) submitted, 1 CPU"
    assert "killed: walltime" in lines[1]
    assert "secret" not in state.encode(model, "", NOW).decode()


# ----------------------------------------------------------------- what if


def comparison(name: str) -> WhatIf:
    row = WhatIfRow(job=2, user="ann", cpus=3, submit=NOW - 10, current=NOW + 50,
                    other=NOW + 20, delta=-30.0)  # fmt: skip
    return WhatIf(now=NOW, current="easy", current_params={}, policy=name, params={},
                  rows=[row], current_mean_wait=60.0, mean_wait=30.0)  # fmt: skip


async def whatif_server(simulate: Callable[[str], WhatIf]) -> WebServer:
    web = WebServer(cluster(), whatifs=WhatIfs(["easy", "fifo"], simulate))
    await web.start(0)
    return web


async def test_a_what_if_answers_with_the_comparison(
    errors: list[dict[str, Any]],
) -> None:
    asked: list[str] = []
    web = await whatif_server(lambda name: asked.append(name) or comparison(name))
    try:
        code, headers, body = await exchange(
            web.port, get(web.port, "/whatif?policy=fifo")
        )
        assert (code, headers["Content-Type"]) == (200, "application/json")
        assert json.loads(body)["rows"][0] == {
            "job": 2, "user": "ann", "cpus": 3, "submit": NOW - 10,
            "current": NOW + 50, "other": NOW + 20, "delta": -30.0,
        }  # fmt: skip
        assert asked == ["fifo"]
        _, _, view = await exchange(web.port, get(web.port, "/state"))
        assert json.loads(view)["policies"] == ["easy", "fifo"]
    finally:
        await web.close()
    assert errors == []


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("/whatif", "unknown policy '' (one of easy, fifo)"),
        ("/whatif?policy=mod:Cls", "unknown policy 'mod:Cls' (one of easy, fifo)"),
        ("/whatif?policy=fifo&k=1", "/whatif takes policy only (got 'k')"),
        ("/whatif?policy=fifo&policy=easy", "'policy' given twice"),
    ],
)
async def test_a_what_if_for_no_known_policy_is_refused(target: str, says: str) -> None:
    web = await whatif_server(comparison)
    try:
        code, _, body = await exchange(web.port, get(web.port, target))
    finally:
        await web.close()
    assert (code, body.decode()) == (400, says + "\n")


@pytest.mark.parametrize(
    ("failure", "status", "says"),
    [
        (Unavailable("no minibatch server at ipc://x"), 503, "no minibatch server"),
        (InvalidArgument("bad parameter k"), 400, "bad parameter k"),
        (RuntimeError("policy bug"), 500, "the simulation failed: RuntimeError"),
    ],
)
async def test_a_failed_what_if_is_said_and_the_page_stays_up(
    failure: Exception, status: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    def simulate(name: str) -> WhatIf:
        raise failure

    web = await whatif_server(simulate)
    try:
        code, _, body = await exchange(web.port, get(web.port, "/whatif?policy=fifo"))
        assert code == status and says in body.decode()
        assert (await exchange(web.port, get(web.port, "/state")))[0] == 200
    finally:
        await web.close()
    logged = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(logged) == (1 if status == 500 else 0)


async def test_one_what_if_at_a_time() -> None:
    release = threading.Event()

    def slow(name: str) -> WhatIf:
        release.wait(10)
        return comparison(name)

    web = await whatif_server(slow)
    try:
        first = asyncio.ensure_future(
            exchange(web.port, get(web.port, "/whatif?policy=fifo"))
        )
        await until(lambda: web.whatifs is not None and web.whatifs.busy, "busy")
        code, _, body = await exchange(web.port, get(web.port, "/whatif?policy=easy"))
        assert code == 503 and b"another what-if" in body
        assert (await exchange(web.port, get(web.port, "/state")))[0] == 200
        release.set()
        assert (await first)[0] == 200
    finally:
        release.set()
        await web.close()


async def test_without_what_ifs_there_is_no_such_page(web: WebServer) -> None:
    code, _, _ = await exchange(web.port, get(web.port, "/whatif?policy=fifo"))
    assert code == 404
    _, _, view = await exchange(web.port, get(web.port, "/state"))
    assert json.loads(view)["policies"] == []
