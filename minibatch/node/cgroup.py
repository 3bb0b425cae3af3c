"""Each job in cgroups of its own: limits the kernel enforces, processes findable.

A job's processes are put in a ``job_<id>`` cgroup below the node daemon's own
(``minibatch-<node>-<tag>``, the tag telling clusters on one machine apart), with

* ``cpuset``: the job's CPUs; a job cannot widen them (``taskset`` only narrows
  within the cpuset) and a resize rewrites the list for every thread at once;
* ``memory``: the job's ``mem`` as a hard limit (the kernel reclaims, then
  OOM-kills; ``/dev/shm`` and memfd pages the job writes are charged too);
* ``pids``: at most ``pids_max`` tasks, so a fork bomb stays in its box;
* CPU time (``cpuacct``) and peak memory read back when the job ends.

**Placement without preexec.** Launches use ``vfork`` and no Python in the child
(see :mod:`.launcher`), so the child cannot place itself. On cgroup v1 the
spawning *thread* moves into the job's cgroups (its tid to ``tasks``), forks (the
child starts inside) and moves back: the job runs not one instruction outside.
On v2 threads cannot be split from their process, so the daemon lives in a leaf
``daemon`` cgroup and moves its whole process in and out the same way.

Processes cannot leave a cgroup unless root moves them, so a job that calls
``setsid`` with ``env -i`` is still found, and a node daemon that restarts finds
every job of its predecessor by the cgroup paths recorded in the spool
(:mod:`.records`) without having been their parent.

Where the hierarchies are not writable (a daemon not run as root), nothing here is
used: affinity and sampling remain (:attr:`Cgroups.why_not` says why, shown by
``mb status``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from minibatch.core.units import format_cpu_list
from minibatch.node import thrash

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
#: cgroup v1 controllers used, by hierarchy directory.
_V1 = ("cpuset", "memory", "pids", "cpuacct")
_V2_NEEDED = {"cpuset", "memory", "pids"}


def _own_path(controller: str) -> str:
    """This process's cgroup in a v1 hierarchy ('' for v2), from /proc."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (controller == "" and names == ""):
            return path
    raise FileNotFoundError(f"no {controller or 'v2'} cgroup in /proc/self/cgroup")


def _write(path: str | Path, value: str) -> None:
    # One write(2) per value: the kernel parses the whole buffer at once. Paths
    # on a job's way are plain strings: pathlib's joins cost more than the
    # system calls they name (a job's launch and end touch ~20 cgroup files).
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str | Path) -> str:
    # os-level: a text file object costs more than the read it wraps, and a
    # job's end reads five of these files.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _stall_us(pressure: str) -> int | None:
    """The ``some total=`` of a PSI file, or None without one."""
    for line in pressure.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                name, _, value = field.partition("=")
                if name == "total" and value.isdigit():
                    return int(value)
    return None


