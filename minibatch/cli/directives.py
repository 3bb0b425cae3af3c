"""Job options from the command line and from ``#PBS`` / ``#SBATCH`` directives.

Pure parsing: nothing here talks to the server or reads files, and the environment
and the clock come in as arguments, so every rule is unit-tested. ``qsub`` and
``sbatch`` parse their own command lines with the same option tables
(:mod:`minibatch.cli.pbsopts`, :mod:`minibatch.cli.slurmopts`), then lay the
command line over the script's directives field by field (``-l walltime=`` given
to qsub keeps the script's ``ncpus=``).

Every documented option is accepted: it is either honoured, or recorded in
:attr:`SubmitOptions.recorded` (``qstat -f`` shows it) with a one-line note saying
why it has no effect here. Only a malformed value, or contradictory options,
is an error.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from minibatch.core.job import Dependency
from minibatch.errors import InvalidArgument

#: The queue jobs go to unless they name one (the server may configure another).
QUEUE = "batch"


class Context(NamedTuple):
    """What parsing may depend on besides the text: the submitter's environment,
    the time (for ``-a``/``--begin``) and whether mail can be sent here."""

    environ: Mapping[str, str]
    now: float
    mail: bool = True
    #: The submitter's login name (``qsub -u`` may only name them).
    user: str = ""


# A Struct, not a dataclass: importing dataclasses costs qsub milliseconds.
class SubmitOptions(msgspec.Struct, kw_only=True):
    """Everything a submission can set; None means "not given at this layer"."""

    name: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    #: ``-j``: "oe" (stderr into stdout), "eo" (stdout into stderr) or "n".
    join: str | None = None
    nodes: int | None = None
    ppn: int | None = None
    #: Slurm's tasks and CPUs per task, folded into ppn at submission.
    ntasks: int | None = None
    cpus_per_task: int | None = None
    #: ``procs=N`` (Torque): N CPUs, over as many nodes as it takes.
    spread: bool | None = None
    #: The CPU resources given in this layer (``nodes``, ``ncpus``, ...), each
    #: with the nodes and CPUs per node it asks and its text, so another one
    #: that asks otherwise is named as a contradiction.
    cpu_requests: dict[str, tuple[int, int, str]] = {}
    tasks_per_node: int | None = None
    #: Memory of the whole job; Slurm's per node and per CPU forms.
    mem_kb: int | None = None
    mem_per_node_kb: int | None = None
    mem_per_cpu_kb: int | None = None
    gpus: int | None = None
    #: Slurm's other GPU forms, folded into GPUs per node at submission.
    gpus_total: int | None = None
    gpus_per_task: int | None = None
    mem_per_gpu_kb: int | None = None
    walltime: int | None = None
    depends: list[Dependency] | None = None
    hold: bool | None = None
    array: list[int] | None = None
    array_limit: int | None = None
    #: Which option gave the array (``-t`` and ``-J`` contradict each other).
    array_option: str | None = None
    env: dict[str, str] = {}
    export_all: bool | None = None
    account: str | None = None
    project: str | None = None
    qos: str | None = None
    advres: str | None = None
    malleable: tuple[int, int] | None = None
    #: Queues asked for, in order (Slurm's ``-p a,b`` names several), and the
    #: directive that named them ("" for the command line).
    queues: list[str] | None = None
    queue_source: str | None = None
    workdir: str | None = None
    shell: str | None = None
    script_args: list[str] | None = None
    rerunnable: bool | None = None
    keep: str | None = None
    umask: int | None = None
    append: bool | None = None
    begin: float | None = None
    priority: int | None = None
    cput: int | None = None
    pmem_kb: int | None = None
    vmem_kb: int | None = None
    #: ``--signal``: (signal number, seconds before the limit, batch shell only).
    warn: tuple[int, int, bool] | None = None
    mail_points: str | None = None
    mail_users: list[str] | None = None
    features: list[str] | None = None
    #: ``-W group_list=``: the group the job runs as.
    group: str | None = None
    #: ``-W block=true`` / ``--wait``: qsub waits for the end, exits with its status.
    block: bool | None = None
    #: ``-z`` / ``--parsable`` / ``--quiet``: print the id only, or nothing.
    quiet: bool | None = None
    parsable: bool | None = None
    #: ``--test-only``: check everything, submit nothing.
    test_only: bool | None = None
    #: ``--wrap``: a command line to run as the script.
    wrap: str | None = None
    #: ``--ignore-pbs``: skip ``#PBS`` lines.
    ignore_pbs: bool | None = None
    #: Options with no effect here, by name, with their values (merged by name).
    recorded: dict[str, str] = {}
    #: One line each for the user's stderr: what was recorded or changed, and why.
    notes: list[str] = []
    #: #SBATCH directives or sbatch: Slurm's defaults and variables apply.
    slurm: bool = False

    def record(self, name: str, value: str, why: str) -> None:
        """Keep an option that has no effect here, and say so once."""
        self.recorded = {**self.recorded, name: value}
        self.note(f"{name}={value}" if value else name, why)

    def note(self, option: str, why: str) -> None:
        line = f"{option}: {why}"
        if line not in self.notes:
            self.notes = [*self.notes, line]


#: Fields merged rather than replaced when a higher layer is laid over a lower one.
_UNION = frozenset({"env", "recorded"})
#: Slurm's memory options, one request: a layer that gives one of them replaces
#: all three of the layer below (sbatch's command line over ``#SBATCH``).
MEMORY_FIELDS = ("mem_per_node_kb", "mem_per_cpu_kb", "mem_per_gpu_kb")


def merge(lower: SubmitOptions, higher: SubmitOptions) -> SubmitOptions:
    """``higher`` over ``lower``, field by field; variables and recorded options
    merge by name, notes add up.

    A ``nodes=`` or ``ncpus=`` request sets both the node count and the CPUs per
    node, so a higher layer's replaces a lower one's CPU request whole, as PBS
    replaces a resource value.
    """
    out = SubmitOptions()
    memory = any(getattr(higher, f) is not None for f in MEMORY_FIELDS)
    for name in SubmitOptions.__struct_fields__:
        low, high = getattr(lower, name), getattr(higher, name)
        if memory and name in MEMORY_FIELDS:
            value = high
        elif name in _UNION:
            value = {**low, **high}
        elif name == "notes":
            value = low + [n for n in high if n not in low]
        elif name == "slurm":
            value = low or high
        elif name == "queue_source":  # whoever named the queue last
            value = high if higher.queues is not None else low
        else:
            value = low if high is None else high
        setattr(out, name, value)
    return out


def directive_tokens(text: str) -> list[str]:
    """A directive's words, up to a comment.

    ``#`` starts a comment only at the start of a word outside quotes (a job name
    like ``run#2`` survives), and the comment is cut before the words are split,
    so an apostrophe in it (``# don't change``) is not an unbalanced quote.
    """
    quote = ""
    word_start = True
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and word_start:
            text = text[:i]
            break
        word_start = ch.isspace() if not quote else False
    try:
        return shlex.split(text)
    except ValueError as exc:  # an unbalanced quote in the options themselves
        raise InvalidArgument(f"malformed directive: {exc}") from None


def parse_directives(
    text: str,
    source: str,
    ctx: Context,
    *,
    prefix: str = "#PBS",
    ignore_pbs: bool = False,
) -> SubmitOptions:
    """Options from the directives at the top of a script.

    Reading stops at the first line that is neither blank nor a comment, as
    qsub and sbatch do. ``prefix`` is qsub's ``-C`` (``$PBS_DPREFIX``).

    Raises:
        InvalidArgument: a malformed directive, named by ``source``, its line
            number and the line.
    """
    from minibatch.cli import pbsopts, slurmopts

    opts = SubmitOptions()
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (lineno == 1 and stripped.startswith("#!")):
            continue
        if not stripped.startswith("#"):
            break
        word = stripped.split(None, 1)[0]
        if word == "#SBATCH":
            kind = "slurm"
        elif word == prefix and not ignore_pbs:
            kind = "pbs"
        else:
            continue
        queues = opts.queues
        try:
            tokens = directive_tokens(stripped[len(word) :])
            if kind == "pbs":
                pbsopts.apply_directive(opts, tokens, ctx)
            else:
                opts.slurm = True
                slurmopts.apply_tokens(opts, tokens, ctx, directive=True)
        except (InvalidArgument, ValueError) as exc:
            raise InvalidArgument(
                f"{source} line {lineno}: {exc} (in {stripped!r})"
            ) from None
        if opts.queues is not queues:  # the server's refusal will name the line
            opts.queue_source = f"{source} line {lineno} ({stripped})"
    return opts


def directive_prefix(environ: Mapping[str, str]) -> str:
    """The directive prefix: ``$PBS_DPREFIX`` or ``#PBS`` (qsub -C overrides)."""
    return environ.get("PBS_DPREFIX") or "#PBS"
