"""The node's side of qsig, qrerun and live usage: the tracker driven directly,
with real processes and no server."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from minibatch.core.job import JobResult
from minibatch.protocol.messages import JobEnded
from tests.integration.conftest import GRACE, Harness, wait_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_signal_reaches_every_process_and_is_not_a_kill(node: Harness) -> None:
    script = (
        "trap 'echo top >> got' USR1\n"
        "sh -c \"trap 'echo child >> got' USR1; echo > ready; "
        'while :; do sleep 0.05; done" &\n'
        "while :; do sleep 0.05; done\n"
    )
    node.tracker.launch(node.spec(1, script))
    await node.started(1)
    await wait_file(node.workdir / "ready")
    node.tracker.signal(1, signal.SIGUSR1)
    got = node.workdir / "got"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if got.exists() and sorted(got.read_text().split()) == ["child", "top"]:
            break
        await asyncio.sleep(0.05)
    assert sorted(got.read_text().split()) == ["child", "top"]
    assert 1 in node.tracker.running()  # caught, so it runs on
    node.tracker.signal(99, signal.SIGUSR1)  # not here: ignored
    node.tracker.kill(1, JobResult.CANCELLED)
    end = await node.ended(1, timeout=GRACE + 3)
    assert end.signal == signal.SIGTERM


async def test_usage_is_sampled_while_the_job_runs(node: Harness) -> None:
    node.tracker.launch(node.spec(2, "while :; do :; done"))
    await node.started(2)
    deadline = time.monotonic() + 10
    use = None
    while time.monotonic() < deadline:
        use = {u.job: u for u in node.tracker.usage()}.get(2)
        if use is not None and use.cputime_s >= 0.5:
            break
        await asyncio.sleep(0.1)
    assert use is not None and use.cputime_s >= 0.5 and use.rss_kb > 0
    node.tracker.kill(2, JobResult.CANCELLED)
    await node.ended(2, timeout=GRACE + 3)
    assert node.tracker.usage() == []


async def test_a_later_run_of_an_ended_job_is_launched(node: Harness) -> None:
    node.tracker.launch(node.spec(3, "echo run >> runs"))
    first = await node.ended(3)
    assert first.reruns == 0
    node.tracker.launch(node.spec(3, "echo run >> runs"))  # a repeat: ignored
    node.tracker.launch(node.spec(3, "echo run >> runs", reruns=1))  # qrerun
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ends = [r for r in node.reports if isinstance(r, JobEnded) and r.job == 3]
        if len(ends) == 2:
            break
        await asyncio.sleep(0.05)
    assert [e.reruns for e in ends] == [0, 1]
    assert (node.workdir / "runs").read_text() == "run\nrun\n"
