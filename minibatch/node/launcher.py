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
import resource
import shutil
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import msgspec

from minibatch.core.units import format_cpu_list
from minibatch.malleable import signal_named
from minibatch.net.limits import give_back
from minibatch.node.identity import (
    Identity,
    LaunchError,
    describe_exec_error,
    describe_os_error,
    effective_identity,
    resolve_identity,
)
from minibatch.node.jobenv import job_environment, nodefile_lines
from minibatch.node.resizer import write_cpuset
from minibatch.protocol.messages import LaunchSpec

#: Errors writing the spool that say the node cannot start any job now.
_SPOOL_TROUBLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


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
    for suffix in (".sh", ".nodes", ".cpus", ".run", ".exit", ".exit-new"):
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
