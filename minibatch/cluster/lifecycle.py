"""Starting and stopping a local cluster's daemons (``mb up``, ``mb down``).

Each daemon is a detached process (own session, stdin /dev/null, output appended
to ``log/<name>.log``) with a pid file ``run/<name>.pid``, trusted as
:mod:`.probe` says (which also answers ``mb status``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import psutil

from minibatch.cluster import layout as layouts
from minibatch.cluster.layout import NodeLayout

# Re-exported: callers that start and stop clusters (benches, tests) ask here.
from minibatch.cluster.probe import (
    Daemon,
    check_owner,
    load_layout,
    pidfile_names,
    read_pid,
    running,
    running_pid,
)
from minibatch.config import Config, Paths, mqtt_url
from minibatch.errors import InvalidArgument, MinibatchError, Unavailable
from minibatch.net.client import Client
from minibatch.protocol.messages import NodeList, QueryNodes, ServerStatus, Status

#: Seconds a daemon gets between SIGTERM and SIGKILL in :func:`down`.
STOP_GRACE = 10.0
#: How often :func:`up` polls while it waits for the daemons: a connection
#: attempt to the broker, or one request to the server, each a fraction of a ms.
POLL = 0.025
#: The longest :func:`down` sleeps between looks at a stopping daemon; it wakes
#: as soon as one exits (a pidfd turns readable), so this only bounds a miss.
EXIT_POLL = 0.5
#: Node states that do not count as "up" when :func:`up` waits for the nodes.
NOT_UP = frozenset({"down", "unknown"})
#: Stop order: nodes first (they end their jobs), the broker last.
STOP_STAGE = {"scheduler": 1, "server": 2, "broker": 3}
#: Held until exit: a dropped Popen of a live daemon warns "still running".
_SPAWNED: list[subprocess.Popen[bytes]] = []


class StartError(Unavailable):
    """A daemon did not start, or did not become ready in time."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` (empty if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _spawn(paths: Paths, daemon: Daemon) -> subprocess.Popen[bytes]:
    # MB_* variables of a job (MB_NODE, MB_JOBID, ...) must not leak into daemons
    # started from inside a job: a node cleaning up leftovers matches on them.
    # NOTIFY_SOCKET is the caller's service manager's, not the daemons'.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MB_") and k != "NOTIFY_SOCKET"
    }
    env.update(MB_HOME=str(paths.home), PYTHONUNBUFFERED="1")
    command = daemon.command()
    pidfile = paths.pidfile(daemon.name)
    if daemon.is_node:
        from minibatch.node import keeper

        # The keeper writes the daemon's pid; a stale file must not stand in.
        pidfile.unlink(missing_ok=True)
        node = daemon.name.removeprefix("node-")
        command = keeper.command(pidfile, paths.spool, node, command)
    with paths.logfile(daemon.name).open("ab") as log:
        log.write(f"--- {time.ctime()} mb up: {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the terminal and `mb up` itself
            cwd=paths.home,
            env=env,
        )
    if not daemon.is_node:
        _write_atomic(pidfile, f"{proc.pid}\n")
    _SPAWNED.append(proc)
    return proc


def _broker_port(paths: Paths, patience: float = 3.0) -> int:
    # A running server keeps publishing to the URL it read at start, so a broker
    # restarted after a crash comes back on the same port when it is free. A
    # killed mb-broker's mosquitto dies a moment after it (its parent-death
    # signal) and holds the port until then: wait a little for it.
    old = mqtt_url(paths, Config()).rpartition(":")[2]
    deadline = time.monotonic() + (patience if old.isdigit() else 0.0)
    while True:
        with socket.socket() as s:
            # As the broker binds: connections of its dead predecessor still in
            # TIME_WAIT must not make the port look taken.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", int(old) if old.isdigit() else 0))
                return int(s.getsockname()[1])
            except OSError:
                if time.monotonic() >= deadline:
                    s.bind(("127.0.0.1", 0))
                    return int(s.getsockname()[1])
        time.sleep(POLL)


def _listening(port: int) -> bool:
    socket.create_connection(("127.0.0.1", port), 0.5).close()
    return True