def _stat_value(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class JobCgroup:
    """The cgroup directories of one job (one per v1 hierarchy, or one on v2)."""

    def __init__(self, dirs: dict[str, str], v2: bool) -> None:
        #: Controller ('' on v2) -> the job's directory in its hierarchy.
        self.dirs = dirs
        self.v2 = v2
        #: The memory limit (bytes; 0 for none): the one set here, or read at
        #: the first look for a cgroup a predecessor made.
        self._limit: int | None = None
        #: The limit to set once the spawning thread has left (bytes).
        self.pending_limit = 0
        #: Why the job could not be held to its memory limit ("" if it is):
        #: the job must end.
        self.unlimited = ""

    @classmethod
    def at(cls, dirs: dict[str, str]) -> JobCgroup | None:
        """The job cgroup recorded as ``dirs`` (by a predecessor), if it exists."""
        if not dirs or not all(os.path.isdir(p) for p in dirs.values()):
            return None
        return cls(dict(dirs), v2="" in dirs)

    def _dir(self, controller: str) -> str | None:
        return self.dirs.get("" if self.v2 else controller)

    def procs(self) -> list[int]:
        """Every process in the job's cgroup now (one hierarchy says it: the
        job's processes are forked into all of them together)."""
        d = self.dirs.get("" if self.v2 else "pids") or next(iter(self.dirs.values()))
        return [int(p) for p in _read(f"{d}/cgroup.procs").split()]

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Signal every process in the cgroup; how many there were."""
        pids = self.procs()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return len(pids)

    def set_cpus(self, cpus: list[int]) -> None:
        d = self._dir("cpuset")
        if d is not None:
            _write(f"{d}/cpuset.cpus", format_cpu_list(cpus))

    def cpu_seconds(self) -> float:
        if self.v2:
            usec = _stat_value(_read(f"{self.dirs['']}/cpu.stat"), "usage_usec")
            return usec / 1e6
        d = self.dirs.get("cpuacct")
        text = _read(f"{d}/cpuacct.usage") if d else ""
        return int(text) / 1e9 if text.strip() else 0.0

    def peak_kb(self) -> int:
        d = self._dir("memory")
        if d is None:
            return 0
        peak = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        text = _read(f"{d}/{peak}")
        return int(text) // 1024 if text.strip() else 0

    def shmem_bytes(self) -> int:
        """Shared memory (``/dev/shm``, memfd) charged to the job: its pages stay
        charged to the cgroup that wrote them after its processes are gone."""
        d = self._dir("memory")
        return _stat_value(_read(f"{d}/memory.stat"), "shmem") if d else 0

    def oom_kills(self) -> int:
        d = self._dir("memory")
        if d is None:
            return 0
        name = "memory.events" if self.v2 else "memory.oom_control"
        return _stat_value(_read(f"{d}/{name}"), "oom_kill")

    def memory_limit(self) -> int:
        """The job's memory limit (bytes; 0 for none)."""
        if self._limit is None:
            d = self._dir("memory")
            name = "memory.max" if self.v2 else "memory.limit_in_bytes"
            text = _read(f"{d}/{name}").strip() if d is not None else ""
            # v1 says "no limit" with a number near 2**63, v2 with "max".
            self._limit = int(text) if text.isdigit() and int(text) < 1 << 62 else 0
        return self._limit

    def memory_now(self) -> thrash.Sample | None:
        """What :class:`thrash.Watch <minibatch.node.thrash.Watch>` looks at."""
        d = self._dir("memory")
        if d is None:
            return None
        usage = "memory.current" if self.v2 else "memory.usage_in_bytes"
        stat = _read(f"{d}/memory.stat")
        files = _stat_value(stat, "file" if self.v2 else "cache")
        refaults = _stat_value(stat, "workingset_refault_file") or _stat_value(
            stat,
            "workingset_refault",  # its name before Linux 5.9
        )
        pressure = f"{d}/memory.pressure" if self.v2 else "/proc/pressure/memory"
        return thrash.Sample(
            used=int(_read(f"{d}/{usage}") or 0),
            limit=self.memory_limit(),
            files=files - _stat_value(stat, "shmem"),
            refaults=refaults,
            stall_us=_stall_us(_read(pressure)),
        )

    def limit_memory(self) -> None:
        """Set the job's memory limit, now that no thread of the daemon is in
        its cgroup: while one is, the kernel's OOM killer would choose among
        the cgroup's tasks the daemon's (the largest) if the job hit its
        limit, and a job with ``mem=1kb`` did as it started."""
        d = self._dir("memory")
        self._limit = self.pending_limit
        if d is None or not self.pending_limit:
            return
        limit = str(self.pending_limit)
        try:
            if self.v2:
                _write(f"{d}/memory.max", limit)
                with contextlib.suppress(OSError):
                    _write(f"{d}/memory.swap.max", "0")
                return
            _write(f"{d}/memory.limit_in_bytes", limit)
        except OSError as exc:
            kb = self.pending_limit // 1024
            if exc.errno == errno.EBUSY:
                # v1 refuses a limit below what it cannot reclaim.
                used = int(_read(f"{d}/memory.usage_in_bytes") or 0) // 1024
                self.unlimited = f"memory limit of {kb} kb is below the {used} kb "
                self.unlimited += "the job used as it started"
            else:
                self.unlimited = f"cannot set its memory limit of {kb} kb: {exc}"
            return
        # Swap would let a job past its limit; memsw must be set after memory.
        with contextlib.suppress(OSError):
            _write(f"{d}/memory.memsw.limit_in_bytes", limit)

    def remove(self) -> bool:
        """Remove the directories; False while a process is still inside."""
        gone = True
        for d in self.dirs.values():
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("cannot remove cgroup %s: %s", d, exc)
                gone = False
        return gone


def _hierarchies() -> dict[str, Path]:
    """Controller ('' on v2) -> where its hierarchy is mounted: v1's when it
    has every controller used, else the v2 one."""
    if all((ROOT / c / "tasks").exists() for c in _V1):
        return {c: ROOT / c for c in _V1}
    return {"": ROOT}


def home_tag(home: str) -> str:
    """Tells the cgroups of clusters on one machine apart."""
    return hashlib.sha1(home.encode()).hexdigest()[:8]


def remove_empty(home: str) -> None:
    """Remove the empty cgroups of every node of the cluster in ``home`` that
    sit below this process's own (daemons started by this process put them
    there); busy ones stay."""
    tag = home_tag(home)
    for c, mount in _hierarchies().items():
        try:
            own = mount / _own_path(c).lstrip("/")
        except OSError:
            continue
        for base in own.glob(f"minibatch-*-{tag}"):
            for d in (*base.glob("*/"), base):
                with contextlib.suppress(OSError):
                    d.rmdir()


class Cgroups:
    """The job cgroups of one node daemon, or the reason there are none."""

    def __init__(
        self, node: str, home: str, pids_max: int = 0, wanted: bool = True
    ) -> None:
        self.name = f"minibatch-{node}-{home_tag(home)}"
        self.pids_max = pids_max
        self.v2 = False
        #: Controller ('' on v2) -> this node's base directory; the daemon's own
        #: cgroup there, to return to after a spawn.
        self.bases: dict[str, Path] = {}
        self._home: dict[str, Path] = {}
        self._mems = ""
        self.why_not = ""
        if not wanted:
            # Nothing created: a node told not to use them leaves no trace.
            self.why_not = "turned off ([node] cgroups = false)"
            return
        try:
            self._set_up()
        except OSError as exc:
            self.bases.clear()
            self.why_not = f"cgroups not writable ({exc.strerror or exc})"
        except ValueError as exc:
            self.bases.clear()
            self.why_not = str(exc)

    @property
    def enabled(self) -> bool:
        return bool(self.bases)

    def describe(self) -> str:
        if not self.enabled:
            return f"affinity and sampling: {self.why_not}"
        return "cgroup v2" if self.v2 else "cgroup v1"

    def _set_up(self) -> None:
        mounts = _hierarchies()
        if "" not in mounts:
            for c, mount in mounts.items():
                own = mount / _own_path(c).lstrip("/")
                base = own / self.name
                base.mkdir(exist_ok=True)
                self._home[c], self.bases[c] = own, base
            # A new v1 cpuset starts empty and accepts no task until given both.
            cs = self.bases["cpuset"]
            _write(cs / "cpuset.cpus", _read(self._home["cpuset"] / "cpuset.cpus"))
            _write(cs / "cpuset.mems", _read(self._home["cpuset"] / "cpuset.mems"))
            # Each job's cpuset needs the memory nodes too: read once, not per job.
            self._mems = _read(cs / "cpuset.mems")
            return
        controllers = set(_read(ROOT / "cgroup.controllers").split())
        if not controllers >= _V2_NEEDED:
            raise ValueError(
                "no cgroup v1 hierarchies or v2 controllers for cpuset, memory and pids"
            )
        own = ROOT / _own_path("").lstrip("/")
        base = own / self.name
        base.mkdir(exist_ok=True)
        leaf = base / "daemon"
        leaf.mkdir(exist_ok=True)
        # v2 allows no process in a cgroup whose controllers its children use.
        _write(leaf / "cgroup.procs", str(os.getpid()))
        enable = " ".join(f"+{c}" for c in sorted(_V2_NEEDED))
        if own != ROOT:
            with contextlib.suppress(OSError):
                _write(own / "cgroup.subtree_control", enable)
        try:
            _write(base / "cgroup.subtree_control", enable)
        except OSError:
            # Back where it was, and nothing left behind (a daemon without
            # cgroups, or the floor bench, runs on in its own).
            with contextlib.suppress(OSError):
                _write(own / "cgroup.procs", str(os.getpid()))
                leaf.rmdir()
                base.rmdir()
            raise
        self.v2 = True
        self._home[""], self.bases[""] = leaf, base

    def create(self, job: int, cpus: list[int], mem_kb: int | None) -> JobCgroup:
        """A fresh cgroup for ``job`` (an old one of the same id is reused)."""
        dirs = {c: f"{base}/job_{job}" for c, base in self.bases.items()}
        fresh = True
        for d in dirs.values():
            try:
                os.mkdir(d)
            except FileExistsError:
                fresh = False
        cg = JobCgroup(dirs, self.v2)
        # The limit waits for the spawn (JobCgroup.limit_memory). A new memory
        # cgroup has none: writing "none" would cost two writes per job for
        # nothing (a reused one may hold an old limit).
        cg.pending_limit = (mem_kb or 0) * 1024
        if self.v2:
            d = dirs[""]
            _write(f"{d}/cpuset.cpus", format_cpu_list(cpus))
            if not fresh:
                _write(f"{d}/memory.max", "max")
            if self.pids_max:
                _write(f"{d}/pids.max", str(self.pids_max))
            return cg
        cs = dirs["cpuset"]
        _write(f"{cs}/cpuset.mems", self._mems)
        _write(f"{cs}/cpuset.cpus", format_cpu_list(cpus))
        if not fresh:
            mem = dirs["memory"]
            # memsw first: it may never be below the memory limit.
            with contextlib.suppress(OSError):
                _write(f"{mem}/memory.memsw.limit_in_bytes", "-1")
            _write(f"{mem}/memory.limit_in_bytes", "-1")
        _write(f"{dirs['pids']}/pids.max", str(self.pids_max or "max"))
        return cg

    @contextlib.contextmanager
    def inside(self, cg: JobCgroup) -> Iterator[None]:
        """Run the body (a fork) with the calling thread in ``cg``'s cgroups."""
        if self.v2:
            me, back = str(os.getpid()), "cgroup.procs"
        else:
            me, back = str(threading.get_native_id()), "tasks"
        moved: list[str] = []
        try:
            for c, d in cg.dirs.items():
                _write(f"{d}/{back}", me)
                moved.append(c)
            yield
        finally:
            for c in moved:
                try:
                    _write(f"{self._home[c]}/{back}", me)
                except OSError as exc:  # cannot happen short of a kernel refusal
                    log.error("cannot leave a job's %s cgroup: %s", c or "v2", exc)
        cg.limit_memory()

    def close(self) -> None:
        """Remove the node's base directories if no job cgroup is left in them."""
        for c, base in self.bases.items():
            with contextlib.suppress(OSError):
                if self.v2:
                    _write(
                        self._home[c].parent.parent / "cgroup.procs", str(os.getpid())
                    )
                    self._home[c].rmdir()
                base.rmdir()
