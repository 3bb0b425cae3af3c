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
import shlex
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn, TextIO

from minibatch.cli import common, directives, pbsopts
from minibatch.cli.blocking import wait_for_end
from minibatch.cli.directives import Context, SubmitOptions
from minibatch.cli.submission import (
    build_spec,
    can_mail,
    current_dir,
    login_name,
    read_script,
    submit,
)
from minibatch.core.job import JobSpec
from minibatch.errors import InvalidArgument

USAGE = """\
usage: qsub [options] SCRIPT [-F "ARGS"]
       qsub [options] -- COMMAND [ARG...]
       qsub [options] < SCRIPT

Submit a batch job and print its id. Options override #PBS/#SBATCH directives.
Every Torque and PBS Pro option is accepted; those with no effect on one machine
are recorded (qstat -f shows them) with a note on stderr (docs/compatibility.md).

  -N NAME          job name (default: the script's or command's base name)
  -o PATH, -e PATH standard output / error file or directory (default: NAME.oID
                   and NAME.eID where qsub runs; ^array_index^ and $PBS_JOBID
                   are filled in)
  -j oe | eo | n   join standard error into standard output (or the reverse)
  -l LIST          resources: ncpus=N, nodes=N[:ppn=C][:gpus=G][:PROPERTY],
                   select=N:ncpus=C[:mem=S][:ngpus=G], mem=SIZE, pmem=SIZE,
                   vmem=SIZE, walltime=[[HH:]MM:]SS, cput=TIME (CPU time of the
                   whole job), gpus=G, qos=NAME, advres=NAME (run inside that
                   advance reservation), malleable=MIN-MAX (the job's CPUs may
                   change while it runs)
  -q QUEUE         queue (qstat -Q lists them)
  -A ACCOUNT       account to charge (fairshare and mb acct group by it)
  -P PROJECT       project (the account when no -A)
  -W LIST          depend=afterok:ID[:ID],afterokarray:ID[],...; umask=022;
                   block=true (wait for the job, exit with its status);
                   group_list=GROUP
  -a [[[[CC]YY]MM]DD]hhmm[.SS]   not before that time
  -p PRIORITY      -1024..1023, orders jobs within a queue
  -r y | n         the job may be rerun (qrerun, a lost node)
  -S SHELL         run the script with SHELL
  -d DIR, -w DIR   working directory (default: where qsub runs)
  -k oe            keep output in the home directory (Torque)
  -m abe, -M USERS mail on abort, begin, end to USERS (needs sendmail)
  -h               submit on user hold (release with qrls)
  -t RANGE, -J RANGE   job array: 1-10, 1,3,5-7, 0-20:2, 1-100%5 (5 at a time)
  -v LIST          variables for the job: VAR=value,VAR2 (VAR2 from here)
  -V               pass the whole current environment to the job
  -F "ARGS"        arguments for the script
  -C PREFIX        directive prefix (default #PBS, or $PBS_DPREFIX)
  -z               print nothing
  --help, --version
"""

#: Typer settings for ``mb qsub`` when registered without :func:`register`.
CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": [],
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "allow_interspersed_args": False,
}
_ARGV_KEY = "minibatch.qsub.argv"


class QsubArgs(NamedTuple):
    """The qsub command line, split into options and operands."""

    options: SubmitOptions
    operands: list[str]
    #: ``--`` was given, so the operands are a command line rather than a script.
    command: bool
    help: bool
    version: bool
    #: ``-C``: the directive prefix ("" = the default).
    prefix: str


def parse_args(argv: list[str], ctx: Context) -> QsubArgs:
    """Parse the qsub command line (everything after the program name)."""
    pairs, operands, command = pbsopts.getopt(argv)
    opts = SubmitOptions()
    prefix = ""
    for key, value in pairs:
        if key == "C":
            prefix = value.strip()
        elif not key.startswith("--"):
            pbsopts.apply(opts, key, value, ctx)
    flags = {key for key, _ in pairs}
    version = "--version" in flags or "--about" in flags
    return QsubArgs(opts, operands, command, "--help" in flags, version, prefix)


