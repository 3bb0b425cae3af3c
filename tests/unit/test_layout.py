"""Node layouts (pure) and the cluster lifecycle's pid-file logic (fake daemons).

The lifecycle tests replace the real daemons with tiny fakes: a ROUTER socket
answering ``Status``/``QueryNodes`` like the server, and sleepers for the
scheduler and the nodes. Only the embedded broker is real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibatch.cluster import layout as L
from minibatch.cluster import lifecycle, probe
from minibatch.cluster.layout import NodeLayout, from_config, plan_nodes
from minibatch.cluster.lifecycle import StartError
from minibatch.cluster.probe import Daemon
from minibatch.config import Config, MqttConfig, NodeConfig, Paths
from minibatch.errors import InvalidArgument

GB = 1024 * 1024

# ------------------------------------------------------------------ plan_nodes


def test_nodes_get_disjoint_real_cores_in_order() -> None:
    nodes = plan_nodes(2, 2, [3, 2, 1, 0], oversubscribe=False, mem_total_kb=16 * GB)
    assert nodes == [
        NodeLayout(name="node0", cpus=[0, 1], mem="8gb"),
        NodeLayout(name="node1", cpus=[2, 3], mem="8gb"),
    ]


def test_layout_uses_the_available_ids_not_a_range() -> None:
    nodes = plan_nodes(2, 2, [2, 3, 6, 7, 9], oversubscribe=False, mem_total_kb=None)
    assert [n.cpus for n in nodes] == [[2, 3], [6, 7]]
    assert all(n.mem is None and n.shared_cpus == [] for n in nodes)


def test_too_many_cpus_without_oversubscribe_is_refused() -> None:
    with pytest.raises(InvalidArgument) as err:
        plan_nodes(4, 2, [0, 1], oversubscribe=False, mem_total_kb=None)
    assert str(err.value) == (
        "4 nodes x 2 CPUs need 8 CPUs but this machine has 2 "
        "(use --oversubscribe to give the nodes virtual CPUs)"
    )


def test_oversubscribed_nodes_get_virtual_cpus_on_every_core() -> None:
    nodes = plan_nodes(4, 2, [0, 1], oversubscribe=True, mem_total_kb=8 * GB)
    assert [n.cpus for n in nodes] == [[0, 1]] * 4
    assert [n.real_cpus for n in nodes] == [[0, 1]] * 4
    assert [n.shared_cpus for n in nodes] == [[0, 1]] * 4
    assert {n.mem for n in nodes} == {"2gb"}


def test_oversubscribe_marks_only_the_cpus_on_shared_cores() -> None:
    nodes = plan_nodes(3, 2, [0, 1, 2, 3], oversubscribe=True, mem_total_kb=None)
    assert [n.cpus for n in nodes] == [[0, 1]] * 3
    assert [n.real_cpus for n in nodes] == [[0, 1], [2, 3], [0, 1]]
    assert [n.shared_cpus for n in nodes] == [[0, 1], [], [0, 1]]


def test_oversubscribe_wraps_round_robin() -> None:
    nodes = plan_nodes(3, 3, [0, 1, 2, 3], oversubscribe=True, mem_total_kb=None)
    assert [n.real_cpus for n in nodes] == [[0, 1, 2], [3, 0, 1], [2, 3, 0]]


def test_a_node_may_have_more_virtual_cpus_than_the_machine_has_cores() -> None:
    # mb up --nodes 4 --cpus-per-node 16 --oversubscribe on a 2-core laptop.
    nodes = plan_nodes(4, 16, [0, 1], oversubscribe=True, mem_total_kb=None)
    for n in nodes:
        assert n.cpus == list(range(16))
        assert n.real_cpus == [0, 1] * 8
    alone = plan_nodes(1, 4, [5, 7], oversubscribe=True, mem_total_kb=None)
    assert alone == [NodeLayout(name="node0", cpus=[0, 1, 2, 3], real_cpus=[5, 7] * 2)]


@pytest.mark.parametrize(
    ("nodes", "cpus", "available", "message"),
    [
        (0, 1, [0], "at least one node"),
        (1, 0, [0], "at least one CPU"),
        (1, 1, [], "no CPUs"),
        (2, 1, [0], "^2 nodes x 1 CPU need 2 CPUs"),
    ],
)
def test_bad_requests(
    nodes: int, cpus: int, available: list[int], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        plan_nodes(nodes, cpus, available, oversubscribe=False, mem_total_kb=None)


def test_memory_share_rounds_down() -> None:
    assert L.mem_share(10 * GB + 5, 4) == "2560mb"
    assert L.mem_share(None, 4) is None
    assert L.mem_share(0, 4) is None


@given(
    nodes=st.integers(1, 8),
    cpus=st.integers(1, 20),
    available=st.sets(st.integers(0, 63), min_size=1, max_size=16),
    oversubscribe=st.booleans(),
)
def test_layout_invariants(
    nodes: int, cpus: int, available: set[int], oversubscribe: bool
) -> None:
    try:
        layout = plan_nodes(nodes, cpus, available, oversubscribe, None)
    except InvalidArgument:
        assert nodes * cpus > len(available) and not oversubscribe
        return
    assert [n.name for n in layout] == [f"node{i}" for i in range(nodes)]
    cores = len(available)
    load = Counter(c for n in layout for c in n.real_cpus or n.cpus)
    for n in layout:
        assert len(n.cpus) == cpus == len(set(n.cpus)) and n.cpus == sorted(n.cpus)
        real = n.real_cpus or n.cpus
        assert set(real) <= available
        others = {c for m in layout if m is not n for c in m.real_cpus or m.cpus}
        pairs = zip(n.cpus, real, strict=True)
        assert n.shared_cpus == [c for c, r in pairs if r in others]
        # Any run of consecutive CPUs is on as many distinct cores as it can be.
        width = min(cpus, cores)
        for start in range(cpus - width + 1):
            assert len(set(real[start : start + width])) == width
    if nodes * cpus <= cores:
        assert all(n.real_cpus == [] for n in layout)  # real ids, no mapping
        assert max(load.values()) == 1  # disjoint whenever possible
    else:
        assert all(n.cpus == list(range(cpus)) for n in layout)  # virtual ids
        assert set(load) == available  # every core carries work...
        assert max(load.values()) - min(load.values()) <= 1  # ...evenly


# ----------------------------------------------------------------- from_config


def config(*nodes: NodeConfig, oversubscribe: bool = False) -> Config:
    return Config(nodes=list(nodes), oversubscribe=oversubscribe)


def test_configured_nodes() -> None:
    cfg = config(
        NodeConfig(name="big", cpus=[3, 2], mem="2gb"), NodeConfig(name="s", cpus=[0])
    )
    assert from_config(cfg, [0, 1, 2, 3], 8 * GB) == [
        NodeLayout(name="big", cpus=[2, 3], mem="2gb"),
        NodeLayout(name="s", cpus=[0]),
    ]


def test_configured_nodes_default_to_this_machine() -> None:
    cpu = L.usable_cpus()[0]
    assert from_config(config(NodeConfig(name="n", cpus=[cpu])))[0].cpus == [cpu]


def test_configured_cpu_must_exist_unless_oversubscribed() -> None:
    cfg = config(NodeConfig(name="n", cpus=[0, 7]))
    with pytest.raises(InvalidArgument) as err:
        from_config(cfg, [0, 1])
    assert str(err.value) == (
        "node 'n' uses CPU 7 but this machine has only CPUs 0-1 "
        "(set oversubscribe = true to make such CPUs virtual)"
    )
    cfg = config(NodeConfig(name="n", cpus=[0, 7]), oversubscribe=True)
    # 0 is a real id, its own core; 7 is virtual, on the less loaded core.
    assert from_config(cfg, [0, 1]) == [
        NodeLayout(name="n", cpus=[0, 7], real_cpus=[0, 1])
    ]


def test_configured_virtual_cpus_go_round_robin_over_the_cores() -> None:
    big = [NodeConfig(name=f"n{i}", cpus=list(range(16))) for i in range(4)]
    nodes = from_config(config(*big, oversubscribe=True), [0, 1, 2])
    load = Counter(c for n in nodes for c in n.real_cpus)
    assert sorted(load.values()) == [21, 21, 22]  # 64 CPUs on 3 cores
    for n in nodes:
        assert n.cpus == list(range(16)) and n.real_cpus[:3] == [0, 1, 2]
        assert n.shared_cpus == n.cpus
    # Nodes on real ids only keep them, unmapped, next to virtual ones.
    nodes = from_config(
        config(
            NodeConfig(name="real", cpus=[1]),
            NodeConfig(name="virt", cpus=[10, 11, 12]),
            oversubscribe=True,
        ),
        [0, 1],
    )
    assert nodes == [
        NodeLayout(name="real", cpus=[1], shared_cpus=[1]),
        NodeLayout(
            name="virt", cpus=[10, 11, 12], real_cpus=[0, 1, 0], shared_cpus=[11]
        ),
    ]


def test_configured_virtual_cpus_need_a_core() -> None:
    cfg = config(NodeConfig(name="v", cpus=[4]), oversubscribe=True)
    with pytest.raises(InvalidArgument, match="no CPUs available to carry .* of v"):
        from_config(cfg, [])


def test_configured_overlap_needs_oversubscribe_and_is_marked() -> None:
    a, b = NodeConfig(name="a", cpus=[0, 1]), NodeConfig(name="b", cpus=[1, 2])
    with pytest.raises(InvalidArgument, match="'a' and 'b' both use CPU 1"):
        from_config(config(a, b), [0, 1, 2])
    nodes = from_config(config(a, b, oversubscribe=True), [0, 1, 2])
    assert [n.shared_cpus for n in nodes] == [[1], [1]]


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ((), "no \\[\\[nodes\\]\\]"),
        ((NodeConfig(name="a b", cpus=[0]),), "bad node name"),
        ((NodeConfig(name="a", cpus=[0]), NodeConfig(name="a", cpus=[1])), "twice"),
        ((NodeConfig(name="a", cpus=[]),), "has no CPUs"),
        ((NodeConfig(name="a", cpus=[1, 1]),), "lists a CPU twice"),
        ((NodeConfig(name="a", cpus=[-1]),), "negative"),
        ((NodeConfig(name="a", cpus=[0], mem="lots"),), "malformed size"),
        ((NodeConfig(name="a", cpus=[0], mem="64gb"),), "this machine has"),
    ],
)
def test_bad_configurations(nodes: tuple[NodeConfig, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        from_config(config(*nodes, oversubscribe=True), [0, 1], 16 * GB)


def test_layout_json_round_trip_and_node_arguments() -> None:
    nodes = plan_nodes(3, 1, [0, 1], oversubscribe=True, mem_total_kb=3 * GB)
    assert L.decode(L.encode(nodes)) == nodes
    with pytest.raises(InvalidArgument):
        L.decode(b'{"nodes": 3}')
    assert nodes[1].daemon_args() == [
        "--name", "node1", "--cpus", "0", "--real-cpus", "1", "--mem", "1gb",
    ]  # fmt: skip
    assert nodes[2].daemon_args() == [
        "--name", "node2", "--cpus", "0", "--real-cpus", "0", "--mem", "1gb",
        "--shared-cpus", "0",
    ]  # fmt: skip
    assert NodeLayout(name="n", cpus=[1, 2]).daemon_args() == [
        "--name", "n", "--cpus", "1,2",
    ]  # fmt: skip


def test_layouts_written_before_virtual_cpus_still_decode() -> None:
    old = b'{"nodes":[{"name":"node0","cpus":[0,1],"shared_cpus":[1],"mem":null}]}'
    assert L.decode(old) == [NodeLayout(name="node0", cpus=[0, 1], shared_cpus=[1])]
    bad = b'{"nodes":[{"name":"node0","cpus":[0,1],"real_cpus":[0]}]}'
    with pytest.raises(InvalidArgument, match="node0 has 1 real core for 2 CPUs"):
        L.decode(bad)


def test_the_real_cores_of_virtual_cpus_are_said_per_core() -> None:
    real = dict(zip([0, 1, 2, 3, 4], [0, 1, 0, 1, 0], strict=True))
    assert L.carried(real) == {0: [0, 2, 4], 1: [1, 3]}
    assert L.virtual_note(real) == (
        "virtual CPUs 0-4 on real cores 0-1 (0,2,4 on core 0; 1,3 on core 1)"
    )
    assert L.carried({}) == {}


def test_a_running_virtual_layout_is_named_so() -> None:
    running = plan_nodes(2, 4, [0, 1], oversubscribe=True, mem_total_kb=None)
    with pytest.raises(InvalidArgument, match="node0: virtual CPUs 0-3, node1"):
        L.layout_for_up(Config(), 1, 1, False, running)


# ------------------------------------------------- lifecycle, with fake daemons


def test_daemon_matching() -> None:
    node = Daemon("node-node1")
    assert Daemon("server").matches(["/venv/bin/python", "/venv/bin/mb-server", "-v"])
    assert Daemon("server").matches(["python", "-m", "minibatch.server.service"])
    assert not Daemon("server").matches(["python", "/venv/bin/mb-scheduler"])
    assert node.matches(["py", "/v/mb-node", "--name", "node1", "--cpus", "1"])
    assert node.matches(["py", "/v/mb-node", "--name=node1"])
    assert not node.matches(["py", "/v/mb-node", "--name", "node10"])
    assert not node.matches(["py", "/v/mb-node", "--cpus", "node1"])


FAKES = {
    "fake_mb_server": """
        import os, pathlib, socket
        from minibatch.net.stream import HEADER
        from minibatch.protocol import decode, encode
        from minibatch.protocol.messages import NodeInfo, NodeList, ServerStatus, Status
        run = pathlib.Path(os.environ["MB_HOME"]) / "run"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(run / "server.commands"))
        listener.listen()
        (run / "server.sock").touch()  # the ipc endpoint the commands look for
        while True:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as stream:
                while header := stream.read(HEADER.size):
                    env = decode(stream.read(HEADER.unpack(header)[0]))
                    up = {p.name[3:]: int(p.read_text()) for p in run.glob("up-*")}
                    sched = up.pop("scheduler", None)
                    reply = ServerStatus(pid=os.getpid(), endpoint="", mqtt_url="",
                        policy="fifo", nodes={}, scheduler_pid=sched, jobs={})
                    if not isinstance(env.body, Status):
                        reply = NodeList(nodes=[NodeInfo(name=n, state="free",
                            cpus=[], free_cpus=[], mem_kb=None, jobs={}) for n in up])
                    data = encode(reply, re=env.id)
                    conn.sendall(HEADER.pack(len(data)) + data)
    """,
    "fake_mb_scheduler": """
        import os, pathlib, time
        run = pathlib.Path(os.environ["MB_HOME"]) / "run"
        # Written then renamed: the fake server must never read half a file.
        (run / ".up-scheduler").write_text(str(os.getpid()))
        (run / ".up-scheduler").rename(run / "up-scheduler")
        time.sleep(600)
    """,
    "fake_mb_node": """
        import json, os, pathlib, signal, sys, time
        run = pathlib.Path(os.environ["MB_HOME"]) / "run"
        name = sys.argv[sys.argv.index("--name") + 1]
        if name == "broken":
            sys.exit("mb-node: cannot set the affinity of CPU 99")
        if name == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (run / f"args-{name}").write_text(json.dumps(sys.argv[1:]))
        (run / f".up-{name}").write_text(str(os.getpid()))
        (run / f".up-{name}").rename(run / f"up-{name}")
        time.sleep(600)
    """,
}


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Paths]:
    """A cluster home whose server, scheduler and nodes are the fakes above."""
    # A short path: an ipc:// socket path must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="mbt"))
    fakes = root / "fakes"
    fakes.mkdir()
    for module, source in FAKES.items():
        (fakes / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fakes), *sys.path]))
    programs = dict(probe.PROGRAMS)
    for kind in ("server", "scheduler", "node"):
        # No such console script exists, so the daemon runs as `python -m fake`.
        programs[kind] = (f"fake-mb-{kind}", f"fake_mb_{kind}")
    monkeypatch.setattr(probe, "PROGRAMS", programs)
    paths = Paths(root / "home")
    try:
        yield paths
    finally:
        lifecycle.down(paths)
        run = paths.run
        pids = [int(p.read_text()) for p in run.glob("up-*")] if run.is_dir() else []
        survivors = [pid for pid in pids if alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        assert not survivors, "down() left processes running"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(60)
def test_up_starts_only_what_is_not_running_and_down_stops_all(home: Paths) -> None:
    layout = [
        NodeLayout(name="node0", cpus=[0], mem="1gb"),
        NodeLayout(name="node1", cpus=[0], shared_cpus=[0]),
    ]
    report = lifecycle.up(home, Config(), layout, wait=30)
    everyone = ["broker", "server", "scheduler", "node-node0", "node-node1"]
    assert report.started == everyone and report.already_running == []
    assert report.mqtt_url == home.mqtt_url_file.read_text().strip()
    assert report.mqtt_url.startswith("mqtt://127.0.0.1:")
    assert json.loads((home.run / "args-node0").read_text()) == [
        "--name", "node0", "--cpus", "0", "--mem", "1gb",
    ]  # fmt: skip
    assert probe.load_layout(home) == layout
    for name in everyone:
        assert probe.read_pid(home.pidfile(name)) == report.pids[name]
        assert "mb up:" in home.logfile(name).read_text()

    again = lifecycle.up(home, Config(), layout, wait=30)
    assert again.started == [] and again.already_running == everyone
    assert again.pids == report.pids and again.mqtt_url == report.mqtt_url

    os.kill(report.pids["node-node1"], signal.SIGKILL)
    (home.run / "up-node1").unlink()
    third = lifecycle.up(home, Config(), layout, wait=30)
    assert third.started == ["node-node1"]

    st = probe.status(home, Config())
    assert st["up"] and st["mqtt_url"] == report.mqtt_url
    by_name = {d["name"]: d for d in st["daemons"]}
    assert list(by_name) == everyone
    assert by_name["server"]["endpoint"] == Config().server_endpoint(home)
    assert by_name["node-node1"]["shared_cpus"] == [0]
    assert by_name["node-node0"]["mem"] == "1gb"
    json.dumps(st)  # JSON-ready

    pids = dict(third.pids)
    assert lifecycle.down(home) == [
        "node-node0", "node-node1", "scheduler", "server", "broker",
    ]  # fmt: skip
    assert not any(alive(pid) for pid in pids.values())
    assert not list(home.run.glob("*.pid")) and not home.mqtt_url_file.exists()
    assert not probe.status(home, Config())["up"]
    assert lifecycle.down(home) == []


@pytest.mark.timeout(60)
def test_a_failing_daemon_is_reported_and_the_start_undone(home: Paths) -> None:
    layout = [NodeLayout(name="node0", cpus=[0]), NodeLayout(name="broken", cpus=[0])]
    cfg = Config(mqtt=MqttConfig(url="mqtt://127.0.0.1:1"))  # no embedded broker
    with pytest.raises(StartError) as err:
        lifecycle.up(home, cfg, layout, wait=30)
    message = str(err.value)
    assert message.startswith("node-broken exited with status 1")
    assert "cannot set the affinity of CPU 99" in message
    assert not list(home.run.glob("*.pid"))
    assert not home.pidfile("broker").exists()


@pytest.mark.timeout(60)
def test_a_node_that_never_registers_times_out(
    home: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = Config(mqtt=MqttConfig(url="mqtt://127.0.0.1:1"))
    monkeypatch.setattr(lifecycle, "NOT_UP", frozenset({"down", "unknown", "free"}))
    started = time.monotonic()
    with pytest.raises(StartError, match=r"^node-node0 is free after 3 s; end of"):
        lifecycle.up(home, cfg, [NodeLayout(name="node0", cpus=[0])], wait=3)
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_stale_and_foreign_pid_files_are_not_trusted(home: Paths) -> None:
    home.make()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        home.pidfile("server").write_text(f"{sleeper.pid}\n")  # not a server
        home.pidfile("scheduler").write_text("999999999\n")  # no such process
        home.pidfile("broker").write_text("garbage\n")
        for name in ("server", "scheduler", "broker"):
            assert probe.running_pid(home, Daemon(name)) is None
        assert lifecycle.down(home) == []
        assert sleeper.poll() is None  # never signalled
        assert not list(home.run.glob("*.pid"))
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.timeout(60)
def test_down_kills_what_ignores_sigterm(
    home: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "STOP_GRACE", 1.0)
    cfg = Config(mqtt=MqttConfig(url="mqtt://127.0.0.1:1"))
    layout = [NodeLayout(name="stubborn", cpus=[0])]
    report = lifecycle.up(home, cfg, layout, wait=30)
    assert "broker" not in report.started
    started = time.monotonic()
    assert lifecycle.down(home) == ["node-stubborn", "scheduler", "server"]
    assert time.monotonic() - started < 8
    assert not any(alive(pid) for pid in report.pids.values())


@pytest.mark.parametrize(
    ("nodes", "per_node", "says"),
    [(0, None, "--nodes must be at least 1, got 0"), (2, 0, "--cpus-per-node must be")],
)
def test_mb_up_refuses_zero_nodes_or_cpus(nodes, per_node, says):
    with pytest.raises(InvalidArgument, match=says):
        L.choose_layout(Config(), nodes, per_node, oversubscribe=False)


def test_a_running_cluster_keeps_its_layout() -> None:
    running = [NodeLayout(name="node0", cpus=[0]), NodeLayout(name="node1", cpus=[1])]
    assert L.layout_for_up(Config(), None, None, False, running) == running
    with pytest.raises(InvalidArgument, match="running with another layout"):
        L.layout_for_up(Config(), 1, None, False, running)
    fresh = L.layout_for_up(Config(), 1, 1, False, None)
    assert [n.name for n in fresh] == ["node0"]


def test_a_stopped_cluster_comes_back_with_the_layout_it_last_had() -> None:
    cpus = L.usable_cpus()
    last = plan_nodes(2, 4, cpus, oversubscribe=True, mem_total_kb=None)
    assert L.layout_for_up(Config(), None, None, False, None, last) == last
    # Flags, or nodes in the config, say what to start instead.
    other = L.layout_for_up(Config(), 1, 1, False, None, last)
    assert [len(n.cpus) for n in other] == [1]
    gone = [NodeLayout(name="node0", cpus=[max(cpus) + 1])]  # a core this box lacks
    assert L.layout_for_up(Config(), None, None, False, None, gone) != gone
