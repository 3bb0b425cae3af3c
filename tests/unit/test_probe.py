"""Which daemons run: pid files checked against /proc, read without psutil
(``mb status``), and agreeing with what psutil reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from minibatch.cluster import probe
from minibatch.cluster.probe import Daemon
from minibatch.config import Paths
from tests.unit.fresh_python import output_of

pytestmark = pytest.mark.timeout(30)


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
