"""``qsub``: submit a batch job and print its id.

Start-up time matters (scripts submit jobs in loops), so this module imports neither
typer nor rich: ``qsub`` parses its own PBS-style options with
:mod:`minibatch.cli.directives`, the same parser that reads ``#PBS`` lines. The typer
objects ``mb qsub`` needs are built on first access (PEP 562 ``__getattr__``), so
plain ``qsub`` never pays the ~35 ms typer import.

This module deliberately has no ``from __future__ import annotations``: the lazily
built typer command's ``ctx: typer.Context`` annotation must be a real class, since
typer resolves string annotations in module globals, where typer is absent.
"""

import os
import pwd
import shlex
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn, TextIO

import msgspec

from minibatch.cli import common, directives
from minibatch.cli.directives import SubmitOptions
from minibatch.core.job import JobRequest, JobSpec
from minibatch.core.resize import check_range
from minibatch.errors import InvalidArgument

USAGE = """\
usage: qsub [options] SCRIPT
       qsub [options] -- COMMAND [ARG...]
       qsub [options] < SCRIPT

Submit a batch job and print its id. Options override #PBS/#SBATCH directives.

  -N NAME          job name (default: the script's or command's base name)
  -o PATH          standard output file (default: NAME.oID in the current dir)
  -e PATH          standard error file (default: NAME.eID)
  -j oe | n        join standard error into standard output
  -l LIST          resources: ncpus=N, nodes=N[:ppn=C], select=N:ncpus=C[:mem=S],
                   mem=SIZE, walltime=[[HH:]MM:]SS (repeatable, comma lists);
                   qos=NAME (quality of service), advres=NAME (run inside the
                   advance reservation NAME, see setres), malleable=MIN-MAX
                   (the job's CPUs may change while it runs, within MIN-MAX)
  -A ACCOUNT       account to charge (fairshare by account)
  -W depend=LIST   afterok:ID[:ID...],afternotok:...,afterany:...
  -h               submit on user hold (release with qrls)
  -t RANGE         job array indices: 1-10, 1,3,5-7, 0-20:2
  -v LIST          variables for the job: VAR=value,VAR2 (VAR2 from here)
  -V               pass the whole current environment to the job
  -q QUEUE         queue (only "batch")
  --help           show this help
"""

#: Typer settings for ``mb qsub`` when registered without :func:`register`.
CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": [],
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "allow_interspersed_args": False,
}
_ARGV_KEY = "minibatch.qsub.argv"
#: The submitter's variables PBS passes to every job as PBS_O_<NAME>.
_ORIGIN_VARS = ("HOME", "LANG", "PATH", "MAIL", "SHELL", "TZ")


class QsubArgs(NamedTuple):
    """The qsub command line, split into options and operands."""

    options: SubmitOptions
    operands: list[str]
    #: ``--`` was given, so the operands are a command line rather than a script.
    command: bool
    help: bool


def parse_args(argv: list[str], environ: Mapping[str, str]) -> QsubArgs:
    """Parse the qsub command line (everything after the program name)."""
    pairs, operands, command = directives.pbs_getopt(argv)
    opts = SubmitOptions()
    for key, value in pairs:
        if key != "help":
            directives.apply_option(opts, key, value, environ)
    return QsubArgs(opts, operands, command, ("help", "") in pairs)


def merge(lower: SubmitOptions, higher: SubmitOptions) -> SubmitOptions:
    """``higher`` over ``lower``, field by field; ``-v`` variables merge by name.

    A ``nodes=`` or ``ncpus=`` request sets both the node count and the CPUs per
    node, so a higher layer's replaces a lower one's CPU request whole, as PBS
    replaces a resource value.
    """
    out = SubmitOptions()
    for name in SubmitOptions.__struct_fields__:
        low, high = getattr(lower, name), getattr(higher, name)
        if name == "env":
            value = {**low, **high}
        elif name == "slurm":
            value = low or high
        else:
            value = low if high is None else high
        setattr(out, name, value)
    return out


