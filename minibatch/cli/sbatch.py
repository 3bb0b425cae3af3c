"""``sbatch``: submit a Slurm batch script unchanged.

The same submission path as ``qsub`` (:mod:`minibatch.cli.submission`) with
sbatch's command line, defaults and output: ``Submitted batch job N`` (just
``N`` with ``--parsable``), ``slurm-%j.out`` with both streams, the whole
environment exported. ``#PBS`` lines in the script are read too, after the
``#SBATCH`` ones, unless ``--ignore-pbs``, as sbatch does.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Mapping
from typing import NoReturn

from minibatch.cli import common, directives, slurmopts
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
usage: sbatch [options] SCRIPT [ARGS...]
       sbatch [options] --wrap="COMMAND"

Submit a Slurm batch script. Every sbatch option is accepted; those with no
effect on one machine are recorded (qstat -f shows them) with a note on stderr.
Long options may be abbreviated. Common ones:

  -J, --job-name NAME     -o, --output PATTERN    -e, --error PATTERN
  -t, --time TIME         -N, --nodes N           -n, --ntasks N
  -c, --cpus-per-task N   --ntasks-per-node N     --mem SIZE (per node)
  --mem-per-cpu SIZE      --gres gpu:N, -G/--gpus N   -C, --constraint FEATURES
  -p, --partition QUEUE   -A, --account NAME      -q, --qos NAME
  -a, --array 0-15%4      -d, --dependency afterok:ID   -H, --hold
  -D, --chdir DIR         --export ALL|NONE|VARS  --begin TIME
  --signal [B:]SIG@SECS   --requeue, --no-requeue --mail-type, --mail-user
  --nice N                --open-mode append      -W, --wait   --parsable
  --malleable MIN-MAX     --wrap COMMAND          --ignore-pbs

Output patterns: %j job id, %A array id, %a array index, %x name, %u user,
%N node, %% a percent sign.
"""


def make_spec(
    argv: list[str],
    *,
    environ: Mapping[str, str],
    workdir: str,
    host: str | None = None,
    user: str | None = None,
    now: float | None = None,
    mail: bool = True,
) -> tuple[JobSpec, SubmitOptions] | None:
    """The JobSpec for an sbatch command line, or None for ``--help``/``--version``."""
    host = host or os.uname().nodename
    user = user or login_name()
    ctx = Context(environ, time.time() if now is None else now, mail, user)
    pairs, operands = slurmopts.getopt(argv)
    if any(name in ("help", "usage", "version") for name, _ in pairs):
        return None
    cli = SubmitOptions(slurm=True)
    for name, value in pairs:
        slurmopts.apply(cli, name, value, ctx)
    if cli.wrap is not None:
        if operands:
            raise InvalidArgument(f"unexpected argument {operands[0]!r} with --wrap")
        text = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cli.wrap}\n"
        source, name = "--wrap", "wrap"
    elif operands:
        source = operands[0]
        text = read_script(source)
        name = os.path.basename(source.rstrip("/")) or source
    elif not sys.stdin.isatty():
        source, name = "STDIN", "sbatch"
        text = sys.stdin.read()
    else:
        raise InvalidArgument("no script given (sbatch [options] SCRIPT, or --wrap)")
    if not text.startswith("#!"):
        raise InvalidArgument(
            f"{source}: this does not look like a batch script: the first line "
            "must start with #! followed by the path to an interpreter"
        )
    script_opts = directives.parse_directives(
        text, source, ctx, ignore_pbs=bool(cli.ignore_pbs)
    )
    script_opts.slurm = True
    opts = directives.merge(script_opts, cli)
    if len(operands) > 1:
        opts.script_args = operands[1:]
    spec = build_spec(
        opts,
        default_name=name,
        cwd=workdir,
        environ=environ,
        host=host,
        user=user,
        script=text,
        submit_args=shlex.join(argv),
    )
    return spec, opts


def run(argv: list[str], prog: str = "sbatch") -> None:
    with common.reporting(prog):
        workdir = current_dir()
        made = make_spec(argv, environ=os.environ, workdir=workdir, mail=can_mail())
        if made is None:
            if any(a in ("-V", "--version") for a in argv):
                from minibatch import __version__

                print(f"sbatch (minibatch) {__version__}")
            else:
                print(USAGE, end="")
            return
        spec, opts = made
        reply = submit(spec, opts, prog)
        if opts.test_only:  # the server checked it and queued nothing
            print(f"{prog}: --test-only: the job is valid and was not submitted")
            return
        if opts.parsable:
            print(reply.ids[0])  # an array's id, as Slurm prints it
        elif not opts.quiet:
            print(f"Submitted batch job {reply.ids[0]}")
        if opts.block:
            wait_for_end(reply, prog)


def main() -> NoReturn:
    """The ``sbatch`` console script."""
    common.run_and_exit(lambda: run(sys.argv[1:]))
