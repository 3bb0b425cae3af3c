"""The scheduler's copy of the queue (deltas, minibatch/scheduler/mirror.py)
across a scheduler killed and started again while jobs keep coming: the new
one gets the whole queue, then deltas again, and plans exactly the queue.

One CPU, held by a gated job; every job logs its start, so the start order
shows what the scheduler planned from: had the restarted scheduler planned
from a copy missing the jobs queued before it, or keeping the deleted and held
ones, the order would differ.
"""

from __future__ import annotations

import pytest
from conftest import Cluster, ClusterFactory
from test_scheduler_restart import kill9, logged, starts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def seen(c: Cluster, job: str) -> None:
    """Wait until a plan has seen ``job`` (its reason is the plan's)."""
    c.wait_for(
        lambda: c.job(job)["reason"] != "waiting for the scheduler",
        what=f"a pass that saw job {job}",
    )


def test_a_restarted_scheduler_resyncs_its_copy_of_the_queue(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    gate = c.work / "gate"
    blocker = logged(c, "blocker", gate)
    c.wait_state(blocker, "running")
    before = [logged(c, f"before{i}") for i in range(8)]
    seen(c, before[-1])
    kill9(c.pids()["scheduler"])
    during = [logged(c, f"during{i}") for i in range(4)]
    c.run("qdel", before[1])
    c.run("qhold", before[2])
    assert c.up().started == ["scheduler"]
    after = [logged(c, f"after{i}") for i in range(4)]
    # Ranks ahead of everything queued: the plan must know the whole queue.
    urgent = c.qsub("-p", "100", "-N", "urgent", "--", "sh", "-c", "true")
    c.run("qdel", after[0])
    seen(c, urgent)
    gate.touch()
    expected = [before[0], *before[3:], *during, *after[1:]]
    for job in expected:
        assert c.wait_state(job, "finished", timeout=60)["result"] == "completed"
    assert c.wait_state(urgent, "finished", timeout=60)["result"] == "completed"
    assert starts(c) == [blocker, *expected]
    record = c.job(urgent)
    assert record["start_time"] <= c.job(before[0])["start_time"], record
    assert c.job(before[2])["state"] == "held"
    assert "Traceback" not in c.log("scheduler")
    assert "Traceback" not in c.log("server")
