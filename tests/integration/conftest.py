"""A real local cluster per test (the ``cluster`` factory fixture), and a node's
tracker on its own (the ``node`` fixture).

``cluster(nodes=2, cpus_per_node=1, policy="easy", **config)`` makes a fresh
``MB_HOME``, writes its ``minibatch.toml``, starts the real daemons with
:func:`minibatch.cluster.lifecycle.up` and returns a :class:`Cluster` handle that
runs the real console scripts against it. Config overrides are passed as
``section={"key": value}`` (``node={"kill_grace": 1.0}``) and written as TOML.

Teardown stops the cluster with :func:`lifecycle.down`, then SIGKILLs whatever is
still alive that the cluster started: its daemons (by pid file and by pid seen
during the test) and every process whose environment carries this ``MB_HOME``.
No test leaves a process behind, whatever it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from minibatch.cli.render import job_record
from minibatch.cluster import lifecycle, probe, stopping
from minibatch.cluster.layout import NodeLayout, plan_nodes, usable_cpus
from minibatch.config import Config, NodeDaemonConfig, Paths, load
from minibatch.net.client import Client
from minibatch.node import cgroup
from minibatch.node.launcher import Launcher
from minibatch.node.procfs import set_child_subreaper
from minibatch.node.tracker import Report, Tracker
from minibatch.protocol.messages import (
    JobEnded,
    JobStarted,
    LaunchSpec,
    QueryJobs,
    QueryNodes,
)

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "jobs" / "examples"
#: A socket path must fit in ``sun_path`` (108 bytes with the NUL).
MAX_SOCKET_PATH = 100
#: Defaults that keep the tests fast; a test may override any of them. A node
#: daemon's first hello is refused at once (ZMQ_IMMEDIATE: not connected yet) and
#: sent again a heartbeat later, so the heartbeat is most of the time ``up``
#: waits for the nodes: 1 s by default, 0.2 s here.
DEFAULT_CONFIG: dict[str, dict[str, Any]] = {
    "node": {"kill_grace": 1.0, "heartbeat": 0.2}
}

#: The first pause of :func:`wait_for`.
FIRST_POLL = 0.01

T = TypeVar("T")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        items = ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def toml_text(policy: str, config: dict[str, Any]) -> str:
    """``minibatch.toml`` for ``policy`` and section overrides, written by hand."""
    sections: dict[str, dict[str, Any]] = {
        k: dict(v) for k, v in DEFAULT_CONFIG.items()
    }
    sections.setdefault("scheduler", {})["policy"] = policy
    top: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            sections.setdefault(key, {}).update(value)
        else:
            top[key] = value
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    The first polls come quickly (10 ms apart, then 1.5 times longer each time)
    and then every ``interval`` s: most conditions hold within moments, and a
    long wait costs no more polls than a fixed ``interval``."""
    deadline = time.monotonic() + timeout
    pause = min(interval, FIRST_POLL)
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{what} not reached within {timeout:g} s")
        time.sleep(min(pause, left))
        pause = min(interval, pause * 1.5)


def environ_of(proc: psutil.Process) -> dict[str, str] | None:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return None


def bench_leftovers(tmp: str) -> list[psutil.Process]:
    """Processes of a bench cluster whose home the bench made in ``tmp`` (its
    ``TMPDIR``): other benches may run meanwhile, in homes of their own."""
    home = os.path.join(tmp, "mb-bench-")
    return [
        p
        for p in psutil.process_iter()
        if (environ_of(p) or {}).get("MB_HOME", "").startswith(home)
    ]