@dataclass
class UpReport:
    """What :func:`up` did (``msgspec.json.encode`` turns it into JSON)."""

    started: list[str] = field(default_factory=list)
    already_running: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    server_endpoint: str = ""
    mqtt_url: str = ""
    layout: list[NodeLayout] = field(default_factory=list)


class _Starter:
    """One run of :func:`up`: the processes it started and the shared deadline."""

    def __init__(self, paths: Paths, config: Config, wait: float) -> None:
        self.paths, self.wait = paths, wait
        self.deadline = time.monotonic() + wait
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.report = UpReport(server_endpoint=config.server_endpoint(paths))

    def ensure(self, daemon: Daemon) -> None:
        """Start ``daemon`` unless it is already running."""
        pid = running_pid(self.paths, daemon)
        if pid is not None:
            self.report.already_running.append(daemon.name)
        else:
            self.procs[daemon.name] = proc = _spawn(self.paths, daemon)
            self.report.started.append(daemon.name)
            pid = proc.pid
            if daemon.is_node:
                pid = self._kept(daemon.name, proc)
        self.report.pids[daemon.name] = pid

    def _kept(self, name: str, keeper: subprocess.Popen[bytes]) -> int:
        """The pid of the daemon ``keeper`` started, once it wrote it."""
        pidfile = self.paths.pidfile(name)
        while (pid := read_pid(pidfile)) is None:
            if keeper.poll() is not None:
                self.fail(name, f"exited with status {keeper.returncode}")
            if time.monotonic() >= self.deadline:
                self.fail(name, f"was not started after {self.wait:g} s")
            time.sleep(POLL)
        return pid

    def fail(self, name: str, what: str) -> NoReturn:
        logfile = self.paths.logfile(name)
        tail = log_tail(logfile) or "(empty log)"
        raise StartError(f"{name} {what}; end of {logfile}:\n{tail}")

    def until(
        self, ready: Callable[[], bool], blame: Callable[[], tuple[str, str]]
    ) -> None:
        """Poll ``ready``; fail when a daemon exits, or on timeout with ``blame()``."""
        while True:
            with contextlib.suppress(MinibatchError, OSError):
                if ready():
                    return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    self.fail(name, f"exited with status {proc.returncode}")
            if time.monotonic() >= self.deadline:
                name, what = blame()
                self.fail(name, f"{what} after {self.wait:g} s")
            time.sleep(POLL)

    def stop_started(self) -> None:
        pids = self.report.pids
        _stop(
            {name: pids.get(name, p.pid) for name, p in self.procs.items()}, self.paths
        )
        for name, proc in self.procs.items():
            self.paths.pidfile(name).unlink(missing_ok=True)
            # A node's keeper ends with its daemon; one whose daemon never
            # wrote a pid file was signalled above, and passed it on.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_GRACE)


def up(
    paths: Paths, config: Config, layout: list[NodeLayout], *, wait: float = 15
) -> UpReport:
    """Start what is not running and wait (``wait`` s in all) until the cluster is up.

    Order: broker (if ``config.mqtt.url`` is empty), server, then scheduler and
    nodes. Up: the server answers, a scheduler has registered, and every node of
    ``layout`` is neither down nor unknown. A running node keeps its CPUs.

    Raises:
        InvalidArgument: ``layout`` is empty.
        PermissionDenied: Another user owns the cluster (:func:`check_owner`).
        MinibatchError: Its home cannot be made.
        StartError: A daemon exited or was not ready in time; what this call
            started is stopped again, and the message ends with the culprit's log.
    """
    if not layout:
        raise InvalidArgument("a cluster needs at least one node")
    check_owner(paths, "start")
    _make(paths)
    previous = load_layout(paths)
    try:
        return _up(paths, config, layout, wait)
    except BaseException:
        # The next flagless mb up brings back the last layout that ran.
        if previous is None:
            (paths.run / "layout.json").unlink(missing_ok=True)
        else:
            _write_layout(paths, previous)
        raise


def _make(paths: Paths) -> None:
    try:
        paths.make()
    except OSError as exc:
        raise MinibatchError(f"cannot make the cluster's home: {exc}") from None


