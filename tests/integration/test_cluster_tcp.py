"""Commands and node daemons on "other hosts": tcp with CURVE keys.

The server listens on 127.0.0.1 besides its ipc socket (``[server] listen``).
Each client has an ``MB_HOME`` of its own, as on another machine, holding its
keypair and the server's public key (``mb keys init --client``, ``mb keys
trust``); the server accepts only the keys registered with ``mb keys add-user``
and ``add-node``. The commands run as root here, but over tcp they are whoever
their key was registered for: a user made for these tests.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import zmq

from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.errors import ErrorCode, RemoteError
from minibatch.net.client import Client
from minibatch.protocol import encode
from minibatch.protocol.messages import (
    Heartbeat,
    NodeHello,
    SetNodeOffline,
    Status,
)
from tests.integration.conftest import BIN, Cluster, procs_with, toml_text
from tests.integration.test_cluster_identity import alice  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root"),
    pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq has no CURVE"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpCluster:
    """A cluster listening on tcp, and homes standing for other hosts."""

    def __init__(self, c: Cluster, endpoint: str, tmp: Path) -> None:
        self.c, self.endpoint, self.tmp = c, endpoint, tmp
        self.server_key = c.run("mb", "keys", "show").stdout.strip()

    def host(self, name: str, register: tuple[str, str] | None = None) -> Path:
        """A client home (``MB_HOME`` of another host) with its keys, the
        server's key trusted, and its key registered as ``(kind, name)``."""
        home = self.tmp / name
        home.mkdir()
        env = self.env(home)
        public = self.c.run("mb", "keys", "init", "--client", env=env).stdout.strip()
        self.c.run("mb", "keys", "trust", "--", self.server_key, env=env)
        if register is not None:
            kind, who = register
            self.c.run("mb", "keys", f"add-{kind}", "--", who, public)
        return home

    def env(self, home: Path) -> dict[str, str]:
        return {**self.c.env, "MB_HOME": str(home), "MB_SERVER": self.endpoint}

    def run(self, home: Path, *args: str, check: bool = True) -> str:
        return self.c.run(*args, env=self.env(home), check=check).stdout

    def client(self, home: Path) -> Client:
        return Client(self.endpoint, timeout=5, keys=home / "keys")


@pytest.fixture
def tcp() -> Iterator[TcpCluster]:
    home = Path(tempfile.mkdtemp(prefix="mb-tcp-", dir="/tmp"))
    home.chmod(0o755)  # the test user's jobs reach the spool
    c = Cluster(home, plan_nodes(1, 1, usable_cpus()[:1], False, None), True)
    c.work.chmod(0o777)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    c.paths.config.write_text(toml_text("easy", {"server": {"listen": [endpoint]}}))
    hosts = Path(tempfile.mkdtemp(prefix="mb-hosts-", dir="/tmp"))
    try:
        c.up()
        yield TcpCluster(c, endpoint, hosts)
        c.down()  # the ZAP thread stops with the server, cleanly
        assert "Traceback" not in c.log("server"), c.log("server")
    finally:
        c.teardown()
        shutil.rmtree(hosts, ignore_errors=True)


def test_a_registered_key_submits_as_its_user(
    tcp: TcpCluster,
    alice: pwd.struct_passwd,  # noqa: F811
) -> None:
    c = tcp.c
    laptop = tcp.host("laptop", ("user", alice.pw_name))
    job = tcp.run(laptop, "qsub", "--", "id", "-u").strip()
    record = c.wait_state(job, "completed")
    assert record["user"] == alice.pw_name
    out = Path(record["output_path"])
    assert out.read_text().strip() == str(alice.pw_uid)
    assert out.stat().st_uid == alice.pw_uid
    assert job in tcp.run(laptop, "qstat", "-x")
    # An ordinary user over tcp: neither an operator nor a daemon.
    with tcp.client(laptop) as client:
        for message in (
            SetNodeOffline(names=["node0"], offline=True),
            NodeHello(name="node0", cpus=[0], mem_kb=None, pid=1),
        ):
            with pytest.raises(RemoteError) as refused:
                client.call(message)
            assert refused.value.code is ErrorCode.PERMISSION
        # Removing the key cuts the connection already made with it too.
        c.run("mb", "keys", "remove", alice.pw_name)
        time.sleep(1.2)  # the server looks at the key file again each second
        with pytest.raises(RemoteError, match="no longer registered"):
            client.call(Status())


