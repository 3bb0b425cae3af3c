"""From parsed options to the :class:`JobSpec` qsub and sbatch send.

Everything that can be checked on the submitting side is checked here, before
anything is sent: the working directory and the output directories exist, the
request is well formed. Paths are made absolute here, with the rules of the tool
the options came from (PBS: relative to where qsub ran; Slurm: to the job's
working directory); job-id patterns (``%j``, ``^array_index^``,
``$PBS_JOBID``) are left for the server, which knows the ids.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from minibatch.cli.directives import QUEUE, SubmitOptions
from minibatch.core.job import MAX_NAME, JobOptions, JobRequest, JobSpec
from minibatch.core.resize import check_range
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    from minibatch.protocol.submit import Submitted

#: The submitter's variables PBS passes to every job as PBS_O_<NAME>.
_ORIGIN_VARS = ("HOME", "LANG", "PATH", "MAIL", "SHELL", "TZ")
# Compiled by re's cache when first used (-o, -e): not by every qsub.
_HOST_PREFIX = r"^([A-Za-z0-9_.-]+):(?=[^:]*$)"
#: Parts of an output path the server fills in per job.
_PATTERN = r"%[0-9]*[AajJxuNnst%]|\^array_index\^|\$\{?PBS_\w+\}?"
_SENDMAIL = ("/usr/sbin/sendmail", "/usr/lib/sendmail")


def can_mail() -> bool:
    """Whether this machine has a sendmail to hand job mail to."""
    return any(os.access(p, os.X_OK) for p in _SENDMAIL)


def to_request(opts: SubmitOptions) -> JobRequest:
    """The resource request.

    Slurm tasks go onto the nodes evenly, rounded up; ``--mem`` is per node and
    ``--mem-per-cpu`` per CPU, PBS's ``mem=`` is for the whole job.
    """
    nodes = opts.nodes or 1
    per_task = opts.cpus_per_task or 1
    if opts.ppn is not None:
        ppn = opts.ppn
    elif opts.tasks_per_node is not None:
        ppn = opts.tasks_per_node * per_task
        if opts.nodes is None and opts.ntasks:
            nodes = -(-opts.ntasks // opts.tasks_per_node)
    elif opts.ntasks is not None or opts.cpus_per_task is not None:
        ppn = -(-(opts.ntasks or 1) // nodes) * per_task
    else:
        ppn = 1
    gpus = opts.gpus or 0
    if opts.gpus_per_task is not None:
        gpus = opts.gpus_per_task * max(1, ppn // per_task)
    elif opts.gpus_total is not None:
        gpus = -(-opts.gpus_total // nodes)
    mem_kb = opts.mem_kb
    if opts.mem_per_node_kb is not None:  # 0: --mem=0, no limit
        mem_kb = opts.mem_per_node_kb * nodes or None
    elif opts.mem_per_cpu_kb is not None:
        mem_kb = opts.mem_per_cpu_kb * ppn * nodes
    elif opts.mem_per_gpu_kb is not None and gpus:
        mem_kb = opts.mem_per_gpu_kb * gpus * nodes
    request = JobRequest(
        nodes=nodes, ppn=ppn, mem_kb=mem_kb, malleable=opts.malleable, gpus=gpus
    )
    check_range(request.malleable, request.ppn, request.nodes)
    if opts.walltime is not None:
        # Unset stays at JobRequest's default, which the server treats as its own.
        request = msgspec.structs.replace(request, walltime=opts.walltime)
    return request


def origin_env(
    environ: Mapping[str, str], *, workdir: str, host: str, user: str, queue: str
) -> dict[str, str]:
    """The PBS_O_* variables PBS gives every job about where it was submitted."""
    env = {f"PBS_O_{var}": environ[var] for var in _ORIGIN_VARS if var in environ}
    env.update(
        PBS_O_WORKDIR=workdir,
        PBS_O_HOST=host,
        PBS_O_LOGNAME=user,
        PBS_O_QUEUE=queue or QUEUE,
    )
    return env


def exported(environ: Mapping[str, str], opts: SubmitOptions) -> dict[str, str]:
    """The whole environment (``-V``, sbatch's default) less the variables the
    protocol cannot carry (not UTF-8), each with a note: one stray variable
    must not stop every submission."""
    env = {}
    for name, value in environ.items():
        try:
            name.encode(), value.encode()
        except UnicodeEncodeError:
            shown = name.encode(errors="backslashreplace").decode()
            opts.note(f"variable {shown}", "not exported: it is not valid UTF-8")
            continue
        env[name] = value
    return env


def output_path(
    given: str | None, base: str, host: str, opts: SubmitOptions, what: str
) -> str | None:
    """An absolute output path, or None for the default name.

    ``host:path`` is accepted (there is one host); a directory (existing, or
    written with a trailing ``/``) keeps its trailing ``/`` so that the server
    puts the default name inside it. Its directory must exist now: a job that
    could only fail at its start is refused at submission.
    """
    if not given:
        return None
    path = given
    m = re.match(_HOST_PREFIX, path)
    if m is not None and not path.startswith("/"):
        if m.group(1) not in (host, host.split(".")[0], "localhost"):
            opts.note(f"{what} {given}", f"written on this host, not on {m.group(1)}")
        path = path[m.end() :]
    if not path.startswith("$"):  # $PBS_O_WORKDIR/...: the server fills it in
        path = os.path.join(base, os.path.expanduser(path))
    if re.search(_PATTERN, os.path.dirname(path)):
        return path  # the directory depends on the job: checked when it starts
    if path.endswith("/") or os.path.isdir(path):
        if not os.path.isdir(path):
            raise InvalidArgument(f"{what} {given}: directory {path} does not exist")
        return path.rstrip("/") + "/"
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise InvalidArgument(f"{what} {given}: directory {parent} does not exist")
    return path


def job_workdir(opts: SubmitOptions, cwd: str) -> str:
    """``-d``/``-w``/``--chdir`` (relative to where qsub runs), else ``cwd``."""
    if opts.workdir is None:
        return cwd
    path = os.path.normpath(os.path.join(cwd, os.path.expanduser(opts.workdir)))
    if not os.path.isdir(path):
        raise InvalidArgument(f"working directory {opts.workdir} does not exist")
    return path


def job_options(opts: SubmitOptions) -> JobOptions:
    sig, secs, shell_only = opts.warn or (0, 0, False)
    return JobOptions(
        shell=opts.shell or "",
        script_args=opts.script_args or [],
        rerunnable=opts.rerunnable if opts.rerunnable is not None else True,
        keep=opts.keep or "",
        # As Slurm's SLURM_UMASK: the job's files are created as the
        # submitter's would be, not as the node daemon's umask says.
        umask=opts.umask if opts.umask is not None else current_umask(),
        append=bool(opts.append),
        begin=opts.begin,
        priority=opts.priority or 0,
        cput=opts.cput,
        pmem_kb=opts.pmem_kb,
        vmem_kb=opts.vmem_kb,
        warn_signal=sig,
        warn_seconds=secs,
        warn_shell_only=shell_only,
        # PBS mails an abort unless told otherwise (-m n); Slurm sends nothing.
        mail_points=opts.mail_points
        if opts.mail_points is not None
        else ("" if opts.slurm else "a"),
        mail_users=opts.mail_users or [],
        features=opts.features or [],
        ntasks=opts.ntasks or 0,
        cpus_per_task=opts.cpus_per_task or 0,
        tasks_per_node=opts.tasks_per_node or 0,
        array_limit=opts.array_limit or 0,
        mem_per_node=bool(opts.mem_per_node_kb),
        # Slurm's -n without -N (or a node count), Torque's procs=: the tasks
        # go on as many nodes as they need.
        spread=bool(opts.spread)
        or (
            opts.ntasks is not None
            and opts.nodes is None
            and opts.ppn is None
            and opts.tasks_per_node is None
        ),
        project=opts.project or "",
        recorded=dict(opts.recorded),
        group=opts.group or "",
        slurm=opts.slurm,
    )


def build_spec(
    opts: SubmitOptions,
    *,
    default_name: str,
    cwd: str,
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
        default_name: The name when no option gives one.
        cwd: Where the command runs (the job's default working directory).
        environ: The submitter's environment.
        host: The submit host, for PBS_O_HOST.
        user: The submitter's login name, for PBS_O_LOGNAME.
        script: The script's text, or None for a command job.
        argv: The command for ``qsub -- COMMAND``, or None for a script.
        submit_args: The arguments, kept for ``qstat -f``.

    Raises:
        InvalidArgument: a value the server would refuse, such as a control
            character in a name or path.
    """
    from minibatch.protocol.fields import check_spec_text, check_text

    # Before these paths reach the file system (a NUL would raise there).
    for path, what in (
        (opts.workdir, "working directory"),
        (opts.stdout_path, "output path"),
        (opts.stderr_path, "error path"),
    ):
        check_text(path or "", what)
    workdir = job_workdir(opts, cwd)
    export_all = opts.export_all
    if export_all is None:
        export_all = opts.slurm  # sbatch's default is --export=ALL
    queue = ",".join(opts.queues or [])
    env = exported(environ, opts) if export_all else {}
    first = (opts.queues or [""])[0]
    env.update(origin_env(environ, workdir=cwd, host=host, user=user, queue=first))
    env.update(opts.env)
    base = workdir if opts.slurm else cwd
    stdout = output_path(opts.stdout_path, base, host, opts, "-o")
    stderr = output_path(opts.stderr_path, base, host, opts, "-e")
    join = opts.join == "oe"
    if opts.join == "eo":
        join = True
        if stderr is not None:
            stdout = stderr
        else:
            opts.note("-j eo", "both streams go to the output file NAME.oID")
    elif opts.join is None and opts.slurm:
        join = stderr is None  # Slurm writes both streams to one file by default
    if opts.slurm and stdout is None:
        pattern = "slurm-%A_%a.out" if opts.array else "slurm-%j.out"
        stdout = os.path.join(workdir, pattern)
    if opts.slurm and stderr is None:
        stderr = stdout  # one file for both, joined or not
    spec = JobSpec(
        name=opts.name or default_name[:MAX_NAME],
        workdir=workdir,
        request=to_request(opts),
        script=script,
        argv=argv,
        env=env,
        stdout_path=stdout,
        stderr_path=stderr,
        join=join,
        depends=opts.depends or [],
        hold=bool(opts.hold),
        array=opts.array,
        submit_args=submit_args,
        account=opts.account or opts.project or "",
        qos=opts.qos or "",
        advres=opts.advres or "",
        queue=queue,
        options=job_options(opts),
        walltime_given=opts.walltime is not None,
        queue_source=opts.queue_source or "",
    )
    check_spec_text(spec)
    return spec


def current_umask() -> int:
    """This process's umask (reading it means setting it: set it back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def current_dir() -> str:
    """Where the command runs: the job's default working directory."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise InvalidArgument("the current directory no longer exists") from None


def login_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def read_script(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise InvalidArgument(f"script {path} is not a text file") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read script {path}: {exc.strerror}") from None


def submit(spec: JobSpec, opts: SubmitOptions, prog: str) -> Submitted:
    """Send the job (only check it, with ``--test-only``); the notes (ours,
    then the server's) go to stderr."""
    from minibatch.cli import common
    from minibatch.protocol.submit import Submit

    reply: Submitted = common.call(Submit(spec=spec, test_only=bool(opts.test_only)))
    for line in [*opts.notes, *reply.notes]:
        print(f"{prog}: note: {line}", file=sys.stderr)
    return reply
