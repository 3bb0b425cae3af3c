"""Starting a job's top process: identity, CPU mask, files and environment.

The node daemon must start hundreds of short jobs a second, so a launch is one
``subprocess.Popen`` with no ``preexec_fn`` (CPython can then use ``vfork``).
Everything that would otherwise run in the child between fork and exec is done
another way:

* **CPU affinity** is set on the daemon's own thread just before the spawn and
  restored right after; the child inherits the mask at fork, so the job never runs
  a single instruction on a CPU it was not given. A node with virtual CPUs (more
  than the machine has) binds the job to the real cores behind them, while its
  environment (``MB_CPU_LIST``, the counts) names the node's CPUs.
* **Identity**: ``user=``/``group=``/``extra_groups=`` switch to the submitting user
  (only when the daemon is root and the uid differs; a daemon that is not root runs
  jobs of its own user only).
* **Output files** are opened by the daemon and handed to the child. When switching
  user they are opened under the user's effective ids, so a job cannot make the
  daemon write where its user may not.
* **Session**: ``start_new_session`` makes the top process a session and group
  leader whose id is its pid, which is how the tracker finds the job's processes.

The script (when the job is not an ``argv``) and the PBS node file are written to
the spool directory and removed by :meth:`Launcher.cleanup` when the job ends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import resource
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec

from minibatch.core.units import format_cpu_list
from minibatch.malleable import signal_named
from minibatch.net.limits import give_back
from minibatch.node.resizer import write_cpuset
from minibatch.protocol.messages import LaunchSpec

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Inherited variables that describe *another* job (qsub from inside a job).
_FOREIGN_PREFIXES = ("MB_", "PBS_", "SLURM_")


class LaunchError(Exception):
    """The job could not be started; the message is the comment the user sees.

    ``node_trouble``: the node, not the job, is at fault (its spool is full or
    read-only): the job may run elsewhere and the node should take no more."""

    def __init__(self, message: str, node_trouble: bool = False) -> None:
        super().__init__(message)
        self.node_trouble = node_trouble


#: Errors writing the spool that say the node cannot start any job now.
_SPOOL_TROUBLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    user: str
    home: str
    shell: str
    groups: list[int]
    #: Whether the child must change uid (the daemon is root, the user is not).
    switch: bool


def resolve_identity(spec: LaunchSpec, euid: int) -> Identity:
    """Who the job runs as, or :class:`LaunchError` when the daemon cannot do it."""
    switch = spec.uid != euid
    if switch and euid != 0:
        raise LaunchError(
            f"cannot run a job of user {spec.user} (uid {spec.uid}): mb-node runs "
            f"as uid {euid} without root privileges, so it can only run its own "
            "user's jobs"
        )
    try:
        pw = pwd.getpwuid(spec.uid)
    except KeyError:
        # Not in the passwd database (a container's ad-hoc uid): run it anyway.
        groups = [spec.gid] if switch else []
        return Identity(spec.uid, spec.gid, spec.user, "/", "/bin/sh", groups, switch)
    groups = os.getgrouplist(pw.pw_name, spec.gid) if switch else []
    return Identity(
        spec.uid, spec.gid, pw.pw_name, pw.pw_dir, pw.pw_shell, groups, switch
    )


@contextlib.contextmanager
def effective_identity(ident: Identity) -> Iterator[None]:
    """Act with the user's effective ids (file access checks use them)."""
    if not ident.switch:
        yield
        return
    groups, egid = os.getgroups(), os.getegid()
    os.setgroups(ident.groups)
    os.setegid(ident.gid)
    os.seteuid(ident.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)


def describe_os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {where}" if where else exc.strerror
    return str(exc)


def describe_exec_error(
    exc: BaseException, argv: list[str], workdir: str, ident: Identity
) -> str:
    """Why ``argv`` could not start. A script whose ``#!`` names a missing
    interpreter fails with ENOENT on the script itself; say which program is
    missing, as a shell says "bad interpreter". The script is the user's: read
    as the user, only if it is a regular file, never waiting (it may have
    become a FIFO since the exec failed)."""
    if not (isinstance(exc, FileNotFoundError) and exc.filename == argv[0]):
        return describe_os_error(exc)
    line = b""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        with effective_identity(ident):
            fd = os.open(os.path.join(workdir, argv[0]), flags)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                line = os.read(fd, 256).split(b"\n", 1)[0]
        finally:
            os.close(fd)
    words = line[2:].split() if line.startswith(b"#!") else []
    program = words[0].decode(errors="replace") if words else ""
    if program and not os.path.exists(program):
        return f"{program}: bad interpreter: No such file or directory"
    return describe_os_error(exc)


