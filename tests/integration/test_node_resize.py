"""Resizing a running job on the node: masks of every thread, the file, the signal.

Real processes, no server: the tracker is driven directly (see test_node_tracker)
and every assertion is what the kernel says about the job's threads.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import psutil
import pytest

from minibatch.core.job import JobResult
from minibatch.malleable import signal_named
from minibatch.node import resizer
from minibatch.protocol.messages import JobResized
from tests.integration.conftest import Harness, wait_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

CPUS = sorted(os.sched_getaffinity(0))

#: A job with threads, a child that leaves SIGUSR1 alone, and a handler that
#: reports what it sees and starts a new thread and a new process after a resize.
JOB = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    def spin():
        while True:
            time.sleep(0.01)
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        time.sleep(60)
        os._exit(0)
    def on_resize(sig, frame):
        cpus = open(os.environ["MB_CPUSET_FILE"]).read()
        t = threading.Thread(target=spin, daemon=True)
        t.start()
        late = os.fork()
        if late == 0:
            time.sleep(60)
            os._exit(0)
        with open("seen", "w") as f:
            f.write(f"{cpus.strip()} {t.native_id} {late} {child}\\n")
    signal.signal(signal.SIGUSR1, on_resize)
    with open("ready", "w") as f:
        f.write(open(os.environ["MB_CPUSET_FILE"]).read())
    while True:
        time.sleep(0.05)
    """
)


def masks(pid: int) -> dict[int, set[int]]:
    """tid -> affinity, for every thread of every live process of ``pid``'s tree."""
    out = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        for thread in proc.threads():
            try:
                out[thread.id] = os.sched_getaffinity(thread.id)
            except ProcessLookupError:
                continue
    return out


async def test_resize_moves_every_thread_writes_the_file_and_signals(node: Harness):
    assert len(CPUS) >= 2, "the resize tests need two CPUs"
    spec = node.spec(1, argv=[sys.executable, "-c", JOB], cpus=CPUS[:2], malleable=True)
    node.tracker.launch(spec)
    started = await node.started(1)
    ready = await wait_file(node.workdir / "ready")
    assert ready == resizer.format_cpu_list(CPUS[:2]) + "\n"
    assert set().union(*masks(started.pid).values()) == set(CPUS[:2])

    node.tracker.resize(1, [CPUS[0]], 120.0)
    report = await node.wait_for(JobResized, 1)
    assert isinstance(report, JobResized) and not report.error
    assert report.cpus == [CPUS[0]]
    seen = (await wait_file(node.workdir / "seen")).split()
    assert seen[0] == str(CPUS[0])  # the file held the new list when told
    tree = masks(started.pid)
    assert len(tree) >= 4  # main thread, two spinners, the handler's thread, ...
    assert all(m == {CPUS[0]} for m in tree.values()), tree
    # What it started after the resize inherited the new mask; the child that
    # does not catch SIGUSR1 was not signalled (it would have died).
    assert os.sched_getaffinity(int(seen[1])) == {CPUS[0]}
    assert os.sched_getaffinity(int(seen[2])) == {CPUS[0]}
    assert psutil.Process(int(seen[3])).status() != psutil.STATUS_ZOMBIE
    assert (node.spool / "1.cpus").read_text() == f"{CPUS[0]}\n"

    # A stretched limit re-arms the walltime: one second from the start.
    node.tracker.resize(1, CPUS[:2], 1.0)
    end = await node.ended(1)
    assert end.result is JobResult.TIMEOUT and "walltime of 1 s" in end.comment


async def test_resize_of_a_job_not_here_is_answered_with_an_error(node: Harness):
    node.tracker.resize(42, [CPUS[0]], 10.0)
    report = await node.wait_for(JobResized, 42)
    assert isinstance(report, JobResized) and "not running" in report.error


def test_a_mask_the_kernel_refuses_changes_nothing():
    proc = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        before = os.sched_getaffinity(proc.pid)
        with pytest.raises(resizer.ResizeRefused, match="refused CPUs 4095"):
            resizer.set_mask(lambda: [proc.pid], [4095])
        assert os.sched_getaffinity(proc.pid) == before
    finally:
        proc.kill()
        proc.wait()


def test_only_processes_that_catch_the_signal_get_it():
    catcher = psutil.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: print('got', flush=True))\n"
            "print('ready', flush=True)\ntime.sleep(30)\n",
        ],
        stdout=-1,
        text=True,
    )
    plain = psutil.Popen(["sleep", "30"])
    try:
        assert catcher.stdout.readline() == "ready\n"
        assert resizer.catches(catcher.pid, signal.SIGUSR1)
        assert not resizer.catches(plain.pid, signal.SIGUSR1)
        assert resizer.notify([catcher.pid, plain.pid], signal.SIGUSR1) == [catcher.pid]
        assert catcher.stdout.readline() == "got\n"
        assert plain.status() != psutil.STATUS_ZOMBIE and plain.is_running()
        assert resizer.notify([catcher.pid], None) == []
    finally:
        for p in (catcher, plain):
            p.kill()
            p.wait()
        catcher.stdout.close()


def test_cpuset_file_and_signal_names(tmp_path):
    path = tmp_path / "7.cpus"
    resizer.write_cpuset(path, [0, 1, 2, 5])
    assert path.read_text() == "0-2,5\n"
    resizer.write_cpuset(path, [3])
    assert path.read_text() == "3\n" and os.listdir(tmp_path) == ["7.cpus"]
    assert signal_named("USR1") == signal.SIGUSR1
    assert signal_named("sigusr2") == signal.SIGUSR2
    assert signal_named("none") is None
    with pytest.raises(ValueError, match="unknown signal"):
        signal_named("USR9")


async def test_a_repeated_resize_is_answered_again_and_an_ending_job_refuses(
    node: Harness,
):
    assert len(CPUS) >= 2, "the resize tests need two CPUs"
    spec = node.spec(1, argv=["sleep", "30"], cpus=CPUS[:2], malleable=True)
    node.tracker.launch(spec)
    started = await node.started(1)
    node.tracker.resize(1, [CPUS[0]], 60.0, seq=1)
    # The same number again (a server that restarted): answered, not redone,
    # even if it names other CPUs.
    node.tracker.resize(1, CPUS[:2], 60.0, seq=1)
    answers = [r for r in node.reports if isinstance(r, JobResized)]
    assert [(r.seq, r.cpus, r.error) for r in answers] == [
        (1, [CPUS[0]], ""),
        (1, [CPUS[0]], ""),
    ]
    assert os.sched_getaffinity(started.pid) == {CPUS[0]}
    node.tracker.kill(1, JobResult.CANCELLED)
    node.tracker.resize(1, CPUS[:2], 60.0, seq=2)
    last = [r for r in node.reports if isinstance(r, JobResized)][-1]
    assert (last.seq, last.cpus) == (2, [CPUS[0]]) and "ending" in last.error
    await node.ended(1)
