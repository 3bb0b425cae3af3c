"""The console scripts: each command's goes through :mod:`minibatch.cli.launch`
(the collector off before its imports) to the command's ``main``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from minibatch.cli import launch
from tests.unit.fresh_python import output_of

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: Long-running programs keep their collector: the daemons, and ``mb`` (``mb
#: web``, ``mb sim``), which turns it off for its quick commands only.
OWN_ENTRY = {"mb", "mb-server", "mb-scheduler", "mb-node", "mb-broker"}


def test_every_command_script_is_launched_and_resolves() -> None:
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    launched = {
        name: target
        for name, target in scripts.items()
        if target == f"minibatch.cli.launch:{name}"
    }
    assert set(scripts) - set(launched) == OWN_ENTRY
    assert set(launched) == set(launch.SCRIPTS)
    for name in launched:
        assert callable(getattr(launch, name)), name
    with pytest.raises(AttributeError, match="no console script 'mb'"):
        launch.mb  # noqa: B018


@pytest.mark.timeout(30)
def test_a_command_imported_through_launch_has_the_collector_off() -> None:
    probe = (
        "import gc, sys\n"
        "from minibatch.cli.launch import qstat\n"
        "print(gc.isenabled(), 'msgspec' in sys.modules)\n"
    )
    out = output_of(probe)
    assert out.split() == ["False", "True"]


@pytest.mark.timeout(30)
def test_commands_import_msgspec_without_typing_extensions() -> None:
    # msgspec then reads typing's get_type_hints: the protocol still decodes,
    # and typer (help, usage errors) still finds typing_extensions later.
    probe = (
        "import sys\n"
        "from minibatch.cli.launch import qstat\n"
        "import minibatch.cli.qstat\n"
        "from minibatch.protocol.codec import decode, encode\n"
        "from minibatch.protocol.messages import QueryJobs\n"
        "q = QueryJobs(selectors=['7[]'], rows=True)\n"
        "same = decode(encode(q)).body == q\n"
        "print('typing_extensions' in sys.modules, 'inspect' in sys.modules, same)\n"
        "import typing_extensions\n"
        "print(typing_extensions.__name__)\n"
    )
    assert output_of(probe).split() == ["False", "False", "True", "typing_extensions"]


@pytest.mark.timeout(60)
def test_a_reader_gone_is_not_an_error_message(tmp_path: Path) -> None:
    """``mb status | head -1``: the output's reader closed its end; the command
    stops without a word on stderr (it said "Broken pipe", found by a new-user
    trial)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # every write to the pipe fails: EPIPE
    try:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("mb")), "status"],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "MB_HOME": str(tmp_path)},
            timeout=30,
        )
    finally:
        os.close(write)
    assert done.stderr == b"" and done.returncode != 0
