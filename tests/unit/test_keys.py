"""The CURVE key store (minibatch.net.keys), and who a tcp caller may be."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import zmq

from minibatch.config import Config, Paths
from minibatch.core.job import JobResult
from minibatch.errors import InvalidArgument, MinibatchError, PermissionDenied
from minibatch.net import keys
from minibatch.protocol.messages import Heartbeat, JobEnded, NodeHello, Status
from minibatch.server.access import Context, need_remote_allowed
from minibatch.server.submit import Caller, parse_peer, remote_caller

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="no CURVE in libzmq")


def public_key() -> str:
    return zmq.curve_keypair()[0].decode()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_check_key_takes_z85_public_keys_only() -> None:
    key = public_key()
    assert keys.check_key(f" {key}\n") == key
    for bad in ("", "short", key[:-1] + " ", '"' * 40, "#" * 40, "é" * 40):
        with pytest.raises(InvalidArgument, match="not a CURVE public key"):
            keys.check_key(bad)


def test_the_server_keypair_is_made_once_and_private(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "keys"
    (tmp_path / "state").mkdir()
    public, made = keys.server_keypair(folder)
    assert made and keys.check_key(public) == public
    assert mode(folder) == 0o700
    assert mode(folder / "server.key_secret") == 0o600
    again, made = keys.server_keypair(folder)
    assert (again, made) == (public, False)
    assert keys.read_keypair(folder, keys.SERVER)[0] == public


def test_a_client_needs_its_keypair_and_the_servers_key(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    with pytest.raises(MinibatchError, match="mb keys init --client"):
        keys.load_client(folder)
    public, made = keys.client_keypair(folder)
    assert made
    with pytest.raises(MinibatchError, match="mb keys trust"):
        keys.load_client(folder)
    server = public_key()
    keys.trust(folder, server)
    loaded = keys.load_client(folder)
    assert (loaded.public, loaded.server) == (public, server)
    assert len(loaded.secret) == 40
    with pytest.raises(InvalidArgument):
        keys.trust(folder, "not a key")


def test_registered_keys_map_to_users_and_nodes(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    store = keys.Registered(tmp_path / "state" / "keys")
    assert store.entries() == [] and store.lookup(public_key()) is None
    user, node = public_key(), public_key()
    store.add("user", "nobody", user)
    store.add("node", "node3", node)
    assert mode(store.path) == 0o600
    assert store.lookup(user, fresh=True) == ("user", "nobody", user)
    assert store.lookup(node) == ("node", "node3", node)
    with pytest.raises(InvalidArgument, match="already registered for user nobody"):
        store.add("node", "node4", user)
    assert store.remove(node) == [("node", "node3", node)]  # by key
    assert store.lookup(node, fresh=True) is None
    assert store.remove("nobody") == [("user", "nobody", user)]  # by name
    with pytest.raises(InvalidArgument, match="no key is registered"):
        store.remove("nobody")


def test_no_key_stands_for_root_or_an_unknown_user(tmp_path: Path) -> None:
    store = keys.Registered(tmp_path / "keys")
    with pytest.raises(InvalidArgument, match="root"):
        store.add("user", "root", public_key())
    with pytest.raises(InvalidArgument, match="no user"):
        store.add("user", "no-such-user-here", public_key())
    with pytest.raises(InvalidArgument, match="invalid node name"):
        store.add("node", "a b", public_key())
    assert store.entries() == []


def test_a_key_file_edited_by_hand_is_read_again(tmp_path: Path) -> None:
    store = keys.Registered(tmp_path)
    key = public_key()
    assert store.lookup(key) is None
    store.path.write_text(f"# comment\n\nnode n1 {key}\n")
    assert store.lookup(key) is None  # looked at less than a second ago
    assert store.lookup(key, fresh=True) == ("node", "n1", key)
    store.path.write_text("user alice\n")
    with pytest.raises(MinibatchError, match=":1: expected"):
        store.entries()


def test_tcp_is_curve_only_in_the_configuration(monkeypatch: Any) -> None:
    def config(text: str) -> Config:
        c = msgspec.toml.decode(text.encode(), type=Config)
        c.check()
        return c

    with pytest.raises(InvalidArgument, match=r"\[server\] listen"):
        config('[server]\nendpoint = "tcp://0.0.0.0:5555"\n')
    with pytest.raises(InvalidArgument, match="not a tcp"):
        config('[server]\nlisten = ["ipc:///tmp/x"]\n')
    paths = Paths(Path("/h"))
    monkeypatch.delenv("MB_SERVER", raising=False)
    assert config("").client_endpoint(paths) == "ipc:///h/run/server.sock"
    remote = config('[client]\nserver = "tcp://a:1"\n')
    assert remote.client_endpoint(paths) == "tcp://a:1"
    assert remote.server_endpoint(paths) == "ipc:///h/run/server.sock"
    monkeypatch.setenv("MB_SERVER", "tcp://b:2")
    assert remote.client_endpoint(paths) == "tcp://b:2"


def test_a_tcp_address_never_passes_for_peer_credentials() -> None:
    assert parse_peer("localhost:0:0:12") == Caller(0, 0, 12)
    for address in ("127.0.0.1", "1::0:0:0", "::0:0:0", "fe80::1:2:3:4", ""):
        assert parse_peer(address) is None


def test_remote_callers_are_never_root_nor_daemons_of_this_host() -> None:
    ctx = Context(operators=frozenset({"nobody"}))
    nobody = pwd.getpwnam("nobody")
    user = remote_caller("user", "nobody")
    assert (user.uid, user.gid, user.remote) == (nobody.pw_uid, nobody.pw_gid, True)
    assert not ctx.is_daemon(user) and ctx.is_operator(user)  # listed
    node = remote_caller("node", "node3")
    assert node.uid == os.getuid() and node.node == "node3"
    assert ctx.is_daemon(node) and not ctx.is_operator(node)
    owner = Caller(os.getuid(), os.getgid(), 0, remote=True)
    assert not ctx.is_daemon(owner)
    assert not Context().is_operator(owner)
    with pytest.raises(PermissionDenied, match="root"):
        remote_caller("user", "root")
    with pytest.raises(PermissionDenied, match="does not exist"):
        remote_caller("user", "no-such-user-here")


def test_a_node_key_speaks_for_its_node_only() -> None:
    on = SimpleNamespace(node="node3")
    jobs = {
        1: SimpleNamespace(alloc=[on], display_id="1"),
        2: SimpleNamespace(alloc=[SimpleNamespace(node="node0")], display_id="2"),
    }
    state: Any = SimpleNamespace(jobs=jobs)
    node = remote_caller("node", "node3")

    def ended(job: int) -> JobEnded:
        return JobEnded(
            job=job,
            result=JobResult.COMPLETED,
            exit_status=0,
            signal=None,
            end_time=0.0,
            cputime_s=0.0,
            maxrss_kb=0,
        )

    allowed = [
        Status(),
        NodeHello(name="node3", cpus=[0], mem_kb=None, pid=1),
        Heartbeat(name="node3", running=[]),
        ended(1),
        ended(99),  # unknown: changes nothing
    ]
    for message in allowed:
        need_remote_allowed(state, node, message)
    refused = [
        (NodeHello(name="node0", cpus=[0], mem_kb=None, pid=1), "speak for node node0"),
        (Heartbeat(name="node0", running=[]), "speak for node node0"),
        (ended(2), "report job 2,"),
    ]
    for message, why in refused:
        with pytest.raises(PermissionDenied, match=f"key of node node3 may not {why}"):
            need_remote_allowed(state, node, message)
    user = remote_caller("user", "nobody")
    need_remote_allowed(state, user, ended(2))  # the handlers refuse it
