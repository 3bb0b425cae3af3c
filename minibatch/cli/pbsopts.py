"""qsub's options, Torque's and PBS Pro's together, and their ``-l``/``-W`` lists.

Letters mean the same in both but one: ``-P`` is PBS Pro's project (Torque's
proxy user cannot apply on one machine), which is the accounting group when no
``-A`` is given. See docs/compatibility.md for the table with every option.
"""

from __future__ import annotations

from minibatch.cli.common import check_name, positive_int
from minibatch.cli.directives import Context, SubmitOptions
from minibatch.cli.optvalues import (
    check_word,
    parse_array,
    parse_depend,
    parse_env_list,
    parse_pbs_date,
)
from minibatch.core.units import parse_duration, parse_size_kb
from minibatch.errors import InvalidArgument

#: qsub letters that take a value; the rest of :data:`LETTERS` are flags.
_VALUED = frozenset("aAbcCdDeFijkKlLmMNoPpqrRSTtuvwWJ")
#: Flags (Torque and PBS Pro); ``-I``, ``-G`` and ``-X`` need a terminal.
_FLAGS = frozenset("fhnVzIGXx")
LETTERS = _VALUED | _FLAGS

#: Options with no effect on one machine -> why (the note the user sees).
# fmt: off
_RECORDED = {
    "b": "the server is local, so qsub never retries it",
    "c": "checkpointing is not available: a rerun starts from the beginning",
    "D": "jobs do not run under another root directory",
    "f": "one host: there is no sister node to tolerate the loss of",
    "i": "idle slots are not held for arrays (the % limit of -t is honoured)",
    "K": "the node's kill_grace sets the time between SIGTERM and SIGKILL",
    "L": "jobs are bound to their CPUs; NUMA requests are not placed separately",
    "n": "each job is bound to its own CPUs; node exclusivity is not enforced",
    "R": "output files are kept (remove them after the job if needed)",
    "T": "no per-job prologue or epilogue",
    "x": "the script is run as a batch job",
}
# fmt: on
_NEED_TERMINAL = {"I": "interactive jobs", "G": "GUI jobs", "X": "X11 forwarding"}

#: ``-l`` resources that are recorded, with why.
# fmt: off
_RESOURCE_NOTES = {
    "place": "one host: scatter, pack and excl mean nothing more here",
    "host": "one host", "vnode": "one host", "arch": "one architecture",
    "opsys": "one operating system", "file": "no per-job disk limit",
    "software": "no software licences are counted", "other": "recorded only",
    "naccesspolicy": "each job is bound to its own CPUs",
    "epilogue": "no per-job epilogue", "prologue": "no per-job prologue",
    "tpn": "tasks are not placed by minibatch", "trl": "no task lists",
    "partition": "Moab partitions: use -q for a queue",
    "flags": "no Moab flags", "nice": "jobs run at the node's priority",
    "mpiprocs": "MPI ranks are placed by the MPI launcher",
    "ompthreads": "OMP_NUM_THREADS is the job's CPU count on its node",
    "mppwidth": "Cray ALPS: use nodes=/ncpus= here",
    "mppnppn": "Cray ALPS: use nodes=/ncpus= here",
    "mppdepth": "Cray ALPS: use nodes=/ncpus= here",
    "mppmem": "Cray ALPS: use mem= here", "mppnodes": "Cray ALPS",
    "gres": "generic resources other than GPUs are not counted",
    "feature": "", "accelerator": "recorded only", "procs_bitmap": "no bitmaps",
    "pcput": "", "pvmem": "",
}
# fmt: on
_W_NOTES = {
    "stagein": "one host: files are already where the job runs",
    "stageout": "one host: files are already where the job runs",
    "sandbox": "the job runs in its working directory",
    "run_count": "recorded only",
    "x": "Moab extensions are recorded only",
    "release_nodes_on_stageout": "one host",
    "interactive": "jobs are batch jobs",
    "pwd": "use -d for the working directory",
}


