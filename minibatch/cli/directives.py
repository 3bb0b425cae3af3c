"""Job options from the qsub command line and from ``#PBS`` / ``#SBATCH`` directives.

Pure parsing: nothing here talks to the server or reads files, and the environment
comes in as an argument, so every rule is unit-tested. qsub parses its own command
line with the same code, then lays the command line over the script's directives
field by field (``-l walltime=`` given to qsub keeps the script's ``ncpus=``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

import msgspec

from minibatch.cli.common import check_name, positive_int
from minibatch.core.job import Dependency, DependKind
from minibatch.core.units import parse_duration, parse_size_kb
from minibatch.errors import InvalidArgument

QUEUE = "batch"
#: Guards against ``-t 0-999999999`` turning into a billion job records.
MAX_ARRAY = 100_000

#: #SBATCH short options -> long names.
# fmt: off
_SLURM_SHORT = {
    "J": "job-name", "o": "output", "e": "error", "t": "time", "n": "ntasks",
    "c": "cpus-per-task", "N": "nodes", "a": "array", "d": "dependency",
    "p": "partition", "H": "hold", "A": "account", "q": "qos",
}
# fmt: on
_SLURM_LONG = frozenset(_SLURM_SHORT.values()) | {"mem", "reservation", "malleable"}
_SLURM_FLAGS = frozenset({"hold"})

_DIRECTIVE = re.compile(r"^#(PBS|SBATCH)(?=\s|$)")
_ARRAY_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_JOB_REF = re.compile(r"^(\d+)(?:\.[\w.-]+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SLURM_MEM = re.compile(r"^(\d+)([kmgt]?)b?$", re.IGNORECASE)
_SLURM_MEM_KB = {"k": 1, "": 1024, "m": 1024, "g": 1024**2, "t": 1024**3}
_HOST_PREFIX = re.compile(r"^[A-Za-z0-9_.-]+:(?=/)")
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")


# A Struct, not a dataclass: importing dataclasses costs qsub milliseconds.
class SubmitOptions(msgspec.Struct, kw_only=True):
    """Everything a submission can set; None means "not given at this layer"."""

    name: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    join: bool | None = None
    nodes: int | None = None
    ppn: int | None = None
    #: Slurm's ``--ntasks`` and ``--cpus-per-task``, folded into ppn at submission.
    ntasks: int | None = None
    cpus_per_task: int | None = None
    mem_kb: int | None = None
    walltime: int | None = None
    depends: list[Dependency] | None = None
    hold: bool | None = None
    array: list[int] | None = None
    env: dict[str, str] = {}
    export_all: bool | None = None
    account: str | None = None
    qos: str | None = None
    #: An advance reservation to run inside (``-l advres=NAME``).
    advres: str | None = None
    #: Malleable: the fewest and most CPUs (``-l malleable=MIN-MAX``).
    malleable: tuple[int, int] | None = None
    #: #SBATCH directives were used: Slurm sends stderr to the output file by default.
    slurm: bool = False


def check_word(value: str, what: str) -> str:
    """A QOS, account or reservation name: letters, digits and ``_ . - @``."""
    if not _WORD.match(value):
        raise InvalidArgument(f"invalid {what} {value!r}")
    return value


def check_queue(queue: str) -> None:
    """Accept ``batch`` (optionally ``batch@server``), the only queue there is."""
    if queue.partition("@")[0] not in ("", QUEUE):
        raise InvalidArgument(f"unknown queue {queue!r} (the only queue is {QUEUE!r})")


def parse_array(text: str) -> list[int]:
    """``1-10``, ``1,3,5-7`` or ``0-15:2`` -> sorted unique indices."""
    if "%" in text:
        raise InvalidArgument(f"array slot limits are not supported: {text!r}")
    indices: set[int] = set()
    for item in text.split(","):
        m = _ARRAY_ITEM.match(item.strip())
        if m is None:
            raise InvalidArgument(f"malformed array range {text!r} (e.g. 1-10,12)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise InvalidArgument(f"malformed array range {item!r} in {text!r}")
        if len(indices) + (hi - lo) // step + 1 > MAX_ARRAY:
            raise InvalidArgument(f"array {text!r} has more than {MAX_ARRAY} tasks")
        indices.update(range(lo, hi + 1, step))
    return sorted(indices)


def parse_depend(text: str) -> list[Dependency]:
    """``afterok:1:2,afterany:3`` -> dependencies (all must hold, as in PBS)."""
    if "?" in text:
        raise InvalidArgument(f"'?' (any-of) dependencies are not supported: {text!r}")
    deps: list[Dependency] = []
    for clause in text.split(","):
        kind, _, ids = clause.strip().partition(":")
        try:
            dep_kind = DependKind(kind.lower())
        except ValueError:
            supported = ", ".join(k.value for k in DependKind)
            raise InvalidArgument(
                f"unsupported dependency type {kind!r} (supported: {supported})"
            ) from None
        if not ids:
            raise InvalidArgument(f"dependency {clause!r} names no job")
        for ref in ids.split(":"):
            m = _JOB_REF.match(ref.strip())  # 123 or 123.server
            if m is None:
                raise InvalidArgument(f"malformed job id {ref!r} in a dependency")
            dep = Dependency(dep_kind, int(m.group(1)))
            if dep not in deps:
                deps.append(dep)
    return deps


def parse_env_list(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``A=1,B=2,C`` -> variables; a bare name takes its value from ``environ``."""
    out: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not _ENV_NAME.match(name):
            raise InvalidArgument(f"malformed variable {item!r} in -v {text!r}")
        out[name] = value if sep else environ.get(name, "")
    return out