def make_spec(
    argv: list[str],
    *,
    environ: Mapping[str, str],
    workdir: str,
    stdin: TextIO | None = None,
    host: str | None = None,
    user: str | None = None,
    now: float | None = None,
    mail: bool = True,
) -> tuple[JobSpec, SubmitOptions] | None:
    """The JobSpec for a qsub command line and the options it came from (notes,
    ``-z``, ``block``), or None when it asks for ``--help``.

    Args:
        argv: The arguments after the program name.
        environ: The submitter's environment (for ``-V``, ``-v VAR`` and PBS_O_*).
        workdir: Where qsub runs: the job's working directory unless ``-d``.
        stdin: Read as the script when no script is named and it is not a terminal.
        host: The submit host for PBS_O_HOST (default: this machine's name).
        user: The submitter for PBS_O_LOGNAME (default: the login name).
        now: The time ``-a`` is read against (default: now).
        mail: Whether mail can be sent here (otherwise ``-m`` gets a note).

    Raises:
        InvalidArgument: anything wrong with the options, the directives or the
            script; nothing has been sent when it is raised.
    """
    host = host or os.uname().nodename
    user = user or login_name()
    ctx = Context(environ, time.time() if now is None else now, mail, user)
    args = parse_args(argv, ctx)
    if args.help or args.version:
        return None
    submit_args = shlex.join(argv)
    if args.command:
        if not args.operands:
            raise InvalidArgument("no command after --")
        spec = build_spec(
            args.options,
            default_name=os.path.basename(args.operands[0]) or "COMMAND",
            cwd=workdir,
            environ=environ,
            host=host,
            user=user,
            argv=list(args.operands),
            submit_args=submit_args,
        )
        return spec, args.options
    if len(args.operands) > 1:
        raise InvalidArgument(
            f"unexpected argument {args.operands[1]!r} after the script "
            "(to run a command: qsub [options] -- COMMAND ARGS; "
            'arguments for the script: -F "ARGS")'
        )
    if args.operands and args.operands[0] != "-":  # "-": the script on stdin
        source = args.operands[0]
        text = read_script(source)
        name = os.path.basename(source.rstrip("/")) or source
    elif stdin is not None and (args.operands or not stdin.isatty()):
        source = name = "STDIN"
        text = stdin.read()
    else:
        raise InvalidArgument(
            "no script given (qsub [options] SCRIPT, or qsub [options] -- COMMAND)"
        )
    if not text.strip():
        raise InvalidArgument(f"script {source} is empty")
    prefix = args.prefix or directives.directive_prefix(environ)
    script_opts = directives.parse_directives(text, source, ctx, prefix=prefix)
    opts = directives.merge(script_opts, args.options)
    if (
        opts.array_option is not None
        and "-J"
        in (
            script_opts.array_option,
            args.options.array_option,
        )
        and "-t" in (script_opts.array_option, args.options.array_option)
    ):
        raise InvalidArgument("-J and -t both give an array; use one")
    spec = build_spec(
        opts,
        default_name=name,
        cwd=workdir,
        environ=environ,
        host=host,
        user=user,
        script=text,
        submit_args=submit_args,
    )
    return spec, opts


def run(argv: list[str], prog: str = "qsub") -> None:
    """Submit per ``argv`` and print the job id; exits non-zero on any error."""
    with common.reporting(prog):
        workdir = current_dir()
        made = make_spec(
            argv, environ=os.environ, workdir=workdir, stdin=sys.stdin, mail=can_mail()
        )
        if made is None:
            if "--version" in argv or "--about" in argv:
                from minibatch import __version__

                print(f"qsub (minibatch) {__version__}")
            else:
                print(USAGE, end="")
            return
        spec, opts = made
        reply = submit(spec, opts, prog)
        if opts.test_only:  # #SBATCH --test-only: checked, nothing queued
            print(f"{prog}: --test-only: the job is valid and was not submitted")
            return
        if not opts.quiet:
            print(reply.display)
        if opts.block:
            wait_for_end(reply, prog)


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
