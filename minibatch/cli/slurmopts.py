"""sbatch's options, as ``#SBATCH`` lines and on ``sbatch``'s command line.

Long options may be abbreviated to any unambiguous prefix and take their value
after ``=`` or as the next word, as getopt_long allows (``--time 30``,
``--cpus-per-t=4``). Options that cannot mean anything on one workstation are
recorded with a note; see docs/compatibility.md.
"""

from __future__ import annotations

import re

from minibatch.cli.common import check_name, positive_int
from minibatch.cli.directives import MEMORY_FIELDS, Context, SubmitOptions
from minibatch.cli.longopts import FLAG as _FLAG
from minibatch.cli.longopts import OPTIONAL as _OPTIONAL
from minibatch.cli.longopts import VALUE as _VALUE
from minibatch.cli.longopts import LongOptions
from minibatch.cli.optvalues import (
    check_word,
    parse_array,
    parse_depend,
    parse_env_list,
    parse_slurm_begin,
)
from minibatch.errors import InvalidArgument

#: Long name -> (short letter, arity); honoured by :func:`apply`.
# fmt: off
_HONOURED: dict[str, tuple[str, str]] = {
    "account": ("A", _VALUE), "array": ("a", _VALUE), "begin": ("b", _VALUE),
    "chdir": ("D", _VALUE), "constraint": ("C", _VALUE),
    "cpus-per-task": ("c", _VALUE), "dependency": ("d", _VALUE),
    "error": ("e", _VALUE), "export": ("", _VALUE), "gpus": ("G", _VALUE),
    "gpus-per-node": ("", _VALUE), "gpus-per-task": ("", _VALUE),
    "gres": ("", _VALUE), "hold": ("H", _FLAG), "ignore-pbs": ("", _FLAG),
    "job-name": ("J", _VALUE), "mail-type": ("", _VALUE),
    "mail-user": ("", _VALUE), "malleable": ("", _VALUE), "mem": ("", _VALUE),
    "mem-per-cpu": ("", _VALUE), "mem-per-gpu": ("", _VALUE),
    "mincpus": ("", _VALUE), "nice": ("", _OPTIONAL), "no-requeue": ("", _FLAG),
    "nodes": ("N", _VALUE), "ntasks": ("n", _VALUE),
    "ntasks-per-node": ("", _VALUE), "open-mode": ("", _VALUE),
    "output": ("o", _VALUE), "parsable": ("", _FLAG), "partition": ("p", _VALUE),
    "qos": ("q", _VALUE), "quiet": ("Q", _FLAG), "requeue": ("", _FLAG),
    "reservation": ("", _VALUE), "signal": ("", _VALUE), "time": ("t", _VALUE),
    "wait": ("W", _FLAG), "wrap": ("", _VALUE), "help": ("h", _FLAG),
    "test-only": ("", _FLAG),
    "usage": ("", _FLAG), "version": ("V", _FLAG),
}
#: Long name -> (short letter, arity, why it has no effect here).
_RECORDED: dict[str, tuple[str, str, str]] = {
    "acctg-freq": ("", _VALUE, "usage is sampled by the node daemon"),
    "batch": ("", _VALUE, "one kind of node"),
    "bb": ("", _VALUE, "no burst buffers"), "bbf": ("", _VALUE, "no burst buffers"),
    "cluster-constraint": ("", _VALUE, "one cluster"),
    "clusters": ("M", _VALUE, "one cluster"),
    "comment": ("", _VALUE, "kept as the job's comment only"),
    "container": ("", _VALUE, "no OCI containers"),
    "container-id": ("", _VALUE, "no OCI containers"),
    "contiguous": ("", _FLAG, "one host"),
    "core-spec": ("S", _VALUE, "no cores are set aside for the system"),
    "cores-per-socket": ("", _VALUE, "CPUs are counted, not sockets"),
    "cpu-freq": ("", _VALUE, "the CPU frequency is the machine's"),
    "cpus-per-gpu": ("", _VALUE, "CPUs are asked for with -c or -n"),
    "deadline": ("", _VALUE, "no deadline scheduling"),
    "delay-boot": ("", _VALUE, "nodes are not rebooted"),
    "distribution": ("m", _VALUE, "tasks are placed by the launcher"),
    "exclude": ("x", _VALUE, "nodes are chosen by the scheduler"),
    "exclusive": ("", _OPTIONAL, "each job is bound to its own CPUs"),
    "export-file": ("", _VALUE, "use --export"),
    "extra": ("", _VALUE, "recorded only"),
    "extra-node-info": ("B", _VALUE, "CPUs are counted, not sockets"),
    "get-user-env": ("", _OPTIONAL, "the job gets the submitter's environment"),
    "gid": ("", _VALUE, "jobs run as their submitter"),
    "gpu-bind": ("", _VALUE, "GPUs are given by CUDA_VISIBLE_DEVICES"),
    "gpu-freq": ("", _VALUE, "the GPU frequency is the machine's"),
    "gpus-per-socket": ("", _VALUE, "GPUs are counted per node"),
    "gres-flags": ("", _VALUE, "recorded only"),
    "hint": ("", _VALUE, "jobs are bound to the CPUs they are given"),
    "input": ("i", _VALUE, "jobs read no standard input"),
    "kill-on-invalid-dep": ("", _VALUE, "an unmet dependency cancels the job"),
    "licenses": ("L", _VALUE, "no licences are counted"),
    "mcs-label": ("", _VALUE, "no MCS labels"),
    "mem-bind": ("", _VALUE, "memory is not bound to NUMA nodes"),
    "network": ("", _VALUE, "one host"),
    "no-kill": ("k", _OPTIONAL, "one host: no node can fail alone"),
    "nodefile": ("F", _VALUE, "nodes are chosen by the scheduler"),
    "nodelist": ("w", _VALUE, "nodes are chosen by the scheduler"),
    "ntasks-per-core": ("", _VALUE, "CPUs are counted, not cores"),
    "ntasks-per-gpu": ("", _VALUE, "tasks are placed by the launcher"),
    "ntasks-per-socket": ("", _VALUE, "CPUs are counted, not sockets"),
    "overcommit": ("O", _FLAG, "jobs get the CPUs they ask for"),
    "oversubscribe": ("s", _FLAG, "jobs do not share CPUs"),
    "power": ("", _VALUE, "no power management"),
    "prefer": ("", _VALUE, "preferences are not scheduled"),
    "priority": ("", _VALUE, "only an operator sets priorities (setspri)"),
    "profile": ("", _VALUE, "usage is sampled by the node daemon"),
    "propagate": ("", _OPTIONAL, "the job inherits the node's limits"),
    "reboot": ("", _FLAG, "nodes are not rebooted"),
    "sockets-per-node": ("", _VALUE, "CPUs are counted, not sockets"),
    "spread-job": ("", _FLAG, "nodes are chosen by the scheduler"),
    "switches": ("", _VALUE, "one host"),
    "thread-spec": ("", _VALUE, "no threads are set aside"),
    "threads-per-core": ("", _VALUE, "CPUs are counted, not hardware threads"),
    "time-min": ("", _VALUE, "the time limit is not reduced to backfill"),
    "tmp": ("", _VALUE, "no per-job disk limit; TMPDIR is the job's own"),
    "tres-bind": ("", _VALUE, "recorded only"),
    "tres-per-task": ("", _VALUE, "recorded only"),
    "uid": ("", _VALUE, "jobs run as their submitter"),
    "use-min-nodes": ("", _FLAG, "node counts are taken as given"),
    "verbose": ("v", _FLAG, "recorded only"),
    "wait-all-nodes": ("", _VALUE, "nodes are ready when the job starts"),
    "wckey": ("", _VALUE, "no workload keys"),
    "x11": ("", _OPTIONAL, "batch jobs have no display"),
    "oom-kill-step": ("", _OPTIONAL, "a job over its memory is ended whole"),
    "mem-update": ("", _VALUE, "the memory limit stays as asked"),
    "resources": ("", _VALUE, "no hierarchical resources"),
    "runtime": ("", _VALUE, "no runtime plugins"),
    "resv-ports": ("", _OPTIONAL, "no reserved MPI ports"),
    "stepmgr": ("", _FLAG, "no step manager"),
    "segment": ("", _VALUE, "one host: no topology segments"),
    "consolidate-segments": ("", _FLAG, "one host: no topology segments"),
    "spread-segments": ("", _FLAG, "one host: no topology segments"),
    "checkpoint": ("", _VALUE, "checkpointing is not available"),
    "checkpoint-dir": ("", _VALUE, "checkpointing is not available"),
}
# fmt: on
_LONG = {name: (short, arity) for name, (short, arity) in _HONOURED.items()} | {
    name: (short, arity) for name, (short, arity, _) in _RECORDED.items()
}