def parse_slurm_time(text: str) -> int:
    """Slurm ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]`` -> seconds."""
    days_text, dash, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    units: tuple[int, ...]
    if dash:
        units = (3600, 60, 1)
        ok = days_text.isdigit() and len(parts) <= 3
    else:
        units = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}.get(len(parts), ())
        ok = bool(units)
    if not ok or not all(p.isdigit() for p in parts):
        raise InvalidArgument(
            f"malformed time {text!r} (expected MM, MM:SS, HH:MM:SS or D-HH:MM:SS)"
        )
    seconds = sum(int(p) * u for p, u in zip(parts, units, strict=False))
    seconds += int(days_text) * 86400 if dash else 0
    if seconds <= 0:
        raise InvalidArgument(f"time must be positive, got {text!r}")
    return seconds


def parse_slurm_mem(text: str) -> int:
    """Slurm ``--mem``: a number with an optional K/M/G/T suffix, MB by default."""
    m = _SLURM_MEM.match(text.strip())
    if m is None or int(m.group(1)) <= 0:
        raise InvalidArgument(f"malformed memory size {text!r} (e.g. 500, 4G)")
    return int(m.group(1)) * _SLURM_MEM_KB[m.group(2).lower()]


def parse_malleable(text: str) -> tuple[int, int]:
    """``2-8`` -> (2, 8): the fewest and most CPUs a malleable job runs on."""
    low, dash, high = text.strip().partition("-")
    if not dash or not low.isdigit() or not high.isdigit():
        raise InvalidArgument(
            f"malformed malleable range {text!r} (expected MIN-MAX, e.g. 2-8)"
        )
    return int(low), int(high)


# -------------------------------------------------------------- resources


def parse_resource_list(text: str) -> list[tuple[str, str]]:
    """``nodes=1:ppn=2,walltime=10:00`` -> ``[(name, value), ...]`` (syntax only)."""
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidArgument(f"malformed resource {item!r} (expected name=value)")
        pairs.append((key.strip().lower(), value.strip()))
    return pairs


def _apply_nodes(opts: SubmitOptions, value: str) -> None:
    count, *props = value.split(":")
    if "+" in value or not count.isdigit():
        raise InvalidArgument(f"nodes= must be like nodes=2:ppn=4, got {value!r}")
    opts.nodes, opts.ppn = positive_int(count, "nodes"), 1
    for prop in props:
        key, _, num = prop.partition("=")
        if key != "ppn":
            raise InvalidArgument(f"unsupported node property {prop!r} (only ppn=)")
        opts.ppn = positive_int(num, "ppn")