def getopt(tokens: list[str]) -> tuple[list[tuple[str, str]], list[str], bool]:
    """qsub tokens -> ((letter, value) pairs, operands, whether ``--`` came).

    Parsing stops at the first operand (the script), as getopt does for qsub.
    Flags get the value ""; ``--help`` and ``--version`` come as themselves.
    """
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            return opts, tokens[i + 1 :], True
        if tok in ("--help", "--version", "--about"):
            opts.append((tok, ""))
        elif tok.startswith("--"):
            raise InvalidArgument(f"unknown option {tok}")
        elif len(tok) < 2 or tok[0] != "-":
            break
        else:
            for j, letter in enumerate(tok[1:], start=1):
                if letter not in LETTERS:
                    raise InvalidArgument(f"unknown option -{letter}")
                if letter in _FLAGS:
                    opts.append((letter, ""))
                    continue
                value = tok[j + 1 :]
                if not value:
                    i += 1
                    if i == len(tokens):
                        raise InvalidArgument(f"option -{letter} needs a value")
                    value = tokens[i]
                opts.append((letter, value))
                break
        i += 1
    return opts, tokens[i:], False


def apply_directive(opts: SubmitOptions, tokens: list[str], ctx: Context) -> None:
    """One ``#PBS`` line: options only, no operands."""
    pairs, operands, dashes = getopt(tokens)
    if operands or dashes:
        raise InvalidArgument(
            f"unexpected argument {operands[0] if operands else '--'!r}"
        )
    for letter, value in pairs:
        if letter.startswith("--") or letter == "C":
            raise InvalidArgument(
                f"{letter if letter.startswith('--') else '-C'} "
                "is a command-line option"
            )
        apply(opts, letter, value, ctx)


def _yes_no(value: str, letter: str) -> bool:
    v = value.strip().lower()
    if v not in ("y", "n"):
        raise InvalidArgument(f"-{letter} takes y or n, got {value!r}")
    return v == "y"


def _set_array(opts: SubmitOptions, value: str, option: str) -> None:
    if opts.array_option not in (None, option):
        raise InvalidArgument(f"{option} and {opts.array_option} both give an array")
    opts.array, opts.array_limit = parse_array(value)
    opts.array_option = option


def apply(opts: SubmitOptions, letter: str, value: str, ctx: Context) -> None:
    """Apply one qsub option, named by its letter."""
    try:
        _apply(opts, letter, value, ctx)
    except ValueError as exc:  # int() of 4,301 digits, shlex of an open quote
        raise InvalidArgument(f"-{letter}: {exc}") from None


