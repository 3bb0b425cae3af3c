"""The commands parse their command line without typer exactly as typer would.

:func:`minibatch.cli.fastargs.parse` either declines (typer then runs the
command) or returns the keyword arguments typer would have called the command
with: checked here against typer itself, for every command ``mb`` runs quickly,
on command lines built from each one's own options and from odd tokens.
"""

from __future__ import annotations

import functools
import inspect
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from minibatch.cli import app, common, fastargs, jobctl

QUICK = sorted(app.QUICK)
#: Tokens no option table explains, and values in the shapes commands take.
ODD = ["--", "-", "-Z", "--nope", "-h", "--help", "--json=1", "-1", "-5", "-ax"]
VALUES = ["5", "7[]", "bob", "1,2", "1h", "x=y", "-a"]


def command(name: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    target, settings = app.COMMANDS[name]
    return app._load(target), app._settings(target, settings)


def typer_kwargs(
    function: Callable[..., Any], argv: list[str], settings: dict[str, Any]
) -> dict[str, Any] | None:
    """What typer calls ``function`` with for ``argv``; None for a usage error."""
    seen: list[dict[str, Any]] = []

    @functools.wraps(function)
    def record(**kwargs: Any) -> None:
        seen.append(kwargs)

    cli = typer.Typer()
    cli.command(context_settings=settings)(record)
    result = CliRunner().invoke(cli, argv)
    return seen[0] if result.exit_code == 0 and seen else None


def option_names(function: Callable[..., Any]) -> list[str]:
    params = fastargs._params(function)  # type: ignore[arg-type]
    return sorted(fastargs._options(params))


def command_lines(function: Callable[..., Any], seed: int) -> list[list[str]]:
    """Each option alone, with a value attached and apart, and random mixes."""
    names = option_names(function)
    lines: list[list[str]] = [[]]
    for name in names:
        lines += [[name], [name, "5"], [name + "5"], [f"{name}=5"], ["5", name]]
    rng = random.Random(seed)
    pool = names + ODD + VALUES
    lines += [rng.choices(pool, k=rng.randint(1, 5)) for _ in range(60)]
    return lines


@pytest.mark.parametrize("name", QUICK)
def test_quick_commands_parse_as_typer_does(name: str) -> None:
    function, settings = command(name)
    defaults = {
        p.name: p.default
        for p in inspect.signature(function).parameters.values()
        if p.default is not inspect.Parameter.empty
    }
    parsed = 0
    for argv in command_lines(function, seed=len(name)):
        fast = fastargs.parse(function, argv, settings)
        if fast is None:
            continue  # typer runs it: nothing to compare
        parsed += 1
        assert {**defaults, **fast} == typer_kwargs(function, argv, settings), argv
    assert parsed, f"{name}: no command line parsed without typer"


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("qstat", []),
        ("qstat", ["-a"]),
        ("qstat", ["-f", "12"]),
        ("qstat", ["-u", "alice"]),
        ("qstat", ["12"]),
        ("qstat", ["-n1", "-s", "--json", "3[]", "4"]),
        ("qdel", ["12", "13"]),
        ("showq", []),
        ("pbsnodes", ["-a"]),
        ("checkjob", ["12"]),
        ("status", []),
        ("acct", ["-j", "1,2", "-o", "JobID,State", "--json"]),
    ],
)
def test_the_lines_scripts_loop_over_need_no_typer(name: str, argv: list[str]) -> None:
    function, settings = command(name)
    assert fastargs.parse(function, argv, settings) is not None


def test_what_typer_must_parse_is_left_to_it() -> None:
    function, settings = command("acct")
    for argv in (["--help"], ["-Z"], ["-j"], ["--swf-decimals", "2"], ["--json=x"]):
        assert fastargs.parse(function, argv, settings) is None, argv
    # A command declared for typer in a way this parser does not read.
    assert fastargs.parse(lambda ctx: None, [], None) is None


def test_run_command_falls_back_to_typer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        common.run_command(jobctl.qdel_command, "qdel", argv=["--help"])
    assert exc.value.code == 0 and "Usage: qdel" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        common.run_command(jobctl.qdel_command, "qdel", argv=["-Z"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "qdel: No such option: -Z\n"


def test_commands_import_neither_typer_nor_zmq() -> None:
    modules = ["qstat", "jobctl", "pbsnodes", "showq", "diag", "acct", "app"]
    code = (
        "import sys\n"
        + "".join(f"import minibatch.cli.{m}\n" for m in modules)
        + "heavy = ('typer', 'click', 'rich', 'pydantic', 'zmq', 'psutil')\n"
        + "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