def _apply_select(opts: SubmitOptions, value: str) -> None:
    parts = value.split(":")
    # The chunk count may be left out: select=ncpus=4 is one chunk.
    count = 1 if "=" in parts[0] else positive_int(parts.pop(0), "select")
    ncpus, mem_kb = 1, None
    for part in parts:
        key, _, num = part.partition("=")
        if key == "ncpus":
            ncpus = positive_int(num, "ncpus")
        elif key == "mem":
            mem_kb = parse_size_kb(num) * count
        else:
            raise InvalidArgument(f"unsupported select resource {part!r}")
    opts.nodes, opts.ppn = count, ncpus
    if mem_kb is not None:
        opts.mem_kb = mem_kb


def apply_resources(opts: SubmitOptions, text: str) -> None:
    """Apply a ``-l`` list to ``opts``."""
    for key, value in parse_resource_list(text):
        if key == "ncpus":
            opts.nodes, opts.ppn = 1, positive_int(value, "ncpus")
        elif key == "nodes":
            _apply_nodes(opts, value)
        elif key == "select":
            _apply_select(opts, value)
        elif key == "mem":
            opts.mem_kb = parse_size_kb(value)
        elif key == "walltime":
            opts.walltime = parse_duration(value)
        elif key == "qos":
            opts.qos = check_word(value, "QOS")
        elif key == "advres":
            opts.advres = check_word(value, "reservation name")
        elif key == "malleable":
            opts.malleable = parse_malleable(value)
        else:
            supported = "ncpus, nodes, select, mem, walltime, qos, advres, malleable"
            raise InvalidArgument(f"unsupported resource {key!r} ({supported})")


# ---------------------------------------------------------------- options

#: qsub letters -> the option names apply_option knows (as do #SBATCH long names).
# fmt: off
PBS_OPTIONS = {
    "N": "name", "o": "output", "e": "error", "j": "join", "l": "resources",
    "W": "attribute", "t": "array", "v": "variables", "q": "queue", "h": "hold",
    "V": "export", "A": "account",
}
# fmt: on
#: qsub options that are flags; the other PBS_OPTIONS take a value.
PBS_FLAGS = frozenset("hV")
_SLURM_ALIASES = {"job-name": "name", "partition": "queue"}


def apply_option(
    opts: SubmitOptions, key: str, value: str, environ: Mapping[str, str]
) -> None:
    """Apply one option, named as in :data:`PBS_OPTIONS` or by its #SBATCH name."""
    key = _SLURM_ALIASES.get(key, key)
    if key == "name":
        opts.name = check_name(value)
    elif key in ("output", "error"):
        # PBS paths may be written host:/path; there is one host, so drop it.
        setattr(opts, f"std{key[:3]}_path", _HOST_PREFIX.sub("", value))
    elif key == "join":
        if value.lower() not in ("oe", "n"):
            raise InvalidArgument(f"-j {value}: only 'oe' and 'n' are supported")
        opts.join = value.lower() == "oe"
    elif key == "resources":
        apply_resources(opts, value)
    elif key == "attribute":
        attr, sep, spec = value.partition("=")
        if attr.strip().lower() != "depend" or not sep:
            raise InvalidArgument(f"unsupported -W attribute {value!r} (only depend=)")
        opts.depends = parse_depend(spec)
    elif key == "dependency":
        opts.depends = parse_depend(value)
    elif key == "array":
        opts.array = parse_array(value)
    elif key == "variables":
        opts.env.update(parse_env_list(value, environ))
    elif key == "queue":
        check_queue(value)
    elif key == "hold":
        opts.hold = True
    elif key == "export":
        opts.export_all = True
    elif key == "account":
        opts.account = check_word(value, "account")
    elif key == "qos":
        opts.qos = check_word(value, "QOS")
    elif key == "reservation":
        opts.advres = check_word(value, "reservation name")
    elif key == "malleable":
        opts.malleable = parse_malleable(value)
    elif key == "time":
        opts.walltime = parse_slurm_time(value)
    elif key == "mem":
        opts.mem_kb = parse_slurm_mem(value)
    elif key in ("ntasks", "cpus-per-task", "nodes"):
        setattr(opts, key.replace("-", "_"), positive_int(value, f"--{key}"))
    else:
        raise InvalidArgument(f"unknown option {key!r}")