def _apply(opts: SubmitOptions, letter: str, value: str, ctx: Context) -> None:
    if letter == "N":
        opts.name = check_name(value)
    elif letter in "oe":
        setattr(opts, "stdout_path" if letter == "o" else "stderr_path", value)
    elif letter == "j":
        join = value.strip().lower()
        if join not in ("oe", "eo", "n", "o", "e"):
            raise InvalidArgument(f"-j {value}: expected oe, eo or n")
        opts.join = {"o": "n", "e": "n"}.get(join, join)
    elif letter == "l":
        apply_resources(opts, value, ctx)
    elif letter == "W":
        apply_attributes(opts, value, ctx)
    elif letter == "t":
        _set_array(opts, value, "-t")
    elif letter == "J":
        _set_array(opts, value, "-J")
    elif letter == "v":
        opts.env = {**opts.env, **parse_env_list(value, ctx.environ)}
    elif letter == "V":
        opts.export_all = True
    elif letter == "q":
        queue = value.partition("@")[0]  # queue@server: one server here
        opts.queues = [check_word(queue, "queue")] if queue else None
    elif letter == "h":
        opts.hold = True
    elif letter == "A":
        opts.account = check_word(value, "account")
    elif letter == "P":
        opts.project = check_word(value, "project")
    elif letter in "dw":
        opts.workdir = value
    elif letter == "S":
        # path[@host][,path@host...]: one host, so the first path.
        opts.shell = value.split(",")[0].split("@")[0]
    elif letter == "F":
        import shlex

        opts.script_args = shlex.split(value)
    elif letter == "r":
        opts.rerunnable = _yes_no(value, "r")
    elif letter == "k":
        keep = value.strip().lower()
        if not keep or any(c not in "oedn" for c in keep):
            raise InvalidArgument(f"-k {value}: expected a mix of o, e, d, or n")
        opts.keep = keep
    elif letter == "a":
        try:
            opts.begin = parse_pbs_date(value, ctx.now)
        except InvalidArgument as exc:
            raise InvalidArgument(f"-a {value}: {exc}") from None
    elif letter == "p":
        _priority(opts, value)
    elif letter == "m":
        _mail_points(opts, value, ctx)
    elif letter == "M":
        opts.mail_users = [u.strip() for u in value.split(",") if u.strip()]
        if not ctx.mail:
            opts.note("-m/-M", "no mail is sent: this machine has no sendmail")
    elif letter == "z":
        opts.quiet = True
    elif letter == "u":
        if any(u.split("@")[0] != ctx.user for u in value.split(",")):
            raise InvalidArgument(
                f"-u {value}: jobs run as their submitter ({ctx.user})"
            )
    elif letter in _NEED_TERMINAL:
        raise InvalidArgument(
            f"-{letter}: {_NEED_TERMINAL[letter]}: not supported; "
            "submit a batch job (qsub -- COMMAND) and follow its output file"
        )
    elif letter in _RECORDED:
        opts.record(f"-{letter}", value, f"no effect: {_RECORDED[letter]}")
    else:  # pragma: no cover - LETTERS and the branches above agree
        raise InvalidArgument(f"unknown option -{letter}")


def _priority(opts: SubmitOptions, value: str) -> None:
    try:
        prio = int(value)
    except ValueError:
        raise InvalidArgument(f"-p {value}: expected an integer") from None
    if not -1024 <= prio <= 1023:
        raise InvalidArgument(f"-p {value}: priority must be between -1024 and 1023")
    opts.priority = prio


def _mail_points(opts: SubmitOptions, value: str, ctx: Context) -> None:
    points = value.strip().lower()
    if not points or (points != "n" and any(c not in "abefpj" for c in points)):
        raise InvalidArgument(f"-m {value}: expected n or letters of a, b, e")
    opts.mail_points = "" if points == "n" else "".join(c for c in "abe" if c in points)
    if points != "n" and not ctx.mail:
        opts.note("-m/-M", "no mail is sent: this machine has no sendmail")


# -------------------------------------------------------------- resources


def parse_resource_list(text: str) -> list[tuple[str, str]]:
    """``nodes=1:ppn=2,walltime=10:00`` -> ``[(name, value), ...]`` (syntax only)."""
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        # A bare name is a boolean resource (NCI's ``-l wd``); "name=" is not.
        if not key.strip() or (sep and not value.strip()):
            raise InvalidArgument(f"malformed resource {item!r} (expected name=value)")
        pairs.append((key.strip().lower(), value.strip()))
    return pairs


def _add_features(opts: SubmitOptions, names: list[str]) -> None:
    have = list(opts.features or [])
    opts.features = have + [
        check_word(n, "node property") for n in names if n not in have
    ]