def procs_with(home: Path, **match: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment has ``MB_HOME=home`` and
    every ``match`` variable (e.g. ``MB_JOBID="7"``)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        env = environ_of(proc)
        if not env or env.get("MB_HOME") != str(home):
            continue
        if all(env.get(k) == v for k, v in match.items()):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
    return found


class Cluster:
    """A running cluster in its own ``MB_HOME`` and the commands to drive it."""

    def __init__(
        self,
        home: Path,
        layout: list[NodeLayout],
        cleanup_home: bool,
    ) -> None:
        self.home = home
        self.paths = Paths(home)
        self.layout = layout
        self.cleanup_home = cleanup_home
        self.env = {**os.environ, "MB_HOME": str(home)}
        for key in list(self.env):
            # A test run from inside a job must not pass that job's identity on.
            if key.startswith(("MB_", "PBS_", "SLURM_")) and key != "MB_HOME":
                del self.env[key]
        self.work = home / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        #: Every daemon pid ever seen, killed at teardown if still alive.
        self.seen_pids: set[int] = set()
        self.report: lifecycle.UpReport | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def config(self) -> Config:
        return load(self.paths)

    def up(self, wait: float = 20.0) -> lifecycle.UpReport:
        self.report = lifecycle.up(self.paths, self.config, self.layout, wait=wait)
        self.seen_pids.update(self.report.pids.values())
        return self.report

    def down(self) -> list[str]:
        self.seen_pids.update(self.pids().values())
        return lifecycle.down(self.paths)

    def pids(self) -> dict[str, int]:
        """Running daemons by name (``server``, ``node-node0``, ...)."""
        names = ["broker", "server", "scheduler"]
        names += [f"node-{n.name}" for n in self.layout]
        out = {}
        for name in names:
            pid = probe.running_pid(self.paths, probe.Daemon(name))
            if pid is not None:
                out[name] = pid
        self.seen_pids.update(out.values())
        return out

    @property
    def endpoint(self) -> str:
        return self.config.server_endpoint(self.paths)

    # ------------------------------------------------------------ commands

    def run(
        self, *args: str, check: bool = True, timeout: float = 30.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a console script (``qsub``, ``qstat``, ``mb`` ...) in the work dir."""
        kw.setdefault("cwd", self.work)
        kw.setdefault("env", self.env)
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.run(
            [str(BIN / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def qsub(self, *args: str, **kw: Any) -> str:
        """Submit with ``qsub ARGS`` and return the printed id."""
        out = self.run("qsub", *args, **kw).stdout.strip()
        assert out and "\n" not in out, f"qsub printed {out!r}"
        return out

    def qstat_json(self, *args: str) -> list[dict[str, Any]]:
        return json.loads(self.run("qstat", "--json", *args).stdout)

    def client(self, timeout: float = 10.0) -> Client:
        return Client(self.endpoint, timeout=timeout)

    def job(self, job_id: str | int) -> dict[str, Any]:
        """The job's ``qstat --json`` record, straight from the server (fast)."""
        with self.client() as c:
            jobs = c.call(QueryJobs(selectors=[str(job_id)], finished=True)).jobs
        assert len(jobs) == 1, f"{job_id} names {len(jobs)} jobs"
        return job_record(jobs[0])

    def jobs(self, finished: bool = True) -> list[dict[str, Any]]:
        with self.client() as c:
            jobs = c.call(QueryJobs(finished=finished)).jobs
        return [job_record(j) for j in jobs]

    def nodes(self) -> dict[str, Any]:
        with self.client() as c:
            return {n.name: n for n in c.call(QueryNodes()).nodes}

    def wait_state(
        self, job_id: str | int, want: str, timeout: float = 15.0
    ) -> dict[str, Any]:
        """Wait until the job's state or result is ``want``; return its record.

        A job that finishes with another result fails at once."""
        last: dict[str, Any] = {}

        def reached() -> bool:
            last.clear()
            last.update(self.job(job_id))
            if want in (last["state"], last["result"]):
                return True
            if last["state"] == "finished":
                raise AssertionError(f"job {job_id} ended without being {want}: {last}")
            return False

        try:
            wait_for(reached, timeout, what=f"job {job_id} {want}")
        except AssertionError as exc:
            where = self.job_diagnostics(job_id)
            raise AssertionError(f"{exc}; last seen: {last}; {where}") from None
        return dict(last)

    def job_diagnostics(self, job_id: str | int) -> str:
        """What the kernel says of a job that did not get where a test
        expected: its processes' states and its memory cgroup's counters."""
        lines = []
        for proc in self.job_procs(str(job_id)):
            with contextlib.suppress(OSError, psutil.Error):
                wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
                lines.append(f"pid {proc.pid} {proc.status()} in {wchan}")
        tag = cgroup.home_tag(str(self.paths.home))
        memory = Path("/sys/fs/cgroup/memory")
        for memcg in memory.rglob(f"minibatch-*-{tag}/job_{job_id}"):
            for name in ("usage_in_bytes", "limit_in_bytes", "failcnt"):
                with contextlib.suppress(OSError):
                    value = (memcg / f"memory.{name}").read_text().strip()
                    lines.append(f"memory.{name} {value}")
            with contextlib.suppress(OSError):
                lines.append((memcg / "memory.oom_control").read_text())
                stat = (memcg / "memory.stat").read_text().splitlines()
                lines += [s for s in stat if not s.startswith("total_")]
        return "kernel: " + " | ".join(lines)

    def wait_resizes(
        self, job_id: str | int, count: int, timeout: float = 15.0
    ) -> dict[str, Any]:
        """The job's record once the node has acknowledged ``count`` resizes."""

        def done() -> dict[str, Any] | None:
            record = self.job(job_id)
            return record if len(record["resizes"]) >= count else None

        return wait_for(done, timeout, what=f"{count} resizes of job {job_id}")

    def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 10.0,
        interval: float = 0.1,
        what: str = "condition",
    ) -> T:
        return wait_for(predicate, timeout, interval, what)

    def job_procs(self, job_id: str) -> list[psutil.Process]:
        """The live processes of job ``job_id`` (by ``MB_JOBID``/``MB_HOME``)."""
        return procs_with(self.home, MB_JOBID=str(job_id))

    def launched_procs(self, job_id: str) -> list[psutil.Process]:
        """The processes of a job the server says runs, once they exist: the
        server marks a job running when it sends the launch, a moment before
        the node daemon has spawned it."""
        return self.wait_for(
            lambda: self.job_procs(job_id), what=f"job {job_id}'s processes"
        )

    def all_job_procs(self) -> list[psutil.Process]:
        return [
            p
            for p in procs_with(self.home)
            if (env := environ_of(p)) is not None and "MB_JOBID" in env
        ]

    def log(self, daemon: str) -> str:
        path = self.paths.logfile(daemon)
        return path.read_text(errors="replace") if path.exists() else ""

    # ------------------------------------------------------------ teardown

    def kill_everything(self) -> list[int]:
        """SIGKILL every process this cluster started that is still alive."""
        victims: dict[int, psutil.Process] = {}
        for pid in self.seen_pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                env = environ_of(proc)  # None for a zombie: nothing to kill
                if env is not None and env.get("MB_HOME") == str(self.home):
                    victims[pid] = proc
        for proc in procs_with(self.home):
            victims[proc.pid] = proc
        for proc in victims.values():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(list(victims.values()), timeout=5)
        return sorted(victims)

    def teardown(self) -> None:
        try:
            self.down()
        finally:
            self.kill_everything()
            # Jobs of killed node daemons, found by their cgroups; and the
            # cgroups themselves.
            stopping.sweep(self.paths)
            if self.cleanup_home:
                shutil.rmtree(self.home, ignore_errors=True)


ClusterFactory = Callable[..., Cluster]


def make_home(tmp_path: Path) -> tuple[Path, bool]:
    """A home under ``tmp_path``, or under /tmp when its socket path is too long."""
    home = tmp_path / "mbhome"
    if len(str(home / "run" / "server.sock")) < MAX_SOCKET_PATH:
        home.mkdir(parents=True)
        return home, False
    return Path(tempfile.mkdtemp(prefix="mb-", dir="/tmp")), True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterFactory]:
    made: list[Cluster] = []

    def factory(
        nodes: int = 2,
        cpus_per_node: int = 1,
        policy: str = "easy",
        start: bool = True,
        **config: Any,
    ) -> Cluster:
        home, temporary = make_home(tmp_path / f"c{len(made)}")
        c = Cluster(home, [], temporary)
        made.append(c)
        c.paths.config.write_text(toml_text(policy, config))
        cpus = usable_cpus()
        need = nodes * cpus_per_node
        c.layout = plan_nodes(
            nodes,
            cpus_per_node,
            cpus,
            oversubscribe=need > len(cpus),
            mem_total_kb=None,
        )
        if start:
            c.up()
        return c

    tmp_path.mkdir(parents=True, exist_ok=True)
    try:
        yield factory
    finally:
        for c in reversed(made):
            c.teardown()