def pbs_getopt(tokens: list[str]) -> tuple[list[tuple[str, str]], list[str], bool]:
    """qsub tokens -> ((option name, value) pairs, operands, whether ``--`` came).

    Parsing stops at the first operand (the script), as getopt does for qsub.
    Options come by their :data:`PBS_OPTIONS` name; flags get the value "".
    """
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            return opts, tokens[i + 1 :], True
        if tok == "--help":
            opts.append(("help", ""))
        elif tok.startswith("--"):
            raise InvalidArgument(f"unknown option {tok}")
        elif len(tok) < 2 or tok[0] != "-":
            break
        else:
            for j, letter in enumerate(tok[1:], start=1):
                if letter not in PBS_OPTIONS:
                    raise InvalidArgument(f"unknown option -{letter}")
                if letter in PBS_FLAGS:
                    opts.append((PBS_OPTIONS[letter], ""))
                    continue
                value = tok[j + 1 :]
                if not value:
                    i += 1
                    if i == len(tokens):
                        raise InvalidArgument(f"option -{letter} needs a value")
                    value = tokens[i]
                opts.append((PBS_OPTIONS[letter], value))
                break
        i += 1
    return opts, tokens[i:], False


def slurm_getopt(tokens: list[str]) -> list[tuple[str, str]]:
    """Split #SBATCH tokens into (long name, value) pairs; flags get ""."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            name, sep, value = tok[2:].partition("=")
            if name not in _SLURM_LONG:
                raise InvalidArgument(f"unknown option --{name}")
        elif tok.startswith("-") and len(tok) > 1 and tok[1] in _SLURM_SHORT:
            name, value = _SLURM_SHORT[tok[1]], tok[2:]
            sep = "=" if value else ""
        elif tok.startswith("-"):
            raise InvalidArgument(f"unknown option {tok}")
        else:
            raise InvalidArgument(f"unexpected argument {tok!r}")
        if name in _SLURM_FLAGS:
            if sep:
                raise InvalidArgument(f"--{name} takes no value")
        elif not sep:
            i += 1
            if i == len(tokens):
                raise InvalidArgument(f"option --{name} needs a value")
            value = tokens[i]
        out.append((name, value))
        i += 1
    return out


# ------------------------------------------------------------- directives


def _directive_tokens(text: str) -> list[str]:
    # A comment may follow the options; '#' only starts one at a token's start, so
    # a job name like run#2 survives.
    tokens = shlex.split(text)
    ends = [i for i, tok in enumerate(tokens) if tok.startswith("#")]
    return tokens[: ends[0]] if ends else tokens


def parse_directives(
    text: str, source: str, environ: Mapping[str, str]
) -> SubmitOptions:
    """Options from the directives at the top of a script.

    Reading stops at the first line that is neither blank nor a comment.

    Raises:
        InvalidArgument: a bad directive, named by ``source`` and its line number.
    """
    opts = SubmitOptions()
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (lineno == 1 and stripped.startswith("#!")):
            continue
        if not stripped.startswith("#"):
            break
        m = _DIRECTIVE.match(line)
        if m is None:
            continue
        try:
            tokens = _directive_tokens(line[m.end() :])
            if m.group(1) == "PBS":
                pairs, operands, dashes = pbs_getopt(tokens)
                if operands or dashes or ("help", "") in pairs:
                    bad = operands[0] if operands else "--" if dashes else "--help"
                    raise InvalidArgument(f"unexpected argument {bad!r}")
            else:
                opts.slurm = True
                pairs = slurm_getopt(tokens)
            for key, value in pairs:
                apply_option(opts, key, value, environ)
        except (InvalidArgument, ValueError) as exc:
            raise InvalidArgument(
                f"{source} line {lineno}: {exc} (in {stripped!r})"
            ) from None
    return opts