def _nodes(opts: SubmitOptions, value: str) -> None:
    """Torque ``nodes=2:ppn=4:gpus=1:xe[+1:ppn=2]``; a name instead of a count
    asks for that host, which is a property here."""
    total, widest, gpus = 0, 1, 0
    value, hash_, suffix = value.partition("#")  # Torque's nodes=1:ppn=4#excl
    if hash_:
        opts.record("nodes#", suffix, "no effect: each job is bound to its own CPUs")
    specs = value.split("+")
    for spec in specs:
        count_text, *props = spec.split(":")
        if not count_text:
            raise InvalidArgument(f"malformed nodes= {value!r} (e.g. nodes=2:ppn=4)")
        if count_text.isdigit():
            total += positive_int(count_text, "nodes")
        elif count_text.lstrip("-").isdigit():  # no host is named "-1"
            raise InvalidArgument(f"nodes must be a positive count, got {count_text!r}")
        else:
            total += 1
            opts.record("host", count_text, "one host: named nodes are not chosen")
        for prop in props:
            key, sep, num = prop.partition("=")
            if key == "ppn" and sep:
                widest = max(widest, positive_int(num, "ppn"))
            elif key == "gpus" and sep:
                gpus = max(gpus, positive_int(num, "gpus"))
            elif sep:
                opts.record(key, num, "no effect: unknown node property, recorded only")
            else:
                _add_features(opts, [key])
    if len(specs) > 1:
        opts.note(f"nodes={value}", f"run as {total} nodes of {widest} CPUs")
    opts.nodes, opts.ppn = total, widest
    if gpus:
        opts.gpus = gpus


def _select(opts: SubmitOptions, value: str) -> None:
    """PBS Pro ``select=2:ncpus=8:mem=4gb:ngpus=1``; memory is per chunk."""
    chunks = value.split("+")
    if len(chunks) > 1:
        opts.note(f"select={value}", "several chunk kinds: run as equal chunks")
    total, ncpus, mem_kb, gpus = 0, 1, None, 0
    for chunk in chunks:
        parts = chunk.split(":")
        count = 1 if "=" in parts[0] else positive_int(parts.pop(0), "select")
        total += count
        for part in parts:
            key, sep, num = part.partition("=")
            if not sep:
                raise InvalidArgument(f"malformed select resource {part!r}")
            if key == "ncpus":
                ncpus = max(ncpus, positive_int(num, "ncpus"))
            elif key == "mem":
                mem_kb = max(mem_kb or 0, parse_size_kb(num))
            elif key in ("ngpus", "gpus"):
                gpus = max(gpus, positive_int(num, key))
            elif key in ("host", "vnode"):
                opts.record(key, num, "one host: named nodes are not chosen")
            elif num.lower() == "true":
                _add_features(opts, [key])
            else:
                why = _RESOURCE_NOTES.get(key) or "unknown resource, recorded only"
                opts.record(key, num, f"no effect: {why}")
    opts.nodes, opts.ppn = total, ncpus
    if mem_kb is not None:
        opts.mem_kb = mem_kb * total
    if gpus:
        opts.gpus = gpus


def _cpus(opts: SubmitOptions, key: str, value: str) -> None:
    """One of the CPU requests (``ncpus``, ``procs``, ``nodes``, ``select``).

    The same resource given again replaces it, as PBS replaces a resource
    value (a wrapper's ``qsub -l ncpus=2 "$@"`` lets its caller ask
    ``-l ncpus=8``). Different ones in one layer must all ask the same nodes
    and CPUs: PBS has no rule for which would win. A later layer (the command
    line over the script) replaces the request whole
    (:func:`~minibatch.cli.directives.merge`).
    """
    if key in ("ncpus", "procs"):
        opts.nodes, opts.ppn = 1, positive_int(value, key)
        opts.spread = key == "procs"
    else:
        if key == "nodes":
            _nodes(opts, value)
        else:
            _select(opts, value)
        opts.spread = False
    asked = f"{key}={value}"
    nodes, ppn = opts.nodes or 1, opts.ppn or 1
    for other, (n, p, text) in opts.cpu_requests.items():
        if other != key and (n, p) != (nodes, ppn):
            raise InvalidArgument(
                f"contradictory CPU requests: {text} and {asked} (give one)"
            )
    opts.cpu_requests = {**opts.cpu_requests, key: (nodes, ppn, asked)}