def nodefile_lines(spec: LaunchSpec, node: str) -> list[str]:
    """One line per CPU per host, as PBS writes ``$PBS_NODEFILE``."""
    return [h for h in (spec.hosts or [node]) for _ in spec.cpus]


def job_environment(
    spec: LaunchSpec,
    *,
    node: str,
    home: str,
    ident: Identity,
    cpus: list[int],
    nodefile: str,
    cpuset_file: str = "",
    resize_signal: str = "USR1",
    tmpdir: str = "",
) -> dict[str, str]:
    """The job's environment: the submitter's, plus what tells it where it runs."""
    env = {k: v for k, v in spec.env.items() if not k.startswith(_FOREIGN_PREFIXES)}
    # PBS_O_* describe the submission and are set by qsub: keep them.
    env.update({k: v for k, v in spec.env.items() if k.startswith("PBS_O_")})
    env.setdefault("HOME", ident.home)
    env.setdefault("USER", ident.user)
    env.setdefault("LOGNAME", ident.user)
    env.setdefault("SHELL", ident.shell or "/bin/sh")
    env.setdefault("PATH", DEFAULT_PATH)
    hosts = spec.hosts or [node]
    ncpus = str(len(cpus))
    # The CPUs the job runs with here: its other nodes' too when they lent
    # their cores (srun starts that many tasks at most).
    slots = len(cpus) * (len(hosts) if spec.other_cores else 1)
    env.update(
        MB_JOBID=spec.display_id,
        MB_JOB_SLOTS=str(slots),
        MB_CPUS=ncpus,
        MB_CPU_LIST=",".join(map(str, cpus)),
        MB_NODE=node,
        MB_HOME=home,
        OMP_NUM_THREADS=ncpus,
        PBS_JOBID=spec.display_id,
        PBS_JOBNAME=spec.name,
        PBS_O_WORKDIR=spec.workdir,
        PBS_NODEFILE=nodefile,
        PBS_ENVIRONMENT="PBS_BATCH",
        PBS_NUM_NODES=str(len(hosts)),
        PBS_NUM_PPN=ncpus,
        PBS_NP=str(len(hosts) * len(cpus)),
        SLURM_JOB_ID=str(spec.job),
        SLURM_JOB_NAME=spec.name,
        SLURM_CPUS_ON_NODE=ncpus,
        SLURM_JOB_NUM_NODES=str(len(hosts)),
        SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_SUBMIT_DIR=spec.workdir,
    )
    if cpuset_file:
        # Where a malleable job reads its CPUs after a resize, and the signal
        # that announces one (minibatch.malleable reads both).
        env.update(MB_CPUSET_FILE=cpuset_file, MB_RESIZE_SIGNAL=resize_signal)
    env.update(pbs_extras(spec, len(cpus)))
    env.update(slurm_extras(spec, node, ident, len(hosts), len(cpus)))
    if spec.gpus:
        gpus = ",".join(map(str, spec.gpus))
        env.update(
            CUDA_VISIBLE_DEVICES=gpus, SLURM_JOB_GPUS=gpus, GPU_DEVICE_ORDINAL=gpus
        )
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


def pbs_extras(spec: LaunchSpec, ncpus: int) -> dict[str, str]:
    """What Torque and PBS Pro tell a job besides the basics: its queue, task
    and vnode numbers (one task, on the first vnode), array index, account."""
    env = {
        "PBS_QUEUE": spec.queue,
        "PBS_TASKNUM": "1",
        "PBS_VNODENUM": "0",
        "PBS_NODENUM": "0",
        "PBS_WALLTIME": str(spec.walltime),
        "PBS_MOMPORT": "0",
        "NCPUS": str(ncpus),
    }
    if spec.account:
        env["PBS_ACCOUNT"] = spec.account
    if spec.array_index is not None:
        env.update(
            PBS_ARRAYID=str(spec.array_index),
            PBS_ARRAY_INDEX=str(spec.array_index),
            PBS_ARRAY_ID=f"{spec.array_id}[]",
        )
    return env