_MEM = re.compile(r"^(\d+)([kmgt]?)b?$", re.IGNORECASE)
_MEM_KB = {"k": 1, "": 1024, "m": 1024, "g": 1024**2, "t": 1024**3}
#: gpu, gpu:N, gpu:TYPE or gpu:TYPE:N.
_GPU_GRES = re.compile(r"^gpu(?::([A-Za-z_][\w.-]*))?(?::(\d+))?$", re.IGNORECASE)
_MAIL_TYPES = {
    "none": "",
    "begin": "b",
    "end": "e",
    "fail": "a",
    "requeue": "a",
    "all": "abe",
    "invalid_depend": "a",
    "stage_out": "e",
    "time_limit": "a",
    "time_limit_90": "",
    "time_limit_80": "",
    "time_limit_50": "",
    "array_tasks": "",
}


#: Other spellings sbatch accepts.
_OPTIONS = LongOptions(
    _LONG,
    {"tasks-per-node": "ntasks-per-node", "name": "job-name", "workdir": "chdir"},
)


def getopt(tokens: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """sbatch tokens -> ((long name, value) pairs, operands from the first one on)."""
    return _OPTIONS.getopt(tokens)


def apply_tokens(
    opts: SubmitOptions, tokens: list[str], ctx: Context, *, directive: bool
) -> list[str]:
    """Apply sbatch options; the operands left (always none in a directive)."""
    pairs, operands = getopt(tokens)
    if directive and operands:
        raise InvalidArgument(f"unexpected argument {operands[0]!r}")
    for name, value in pairs:
        if directive and name in ("help", "usage", "version"):
            raise InvalidArgument(f"--{name} is a command-line option")
        apply(opts, name, value, ctx)
    return operands


def parse_time(text: str) -> int:
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
    if text.strip().lower() in ("infinite", "unlimited"):
        raise InvalidArgument(f"time {text!r}: give a limit (e.g. 7-00:00:00)")
    if not ok or not all(p.isdigit() for p in parts):
        raise InvalidArgument(
            f"malformed time {text!r} (expected MM, MM:SS, HH:MM:SS or D-HH:MM:SS)"
        )
    seconds = sum(int(p) * u for p, u in zip(parts, units, strict=False))
    seconds += int(days_text) * 86400 if dash else 0
    if seconds <= 0:
        raise InvalidArgument(f"time must be positive, got {text!r}")
    return seconds


def parse_mem(text: str) -> int:
    """Slurm memory: a number with an optional K/M/G/T suffix, MB by default -> KB.
    0 means "all the node's memory" and comes back as 0."""
    m = _MEM.match(text.strip())
    if m is None:
        raise InvalidArgument(f"malformed memory size {text!r} (e.g. 500, 4G)")
    return int(m.group(1)) * _MEM_KB[m.group(2).lower()]


def parse_malleable(text: str) -> tuple[int, int]:
    """``2-8`` -> (2, 8): the fewest and most CPUs a malleable job runs on."""
    low, dash, high = text.strip().partition("-")
    if not dash or not low.isdigit() or not high.isdigit():
        raise InvalidArgument(
            f"malformed malleable range {text!r} (expected MIN-MAX, e.g. 2-8)"
        )
    return int(low), int(high)


def parse_signal(text: str) -> tuple[int, int, bool]:
    """``[B:]SIG[@SECS]`` -> (signal number, seconds before the limit, batch shell
    only); Slurm's default is 60 s."""
    from minibatch.malleable import signal_named

    value = text.strip()
    shell_only = value[:2].upper() == "B:"
    if shell_only:
        value = value[2:]
    name, at, secs = value.partition("@")
    try:
        sig = signal_named(name)
    except ValueError as exc:
        raise InvalidArgument(f"--signal {text}: {exc}") from None
    if sig is None or (at and not secs.isdigit()):
        raise InvalidArgument(f"malformed --signal {text!r} (e.g. B:USR1@60)")
    return sig.value, int(secs) if at else 60, shell_only


def apply_gres(opts: SubmitOptions, value: str) -> None:
    """``gpu[:TYPE][:N]`` items count GPUs per node; other resources are recorded."""
    for item in value.split(","):
        m = _GPU_GRES.match(item.strip())
        if m is not None:
            opts.gpus = int(m.group(2) or 1)
        else:
            opts.record("gres", item, "no effect: only GPUs are counted")


def _memory(opts: SubmitOptions, name: str, value: str) -> None:
    """``--mem``, ``--mem-per-cpu`` or ``--mem-per-gpu``: one of them per layer
    (the same one again replaces it), as sbatch says."""
    field = {"mem": "mem_per_node_kb", "mem-per-cpu": "mem_per_cpu_kb"}.get(
        name, "mem_per_gpu_kb"
    )
    if any(getattr(opts, f) is not None for f in MEMORY_FIELDS if f != field):
        raise InvalidArgument(
            "--mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive"
        )
    kb = parse_mem(value)
    if kb == 0 and name == "mem":
        opts.record("--mem", value, "no memory limit: 0 asks for the whole node")
    # 0 (no limit) stays a value: a command line's --mem=0 still replaces the
    # script's memory options.
    setattr(opts, field, kb if name == "mem" else kb or None)


def _gpu_count(value: str, option: str) -> int:
    # --gpus=[type:]N
    return positive_int(value.rsplit(":", 1)[-1], option)


def _mail_type(opts: SubmitOptions, value: str, ctx: Context) -> None:
    points = ""
    for item in value.lower().split(","):
        if item.strip() not in _MAIL_TYPES:
            raise InvalidArgument(f"unknown --mail-type {item!r}")
        points += _MAIL_TYPES[item.strip()]
    # Several --mail-type options add up, as in sbatch.
    points += opts.mail_points or ""
    opts.mail_points = "".join(c for c in "abe" if c in points)
    if opts.mail_points and not ctx.mail:
        opts.note("--mail-type", "no mail is sent: this machine has no sendmail")


def _export(opts: SubmitOptions, value: str, ctx: Context) -> None:
    items = [v for v in value.split(",") if v]
    head = items[0].upper() if items else "NONE"
    if head in ("ALL", "NONE", "NIL"):
        items = items[1:]
    # ALL: everything plus the items; NONE/NIL or a bare list: only the items
    # (and the job's own variables), as sbatch does.
    opts.export_all = head == "ALL"
    if items:
        opts.env = {**opts.env, **parse_env_list(",".join(items), ctx.environ)}


def apply(opts: SubmitOptions, name: str, value: str, ctx: Context) -> None:
    """Apply one sbatch option, by its long name."""
    try:
        _apply(opts, name, value, ctx)
    except ValueError as exc:  # int() of a number of 4,301 digits
        raise InvalidArgument(f"--{name}: {exc}") from None


def _apply(opts: SubmitOptions, name: str, value: str, ctx: Context) -> None:  # noqa: C901
    if name in _RECORDED:
        opts.record(f"--{name}", value, f"no effect: {_RECORDED[name][2]}")
    elif name == "job-name":
        opts.name = check_name(value, spaces=True)
    elif name == "output":
        opts.stdout_path = value
    elif name == "error":
        opts.stderr_path = value
    elif name == "time":
        opts.walltime = parse_time(value)
    elif name == "nodes":
        low, _, high = value.partition("-")
        if not low:  # "-1": a negative count, not a range
            raise InvalidArgument(f"--nodes must be a positive integer, got {value!r}")
        opts.nodes = positive_int(low, "--nodes")
        if high:
            opts.note(f"--nodes={value}", f"runs on {opts.nodes} (the minimum)")
    elif name in ("ntasks", "cpus-per-task", "mincpus"):
        field = {"ntasks": "ntasks", "cpus-per-task": "cpus_per_task"}.get(name)
        number = positive_int(value, f"--{name}")
        if field:
            setattr(opts, field, number)
        else:
            opts.cpus_per_task = max(opts.cpus_per_task or 1, number)
    elif name == "ntasks-per-node":
        opts.tasks_per_node = positive_int(value, "--ntasks-per-node")
    elif name in ("mem", "mem-per-cpu", "mem-per-gpu"):
        _memory(opts, name, value)
    elif name == "gres":
        apply_gres(opts, value)
    elif name == "gpus-per-node":
        opts.gpus = _gpu_count(value, f"--{name}")
    elif name == "gpus":  # for the whole job: spread over its nodes
        opts.gpus_total = _gpu_count(value, "--gpus")
    elif name == "gpus-per-task":
        opts.gpus_per_task = _gpu_count(value, "--gpus-per-task")
    elif name == "array":
        opts.array, opts.array_limit = parse_array(value)
        opts.array_option = "--array"
    elif name == "dependency":
        opts.depends = parse_depend(value)
    elif name == "partition":
        opts.queues = [check_word(q.strip(), "partition") for q in value.split(",")]
    elif name == "account":
        opts.account = check_word(value, "account")
    elif name == "qos":
        opts.qos = check_word(value, "QOS")
    elif name == "reservation":
        opts.advres = check_word(value, "reservation name")
    elif name == "malleable":
        opts.malleable = parse_malleable(value)
    elif name == "hold":
        opts.hold = True
    elif name == "chdir":
        opts.workdir = value
    elif name == "constraint":
        if any(c in value for c in "|[]*"):
            opts.record(
                "--constraint", value, "no effect: only AND (&) lists are matched"
            )
        else:
            opts.features = [
                check_word(f.strip(), "feature") for f in re.split(r"[&,]", value)
            ]
    elif name == "begin":
        opts.begin = parse_slurm_begin(value, ctx.now)
    elif name == "nice":
        if value and not value.lstrip("-").isdigit():
            raise InvalidArgument(f"--nice {value}: expected an integer")
        opts.priority = -int(value or 100)  # a nicer job ranks lower
    elif name in ("requeue", "no-requeue"):
        opts.rerunnable = name == "requeue"
    elif name == "signal":
        opts.warn = parse_signal(value)
    elif name == "mail-type":
        _mail_type(opts, value, ctx)
    elif name == "mail-user":
        opts.mail_users = [u.strip() for u in value.split(",") if u.strip()]
    elif name == "export":
        _export(opts, value, ctx)
    elif name == "open-mode":
        if value not in ("append", "truncate"):
            raise InvalidArgument(f"--open-mode {value}: expected append or truncate")
        opts.append = value == "append"
    elif name == "parsable":
        opts.parsable = True
    elif name == "quiet":
        opts.quiet = True
    elif name == "wait":
        opts.block = True
    elif name == "test-only":
        opts.test_only = True
    elif name == "wrap":
        opts.wrap = value
    elif name == "ignore-pbs":
        opts.ignore_pbs = True
    else:  # help, usage, version: sbatch answers them before applying options
        raise InvalidArgument(f"--{name} cannot be combined with a submission")
