"""Property tests of what people write: the config file, and the ``#PBS`` /
``#SBATCH`` directives and command lines of job scripts.

Any text gives a result or the project's own error (InvalidArgument, which the
commands and daemons print as one line); never another exception, which would
be a traceback for the user or a daemon that does not start.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibatch.cli import pbsopts, slurmopts
from minibatch.cli.directives import Context, SubmitOptions, parse_directives
from minibatch.config import (
    Config,
    FairshareConfig,
    MqttConfig,
    NodeDaemonConfig,
    Paths,
    QosConfig,
    QueueConfig,
    SchedulerConfig,
    ServerConfig,
    load,
)
from minibatch.errors import InvalidArgument

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CTX = Context(
    {"HOME": "/home/alice", "PATH": "/usr/bin", "FOO": "x"}, 1.8e9, user="alice"
)

#: Pieces option values are made of, so that values often almost parse.
FRAGMENTS = st.sampled_from(
    [
        "1", "0", "-1", "99999999999999999999", "2", "1.5", ":", "::", ",", "=", "+",
        "-", "%", "[", "]", "[]", "ppn=", "nodes=", "walltime=", "mem=", "ncpus=",
        "select=", "gb", "mb", "kb", "tb", "b", "k", "1-3", "1-", "-3", ":2", "x",
        "afterok", "afterany:", "depend=", "umask=", "group_list=", "gpus=",
        "gpu:", "host:", "y", "n", "oe", "eo", "abe", "00:10:00", "1-00:00",
        "now+60", "USR1@30", "B:", "none", "all", "ALL", "a=b", "NONE", "\\", "'",
        '"', " ", "\t", "\0", "é", "#", "^array_index^", "$PBS_JOBID", "%j",
        "malleable=1-4", "procs=", "advres=", "qos=", "naccesspolicy=",
        "9" * 4301,  # too long for int() without raising ValueError
    ]
)  # fmt: skip
VALUES = st.lists(FRAGMENTS, max_size=6).map("".join) | st.text(max_size=12)
PBS_LETTERS = sorted(pbsopts.LETTERS)
SLURM_NAMES = sorted(slurmopts._LONG)


def parses_or_refuses(text: str, prefix: str = "#PBS") -> None:
    try:
        result = parse_directives(text, "job.sh", CTX, prefix=prefix)
    except InvalidArgument as exc:
        assert str(exc).startswith("job.sh line ")
    else:
        assert isinstance(result, SubmitOptions)


# ------------------------------------------------------------- directives


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_as_a_script(text: str) -> None:
    parses_or_refuses(text)
    parses_or_refuses(text, prefix="#SBATCH")


@st.composite
def pbs_line(draw: st.DrawFn) -> str:
    letter = draw(st.sampled_from(PBS_LETTERS))
    value = draw(VALUES)
    return f"#PBS -{letter} {json.dumps(value)}"


@st.composite
def slurm_line(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(SLURM_NAMES))
    value = draw(VALUES)
    sep = draw(st.sampled_from(["=", " "]))
    return f"#SBATCH --{name}{sep}{json.dumps(value)}"


@SETTINGS
@given(st.lists(pbs_line() | slurm_line(), min_size=1, max_size=6))
def test_directives_with_any_values(lines: list[str]) -> None:
    parses_or_refuses("#!/bin/sh\n" + "\n".join(lines) + "\necho hi\n")


@SETTINGS
@given(
    st.lists(st.sampled_from(PBS_LETTERS).map(lambda c: f"-{c}") | VALUES, max_size=8)
)
def test_qsub_command_lines(tokens: list[str]) -> None:
    opts = SubmitOptions()
    with contextlib.suppress(InvalidArgument):
        pairs, _, _ = pbsopts.getopt(tokens)
        for letter, value in pairs:
            if not letter.startswith("--"):
                pbsopts.apply(opts, letter, value, CTX)


@SETTINGS
@given(
    st.lists(st.sampled_from(SLURM_NAMES).map(lambda n: f"--{n}") | VALUES, max_size=8)
)
def test_sbatch_command_lines(tokens: list[str]) -> None:
    with contextlib.suppress(InvalidArgument):
        slurmopts.apply_tokens(SubmitOptions(), tokens, CTX, directive=False)


@pytest.mark.parametrize(
    "line",
    [
        "#PBS -N a\x00b",
        "#PBS -N 'a\nb'",
        "#SBATCH --job-name=a\x1bb",
        "#PBS -q 'q\x00'",
    ],
)
def test_control_characters_in_names_are_refused(line: str) -> None:
    text = f"{line}\n"
    try:
        opts = parse_directives(text, "job.sh", CTX, prefix="#PBS")
    except InvalidArgument:
        return
    # What the directive parser lets through is refused when the spec is built.
    from minibatch.cli.submission import build_spec

    with pytest.raises(InvalidArgument, match="control character"):
        build_spec(
            opts,
            default_name="job",
            cwd="/tmp",
            environ=CTX.environ,
            host="ws",
            user="alice",
            script=text,
        )


# ----------------------------------------------------------------- config


def loads_or_refuses(tmp_path: Path, data: bytes) -> None:
    paths = Paths(tmp_path)
    paths.config.write_bytes(data)
    try:
        config = load(paths)
    except InvalidArgument as exc:
        assert str(exc).startswith(str(paths.config))
    else:
        assert isinstance(config, Config)


@SETTINGS
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_as_the_config(tmp_path: Path, data: bytes) -> None:
    loads_or_refuses(tmp_path, data)


#: Each section's keys, from the config's own structs.
SECTIONS: dict[str, type[msgspec.Struct]] = {
    "server": ServerConfig,
    "scheduler": SchedulerConfig,
    "node": NodeDaemonConfig,
    "mqtt": MqttConfig,
    "fairshare": FairshareConfig,
}
ARRAYS: dict[str, type[msgspec.Struct]] = {"qos": QosConfig, "queue": QueueConfig}


def toml_float(f: float) -> str:
    return ("-inf" if f < 0 else "inf") if math.isinf(f) else repr(f).lower()


WORDS = st.sampled_from(["easy", "USR1", "none", "full", "00:10:00", "batch"])
TOML_VALUES = (
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str)
    | st.just("9" * 4301)
    | st.floats().map(toml_float)
    | st.booleans().map(lambda b: "true" if b else "false")
    | (VALUES | WORDS).map(json.dumps)
    | st.sampled_from(["[]", "[1, 2]", '["a"]', "{}", "{a = 1}", "1979-05-27"])
)


@st.composite
def config_text(draw: st.DrawFn) -> str:
    lines = []
    for key in draw(
        st.lists(st.sampled_from(list(Config.__struct_fields__)), max_size=3)
    ):
        if key not in SECTIONS and key not in ARRAYS:
            lines.append(f"{key} = {draw(TOML_VALUES)}")
    for name in draw(
        st.lists(st.sampled_from(list(SECTIONS)), unique=True, max_size=3)
    ):
        lines.append(f"[{name}]")
        fields = list(SECTIONS[name].__struct_fields__)
        for key in draw(st.lists(st.sampled_from(fields), unique=True, max_size=4)):
            lines.append(f"{key} = {draw(TOML_VALUES)}")
    for name in draw(st.lists(st.sampled_from(list(ARRAYS)), max_size=3)):
        lines.append(f"[[{name}]]")
        fields = list(ARRAYS[name].__struct_fields__)
        for key in draw(st.lists(st.sampled_from(fields), unique=True, max_size=4)):
            lines.append(f"{key} = {draw(TOML_VALUES)}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(config_text())
def test_configs_with_any_values(tmp_path: Path, text: str) -> None:
    loads_or_refuses(tmp_path, text.encode())


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[server]\nmax_script_bytes = 0\n", "max_script_bytes"),
        ("[server]\nmax_connections_per_user = -1\n", "max_connections_per_user"),
        ("[server]\nmax_message_bytes = 'big'\n", "max_message_bytes"),
    ],
)
def test_bad_limits_are_named(tmp_path: Path, text: str, named: str) -> None:
    paths = Paths(tmp_path)
    paths.config.write_text(text)
    with pytest.raises(InvalidArgument, match=named):
        load(paths)


def test_limits_have_defaults_that_fit_together() -> None:
    server: Any = Config().server
    assert server.max_message_bytes > server.max_script_bytes + server.max_env_bytes


def test_variables_that_are_not_utf8_are_left_out_of_an_exported_environment() -> None:
    from minibatch.cli.submission import build_spec

    environ = {**CTX.environ, "BAD": "\udcff", "\udcfeNAME": "x"}
    opts = SubmitOptions(export_all=True)
    spec = build_spec(
        opts,
        default_name="job",
        cwd="/tmp",
        environ=environ,
        host="ws",
        user="alice",
        script="true\n",
    )
    assert spec.env["FOO"] == "x" and "BAD" not in spec.env
    assert "variable BAD: not exported: it is not valid UTF-8" in opts.notes
    assert "variable \\udcfeNAME: not exported: it is not valid UTF-8" in opts.notes
    # Named on purpose, it is refused.
    with pytest.raises(InvalidArgument, match="not valid UTF-8"):
        build_spec(
            SubmitOptions(env={"X": "\udcff"}),
            default_name="job",
            cwd="/tmp",
            environ=CTX.environ,
            host="ws",
            user="alice",
            script="true\n",
        )


def test_a_config_that_cannot_be_read_is_one_error(tmp_path: Path) -> None:
    """Not there: the defaults. There but unreadable (a directory here; another
    user's home out of reach is the same error): named, never a traceback."""
    paths = Paths(tmp_path / "home")
    assert load(paths) == Config()
    paths.config.mkdir(parents=True)
    with pytest.raises(InvalidArgument, match=r"minibatch.toml: Is a directory"):
        load(paths)