def slurm_extras(
    spec: LaunchSpec, node: str, ident: Identity, nodes: int, ncpus: int
) -> dict[str, str]:
    """Slurm's job variables, as sbatch sets them for the batch step."""
    opts = spec.options
    per_task = opts.cpus_per_task or 1
    ntasks = opts.ntasks or max(1, nodes * ncpus // per_task)
    per_node = opts.tasks_per_node or max(1, ncpus // per_task)
    env = {
        "SLURM_JOBID": str(spec.job),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NNODES": str(nodes),
        "SLURM_NODELIST": ",".join(spec.hosts or [node]),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})" if nodes > 1 else str(per_node),
        "SLURM_JOB_CPUS_PER_NODE": f"{ncpus}(x{nodes})" if nodes > 1 else str(ncpus),
        "SLURM_JOB_PARTITION": spec.queue,
        "SLURM_JOB_USER": ident.user,
        "SLURM_JOB_UID": str(ident.uid),
        "SLURM_JOB_GID": str(ident.gid),
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": node,
        "SLURM_RESTART_COUNT": str(spec.reruns),
        "SLURM_SUBMIT_HOST": spec.env.get("PBS_O_HOST", node),
    }
    if opts.cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(opts.cpus_per_task)
    if opts.tasks_per_node:
        env["SLURM_NTASKS_PER_NODE"] = str(opts.tasks_per_node)
    if spec.mem_kb:  # what it holds on each node (mem_kb: all of its nodes here)
        nodes_here = len(spec.hosts) if spec.other_cores else 1
        env["SLURM_MEM_PER_NODE"] = str(spec.mem_kb // nodes_here // 1024)
    if spec.account:
        env["SLURM_JOB_ACCOUNT"] = spec.account
    if spec.gpus:
        env["SLURM_GPUS_ON_NODE"] = str(len(spec.gpus))
    if spec.array_index is not None:
        env.update(
            SLURM_ARRAY_TASK_ID=str(spec.array_index),
            SLURM_ARRAY_JOB_ID=str(spec.array_id),
        )
    return env


class Launcher:
    """Spawns jobs for one node.

    Args:
        node: the node's name (``MB_NODE``; also names its leftover processes).
        home: the cluster's home (``MB_HOME``), told apart from other clusters'.
        spool: where scripts and node files are written.
        cpu_map: node CPU id -> the real core that runs it, when the node's
            CPUs are virtual (several nodes sharing few cores); identity otherwise.
    """

    def __init__(
        self,
        node: str,
        home: str,
        spool: Path,
        cpu_map: Mapping[int, int] | None = None,
        resize_signal: str = "USR1",
    ) -> None:
        self.node = node
        self.home = home
        self.spool = spool
        self.cpu_map = dict(cpu_map or {})
        #: Told to a job after a resize: its name (the job's environment says
        #: it) and its number (None: no signal).
        self.resize_signal = resize_signal
        self.signal = signal_named(resize_signal)
        self._euid = os.geteuid()
        self._allowed = os.sched_getaffinity(0)
        spool.mkdir(mode=0o755, parents=True, exist_ok=True)
        # Removing a job's files waits on the file system (an rmdir on ext4
        # blocks ~1-2 ms), time the event loop would not be answering the
        # server: one thread does it after the job's end is reported.
        self._sweeper = ThreadPoolExecutor(1, thread_name_prefix="spool-sweeper")
        self._sweeps: dict[int, Future[None]] = {}

    def lent(self, spec: LaunchSpec) -> LaunchSpec:
        """``spec`` as this node runs it: with the cores (and memory) its
        other nodes lend, when this daemon may use them all; else its own
        alone (a daemon started with a narrower affinity cannot give more)."""
        if not spec.other_cores or self._allowed.issuperset(spec.other_cores):
            return spec
        nodes = max(1, len(spec.hosts))
        mem = None if spec.mem_kb is None else spec.mem_kb // nodes
        return msgspec.structs.replace(spec, other_cores=[], mem_kb=mem)

    def job_cores(self, spec: LaunchSpec) -> list[int]:
        """The real cores the job runs on: its CPUs here and on its other
        nodes (cores of this machine too; see :meth:`lent`)."""
        return sorted(set(spec.other_cores).union(self.physical_cpus(spec.cpus)))

    def physical_cpus(self, cpus: list[int]) -> list[int]:
        """The real cores behind the node CPUs ``cpus`` (fewer when some of
        them share a core)."""
        return sorted({self.cpu_map.get(c, c) for c in cpus})

    def spawn(
        self,
        spec: LaunchSpec,
        placement: contextlib.AbstractContextManager[None] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start the job's top process; raise :class:`LaunchError` if it cannot.

        ``placement`` is held around the fork (the job's cgroups, see
        :meth:`.cgroup.Cgroups.inside`)."""
        self.swept(spec.job)  # a rerun must not lose its new files to the sweep
        ident = resolve_identity(spec, self._euid)
        cpus = self.job_cores(spec)
        if not cpus:
            raise LaunchError("the job was given no CPUs")
        try:
            nodefile = self._write(
                f"{spec.job}.nodes",
                "".join(f"{h}\n" for h in nodefile_lines(spec, self.node)),
                0o644,
                ident,
            )
            argv = self._command(spec, ident)
            tmpdir = self._tmpdir(spec, ident)
            cpuset = ""
            if spec.malleable:
                # The real cores, as the job's affinity says: a program pins
                # its threads to what the file lists (minibatch.malleable).
                cpuset = str(self.cpuset_path(spec.job))
                write_cpuset(Path(cpuset), cpus)
            env = job_environment(
                spec,
                node=self.node,
                home=self.home,
                ident=ident,
                cpus=list(spec.cpus),
                nodefile=str(nodefile),
                cpuset_file=cpuset,
                resize_signal=self.resize_signal,
                tmpdir=tmpdir,
            )
            out_fd, err_fd = self._open_outputs(spec, ident)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in a path
            self.cleanup(spec.job)
            trouble = (
                isinstance(exc, OSError)
                and exc.errno in _SPOOL_TROUBLE
                and str(exc.filename or "").startswith(str(self.spool))
            )
            raise LaunchError(describe_os_error(exc), trouble) from exc
        try:
            with placement or contextlib.nullcontext():
                return self._popen(spec, ident, argv, env, cpus, out_fd, err_fd)
        except OSError as exc:  # entering or leaving the job's cgroups
            self.cleanup(spec.job)
            raise LaunchError(describe_os_error(exc)) from exc
        except LaunchError:
            self.cleanup(spec.job)
            raise
        finally:
            os.close(out_fd)
            if err_fd != out_fd:
                os.close(err_fd)

    def _popen(
        self,
        spec: LaunchSpec,
        ident: Identity,
        argv: list[str],
        env: dict[str, str],
        cpus: list[int],
        out_fd: int,
        err_fd: int,
    ) -> subprocess.Popen[bytes]:
        saved = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            raise LaunchError(
                f"cannot bind to CPUs {format_cpu_list(cpus)}: {exc.strerror}"
            ) from exc
        umask = spec.options.umask
        try:
            popen = subprocess.Popen(
                argv,
                cwd=spec.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=subprocess.STDOUT if err_fd == out_fd else err_fd,
                close_fds=True,
                start_new_session=True,
                user=spec.uid if ident.switch else None,
                group=spec.gid if ident.switch else None,
                extra_groups=ident.groups if ident.switch else None,
                umask=-1 if umask is None else umask,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            why = describe_exec_error(exc, argv, spec.workdir, ident)
            # In the job's own error file too, where its user looks first
            # (slurmstepd writes its execve error there).
            with contextlib.suppress(OSError):
                os.write(err_fd, f"minibatch: cannot start the job: {why}\n".encode())
            raise LaunchError(why) from exc
        finally:
            os.sched_setaffinity(0, saved)
        give_back(popen.pid)  # the daemon's raised open file limit is not the job's
        vmem = spec.options.vmem_kb
        if vmem:
            # The kernel's limit on each process's address space: set on the
            # top process at once, inherited by everything it starts after.
            with contextlib.suppress(OSError):
                resource.prlimit(popen.pid, resource.RLIMIT_AS, (vmem * 1024,) * 2)
        return popen

    def _command(self, spec: LaunchSpec, ident: Identity) -> list[str]:
        if spec.argv:
            return list(spec.argv)
        script = spec.script or ""
        path = self._write(f"{spec.job}.sh", script, 0o700, ident)
        args = spec.options.script_args
        if spec.options.shell:  # qsub -S: that interpreter, whatever "#!" says
            return [spec.options.shell, str(path), *args]
        # A script without "#!" is a shell script, as qsub treats it.
        if script.startswith("#!"):
            return [str(path), *args]
        return ["/bin/sh", str(path), *args]

    def _tmpdir(self, spec: LaunchSpec, ident: Identity) -> str:
        """The job's own ``$TMPDIR``, the user's alone, removed when it ends."""
        path = self.spool / f"{spec.job}.tmp"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # left by a run the daemon did not see end
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(mode=0o700)
        if ident.switch:
            os.chown(path, ident.uid, ident.gid)
        return str(path)

    def _write(self, name: str, text: str, mode: int, ident: Identity) -> Path:
        path = self.spool / name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            try:
                os.write(fd, text.encode())
            except OSError as exc:  # name the file: a full spool is the node's
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
            if ident.switch:
                os.fchown(fd, ident.uid, ident.gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return path

    def _open_outputs(self, spec: LaunchSpec, ident: Identity) -> tuple[int, int]:
        workdir = Path(spec.workdir)
        # Slurm's %N (the node's name) is the one part only the node knows.
        out_path = workdir / spec.stdout_path.replace("%N", self.node)
        err_path = workdir / spec.stderr_path.replace("%N", self.node)
        mode = os.O_APPEND if spec.options.append else os.O_TRUNC
        # Opened without waiting (a FIFO with no reader would hold the daemon
        # for ever: ENXIO instead), then made blocking again for the job.
        flags = os.O_WRONLY | os.O_CREAT | mode | os.O_CLOEXEC | os.O_NONBLOCK
        # Created under the job's umask (the submitter's), not this daemon's:
        # a user whose umask is 077 gets output no one else can read.
        daemons = os.umask(0o077)
        os.umask(daemons if spec.options.umask is None else spec.options.umask)
        try:
            with effective_identity(ident):
                if ident.switch and not os.access(workdir, os.X_OK, effective_ids=True):
                    raise PermissionError(13, "Permission denied", str(workdir))
                out_fd = os.open(out_path, flags, 0o666)
                os.set_blocking(out_fd, True)
                if spec.join or err_path == out_path:
                    return out_fd, out_fd
                try:
                    err_fd = os.open(err_path, flags, 0o666)
                    os.set_blocking(err_fd, True)
                except OSError:
                    os.close(out_fd)
                    raise
        finally:
            os.umask(daemons)
        return out_fd, err_fd

    def cpuset_path(self, job: int) -> Path:
        """``$MB_CPUSET_FILE``: the job's CPUs now, one line (see resizer)."""
        return self.spool / f"{job}.cpus"

    def cleanup(self, job: int) -> None:
        self.swept(job)
        remove_spool_files(self.spool, job)

    def cleanup_later(self, job: int, then: Callable[[], None] | None = None) -> None:
        """Remove the job's record now, and its other files (then run
        ``then``) in the background.

        The record goes at once: a daemon restarted later must not take the
        job for one that ended while no daemon ran."""
        with contextlib.suppress(OSError):
            (self.spool / f"{job}.run").unlink()
        if len(self._sweeps) > 64:
            self._sweeps = {j: f for j, f in self._sweeps.items() if not f.done()}
        self._sweeps[job] = self._sweeper.submit(self._sweep, job, then)

    def _sweep(self, job: int, then: Callable[[], None] | None) -> None:
        remove_spool_files(self.spool, job)
        if then is not None:
            then()

    def swept(self, job: int) -> None:
        """Wait until what :meth:`cleanup_later` removes of ``job`` is gone."""
        pending = self._sweeps.pop(job, None)
        if pending is not None:
            pending.result()

    def flush(self) -> None:
        """Wait for the removals under way."""
        for job in list(self._sweeps):
            self.swept(job)


def remove_spool_files(spool: Path, job: int) -> None:
    """Remove the job's spool files (best effort)."""
    for suffix in (".sh", ".nodes", ".cpus", ".run"):
        with contextlib.suppress(OSError):
            (spool / f"{job}{suffix}").unlink()
    tmp = spool / f"{job}.tmp"
    try:
        tmp.rmdir()  # most jobs leave their $TMPDIR empty: one system call
    except FileNotFoundError:
        pass
    except OSError:
        # rmtree does not follow symbolic links a job may have left in it.
        shutil.rmtree(tmp, ignore_errors=True)
