"""The planning core compiled by mypyc (minibatch/native.py) plans exactly as
its Python source does, and a build that no longer matches the source is never
used.

``make test`` compiles it first (``make native``), so this process plans
compiled; a second interpreter started with ``MB_PURE_PYTHON=1`` plans the
same snapshots (pickled: the very same values and types) from the source, and
the encoded plans must be the same bytes (so an int that became a float would
show too).
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import native
from minibatch.bench.scheduler import snapshot as bench_snapshot
from minibatch.core.snapshot import ClusterSnapshot
from minibatch.policy import registry, timeline
from minibatch.sim.swf import find_trace
from tests.unit.test_policy_properties import snapshots

ROOT = Path(__file__).resolve().parents[2]
POLICIES = registry.available()

# Plans each (policy, snapshot) it reads from stdin, as plain Python.
WORKER = r"""
import pickle, struct, sys
import msgspec
from minibatch import native
from minibatch.policy import registry
assert not native.compiled(), "MB_PURE_PYTHON=1 must plan from the source"
enc = msgspec.msgpack.Encoder()
read, write = sys.stdin.buffer.read, sys.stdout.buffer
while head := read(4):
    name, snap = pickle.loads(read(struct.unpack(">I", head)[0]))
    out = enc.encode(registry.load(name).plan(snap))
    write.write(struct.pack(">I", len(out)) + out)
    write.flush()
"""


class Pure:
    """The worker interpreter that plans as plain Python."""

    def __init__(self) -> None:
        env = {**os.environ, "MB_PURE_PYTHON": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )

    def plan(self, name: str, snap: ClusterSnapshot) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps((name, snap))
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(4)
        assert head, "the pure-Python worker died"
        return self.proc.stdout.read(struct.unpack(">I", head)[0])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def pure() -> Iterator[Pure]:
    worker = Pure()
    try:
        yield worker
    finally:
        worker.close()


def same_plan(pure: Pure, name: str, snap: ClusterSnapshot) -> None:
    compiled = msgspec.msgpack.encode(registry.load(name).plan(snap))
    plain = pure.plan(name, snap)
    if compiled != plain:
        decode = msgspec.msgpack.decode
        assert decode(compiled) == decode(plain), name
        raise AssertionError(f"{name}: the same plan with other types")


def test_the_planning_core_runs_compiled() -> None:
    # make test builds it (make native): a stale or missing build would
    # leave these tests comparing Python with itself.
    assert native.fresh()
    assert native.compiled()
    assert timeline.NATIVE
    assert timeline.__file__ and timeline.__file__.endswith(".so")


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.sampled_from(POLICIES))
def test_compiled_and_python_plan_alike(pure: Pure, s, name) -> None:
    same_plan(pure, name, s)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["busy", "stuck", "malleable"])
def test_compiled_and_python_plan_alike_on_a_deep_queue(pure: Pure, mode) -> None:
    # The benchmark's cluster, smaller: hundreds of reservations per pass,
    # where the searches' caches and bounds do their work.
    snap = bench_snapshot(
        1500,
        nodes=24,
        cpus=16,
        seed=7,
        stuck=mode == "stuck",
        malleable=0.5 if mode == "malleable" else 0.0,
    )
    for name in POLICIES:
        same_plan(pure, name, snap)


def with_int_times(snap: ClusterSnapshot) -> ClusterSnapshot:
    """``snap`` with every time a whole number of type int, as a simulator
    reading a trace may build it: the compiled core turns them into floats,
    and plain Python must plan the same floats."""
    replace = msgspec.structs.replace
    running = tuple(
        replace(r, start_time=int(r.start_time), walltime=int(r.walltime))
        for r in snap.running
    )
    pending = [replace(j, submit_time=int(j.submit_time)) for j in snap.pending]
    return replace(snap, now=int(snap.now), running=running, pending=pending)


@pytest.mark.timeout(300)
def test_compiled_and_python_plan_alike_with_int_times(pure: Pure) -> None:
    snap = with_int_times(bench_snapshot(800, nodes=16, cpus=8, seed=3))
    assert type(snap.now) is int
    for name in POLICIES:
        same_plan(pure, name, snap)
    plan = registry.load("conservative").plan(snap)
    assert plan.predicted and all(type(t) is float for t in plan.predicted.values())


def run_copy(root: Path, **env: str) -> str:
    """Whether a process running the package at ``root`` plans compiled."""
    code = "from minibatch import native; print(native.compiled())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(root), **env},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.timeout(120)
def test_a_build_is_used_only_while_it_matches_the_source(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "minibatch",
        tmp_path / "minibatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    assert run_copy(tmp_path) == "True"
    assert run_copy(tmp_path, MB_PURE_PYTHON="1") == "False"
    # An edit of any compiled module (here a comment) retires the build
    # until the next make native.
    source = tmp_path / "minibatch" / "policy" / "search.py"
    source.write_text(source.read_text() + "# edited\n")
    assert run_copy(tmp_path) == "False"
    source.write_text(source.read_text().removesuffix("# edited\n"))
    assert run_copy(tmp_path) == "True"
    # So does an edit of a module whose types the build compiled against.
    types = tmp_path / "minibatch" / "core" / "job.py"
    text = types.read_text()
    types.write_text(text + "# edited\n")
    assert run_copy(tmp_path) == "False"
    types.write_text(text)
    # A build missing a library, or its stamp, is not trusted either.
    built = tmp_path / "minibatch" / "policy" / native.DIRNAME
    (next(built.glob("native__mypyc*"))).unlink()
    assert run_copy(tmp_path) == "False"
    (built / native.STAMP).unlink()
    assert run_copy(tmp_path) == "False"


@pytest.mark.timeout(300)
def test_compiled_and_python_simulate_alike(tmp_path: Path) -> None:
    trace = find_trace("SDSC-SP2-1998-4.2-cln.swf.gz")
    mb = Path(sys.executable).with_name("mb")
    for out, env in (("c", {}), ("p", {"MB_PURE_PYTHON": "1"})):
        subprocess.run(
            [str(mb), "sim", str(trace), "-o", str(tmp_path / out)]
            + ["-p", "conservative", "--limit", "3000"],
            env={**os.environ, **env},
            check=True,
            capture_output=True,
            timeout=240,
        )
    jobs = [(tmp_path / d / "jobs.csv").read_bytes() for d in "cp"]
    assert jobs[0] == jobs[1]
