"""minibatch.malleable, the job-side API: list format, the CPU file, and Resizes
in real child processes that receive real signals and real file rewrites."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from minibatch.malleable import (
    Resizes,
    current_cpus,
    format_cpu_list,
    parse_cpu_list,
    resize_signal,
)

# ------------------------------------------------------------------ list format


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-2,5\n", [0, 1, 2, 5]),
        ("7", [7]),
        (" 3 - 4 , 1 \n", [1, 3, 4]),
        ("0-1,1-2", [0, 1, 2]),
        ("\n", []),
    ],
)
def test_parse_cpu_list(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["0-", "-1", "a", "1,,2", "3-1", "0-2\n5", "1.5"])
def test_parse_cpu_list_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_cpu_list(text)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("cpus", "text"),
    [([5, 0, 1, 2], "0-2,5"), ([0, 1], "0-1"), ([3], "3"), ([], ""), ([2, 2], "2")],
)
def test_format_cpu_list(cpus: list[int], text: str) -> None:
    assert format_cpu_list(cpus) == text
    assert parse_cpu_list(format_cpu_list(cpus)) == sorted(set(cpus))


@pytest.mark.timeout(10)
def test_format_cpu_list_refuses_negative_ids() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_cpu_list([-1, 0])


# ------------------------------------------------------------------ environment


@pytest.mark.timeout(10)
def test_current_cpus_reads_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cpuset"
    path.write_text("4-6,9\n")
    monkeypatch.setenv("MB_CPUSET_FILE", str(path))
    assert current_cpus() == [4, 5, 6, 9]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("content", [None, "garbage\n", ""])
def test_current_cpus_falls_back_to_the_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None
) -> None:
    monkeypatch.delenv("MB_CPUSET_FILE", raising=False)
    assert current_cpus() == sorted(os.sched_getaffinity(0))
    path = tmp_path / "cpuset"  # missing, unparsable, or empty
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("MB_CPUSET_FILE", str(path))
    assert current_cpus() == sorted(os.sched_getaffinity(0))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, signal.SIGUSR1),
        ("USR2", signal.SIGUSR2),
        ("sigusr2", signal.SIGUSR2),
        (str(int(signal.SIGHUP)), signal.SIGHUP),
        ("none", None),
        ("", None),
    ],
)
def test_resize_signal(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: int | None
) -> None:
    if value is None:
        monkeypatch.delenv("MB_RESIZE_SIGNAL", raising=False)
    else:
        monkeypatch.setenv("MB_RESIZE_SIGNAL", value)
    assert resize_signal() == expected


@pytest.mark.timeout(10)
def test_unknown_resize_signal_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MB_RESIZE_SIGNAL", "USR9")
    with pytest.raises(ValueError, match="MB_RESIZE_SIGNAL='USR9'"):
        resize_signal()


@pytest.mark.timeout(10)
def test_close_gives_the_signal_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MB_RESIZE_SIGNAL", "USR2")
    before = signal.getsignal(signal.SIGUSR2)
    with Resizes() as resizes:
        assert signal.getsignal(signal.SIGUSR2) not in (before, None)
        assert resizes.signum == signal.SIGUSR2
    assert signal.getsignal(signal.SIGUSR2) == before


@pytest.mark.timeout(30)
def test_importing_the_api_loads_only_the_standard_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        import minibatch.malleable
        loaded = {name.split(".")[0] for name in set(sys.modules) - before}
        print(sorted(n for n in sys.modules if n.startswith("minibatch")))
        print(sorted(loaded - set(sys.stdlib_module_names) - {"minibatch"}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['minibatch', 'minibatch.malleable']", "[]"]


# ------------------------------------------------------------------ Resizes in a child

# What the child does after "ready", by mode: wait for the signal's count, spin on
# changed() (no signal ever sent), or block in wait() (callbacks run there).
CHILD = textwrap.dedent(
    """
    import sys, time
    from minibatch.malleable import Resizes, format_cpu_list as fmt

    with Resizes() as resizes:
        resizes.on_resize(lambda cpus: print("callback", fmt(cpus), flush=True))
        print("ready", fmt(resizes.cpus()), flush=True)
        if sys.argv[1] == "count":
            while resizes.count == 0:
                time.sleep(0.01)
            print("changed", resizes.changed(), flush=True)
            cpus = resizes.cpus()
        elif sys.argv[1] == "changed":
            while not resizes.changed():
                time.sleep(0.01)
            cpus = resizes.cpus()
        else:
            cpus = resizes.wait(timeout=float(sys.argv[2]))
        print("seen", fmt(cpus) if cpus is not None else "nothing", resizes.count,
              flush=True)
    """
)


class Child:
    """A python child running CHILD; its stdout is read by a thread, so that
    waiting for a line can time out."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))

    def line(self, timeout: float = 20.0) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"child {self.proc.pid} said nothing for {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """Start Child(mode...) with $MB_CPUSET_FILE at tmp_path/cpuset ("0-3,7")."""
    started: list[Child] = []

    def start(*args: str, signal_name: str | None = None) -> Child:
        (tmp_path / "cpuset").write_text("0-3,7\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MB_")}
        env["MB_CPUSET_FILE"] = str(tmp_path / "cpuset")
        if signal_name is not None:
            env["MB_RESIZE_SIGNAL"] = signal_name
        started.append(Child(list(args), env))
        assert started[-1].line() == "ready 0-3,7"
        return started[-1]

    yield start
    for c in started:
        c.stop()


def rewrite(path: Path, text: str) -> None:
    """As the node daemon does: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def caught(pid: int) -> set[int]:
    """The signals process ``pid`` has handlers for (SigCgt)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16
    )
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


@pytest.mark.timeout(60)
def test_signal_after_the_file_reports_the_new_list(
    child: Callable[..., Child], tmp_path: Path
) -> None:
    c = child("count")
    rewrite(tmp_path / "cpuset", "2,5\n")
    os.kill(c.proc.pid, signal.SIGUSR1)
    assert c.line() == "changed True"
    assert c.line() == "seen 2,5 1"
    assert c.proc.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_a_signal_alone_counts_as_a_change(child: Callable[..., Child]) -> None:
    c = child("wait", "30")
    os.kill(c.proc.pid, signal.SIGUSR1)
    assert [c.line(), c.line()] == ["callback 0-3,7", "seen 0-3,7 1"]


@pytest.mark.timeout(60)
def test_changed_notices_a_rewritten_file_without_a_signal(
    child: Callable[..., Child], tmp_path: Path
) -> None:
    c = child("changed")
    rewrite(tmp_path / "cpuset", "1-2\n")
    assert c.line() == "seen 1-2 0"


@pytest.mark.timeout(60)
def test_no_signal_configured_polls_the_file(
    child: Callable[..., Child], tmp_path: Path
) -> None:
    c = child("wait", "30", signal_name="none")
    assert signal.SIGUSR1 not in caught(c.proc.pid)
    rewrite(tmp_path / "cpuset", "6\n")
    assert [c.line(), c.line()] == ["callback 6", "seen 6 0"]


@pytest.mark.timeout(60)
def test_wait_times_out_with_nothing(child: Callable[..., Child]) -> None:
    c = child("wait", "0.2")
    assert c.line() == "seen nothing 0"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "expected"), [(None, signal.SIGUSR1), ("USR2", signal.SIGUSR2)]
)
def test_the_process_catches_the_configured_signal(
    child: Callable[..., Child], name: str | None, expected: signal.Signals
) -> None:
    c = child("wait", "30", signal_name=name)
    others = {signal.SIGUSR1, signal.SIGUSR2} - {expected}
    assert expected in caught(c.proc.pid)
    assert not others & caught(c.proc.pid)


@pytest.mark.timeout(10)
def test_wait_returns_at_once_after_a_change_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cpuset"
    path.write_text("0\n")
    monkeypatch.setenv("MB_CPUSET_FILE", str(path))
    monkeypatch.setenv("MB_RESIZE_SIGNAL", "none")
    with Resizes() as resizes:
        assert not resizes.changed()
        rewrite(path, "0-1\n")
        assert resizes.wait(timeout=10) == [0, 1]
        assert not resizes.changed()
        assert resizes.poll() is None
