"""Bad input and greedy clients cannot hurt a daemon (issue 10, item 5).

A real cluster, started with the open file limit most systems give (1,024), is
sent garbage on the server's sockets (a raw ZeroMQ socket, and the commands'
unix socket), and thousands of connections. The server must stay up (its pid),
keep answering (``qstat``), and log about it in a few lines, never a traceback.
Only the server listens: the other daemons connect out, which a test checks.
The per-user connection cap is tested as another user (root only) and, without
a cluster, with the test's own uid made not exempt
(tests/unit/test_connection_caps.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
import zmq

from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.core.job import JobRequest, JobSpec
from minibatch.errors import ErrorCode, RemoteError, Unavailable
from minibatch.net.client import Client
from minibatch.net.local import ROUTE_PREFIX
from minibatch.net.ratelog import BURST
from minibatch.net.stream import HEADER, command_path
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import (
    Error,
    QueryJobs,
    ServerStatus,
    Status,
    Submit,
)
from tests.integration.conftest import Cluster, gone, toml_text

pytestmark = pytest.mark.integration

#: Small limits, so that the test need not send 64 MiB to exceed one.
LIMITS = {
    "max_message_bytes": 256 << 10,
    "max_script_bytes": 16 << 10,
    "max_env_bytes": 64 << 10,
    "max_connections_per_user": 64,
}
#: The soft limit the daemons start with: the usual default.
START_FDS = 1024
NOBODY = 65534
#: Descriptors the server may open or close meanwhile for its own use (a
#: command's connection, the database's files).
SLACK = 8


@contextlib.contextmanager
def soft_fd_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def cluster_1024() -> Iterator[Cluster]:
    """One node, started with a soft limit of 1,024 open files, in a home
    other users can traverse (to connect as another user)."""
    home = Path(tempfile.mkdtemp(prefix="mb-abuse-", dir="/tmp"))
    home.chmod(0o755)
    c = Cluster(home, plan_nodes(1, 1, usable_cpus()[:1], False, None), True)
    c.paths.config.write_text(toml_text("easy", {"server": LIMITS}))
    try:
        with soft_fd_limit(START_FDS):
            c.up()
        yield c
    finally:
        c.teardown()
        shutil.rmtree(home, ignore_errors=True)


def server_pid(c: Cluster) -> int:
    return c.pids()["server"]


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and not gone(pid)


def answers(c: Cluster) -> None:
    """The server is alive and answers qstat."""
    assert alive(server_pid(c))
    c.run("qstat", "-B")


def warnings_since(c: Cluster, start: int) -> list[str]:
    lines = c.log("server").splitlines()[start:]
    return [line for line in lines if " WARNING " in line or " ERROR " in line]


def raw_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    return sock


def garbage() -> list[list[bytes]]:
    """Messages no server should choke on, each answered with one error."""
    rng = random.Random(10)
    valid = encode(QueryJobs(selectors=["1"]), 9)
    out = [[rng.randbytes(rng.randrange(1, 300))] for _ in range(150)]
    out += [[valid[:cut]] for cut in range(len(valid))]  # truncated
    out += [[valid.replace(b"query_jobs", b"query\xffjobs")]]  # invalid UTF-8
    out += [[valid.replace(b"\xa11", b"\xa1\x80")]]
    out += [[b""], [valid, valid], [b"a", b"b", b"c"], [b""] * 50]  # shapes
    bodies = [
        {"type": "query_jobs", "selectors": [1]},
        {"type": "submit", "spec": "job.sh"},
        {"type": "heartbeat", "name": None, "running": {}},
        {"type": "kill", "job": "1", "result": "completed\n" * 1000},
        {"type": "ok"},  # a reply, not a request
        {"type": "no_such_type"},
    ]
    out += [[msgspec.msgpack.encode([1, 9, 0, body])] for body in bodies]
    out += [[msgspec.msgpack.encode([2, 9, 0, {"type": "status"}])]]
    out += [[b"\x94\x01\x01\x00" + b"\x91" * 100_000 + b"\xc0"]]  # deep
    return out


def test_garbage_is_answered_and_logged_in_a_few_lines(cluster_1024: Cluster) -> None:
    c = cluster_1024
    pid = server_pid(c)
    start = len(c.log("server").splitlines())
    began = time.monotonic()
    messages = garbage()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = raw_socket(ctx, c.endpoint)
        for frames in messages:
            sock.send_multipart(frames)
        codes = set()
        for _ in messages:
            reply = decode(sock.recv())
            assert isinstance(reply.body, Error), reply
            codes.add(reply.body.code)
        assert codes == {
            ErrorCode.INVALID_MESSAGE,
            ErrorCode.UNKNOWN_TYPE,
            ErrorCode.VERSION,
        }
        # Too large: libzmq drops it and its connection; the socket reconnects
        # and is answered again.
        sock.send(b"\x00" * (LIMITS["max_message_bytes"] + 1))

        def status_answered() -> bool:
            # A request sent on the dropped connection may be lost with it.
            sock.send(encode(Status(), 77))
            if not sock.poll(2000):
                return False
            return isinstance(decode(sock.recv()).body, ServerStatus)

        c.wait_for(status_answered, timeout=30, interval=0, what="an answer")
    finally:
        ctx.destroy(linger=0)  # closes the socket too, even after a failure
    answers(c)
    assert alive(pid) and server_pid(c) == pid
    c.wait_for(
        lambda: any("suppressed" in line for line in warnings_since(c, start)),
        timeout=20,
        what="the summary of suppressed lines",
    )
    # At most BURST lines and a summary per 10 s window the flood touched.
    windows = int((time.monotonic() - began) // 10) + 2
    logged = warnings_since(c, start)
    assert len(logged) <= windows * (BURST + 1), logged
    assert "Traceback" not in c.log("server")
    assert any("from uid" in line for line in logged), logged


def test_submissions_over_the_limits_are_refused_naming_them(
    cluster_1024: Cluster,
) -> None:
    c = cluster_1024
    big = c.work / "big.sh"
    big.write_text("#!/bin/sh\n" + "# padding\n" * 2000)
    refused = c.run("qsub", str(big), check=False)
    assert refused.returncode == 1
    assert "job script is too large" in refused.stderr
    assert "max_script_bytes" in refused.stderr
    assert f"{big.stat().st_size} bytes" in refused.stderr
    # The client refuses a control character at once; the server, which
    # cannot trust it, as well.
    refused = c.run("qsub", "-N", "a\x1bb", "--", "true", check=False)
    assert refused.returncode == 2 and "control character" in refused.stderr
    spec = JobSpec(
        name="evil\nname", workdir=str(c.work), request=JobRequest(), argv=["true"]
    )
    with c.client() as client, pytest.raises(RemoteError, match="control character"):
        client.call(Submit(spec=spec))
    env = {"V": "x" * LIMITS["max_env_bytes"]}
    with c.client() as client, pytest.raises(RemoteError, match="max_env_bytes"):
        client.call(Submit(spec=msgspec.structs.replace(spec, name="ok", env=env)))
    answers(c)


def daemon_fd_limits(c: Cluster) -> dict[str, int]:
    return {
        name: psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)[0]
        for name, pid in c.pids().items()
        if name != "broker"
    }


def fds(pid: int) -> int:
    return int(psutil.Process(pid).num_fds())


@pytest.mark.timeout(240)
def test_thousands_of_connections_leave_the_server_up(cluster_1024: Cluster) -> None:
    c = cluster_1024
    count = 2000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2 * count + 512:
        pytest.skip(f"the hard open file limit ({hard}) is too low for this test")
    # Every daemon raised the limit it was started with to the hard limit.
    assert set(daemon_fd_limits(c).values()) == {hard} and hard > START_FDS
    pid = server_pid(c)
    before = fds(pid)
    # Each socket holds two descriptors here (connection, mailbox).
    with soft_fd_limit(hard):
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, count + 16)
        socks = []
        try:
            for _ in range(count):
                socks.append(raw_socket(ctx, c.endpoint))
            # The test's user owns the cluster, so only the limit caps it.
            c.wait_for(
                lambda: fds(pid) >= before + count - SLACK,
                timeout=60,
                what=f"{count} connections accepted",
            )
            answers(c)
            socks[-1].send(encode(Status(), 5))
            reply = decode(socks[-1].recv()).body
            assert isinstance(reply, ServerStatus) and reply.pid == pid
        finally:
            ctx.destroy(linger=0)
    c.wait_for(
        lambda: fds(pid) <= before + SLACK, timeout=60, what="connections closed"
    )
    answers(c)
    assert server_pid(c) == pid
    assert "Traceback" not in c.log("server")


#: Run as root by the tests below: becomes another user, then connects.
AS_USER = """
# Imported before setuid: the interpreter's files may be unreadable by the uid.
import os, socket, sys
import zmq
from minibatch.net.client import Client
from minibatch.protocol.messages import Status