def to_request(opts: SubmitOptions) -> JobRequest:
    """The resource request; Slurm tasks go onto the nodes evenly, rounded up."""
    nodes = opts.nodes or 1
    if opts.ppn is not None:
        ppn = opts.ppn
    elif opts.ntasks is not None or opts.cpus_per_task is not None:
        ppn = -(-(opts.ntasks or 1) // nodes) * (opts.cpus_per_task or 1)
    else:
        ppn = 1
    request = JobRequest(
        nodes=nodes, ppn=ppn, mem_kb=opts.mem_kb, malleable=opts.malleable
    )
    check_range(request.malleable, request.ppn, request.nodes)
    if opts.walltime is not None:
        # Unset stays at JobRequest's default, which the server treats as its own.
        request = msgspec.structs.replace(request, walltime=opts.walltime)
    return request


def origin_env(
    environ: Mapping[str, str], *, workdir: str, host: str, user: str
) -> dict[str, str]:
    """The PBS_O_* variables PBS gives every job about where it was submitted."""
    env = {f"PBS_O_{var}": environ[var] for var in _ORIGIN_VARS if var in environ}
    env.update(
        PBS_O_WORKDIR=workdir,
        PBS_O_HOST=host,
        PBS_O_LOGNAME=user,
        PBS_O_QUEUE=directives.QUEUE,
    )
    return env


def _absolute(path: str | None, workdir: str) -> str | None:
    return None if path is None else os.path.join(workdir, os.path.expanduser(path))


def build_spec(
    opts: SubmitOptions,
    *,
    default_name: str,
    workdir: str,
    environ: Mapping[str, str],
    host: str,
    user: str,
    script: str | None = None,
    argv: list[str] | None = None,
    submit_args: str = "",
) -> JobSpec:
    """The JobSpec for the merged options ``opts``.

    Args:
        opts: Directives and command-line options, already merged.
        default_name: The name when neither ``-N`` nor a directive gives one.
        workdir: The job's working directory; relative -o/-e paths start there.
        environ: The submitter's environment.
        host: The submit host, for PBS_O_HOST.
        user: The submitter's login name, for PBS_O_LOGNAME.
        script: The script's text, or None for a command job.
        argv: The command for ``qsub -- COMMAND``, or None for a script.
        submit_args: The qsub arguments, kept for ``qstat -f``.
    """
    env = dict(environ) if opts.export_all else {}
    env.update(origin_env(environ, workdir=workdir, host=host, user=user))
    env.update(opts.env)
    join = opts.join
    if join is None:
        join = opts.slurm and opts.stderr_path is None
    return JobSpec(
        name=opts.name or default_name,
        workdir=workdir,
        request=to_request(opts),
        script=script,
        argv=argv,
        env=env,
        stdout_path=_absolute(opts.stdout_path, workdir),
        stderr_path=_absolute(opts.stderr_path, workdir),
        join=join,
        depends=opts.depends or [],
        hold=bool(opts.hold),
        array=opts.array,
        submit_args=submit_args,
        account=opts.account or "",
        qos=opts.qos or "",
        advres=opts.advres or "",
    )


def _login_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _read_script(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise InvalidArgument(f"script {path} is not a text file") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read script {path}: {exc.strerror}") from None


def make_spec(
    argv: list[str],
    *,
    environ: Mapping[str, str],
    workdir: str,
    stdin: TextIO | None = None,
    host: str | None = None,
    user: str | None = None,
) -> JobSpec | None:
    """The JobSpec for a qsub command line, or None when it asks for ``--help``.

    Args:
        argv: The arguments after the program name.
        environ: The submitter's environment (for ``-V``, ``-v VAR`` and PBS_O_*).
        workdir: The job's working directory, the submitter's current one.
        stdin: Read as the script when no script is named and it is not a terminal.
        host: The submit host for PBS_O_HOST (default: this machine's name).
        user: The submitter for PBS_O_LOGNAME (default: the login name).

    Raises:
        InvalidArgument: anything wrong with the options, the directives or the
            script; nothing has been sent when it is raised.
    """
    args = parse_args(argv, environ)
    if args.help:
        return None
    host = host or os.uname().nodename
    user = user or _login_name()
    submit_args = shlex.join(argv)
    if args.command:
        if not args.operands:
            raise InvalidArgument("no command after --")
        return build_spec(
            args.options,
            default_name=os.path.basename(args.operands[0]) or "COMMAND",
            workdir=workdir,
            environ=environ,
            host=host,
            user=user,
            argv=list(args.operands),
            submit_args=submit_args,
        )
    if len(args.operands) > 1:
        raise InvalidArgument(
            f"unexpected argument {args.operands[1]!r} after the script "
            "(to run a command: qsub [options] -- COMMAND ARGS)"
        )
    if args.operands:
        source = args.operands[0]
        text = _read_script(source)
        name = os.path.basename(source.rstrip("/")) or source
    elif stdin is not None and not stdin.isatty():
        source = name = "STDIN"
        text = stdin.read()
    else:
        raise InvalidArgument(
            "no script given (qsub [options] SCRIPT, or qsub [options] -- COMMAND)"
        )
    if not text.strip():
        raise InvalidArgument(f"script {source} is empty")
    script_opts = directives.parse_directives(text, source, environ)
    return build_spec(
        merge(script_opts, args.options),
        default_name=name,
        workdir=workdir,
        environ=environ,
        host=host,
        user=user,
        script=text,
        submit_args=submit_args,
    )


def run(argv: list[str], prog: str = "qsub") -> None:
    """Submit per ``argv`` and print the job id; exits non-zero on any error."""
    with common.reporting(prog):
        try:
            workdir = os.getcwd()
        except FileNotFoundError:
            raise InvalidArgument("the current directory no longer exists") from None
        spec = make_spec(argv, environ=os.environ, workdir=workdir, stdin=sys.stdin)
        if spec is None:
            print(USAGE, end="")
            return
        from minibatch.protocol.messages import Submit

        reply = common.call(Submit(spec=spec))
    print(reply.display)


def main() -> NoReturn:
    """The ``qsub`` console script."""
    common.run_and_exit(lambda: run(sys.argv[1:]))


def _build_typer_objects() -> dict[str, Any]:
    import typer
    from typer.core import TyperCommand

    class QsubCommand(TyperCommand):
        """Hands qsub its raw arguments, ``--`` included (click's parser drops it)."""

        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            ctx.meta[_ARGV_KEY] = list(args)
            return super().parse_args(ctx, [])

    def qsub_command(ctx: typer.Context) -> None:
        """Submit a batch job: qsub [options] SCRIPT | -- COMMAND (see --help)."""
        argv = ctx.meta.get(_ARGV_KEY)
        if argv is None:
            # Registered without QsubCommand: click has already eaten a "--" that
            # came before the first operand.
            argv = list(ctx.args)
        run(argv)

    return {"QsubCommand": QsubCommand, "qsub_command": qsub_command}


def __getattr__(name: str) -> Any:
    # PEP 562: the typer objects are built only when `mb` asks for them.
    if name in ("QsubCommand", "qsub_command"):
        globals().update(_build_typer_objects())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(app: Any, name: str = "qsub") -> None:
    """Add ``qsub`` to a typer app: raw PBS options, ``-h`` is hold, ``--`` kept."""
    app.command(
        name,
        cls=__getattr__("QsubCommand"),
        context_settings=CONTEXT_SETTINGS,
        add_help_option=False,
    )(__getattr__("qsub_command"))
