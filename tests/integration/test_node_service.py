"""The ``mb-node`` daemon as a real process, against a fake server socket.

The test plays the server on a ROUTER socket: it answers hellos and heartbeats,
sends Launch and Kill, withholds replies to check that reports are re-sent, and
stops the daemon with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
import zmq.asyncio

from minibatch.core.job import JobResult
from minibatch.errors import ErrorCode
from minibatch.node import cgroup
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import (
    Error,
    Heartbeat,
    JobEnded,
    JobStarted,
    Kill,
    Launch,
    LaunchSpec,
    Message,
    NodeHello,
    Ok,
)
from tests.integration.conftest import gone, wait_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


class FakeServer:
    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.node = b""

    async def recv(self, timeout: float = 5.0) -> tuple[int, Any]:
        ident, frame = await asyncio.wait_for(self.sock.recv_multipart(), timeout)
        self.node = ident
        env = decode(frame)
        return env.id, env.body

    async def reply(self, rid: int, body: Message) -> None:
        await self.sock.send_multipart([self.node, encode(body, re=rid)])

    async def send(self, body: Message) -> None:
        await self.sock.send_multipart([self.node, encode(body)])

    async def expect(self, kind: type, timeout: float = 5.0, answer: bool = True):
        """The next message of type ``kind``; heartbeats meanwhile are answered
        (``JobStarted`` is a notification: never answered)."""
        deadline = time.monotonic() + timeout
        while True:
            rid, body = await self.recv(max(0.01, deadline - time.monotonic()))
            if isinstance(body, kind):
                if answer and not isinstance(body, JobStarted):
                    await self.reply(rid, Ok())
                return rid, body
            assert isinstance(body, Heartbeat | JobStarted), body
            if not isinstance(body, JobStarted):
                await self.reply(rid, Ok())


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeServer, Any, Path]]:
    home = tmp_path / "home"
    home.mkdir()
    endpoint = f"ipc:///tmp/mbnode-test-{uuid.uuid4().hex[:12]}.sock"
    (home / "minibatch.toml").write_text(
        f'[server]\nendpoint = "{endpoint}"\n'
        "[node]\nheartbeat = 0.2\nkill_grace = 0.5\nsample_interval = 0.05\n"
    )
    server = FakeServer(endpoint)
    name = f"tn-{uuid.uuid4().hex[:8]}"
    code = "import sys; from minibatch.node.service import main; sys.exit(main())"
    with open(tmp_path / "node.log", "wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-c", code, "--name", name, "--cpus", "0", "--mem", "1gb"],
            env={**os.environ, "MB_HOME": str(home)},
            stderr=log,
        )
    try:
        yield server, daemon, tmp_path
    finally:
        if daemon.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(daemon.pid).children(recursive=True):
                    child.kill()
            daemon.kill()
        daemon.wait()
        # A killed daemon leaves its (empty) cgroups: removed as mb down would.
        cgroup.remove_empty(str(home))
        server.sock.close(0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(endpoint.removeprefix("ipc://"))


def spec(job: int, workdir: Path, script: str) -> LaunchSpec:
    return LaunchSpec(
        job=job,
        display_id=str(job),
        name=f"j{job}",
        user="u",
        uid=os.geteuid(),
        gid=os.getegid(),
        workdir=str(workdir),
        script=script,
        argv=None,
        env={"PATH": os.environ["PATH"]},
        stdout_path=f"j{job}.o",
        stderr_path=f"j{job}.e",
        join=False,
        cpus=[0],
        hosts=["n"],
        walltime=60,
        mem_kb=None,
    )


async def test_registers_launches_resends_and_stops(cluster) -> None:
    server, daemon, tmp = cluster
    _, hello = await server.expect(NodeHello)
    assert (hello.cpus, hello.mem_kb, hello.pid) == ([0], 1 << 20, daemon.pid)

    # A server that forgot the node answers NOT_FOUND: the node says hello again.
    rid, _ = await server.expect(Heartbeat, answer=False)
    await server.reply(rid, Error(code=ErrorCode.NOT_FOUND, message="who?"))
    await server.expect(NodeHello)

    # An unanswered JobEnded is re-sent until answered.
    await server.send(Launch(spec=spec(1, tmp, "echo hi\n")))
    _, started = await server.expect(JobStarted)
    assert started.job == 1
    _, first = await server.expect(JobEnded, answer=False)
    _, again = await server.expect(JobEnded)
    assert first == again and first.result is JobResult.COMPLETED
    assert (tmp / "j1.o").read_text() == "hi\n"

    # Kill from the server: the result is the server's.
    await server.send(Launch(spec=spec(2, tmp, "sleep 30\n")))
    await server.expect(JobStarted)
    await server.send(Kill(job=2, result=JobResult.CANCELLED))
    _, ended = await server.expect(JobEnded)
    assert (ended.job, ended.result, ended.exit_status) == (2, "cancelled", 271)

    # SIGTERM: running jobs end node_fail, the daemon exits 0, nothing is left.
    script = "(setsid env -i /bin/sh -c 'echo $$ > stray.pid; exec sleep 300' &)\n"
    await server.send(Launch(spec=spec(3, tmp, script + "sleep 30\n")))
    await server.expect(JobStarted)
    stray = int((await wait_file(tmp / "stray.pid")).strip())
    daemon.send_signal(signal.SIGTERM)
    _, ended = await server.expect(JobEnded)
    assert (ended.job, ended.result) == (3, JobResult.NODE_FAIL)
    assert ended.comment.startswith("node daemon stopped")
    assert await asyncio.to_thread(daemon.wait, 5) == 0
    assert gone(stray)


async def test_orphan_without_job_markers_is_killed(cluster) -> None:
    server, daemon, tmp = cluster
    await server.expect(NodeHello)
    # setsid + an empty environment: once orphaned, nothing ties the process to
    # the job but having been seen in its tree, or adopted while the job ran.
    script = (
        "(setsid env -i /bin/sh -c 'echo $$ > stray.pid; exec sleep 300' &)\n"
        "while [ ! -s stray.pid ]; do sleep 0.01; done\n"
    )
    await server.send(Launch(spec=spec(1, tmp, script)))
    await server.expect(JobEnded)
    stray = int((await wait_file(tmp / "stray.pid")).strip())
    deadline = time.monotonic() + 3
    while not gone(stray) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert gone(stray)
