"""The job programs in jobs/, run for real outside any batch system: the malleable
kernel follows a resize done as the node daemon does it, and ends cleanly."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from minibatch.malleable import format_cpu_list

JOBS = Path(__file__).resolve().parents[2] / "jobs"
KERNEL = JOBS / "malleable" / "kernel.py"
STREAM = JOBS / "malleable" / "stream.py"
CPUS = sorted(os.sched_getaffinity(0))
TAG_VAR = "JOBS_TEST_TAG"


class Program:
    """A job program with its stdout read by a thread, so that waiting for a
    line can time out; every line seen is kept in ``lines``."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args], env=env, stdout=subprocess.PIPE, text=True
        )
        self.ps = psutil.Process(self.proc.pid)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, prefix: str, timeout: float = 40.0) -> str:
        """The next line that starts with ``prefix``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {prefix!r} line within {timeout} s: {self.lines}")
            if line is None:
                pytest.fail(f"output ended before a {prefix!r} line: {self.lines}")
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def close(self) -> None:
        """Reap it and its output; its processes must have been killed."""
        self.proc.wait()
        self._reader.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def kill_tagged(tag: str) -> None:
    """Kill, by pid, every process whose environment carries ``tag``: all that
    the test started, even those that left the tree (escape.py's)."""
    while tagged := [p for p in psutil.process_iter() if _has_tag(p, tag)]:
        for p in tagged:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def _has_tag(p: psutil.Process, tag: str) -> bool:
    try:
        return p.environ().get(TAG_VAR) == tag and not gone(p)
    except psutil.Error:  # gone, or not ours
        return False


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Program]]:
    """Start a program; $MB_CPUSET_FILE names tmp_path/cpuset if ``cpuset``."""
    started: list[Program] = []
    tag = uuid.uuid4().hex

    def start(*args: str | Path, cpuset: bool = True, **env: str) -> Program:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MB_")}
        environ[TAG_VAR] = tag
        if cpuset:
            (tmp_path / "cpuset").write_text(format_cpu_list(CPUS) + "\n")
            environ["MB_CPUSET_FILE"] = str(tmp_path / "cpuset")
        started.append(Program([str(a) for a in args], environ | env))
        return started[-1]

    yield start
    kill_tagged(tag)
    for program in started:
        program.close()


def fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def gone(p: psutil.Process) -> bool:
    """Dead: no such process, or a zombie nobody reaps (a container's init)."""
    try:
        return bool(p.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def signal_mask(pid: int, field: str) -> int:
    """A mask of /proc/PID/status (``SigCgt``: caught, ``SigIgn``: ignored)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value, 16)
    raise AssertionError(f"no {field} for {pid}")


def has(mask: int, sig: int) -> bool:
    return bool(mask >> (sig - 1) & 1)


def wait_gone(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(gone(p) for p in procs):
        assert time.monotonic() < deadline, f"still alive: {procs}"
        time.sleep(0.05)


def resize_like_the_daemon(program: Program, cpus: list[int], cpuset: Path) -> None:
    """Every thread of every process of the tree, then the file, then the signal."""
    for p in [program.ps, *program.ps.children(recursive=True)]:
        try:
            tids = [t.id for t in p.threads()]
        except psutil.NoSuchProcess:
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
    tmp = cpuset.with_name("cpuset.new")
    tmp.write_text(format_cpu_list(cpus) + "\n")
    os.replace(tmp, cpuset)
    os.kill(program.proc.pid, signal.SIGUSR1)  # the master only catches it


@pytest.mark.timeout(60)
def test_kernel_follows_resizes_and_finishes_the_work(
    run: Callable[..., Program], tmp_path: Path
) -> None:
    assert len(CPUS) >= 2, "shrinking needs two CPUs"
    kernel = run(KERNEL, "--work", "400", "--chunk-ms", "10", "--interval", "0.2")
    start = fields(kernel.until("start"))
    assert (start["cpus"], start["work"]) == (format_cpu_list(CPUS), "400")
    assert fields(kernel.until("t="))["workers"] == str(len(CPUS))
    resize_like_the_daemon(kernel, CPUS[:1], tmp_path / "cpuset")
    shrunk = fields(kernel.until("resize"))
    assert (shrunk["cpus"], shrunk["workers"]) == (str(CPUS[0]), "1")
    assert fields(kernel.until("t="))["workers"] == "1"
    resize_like_the_daemon(kernel, CPUS, tmp_path / "cpuset")
    grown = fields(kernel.until("resize"))
    assert (grown["cpus"], grown["workers"]) == (format_cpu_list(CPUS), str(len(CPUS)))
    assert fields(kernel.until("done"))["chunks"] == "400"
    assert kernel.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_kernel_reports_no_resize_that_changes_nothing(
    run: Callable[..., Program], tmp_path: Path
) -> None:
    kernel = run(KERNEL, "--work", "300", "--chunk-ms", "10", "--interval", "0.2")
    kernel.until("t=")
    resize_like_the_daemon(kernel, CPUS, tmp_path / "cpuset")
    assert fields(kernel.until("done"))["chunks"] == "300"
    assert not [x for x in kernel.lines if x.startswith("resize")]
    assert kernel.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_kernel_workers_leave_the_resize_signal_alone(
    run: Callable[..., Program],
) -> None:
    kernel = run(KERNEL, "--work", "100000", "--interval", "0.2")
    kernel.until("t=")
    workers = kernel.ps.children()
    assert sorted(w.cpu_affinity() for w in workers) == [[c] for c in CPUS]
    assert has(signal_mask(kernel.proc.pid, "SigCgt"), signal.SIGUSR1)
    for w in workers:
        assert not has(signal_mask(w.pid, "SigCgt"), signal.SIGUSR1)


@pytest.mark.timeout(60)
def test_kernel_workers_die_with_a_killed_master(run: Callable[..., Program]) -> None:
    kernel = run(KERNEL, "--work", "100000", "--interval", "0.2")
    kernel.until("t=")
    workers = kernel.ps.children()
    assert len(workers) == len(CPUS)
    os.kill(kernel.proc.pid, signal.SIGKILL)
    kernel.proc.wait(timeout=20)
    wait_gone(workers)


@pytest.mark.timeout(60)
def test_kernel_ends_its_workers_and_fails_on_sigterm(
    run: Callable[..., Program],
) -> None:
    kernel = run(KERNEL, "--work", "100000", "--interval", "0.2")
    kernel.until("t=")
    workers = kernel.ps.children()
    os.kill(kernel.proc.pid, signal.SIGTERM)
    assert kernel.proc.wait(timeout=20) == 128 + signal.SIGTERM
    wait_gone(workers)


@pytest.mark.timeout(60)
def test_kernel_runs_outside_a_batch_system(run: Callable[..., Program]) -> None:
    kernel = run(KERNEL, "--work", "20", "--chunk-ms", "2", cpuset=False)
    assert fields(kernel.until("start"))["cpus"] == format_cpu_list(CPUS)
    done = fields(kernel.until("done"))
    assert done["chunks"] == "20"
    assert 3.0 < float(done["pi"]) < 3.3
    assert kernel.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_stream_reports_bandwidth(run: Callable[..., Program]) -> None:
    stream = run(STREAM, "--mib", "4", "--reps", "8", "--interval", "0.1")
    assert fields(stream.until("start"))["cpus"] == format_cpu_list(CPUS)
    done = fields(stream.until("done"))
    assert done["reps"] == "8"
    assert float(done["bandwidth"].removesuffix("GB/s")) > 0
    assert stream.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_rigid_burn_runs_one_process_per_cpu(run: Callable[..., Program]) -> None:
    burn = run(JOBS / "examples" / "rigid_burn.py", "--seconds", "0.2", MB_CPUS="2")
    assert fields(burn.until("done"))["workers"] == "2"
    assert burn.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_escape_leaves_processes_that_outlive_it(run: Callable[..., Program]) -> None:
    escape = run(JOBS / "examples" / "escape.py", ESCAPE_SECONDS="50")
    escapees: dict[str, psutil.Process] = {}
    for _ in range(3):
        line = fields(escape.until("escapee"))
        escapees[line["kind"]] = psutil.Process(int(line["pid"]))
    assert fields(escape.until("exit")) == {"escapees": "3"}
    assert escape.proc.wait(timeout=20) == 0
    assert not any(gone(p) for p in escapees.values())
    assert os.getsid(escapees["setsid"].pid) != os.getsid(0)
    assert escapees["setsid"].ppid() != escape.proc.pid
    assert has(signal_mask(escapees["ignore-term"].pid, "SigIgn"), signal.SIGTERM)
    assert escapees["nohup"].name() == "sleep"