uid, endpoint, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
if not count:
    with Client(endpoint, timeout=20) as client:
        print(client.call(Status()).pid, flush=True)
    sys.exit(0)
ctx = zmq.Context()
ctx.set(zmq.MAX_SOCKETS, count + 16)
socks = []
for _ in range(count):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 60_000)  # one try each: a steady count
    sock.connect(endpoint)
    socks.append(sock)
print("connected", flush=True)
sys.stdin.read()
for sock in socks:
    sock.close()
ctx.term()
"""


def as_user(uid: int, endpoint: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", AS_USER, str(uid), endpoint, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_one_users_connections_are_capped(cluster_1024: Cluster) -> None:
    c = cluster_1024
    cap = LIMITS["max_connections_per_user"]
    pid = server_pid(c)
    before = fds(pid)
    start = len(c.log("server").splitlines())
    with as_user(NOBODY, c.endpoint, 10 * cap) as flood:
        assert flood.stdin is not None and flood.stdout is not None
        try:
            assert flood.stdout.readline().strip() == "connected"
            # nobody keeps ``cap`` connections; the server closed the others.
            c.wait_for(
                lambda: abs(fds(pid) - (before + cap)) <= SLACK,
                timeout=60,
                what=f"the server holding {cap} of nobody's connections",
            )
            # Other users are still answered: root (exempt), and uid 1.
            answers(c)
            with as_user(1, c.endpoint, 0) as other:
                out, _ = other.communicate(timeout=30)
            assert out.strip() == str(pid)
        finally:
            flood.stdin.close()  # the child closes its sockets and exits
            try:
                flood.wait(timeout=30)
            except subprocess.TimeoutExpired:
                flood.kill()
    c.wait_for(
        lambda: fds(pid) <= before + SLACK, timeout=60, what="connections closed"
    )
    logged = warnings_since(c, start)
    assert any("max_connections_per_user" in line for line in logged), logged
    assert alive(pid) and "Traceback" not in c.log("server")


def listening(pid: int) -> list[str]:
    """The sockets process ``pid`` accepts connections on (TCP or unix)."""
    proc = psutil.Process(pid)
    found = [
        f"tcp {conn.laddr}"
        for conn in proc.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    ]
    inodes = {
        os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:[") : -1]
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
    }
    with open("/proc/net/unix") as table:
        next(table)
        for row in table:
            fields = row.split()
            # Flags 00010000: __SO_ACCEPTCON, a listening socket.
            if fields[6] in inodes and int(fields[3], 16) & 0x10000:
                found.append(f"unix {fields[7] if len(fields) > 7 else '?'}")
    return found


def test_only_the_server_accepts_connections(cluster_1024: Cluster) -> None:
    c = cluster_1024
    pids = c.pids()
    assert listening(pids["server"]), "the server should listen"
    for name in ("scheduler", "node-node0"):
        assert listening(pids[name]) == [], name


def command_socket(c: Cluster) -> socket.socket:
    path = command_path(c.endpoint)
    assert path is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(path)
    return sock


def framed(data: bytes) -> bytes:
    return HEADER.pack(len(data)) + data


def read_message(sock: socket.socket) -> bytes | None:
    """The next message, or None when the server ended the connection."""

    def exactly(size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    header = exactly(HEADER.size)
    return None if header is None else exactly(HEADER.unpack(header)[0])


def test_garbage_on_the_commands_socket_is_answered(cluster_1024: Cluster) -> None:
    c = cluster_1024
    pid = server_pid(c)
    # Each as one message (several frames are a ZeroMQ shape), all sent at
    # once: the server stops reading while 64 wait, and goes on.
    messages = [parts[0] for parts in garbage() if len(parts) == 1]
    with command_socket(c) as sock:
        sock.sendall(b"".join(framed(m) for m in messages))
        for _ in messages:
            reply = read_message(sock)
            assert reply is not None and isinstance(decode(reply).body, Error)
        sock.sendall(framed(encode(Status(), 5)))
        reply = read_message(sock)
        assert reply is not None and isinstance(decode(reply).body, ServerStatus)
        # Too large: refused on its length alone, saying so, then the end.
        sock.sendall(HEADER.pack(LIMITS["max_message_bytes"] + 1) + b"x" * 100)
        reply = read_message(sock)
        assert reply is not None
        refusal = decode(reply).body
        assert isinstance(refusal, Error) and "max_message_bytes" in refusal.message
        assert read_message(sock) is None
    # The client says it too, naming the limit, not a timeout.
    spec = JobSpec(name="big", workdir=str(c.work), request=JobRequest(), argv=["t"])
    big = msgspec.structs.replace(spec, env={"V": "x" * LIMITS["max_message_bytes"]})
    with c.client() as client, pytest.raises(RemoteError, match="max_message_bytes"):
        client.call(Submit(spec=big))
    # A connection that ends halfway through a message leaves nothing behind.
    with command_socket(c) as sock:
        sock.sendall(framed(encode(Status(), 6))[:-3])
    answers(c)
    assert server_pid(c) == pid and "Traceback" not in c.log("server")


def test_a_router_peer_cannot_take_a_commands_route(cluster_1024: Cluster) -> None:
    """A ZeroMQ peer that names itself as a command's connection would get
    that command's replies: its requests are dropped, and said so."""
    c = cluster_1024
    start = len(c.log("server").splitlines())
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, ROUTE_PREFIX + (1).to_bytes(8, "big"))
        sock.connect(c.endpoint)
        sock.send(encode(Status(), 3))
        c.wait_for(
            lambda: any("reserved routing id" in w for w in warnings_since(c, start)),
            timeout=20,
            what="the dropped request logged",
        )
        assert not sock.poll(0)
    finally:
        ctx.destroy(linger=0)
    answers(c)


def test_a_request_given_up_on_is_not_carried_out(cluster_1024: Cluster) -> None:
    """A command that timed out said it got no answer: its request, not yet
    read by a stopped server, must not make a job once the server goes on (a
    qsub run again would make a second one)."""
    c = cluster_1024
    pid = server_pid(c)
    spec = JobSpec(
        name="given-up", workdir=str(c.work), request=JobRequest(), argv=["true"]
    )
    os.kill(pid, signal.SIGSTOP)
    try:
        with (
            Client(c.endpoint, timeout=1) as client,
            pytest.raises(Unavailable, match="running but busy"),
        ):
            client.call(Submit(spec=spec))
    finally:
        os.kill(pid, signal.SIGCONT)
    answers(c)
    with c.client() as client:
        listed = client.call(QueryJobs(finished=True)).jobs
    assert [j for j in listed if j.name == "given-up"] == []
    # Sent again, it is carried out once.
    with c.client() as client:
        (job,) = client.call(Submit(spec=spec)).ids
        listed = client.call(QueryJobs(finished=True)).jobs
    assert [j.id for j in listed if j.name == "given-up"] == [job]