#: Resources that mean nothing without a value.
_NEEDS_VALUE = frozenset(
    {
        "ncpus", "procs", "nodes", "select", "mem", "pmem", "vmem", "pvmem",
        "walltime", "cput", "pcput", "gpus", "ngpus", "feature", "qos", "advres",
        "malleable", "depend", "signal",
    }
)  # fmt: skip


def apply_resources(opts: SubmitOptions, text: str, ctx: Context | None = None) -> None:
    """Apply a ``-l`` list to ``opts``."""
    for key, value in parse_resource_list(text):
        if not value:
            if key in _NEEDS_VALUE:
                raise InvalidArgument(
                    f"malformed resource {key!r} (expected {key}=...)"
                )
            if key != "wd":  # wd: start in the submission directory, as always
                opts.record(key, "", "no effect: unknown resource, recorded only")
        elif key in ("ncpus", "procs", "nodes", "select"):
            _cpus(opts, key, value)
        elif key == "mem":
            opts.mem_kb = parse_size_kb(value)
        elif key == "pmem":
            opts.pmem_kb = parse_size_kb(value)
        elif key in ("vmem", "pvmem"):
            opts.vmem_kb = parse_size_kb(value)
        elif key == "walltime":
            opts.walltime = parse_duration(value.split(".")[0])
        elif key in ("cput", "pcput"):
            opts.cput = parse_duration(value.split(".")[0])
        elif key in ("gpus", "ngpus"):
            opts.gpus = positive_int(value, key)
        elif key == "feature":
            if "|" in value:  # Moab: any one of them
                opts.record(
                    key, value, "no effect: only all-of (a:b) lists are matched"
                )
            else:
                _add_features(opts, value.split(":"))
        elif key == "gres" and value.lower().startswith("gpu"):
            from minibatch.cli.slurmopts import apply_gres

            apply_gres(opts, value)
        elif key == "qos":
            opts.qos = check_word(value, "QOS")
        elif key == "advres":
            opts.advres = check_word(value, "reservation name")
        elif key == "malleable":
            from minibatch.cli.slurmopts import parse_malleable

            opts.malleable = parse_malleable(value)
        elif key == "depend":
            opts.depends = parse_depend(value)
        elif key == "signal":  # Moab: signal=SIG@SECS, as sbatch --signal
            from minibatch.cli.slurmopts import parse_signal

            opts.warn = parse_signal(value)
        else:
            why = _RESOURCE_NOTES.get(key) or "unknown resource, recorded only"
            opts.record(key, value, f"no effect: {why}")


def apply_attributes(opts: SubmitOptions, text: str, ctx: Context) -> None:
    """Apply a ``-W`` list: ``depend=...``, ``umask=022``, ``block=true``, ..."""
    # depend= lists contain commas themselves, so it takes the rest of the text.
    rest = text
    while rest:
        attr, sep, value = rest.partition("=")
        attr = attr.strip().lower()
        if not sep or not attr:
            raise InvalidArgument(
                f"malformed -W attribute {rest!r} (expected name=value)"
            )
        if attr == "depend":
            opts.depends = parse_depend(value)
            return
        value, _, rest = value.partition(",")
        if attr == "umask":
            if (
                not value.isdigit()
                or any(c > "7" for c in value)
                or int(value, 8) > 0o777
            ):
                raise InvalidArgument(
                    f"-W umask={value}: expected an octal mask, e.g. 022"
                )
            opts.umask = int(value, 8)
        elif attr == "block":
            opts.block = value.strip().lower() in ("true", "t", "1", "y", "yes")
        elif attr == "group_list":
            opts.group = check_word(value.split("@")[0], "group")
        elif attr in ("stagein", "stageout", "x"):
            # Their own values hold colons and commas: keep the whole rest.
            value = ",".join(filter(None, (value, rest)))
            opts.record(attr, value, f"no effect: {_W_NOTES[attr]}")
            return
        else:
            why = _W_NOTES.get(attr, "unknown attribute, recorded only")
            opts.record(attr, value, f"no effect: {why}")
