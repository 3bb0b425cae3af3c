"""The built-in policies are found without scanning the installed entry points,
and are the very ones pyproject.toml declares in the entry point group."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from minibatch.policy import registry
from minibatch.policy.backfill import Easy
from tests.unit.fresh_python import output_of

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_table_is_the_entry_point_group_of_pyproject() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["entry-points"][registry.GROUP] == registry.BUILTIN


def test_every_built_in_policy_loads_and_is_listed() -> None:
    for name in registry.BUILTIN:
        assert registry.load(name.upper()) is not None
    assert set(registry.BUILTIN) <= set(registry.available())
    assert isinstance(registry.load_named("Easy"), Easy)


@pytest.mark.timeout(30)
def test_loading_a_built_in_policy_never_imports_importlib_metadata() -> None:
    probe = (
        "import sys\n"
        "from minibatch.policy import registry\n"
        "registry.load('maui')\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    out = output_of(probe)
    assert out == "False"
