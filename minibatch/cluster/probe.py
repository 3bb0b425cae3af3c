"""Which daemons of a local cluster run, and what ``mb status`` says of them.

Each daemon has a pid file ``run/<name>.pid``; ``<name>`` is ``broker``,
``server``, ``scheduler`` or ``node-<node>``. A pid file is trusted only when its
process is alive, runs the expected program and has this ``MB_HOME``: a stale
file or a recycled pid is never taken for a running daemon, nor signalled.
The uid they run as makes the cluster someone's: only they start or stop it.

This is all ``mb status`` needs, so it stays apart from :mod:`.lifecycle`
(starting and stopping: subprocess, sockets, psutil) and reads the three files
it needs from ``/proc`` itself rather than through psutil, whose import is
~8 ms of a command that should answer in 80.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import sys
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from minibatch.cluster import layout as layouts
from minibatch.cluster.layout import NodeLayout, virtual_note
from minibatch.config import Config, Paths, mqtt_url
from minibatch.errors import InvalidArgument, MinibatchError, PermissionDenied
from minibatch.net.client import Client
from minibatch.protocol.messages import (
    NodeInfo,
    NodeList,
    QueryNodes,
    ServerStatus,
    Status,
)

#: Console script and module of each kind of daemon.
PROGRAMS = {
    "broker": ("mb-broker", "minibatch.events.broker"),
    "server": ("mb-server", "minibatch.server.service"),
    "scheduler": ("mb-scheduler", "minibatch.scheduler.service"),
    "node": ("mb-node", "minibatch.node.service"),
}


class Daemon(NamedTuple):
    """How to run one daemon and how to recognise it in the process table."""

    name: str
    args: tuple[str, ...] = ()

    @property
    def is_node(self) -> bool:
        return self.name.startswith("node-")

    @property
    def program(self) -> tuple[str, str]:
        return PROGRAMS["node" if self.is_node else self.name]

    def command(self) -> list[str]:
        """The console script next to ``sys.executable``, else ``python -m``."""
        exe, module = self.program
        script = Path(sys.executable).with_name(exe)
        if os.access(script, os.X_OK):
            return [str(script), *self.args]
        return [sys.executable, "-m", module, *self.args]

    def matches(self, cmdline: list[str]) -> bool:
        """Whether ``cmdline`` runs this daemon (same program, same node)."""
        exe, module = self.program
        if not any(Path(a).name == exe or a == module for a in cmdline[:3]):
            return False
        if not self.is_node:
            return True
        node = self.name.removeprefix("node-")
        pairs = zip(cmdline, cmdline[1:], strict=False)
        return f"--name={node}" in cmdline or ("--name", node) in pairs


def read_pid(path: Path) -> int | None:
    """The pid in ``path``, or None when it is missing or unreadable."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(path.read_text().split()[0])
        return pid if pid > 0 else None
    return None


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited but not been waited for; OSError if gone."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        # The state follows the command name, which ends at the last ')'.
        after_name = f.read().rpartition(b")")[2]
    return after_name[1:2] in (b"Z", b"X")


def _words(pid: int, name: str) -> list[str]:
    """A NUL-separated ``/proc/<pid>/<name>`` (``cmdline``, ``environ``)."""
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read().rstrip(b"\0").decode(errors="replace").split("\0")


def _home_of(pid: int) -> str | None:
    """The ``MB_HOME`` ``pid`` started with; None if it has none or it is not
    ours to read (another user's daemon: the program check stands alone)."""
    try:
        words = _words(pid, "environ")
    except PermissionError:
        return None
    for word in words:
        if word.startswith("MB_HOME="):
            return word[8:]
    return None


def running_pid(paths: Paths, daemon: Daemon) -> int | None:
    """The pid of ``daemon`` if its pid file names a live process that runs it."""
    pid = read_pid(paths.pidfile(daemon.name))
    if pid is None:
        return None
    try:
        if _zombie(pid):
            # A daemon started by this very process (tests; `mb up` and `mb down`
            # in one process) stays a zombie until its parent waits for it.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return None
        if not daemon.matches(_words(pid, "cmdline")):
            return None
        home = _home_of(pid)
    except OSError:  # gone meanwhile
        return None
    # Same program, other cluster: not ours to report or to stop.
    if home is not None and Path(home).absolute() != paths.home:
        return None
    return pid


def pidfile_names(paths: Paths) -> list[str]:
    """Every daemon that may have a pid file, in stopping order."""
    nodes = sorted(p.stem for p in paths.run.glob("node-*.pid"))
    return [*nodes, "scheduler", "server", "broker"]