def _write_layout(paths: Paths, layout: list[NodeLayout]) -> None:
    _write_atomic(paths.run / "layout.json", layouts.encode(layout).decode() + "\n")


@contextlib.contextmanager
def one_at_a_time(paths: Paths, patience: float) -> Iterator[None]:
    """Hold the cluster's start lock while deciding what to start and starting
    it (``mb up``): two at once would each start daemons the other starts too,
    or two layouts at once."""
    _make(paths)
    fd = os.open(paths.run / "up.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + patience
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        "another mb up of this cluster is still starting it; "
                        "try again when it is done"
                    ) from None
                time.sleep(0.05)
        yield  # the lock goes with the descriptor
    finally:
        os.close(fd)


def _up(
    paths: Paths, config: Config, layout: list[NodeLayout], wait: float
) -> UpReport:
    _write_layout(paths, layout)
    run = _Starter(paths, config, wait)
    run.report.layout = list(layout)
    try:
        url = config.mqtt.url
        if not url and running_pid(paths, Daemon("broker")) is not None:
            run.ensure(Daemon("broker"))
            url = mqtt_url(paths, Config())
        elif not url:
            port = _broker_port(paths)
            url = f"mqtt://127.0.0.1:{port}"
            # Written before the server starts: it reads the URL at start-up,
            # and the credentials only it may publish with (the broker's rule).
            _write_atomic(paths.mqtt_url_file, url + "\n")
            from minibatch.events import credentials as mqtt_credentials

            mqtt_credentials.ensure(paths.mqtt_credentials)
            args = ["--port", str(port), "--credentials", str(paths.mqtt_credentials)]
            if _use_mosquitto(config.mqtt.broker):
                args.append("--mosquitto")
            run.ensure(Daemon("broker", tuple(args)))
            # Waiting spares the server a logged "broker unavailable" at start.
            run.until(lambda: _listening(port), lambda: ("broker", "is not listening"))
        run.report.mqtt_url = url
        run.ensure(Daemon("server"))
        endpoint = run.report.server_endpoint
        with Client(endpoint, timeout=0.5) as client:
            run.until(
                lambda: isinstance(client.call(Status()), ServerStatus),
                lambda: ("server", f"does not answer on {endpoint}"),
            )
            # The scheduler and the nodes register with the server; starting them
            # once it answers spares them a round of reconnection attempts.
            run.ensure(Daemon("scheduler"))
            for node in layout:
                run.ensure(Daemon(f"node-{node.name}", tuple(node.daemon_args())))
            run.until(
                lambda: client.call(Status()).scheduler_pid is not None,
                lambda: ("scheduler", "has not registered with the server"),
            )
            late = [(f"node-{n.name}", "is unknown") for n in layout]

            def nodes_up() -> bool:
                reply: NodeList = client.call(QueryNodes())
                st = {n.name: n.state for n in reply.nodes}
                states = [(n.name, st.get(n.name, "unknown")) for n in layout]
                late[:] = [(f"node-{n}", f"is {s}") for n, s in states if s in NOT_UP]
                return not late

            run.until(nodes_up, lambda: late[0])
    except BaseException:
        run.stop_started()
        raise
    return run.report


def _stop(
    pids: dict[str, int], paths: Paths, node_signal: int = signal.SIGTERM
) -> list[str]:
    """SIGTERM ``pids`` stage by stage (nodes: ``node_signal``), SIGKILL what
    outlives :data:`STOP_GRACE`."""
    stages: dict[int, dict[str, int]] = {}
    for name, pid in pids.items():
        stages.setdefault(STOP_STAGE.get(name, 0), {})[name] = pid
    stopped: list[str] = []
    for _, stage in sorted(stages.items()):
        procs: dict[psutil.Process, str] = {}
        for name, pid in stage.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                node = name.startswith("node-")
                proc.send_signal(node_signal if node else signal.SIGTERM)
                procs[proc] = name
            stopped.append(name)
        # The daemons of one stage stop in parallel: all nodes end their jobs at once.
        alive = _wait_gone(procs, STOP_GRACE)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        _wait_gone({p: procs[p] for p in alive}, 5)
        for name in (procs[p] for p in alive if procs[p].startswith("node-")):
            # A node killed before it could end its jobs leaves them running.
            from minibatch.node.procfs import kill_leftovers

            kill_leftovers(name.removeprefix("node-"), str(paths.home))
    return stopped


