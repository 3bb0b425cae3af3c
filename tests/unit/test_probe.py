"""Which daemons run: pid files checked against /proc, read without psutil
(``mb status``), and agreeing with what psutil reads; and whose cluster it is.
The ownership tests act as root and as another uid, as the suite runs (root:
cgroups and users are its to make)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from minibatch.cluster import lifecycle, probe
from minibatch.cluster.layout import NodeLayout
from minibatch.cluster.probe import Daemon
from minibatch.config import Config, Paths
from minibatch.errors import PermissionDenied
from tests.unit.fresh_python import output_of

pytestmark = pytest.mark.timeout(30)
NOBODY = 65534


@pytest.fixture
def home(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path / "home")
    paths.make()
    return paths


@pytest.fixture
def fake_server(tmp_path: Path) -> Path:
    """A program whose process looks like ``mb-server`` by its name."""
    script = tmp_path / "bin" / "mb-server"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    script.chmod(0o755)
    return script


def _start(script: Path, home: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([str(script)], env=dict(os.environ, MB_HOME=str(home)))
    # Until it has exec'd its interpreter, /proc shows the forked test runner.
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).cmdline()[1:] != [str(script)]:
        assert time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.01)
    return proc


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_live_daemon_of_this_home_is_found_as_psutil_sees_it(
    home: Paths, fake_server: Path, stopper: list[subprocess.Popen[bytes]]
) -> None:
    proc = _start(fake_server, home.home)
    stopper.append(proc)
    home.pidfile("server").write_text(f"{proc.pid}\n")
    assert probe.running_pid(home, Daemon("server")) == proc.pid
    assert probe.running(home) == {"server": proc.pid}
    assert probe._words(proc.pid, "cmdline") == psutil.Process(proc.pid).cmdline()
    assert probe._home_of(proc.pid) == psutil.Process(proc.pid).environ()["MB_HOME"]
    # The same pid file under another name is not that daemon.
    home.pidfile("scheduler").write_text(f"{proc.pid}\n")
    assert probe.running_pid(home, Daemon("scheduler")) is None


def test_a_daemon_of_another_home_is_not_ours(
    home: Paths,
    fake_server: Path,
    tmp_path: Path,
    stopper: list[subprocess.Popen[bytes]],
) -> None:
    proc = _start(fake_server, tmp_path / "elsewhere")
    stopper.append(proc)
    home.pidfile("server").write_text(f"{proc.pid}\n")
    assert probe.running_pid(home, Daemon("server")) is None


def test_an_exited_daemon_is_not_running_and_is_reaped(
    home: Paths, fake_server: Path
) -> None:
    proc = _start(fake_server, home.home)
    home.pidfile("server").write_text(f"{proc.pid}\n")
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "not a zombie yet"
        time.sleep(0.01)
    assert probe._zombie(proc.pid)
    assert probe.running_pid(home, Daemon("server")) is None
    assert not psutil.pid_exists(proc.pid)  # waited for: no zombie left
    proc.returncode = -signal.SIGKILL


def test_mb_status_imports_neither_psutil_nor_the_starting_machinery() -> None:
    check = (
        "import sys\n"
        "from minibatch.cli import app\n"
        "from minibatch.cluster import probe\n"
        "heavy = ('psutil', 'dataclasses', 'subprocess', 'importlib.metadata')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = output_of(check)
    assert out == "[]"


@pytest.fixture
def someone_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process, to the owner's checks, another user (not root)."""
    other = os.geteuid() + 1
    monkeypatch.setattr(os, "geteuid", lambda: other)


def test_another_users_cluster_is_neither_stopped_nor_started(
    home: Paths,
    fake_server: Path,
    stopper: list[subprocess.Popen[bytes]],
    someone_else: None,
) -> None:
    proc = _start(fake_server, home.home)
    stopper.append(proc)
    home.pidfile("server").write_text(f"{proc.pid}\n")
    before = sorted(home.run.iterdir())
    me = psutil.Process().username()
    with pytest.raises(PermissionDenied, match=f"only {me} may stop it"):
        lifecycle.down(home)
    layout = [NodeLayout(name="node0", cpus=[0])]
    with pytest.raises(PermissionDenied, match=f"only {me} may start it"):
        lifecycle.up(home, Config(), layout, wait=1)
    assert proc.poll() is None
    assert sorted(home.run.iterdir()) == before  # no layout.json, pid files kept


#: A uid no user has (``useradd`` stops far below).
NO_USER = 4_000_000


def test_root_stops_any_cluster_but_starts_only_its_own(home: Paths) -> None:
    os.chown(home.home, NO_USER, NO_USER)
    assert probe.owner(home) == NO_USER
    assert lifecycle.down(home) == []
    layout = [NodeLayout(name="node0", cpus=[0])]
    with pytest.raises(PermissionDenied, match=f"only uid {NO_USER} may start it"):
        lifecycle.up(home, Config(), layout, wait=1)


def _as_user(uid: int, action: Callable[[], object]) -> str:
    """What ``action`` raises (or returns) in a child running as ``uid``: a
    fork, so nothing is imported after the switch (the interpreter's files
    may be out of the uid's reach)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            os.setgid(uid)
            os.setuid(uid)
            said = repr(action())
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def home_in_tmp() -> Iterator[Paths]:
    """A home a user can reach (pytest's tmp_path is root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="mb-owner-", dir="/tmp"))
    paths = Paths(where)
    paths.make()
    yield paths
    shutil.rmtree(where)


def test_a_user_cannot_stop_roots_daemons_in_their_own_home(
    home_in_tmp: Paths, fake_server: Path, stopper: list[subprocess.Popen[bytes]]
) -> None:
    home = home_in_tmp
    proc = _start(fake_server, home.home)
    stopper.append(proc)
    home.pidfile("server").write_text(f"{proc.pid}\n")
    # The daemons' uid, not the home's, decides: they are whom a stop signals.
    os.chown(home.home, NOBODY, NOBODY)
    said = _as_user(NOBODY, lambda: lifecycle.down(home))
    assert said == (
        f"PermissionDenied: {home.home} is root's cluster: only root may stop it;"
        " nothing was changed"
    )
    assert proc.poll() is None and home.pidfile("server").exists()