def test_an_unknown_key_is_refused_at_once(tcp: TcpCluster) -> None:
    stranger = tcp.host("stranger")
    start = time.monotonic()
    proc = tcp.c.run("qstat", env=tcp.env(stranger), check=False)
    assert proc.returncode == 1
    assert "refused this client's key" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 5, "the refusal should not wait for a timeout"
    # Nor may a key stand for root, even written into the file by hand.
    public = tcp.run(stranger, "mb", "keys", "show", "--client").strip()
    with (tcp.c.paths.server_keys / "authorized").open("a") as f:
        f.write(f"user root {public}\n")
    proc = tcp.c.run("qstat", env=tcp.env(stranger), check=False)
    assert "refused this client's key" in proc.stderr, proc.stderr
    # A host without keys is told how to make them.
    bare = tcp.tmp / "bare"
    proc = tcp.c.run("qstat", env=tcp.env(bare), check=False)
    assert "mb keys init --client" in proc.stderr, proc.stderr


def test_plain_tcp_is_refused(tcp: TcpCluster) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        sock.connect(tcp.endpoint)
        sock.send(encode(Status(), 1))
        assert monitor.poll(5000), "the handshake should fail"
        assert not sock.poll(1000), "a plain tcp client got an answer"
    finally:
        ctx.destroy(linger=0)
    # A client trusting another server's key does not get through either.
    host = tcp.host("impostor-trust")
    other = tcp.c.run("mb", "keys", "init", "--client", env=tcp.env(tcp.tmp / "x"))
    tcp.c.run("mb", "keys", "trust", "--", other.stdout.strip(), env=tcp.env(host))
    proc = tcp.c.run("qstat", env=tcp.env(host), check=False)
    assert "secure handshake" in proc.stderr, proc.stderr


def stop(proc: subprocess.Popen[bytes], home: Path) -> None:
    """End the node daemon ``proc`` and whatever of ``home`` it left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    left = procs_with(home)
    for p in left:
        p.kill()
    psutil.wait_procs(left, timeout=5)


def test_a_node_on_another_host_runs_jobs_as_that_node_only(tcp: TcpCluster) -> None:
    c = tcp.c
    node_home = tcp.host("node3-host")  # its key is registered once it runs
    (node_home / "minibatch.toml").write_text(
        toml_text("easy", {"node": {"cgroups": False}})
    )
    cpu = str(usable_cpus()[-1])
    with (node_home / "node.log").open("wb") as log:
        node = subprocess.Popen(
            [str(BIN / "mb-node"), "--name", "node3", "--server", tcp.endpoint]
            + ["--cpus", cpu],
            env={**c.env, "MB_HOME": str(node_home)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    log_text = (node_home / "node.log").read_text
    try:
        c.wait_for(
            lambda: "refused this client's key" in log_text(),
            timeout=20,
            what="the node told its key was refused",
        )
        public = tcp.run(node_home, "mb", "keys", "show", "--client").strip()
        c.run("mb", "keys", "add-node", "--", "node3", public)
        c.wait_for(  # the node tries again every 5 s
            lambda: "node3" in c.nodes() and c.nodes()["node3"].state == "free",
            timeout=20,
            what="node3 registered",
        )
        c.run("pbsnodes", "-o", "node0")
        job = c.qsub("--", "hostname")
        assert c.wait_state(job, "completed")["node"] == "node3"
        with tcp.client(node_home) as client:
            client.call(Status())
            for message in (
                NodeHello(name="node0", cpus=[0], mem_kb=None, pid=1),
                Heartbeat(name="node0", running=[]),
                SetNodeOffline(names=["node0"], offline=False),
            ):
                with pytest.raises(RemoteError, match="key of node node3") as refused:
                    client.call(message)
                assert refused.value.code is ErrorCode.PERMISSION
        assert c.nodes()["node0"].state == "offline"
    finally:
        stop(node, node_home)
    assert node.returncode == 0, log_text()
