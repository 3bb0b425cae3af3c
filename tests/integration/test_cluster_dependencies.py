"""Dependencies with real jobs: ``afterok:A:B`` waits for both, and ``qrls`` of a
held job does not skip a dependency that is still pending.

The jobs that others depend on wait on a file the test creates, so which job
ends first is decided by the test, not by how busy the machine is; "still
waiting" is checked after a job without dependencies has used the free CPU,
which proves the scheduler had its passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def gated(c: Cluster, name: str) -> tuple[str, Path]:
    """Submit a job that runs until the test creates its gate file."""
    gate = c.work / f"{name}.gate"
    job = c.qsub(
        "-N", name, "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    return job, gate


def passes_happened(c: Cluster) -> None:
    """A job with no dependency runs to completion on a free CPU: the scheduler
    has planned with that CPU free (at least once) since now."""
    probe = c.qsub("-N", "probe", "--", "true")
    assert c.wait_state(probe, "finished", timeout=30)["result"] == "completed"


def test_afterok_on_two_jobs_waits_for_both(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2)  # A and B fill both CPUs
    a, gate_a = gated(c, "A")
    b, gate_b = gated(c, "B")
    c.wait_state(a, "running")
    c.wait_state(b, "running")
    dep = c.qsub("-N", "after-both", "-W", f"depend=afterok:{a}:{b}", "--", "true")
    record = c.job(dep)
    assert record["state"] == "waiting", record
    assert record["depends"] == [
        {"kind": "afterok", "job": int(a)},
        {"kind": "afterok", "job": int(b)},
    ], record

    gate_a.touch()
    assert c.wait_state(a, "finished", timeout=30)["result"] == "completed"
    # The dependency update happens with A's end, before anything can see it.
    record = c.job(dep)
    assert record["state"] == "waiting", f"started with {b} still running: {record}"
    assert record["reason"] == f"dependency on {b}", record
    passes_happened(c)  # node of A is free, and still the job waits
    record = c.job(dep)
    assert record["state"] == "waiting" and record["start_time"] is None, record
    assert c.job(b)["state"] == "running"

    gate_b.touch()
    done = c.wait_state(dep, "finished", timeout=30)
    assert done["result"] == "completed", done
    ends = [c.job(j)["end_time"] for j in (a, b)]
    assert done["start_time"] >= max(ends), (done, ends)
    events = c.run("tracejob", dep).stdout
    assert events.count("started") == 1, events


def test_qrls_leaves_a_job_with_a_pending_dependency_waiting(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2)
    x, gate = gated(c, "X")
    c.wait_state(x, "running")
    held = c.qsub("-h", "-N", "held", "-W", f"depend=afterok:{x}", "--", "true")
    assert c.job(held)["state"] == "held"

    c.run("qrls", held)
    record = c.job(held)
    assert record["state"] == "waiting", f"qrls skipped the dependency: {record}"
    assert record["reason"] == f"dependency on {x}", record
    passes_happened(c)  # the other node is free, and still the job waits
    record = c.job(held)
    assert record["state"] == "waiting" and record["start_time"] is None, record

    gate.touch()
    assert c.wait_state(x, "finished", timeout=30)["result"] == "completed"
    done = c.wait_state(held, "finished", timeout=30)
    assert done["result"] == "completed", done
    assert done["start_time"] >= c.job(x)["end_time"]


def test_a_dependency_that_ends_while_held_waits_for_qrls(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2)
    x, gate = gated(c, "X")
    c.wait_state(x, "running")
    held = c.qsub("-h", "-W", f"depend=afterok:{x}", "--", "true")
    gate.touch()
    assert c.wait_state(x, "finished", timeout=30)["result"] == "completed"
    passes_happened(c)
    assert c.job(held)["state"] == "held"
    c.run("qrls", held)
    assert c.wait_state(held, "finished", timeout=30)["result"] == "completed"