def running(paths: Paths) -> dict[str, int]:
    """The daemons with a pid file that still run them, by name (``node-node0``,
    ..., ``scheduler``, ``server``, ``broker``), in stopping order."""
    names = pidfile_names(paths)
    return {n: p for n in names if (p := running_pid(paths, Daemon(n))) is not None}


def _uid(pid: int) -> int:
    """The effective uid ``pid`` runs as (what signalling it checks against
    ours, :func:`os.geteuid`); OSError if it is gone."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):  # real, effective, saved, file system
                return int(line.split()[2])
    raise ProcessLookupError(pid)


def owner(paths: Paths) -> int | None:
    """The uid whose cluster this is: its daemons' (the server takes its own uid
    for the owner's), else its home's; None when there is no home yet."""
    for pid in running(paths).values():
        with contextlib.suppress(OSError):
            return _uid(pid)
    try:
        return paths.home.stat().st_uid
    except OSError:  # none yet, or out of reach: creating it will say which
        return None


def check_owner(paths: Paths, verb: str, *, root_too: bool = False) -> None:
    """Refuse, before anything changes, to ``verb`` ("start", "stop") another
    user's cluster: its daemons are not ours to signal, nor its files to write.
    ``root_too``: root may, as it may signal anyone (stopping, not starting:
    daemons root started in a user's home would be root's, out of the owner's
    reach).

    Raises:
        PermissionDenied: This user does not own the cluster.
    """
    uid, me = owner(paths), os.geteuid()
    if uid is None or me == uid or (root_too and me == 0):
        return
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    raise PermissionDenied(
        f"{paths.home} is {name}'s cluster: only {name} may {verb} it;"
        " nothing was changed"
    )


def load_layout(paths: Paths) -> list[NodeLayout] | None:
    """The layout the last ``mb up`` used, or None."""
    try:
        return layouts.decode((paths.run / "layout.json").read_bytes())
    except (OSError, InvalidArgument):
        return None


def _ask_server(endpoint: str) -> tuple[dict[str, NodeInfo], dict[str, int]]:
    """The nodes as the server sees them, and its event counters (nothing
    when it does not answer)."""
    try:
        with Client(endpoint, 2.0) as client:
            nodes: NodeList = client.call(QueryNodes())
            server: ServerStatus = client.call(Status())
    except MinibatchError:
        return {}, {}
    return {n.name: n for n in nodes.nodes}, server.events


def status(paths: Paths, config: Config) -> dict[str, Any]:
    """Every daemon of the cluster, JSON-ready: ``home``, ``up`` (all alive),
    ``mqtt_url``, ``server_endpoint``, ``layout`` and ``daemons``, each ``{name,
    pid, alive, log}`` plus ``endpoint`` (broker, server) or ``node``, ``cpus``,
    ``shared_cpus`` and ``mem`` (nodes), with the server's ``state``, ``comment``
    and ``limits`` (how the node enforces CPUs and memory) when it answers."""
    layout = {n.name: n for n in load_layout(paths) or []}
    names = [f"node-{n}" for n in layout]
    if paths.run.is_dir():
        names += [n for n in pidfile_names(paths)[:-3] if n not in names]
    names = ["server", "scheduler", *names]
    if not config.mqtt.url or paths.pidfile("broker").exists():
        names.insert(0, "broker")
    url, endpoint = mqtt_url(paths, config), config.server_endpoint(paths)
    known, events = (
        _ask_server(endpoint) if running_pid(paths, Daemon("server")) else ({}, {})
    )
    daemons: list[dict[str, Any]] = []
    for name in names:
        pid = running_pid(paths, Daemon(name))
        entry: dict[str, Any] = {
            "name": name,
            "pid": pid or read_pid(paths.pidfile(name)),
            "alive": pid is not None,
            "log": str(paths.logfile(name)),
        }
        if name in ("broker", "server"):
            entry["endpoint"] = url if name == "broker" else endpoint
        elif name.startswith("node-"):
            lay = layout.get(name[5:]) or NodeLayout(name=name[5:], cpus=[])
            entry.update(node=lay.name, cpus=lay.cpus, mem=lay.mem)
            entry["shared_cpus"] = lay.shared_cpus
            if lay.real_cpus:
                entry["virtual"] = virtual_note(lay.real_map())
            if (info := known.get(lay.name)) is not None:
                entry.update(state=info.state, comment=info.comment)
                entry["limits"] = info.enforcement
        daemons.append(entry)
    return {
        "home": str(paths.home),
        "up": all(d["alive"] for d in daemons),
        "mqtt_url": url,
        "events": events,
        "server_endpoint": endpoint,
        "layout": [msgspec.structs.asdict(n) for n in layout.values()],
        "daemons": daemons,
    }
