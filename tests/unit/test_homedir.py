"""Where a command finds its cluster without pathlib (:mod:`minibatch.homedir`):
the same home and endpoint as :class:`minibatch.config.Paths` and the
configuration give."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibatch import homedir
from minibatch.config import Paths, load
from minibatch.errors import InvalidArgument
from tests.unit.fresh_python import output_of


@pytest.mark.parametrize(
    "home", ["", "/abs/h", "/abs/h/", "rel/../h", "~/x", "~", "./h", "a//b/./c/"]
)
def test_the_home_is_the_one_paths_has(
    home: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/users/me")
    monkeypatch.setenv("MB_HOME", home)
    paths = Paths.from_env()
    assert homedir.home_dir() == str(paths.home)
    monkeypatch.delenv("MB_SERVER", raising=False)
    assert homedir.client_endpoint() == load(paths).client_endpoint(paths)


def test_without_a_configuration_mb_server_else_the_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MB_HOME", str(tmp_path))
    monkeypatch.delenv("MB_SERVER", raising=False)
    assert homedir.client_endpoint() == f"ipc://{tmp_path}/run/server.sock"
    monkeypatch.setenv("MB_SERVER", "tcp://b:2")
    assert homedir.client_endpoint() == "tcp://b:2"


def test_a_configuration_is_read_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MB_HOME", str(tmp_path))
    monkeypatch.delenv("MB_SERVER", raising=False)
    config = tmp_path / homedir.CONFIG_NAME
    config.write_text('[client]\nserver = "tcp://a:1"\n')
    assert homedir.client_endpoint() == "tcp://a:1"
    config.write_text("[client]\nserver = 5\n")
    with pytest.raises(InvalidArgument, match="minibatch.toml"):
        homedir.client_endpoint()


def test_a_home_that_cannot_be_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    home.write_text("")  # a file: no configuration can be read under it
    monkeypatch.setenv("MB_HOME", str(home))
    with pytest.raises(InvalidArgument, match="minibatch.toml: Not a directory"):
        homedir.client_endpoint()


@pytest.mark.timeout(30)
def test_a_command_reaches_its_server_without_pathlib_or_socket(
    tmp_path: Path,
) -> None:
    # pathlib and the socket module's enums are ~5 ms of every command's start.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "server.sock").touch()  # a server.commands is missing
    probe = (
        "import os, sys\n"
        f"os.environ['MB_HOME'] = {str(tmp_path)!r}\n"
        "from minibatch.cli.launch import qsub\n"
        "from minibatch.cli import common\n"
        "from minibatch.errors import Unavailable\n"
        "from minibatch.protocol.messages import Status\n"
        "try:\n"
        "    common.call(Status())\n"
        "except Unavailable as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in ('pathlib', 'socket') if m in sys.modules))\n"
    )
    said, imported = output_of(probe).splitlines()
    assert said.startswith("no minibatch server at ipc://"), said
    assert imported == "[]"


@pytest.mark.parametrize("value", ["bogus", "/tmp/x.sock", "server:5555"])
def test_an_mb_server_that_is_no_endpoint_is_one_clear_error(monkeypatch, value):
    """MB_SERVER=bogus reached ZeroMQ and every command ended in a traceback
    (found by a new-user trial)."""
    monkeypatch.setenv("MB_SERVER", value)
    with pytest.raises(InvalidArgument, match=f"MB_SERVER {value!r} is not an"):
        homedir.client_endpoint()
