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


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "easy",
            {"nosuch": 1},
            "bad parameters for policy 'easy': unknown parameter 'nosuch' (it takes: ",
        ),
        ("maui", {"backfill": "maybe"}, "parameter backfill: expected true or false"),
        ("maui", {"queuetimeweight": "abc"}, "parameter weights: Expected `float`"),
        ("fairshare", {"fsinterval": "abc"}, "parameter fsinterval: expected a number"),
        ("minibatch.policy.fifo:Nope", {}, "cannot load policy 'minibatch.policy.fifo"),
        ("nosuchmodule:X", {}, "No module named 'nosuchmodule'"),
    ],
)
def test_bad_policy_parameters_are_one_clear_error(name, params, message) -> None:
    from minibatch.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as err:
        registry.load(name, params)
    assert message in str(err.value)


def test_backfill_takes_the_words_of_a_flag() -> None:
    # "no" was a non-empty string, so backfill stayed on.
    assert registry.load("maui", {"backfill": "no"}).backfill is False
    assert registry.load("psp", {"backfill": "yes"}).backfill is True