async def wait_file(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was not written")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ----------------------------------------------- a node's tracker, no daemon

#: Kill grace of the tracker under test: short, so kill tests are quick.
GRACE = 0.5


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.name = f"tnode-{uuid.uuid4().hex[:8]}"
        self.workdir = tmp / "work"
        self.workdir.mkdir()
        self.spool = tmp / "spool"
        self.reports: list[Report] = []
        self.extra_pids: list[int] = []
        self._changed = asyncio.Event()
        self.launcher = Launcher(self.name, str(tmp), self.spool)
        self.tracker = Tracker(
            self.launcher,
            NodeDaemonConfig(kill_grace=GRACE, sample_interval=0.05),
            self._on_report,
            exclusive=False,
        )

    def _on_report(self, report: Report) -> None:
        self.reports.append(report)
        self._changed.set()

    def spec(self, job: int, script: str | None = None, **kw: object) -> LaunchSpec:
        fields: dict[str, object] = dict(
            job=job,
            display_id=str(job),
            name=f"job{job}",
            user="someone",
            uid=os.geteuid(),
            gid=os.getegid(),
            workdir=str(self.workdir),
            script=script,
            argv=None,
            env={"PATH": os.environ["PATH"]},
            stdout_path=f"job{job}.o",
            stderr_path=f"job{job}.e",
            join=False,
            cpus=sorted(os.sched_getaffinity(0))[:1],
            hosts=[self.name],
            walltime=60,
            mem_kb=None,
        )
        fields.update(kw)
        return LaunchSpec(**fields)  # type: ignore[arg-type]

    async def wait_for(self, kind: type, job: int, timeout: float = 10.0) -> Report:
        deadline = time.monotonic() + timeout
        while True:
            for r in self.reports:
                if isinstance(r, kind) and r.job == job:
                    return r
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind.__name__} for job {job}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def ended(self, job: int, timeout: float = 10.0) -> JobEnded:
        r = await self.wait_for(JobEnded, job, timeout)
        assert isinstance(r, JobEnded)
        return r

    async def started(self, job: int, timeout: float = 10.0) -> JobStarted:
        r = await self.wait_for(JobStarted, job, timeout)
        assert isinstance(r, JobStarted)
        return r


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Harness]:
    set_child_subreaper(True)
    h = Harness(tmp_path)
    h.tracker.start()
    try:
        yield h
    finally:
        await h.tracker.close()
        for pid in h.extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        set_child_subreaper(False)
