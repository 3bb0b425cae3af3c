"""``mb whatif`` on a live queue: the cluster runs FIFO, EASY would backfill the
small job now; the look changes nothing, and the scheduler goes on planning.

Only the order of events is fixed (the first job holds a CPU for far longer than
the test lasts), so the predicted starts are asserted by their relations to the
snapshot's own clock and to each other, never by wall-clock windows.
"""

from __future__ import annotations

import json

import pytest
from conftest import ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_whatif_easy_on_a_fifo_queue(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=2, policy="fifo")
    first = c.qsub("-N", "first", "-l", "ncpus=1,walltime=600", "--", "sleep", "600")
    c.wait_state(first, "running")
    wide = c.qsub("-N", "wide", "-l", "ncpus=2,walltime=300", "--", "true")
    small = c.qsub("-N", "small", "-l", "ncpus=1,walltime=100", "--", "true")
    c.wait_for(lambda: "queued behind" in c.job(small)["reason"], what="a FIFO pass")

    data = json.loads(c.run("mb", "whatif", "easy", "--json").stdout)
    assert (data["current"], data["policy"], data["skipped"]) == ("fifo", "easy", {})
    rows = {str(r["job"]): r for r in data["rows"]}
    assert list(rows) == [wide, small]
    now = data["now"]
    # The wide job waits for the first one's walltime under both policies; FIFO
    # keeps the small one behind it, EASY starts it now.
    assert rows[wide]["current"] == rows[wide]["other"] > now
    assert rows[small]["current"] == rows[wide]["current"] + 300
    assert rows[small]["other"] == now
    assert rows[small]["delta"] == now - rows[small]["current"]
    assert rows[small]["cpus"] == 1 and rows[wide]["cpus"] == 2
    assert data["mean_wait"] < data["current_mean_wait"]

    text = c.run("mb", "whatif", "easy").stdout.splitlines()
    assert text[0] == "fifo (current) vs easy: 2 waiting jobs"
    assert text[4].split()[:3] == [small, "root", "1"]
    assert "now" in text[4].split()

    # A look changes nothing: same policy, same queue, and the scheduler still
    # plans (the wide job starts once the CPU is free).
    assert "policy:     fifo" in c.run("mb", "policy", "show").stdout
    assert c.job(wide)["state"] == c.job(small)["state"] == "queued"
    c.run("qdel", first)
    for job in (wide, small):
        assert c.wait_state(job, "finished", timeout=30)["result"] == "completed"


def test_bad_input_is_refused_and_changes_nothing(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1, policy="fifo")
    cases = [
        (("nosuch",), "unknown policy 'nosuch'"),
        (("easy", "--param", "bogus=1"), "bad parameters for policy 'easy'"),
        (("easy", "--param", "novalue"), "malformed parameter 'novalue'"),
        (("os:system",), "policies are chosen by name"),
    ]
    for args, message in cases:
        proc = c.run("mb", "whatif", *args, check=False)
        assert proc.returncode == 2, proc
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc
    assert "policy:     fifo" in c.run("mb", "policy", "show").stdout


def test_no_cluster(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, start=False)
    proc = c.run("mb", "whatif", "easy", check=False)
    assert proc.returncode == 1
    assert "mb up" in proc.stderr and "Traceback" not in proc.stderr