def _wait_gone(
    procs: dict[psutil.Process, str], timeout: float
) -> list[psutil.Process]:
    """Wait until each process (-> its daemon's name) has stopped running its
    daemon; return those still running it.

    A zombie has exited: it only waits for its parent (``init`` may reap late, or
    the caller of :func:`up` is the parent), so it counts as gone, and is reaped
    here when it is ours. So does a pid that runs another program now: a node
    daemon that left its jobs running (--keep-running) becomes their reaper.
    """
    deadline = time.monotonic() + timeout
    left_running = list(procs)
    while True:
        left_running = [p for p in left_running if _running(p, procs[p])]
        left = deadline - time.monotonic()
        if not left_running or left <= 0:
            return left_running
        _await_exit(left_running, min(left, EXIT_POLL))


def _await_exit(procs: list[psutil.Process], timeout: float) -> None:
    """Return once one of ``procs`` has exited, or after ``timeout`` s.

    A pidfd turns readable when its process exits (zombie or reaped), child or
    not; without pidfds (Linux < 5.3) this sleeps a short while instead.
    """
    fds: list[int] = []
    try:
        for proc in procs:
            try:
                fds.append(os.pidfd_open(proc.pid))
            except ProcessLookupError:
                return  # gone already
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    except OSError:
        time.sleep(min(timeout, POLL))
    finally:
        for fd in fds:
            os.close(fd)


def _running(proc: psutil.Process, name: str) -> bool:
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return Daemon(name).matches(proc.cmdline())
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to read: it runs
        return True
    with contextlib.suppress(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)
    return False


def down(
    paths: Paths,
    config: Config | None = None,
    *,
    keep_running: bool = False,
    drain: Callable[[int], None] | None = None,
) -> list[str]:
    """Stop every daemon with a pid file: nodes, scheduler, server, then broker.

    SIGTERM (nodes: SIGUSR2 when ``keep_running``, see :mod:`.stopping`), then
    SIGKILL after :data:`STOP_GRACE` s. With ``drain`` (told the number of jobs
    still running as it changes) the scheduler stops first and the rest once no
    job runs. Then what jobs of dead node daemons left is killed, unless jobs are
    kept. Pid files (stale ones too) and the embedded broker's URL file are
    removed.

    Returns:
        The daemons that were running, in the order they were stopped, and,
        last, how many jobs without a node daemon were killed, if any.

    Raises:
        PermissionDenied: Another user (not root) owns the cluster.
    """
    # Imported here: mb status, which imports this module, has no use for it.
    from minibatch.cluster import stopping

    if not paths.run.is_dir():
        return []
    check_owner(paths, "stop", root_too=True)
    pids = running(paths)
    stopped: list[str] = []
    if keep_running and "server" in pids:
        stopping.check_keep(paths, config or Config())
    if drain is not None and "server" in pids:
        if "scheduler" in pids:
            stopped = _stop({"scheduler": pids.pop("scheduler")}, paths)
        stopping.wait_drained(paths, config or Config(), drain)
    keep = signal.SIGUSR2 if keep_running else signal.SIGTERM
    stopped += _stop(pids, paths, keep)
    if not keep_running:
        swept = stopping.sweep(paths)
        if swept:
            stopped.append(f"{swept} job(s) left running without a node daemon")
        # Their jobs gone, the node daemons' keepers exit: nothing outlives mb down.
        waiting = stopping.wait_keepers(paths)
        if waiting:
            stopped.append(f"{waiting} node keeper(s) still waiting for job processes")
    for name in pidfile_names(paths):
        paths.pidfile(name).unlink(missing_ok=True)
    if "broker" in pids:
        paths.mqtt_url_file.unlink(missing_ok=True)
    return stopped


def _use_mosquitto(choice: str) -> bool:
    """``[mqtt] broker``: "auto" takes Debian's mosquitto when it is installed."""
    if choice == "auto":
        from minibatch.events import mosquitto

        return mosquitto.executable() is not None
    return choice == "mosquitto"
