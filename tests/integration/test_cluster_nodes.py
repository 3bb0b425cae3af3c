"""Nodes, scheduling policies, and the cluster's lifecycle (``mb up/down/status``)."""

from __future__ import annotations

import contextlib
import json
import os
import time

import psutil
import pytest
from conftest import ClusterFactory, procs_with

from minibatch.cluster import lifecycle
from minibatch.cluster.layout import usable_cpus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


# ------------------------------------------------------------------ nodes


def test_pbsnodes_shows_free_nodes_with_their_cpus(cluster: ClusterFactory) -> None:
    c = cluster()
    nodes = json.loads(c.run("pbsnodes", "-a", "--json").stdout)
    assert [(n["name"], n["state"], n["cpus"], n["np"]) for n in nodes] == [
        (lay.name, "free", lay.cpus, 1) for lay in c.layout
    ]
    assert c.layout[0].cpus != c.layout[1].cpus
    for n in nodes:
        assert n["free_cpus"] == n["cpus"] and n["jobs"] == {}
        assert n["shared_cpus"] == [] and n["oversubscribed"] is False
        assert n["pid"] == c.pids()[f"node-{n['name']}"]
    text = c.run("pbsnodes").stdout
    assert "oversubscribed" not in text
    # A running job shows on its node, with its CPU.
    jid = c.qsub("--", "sleep", "30")
    record = c.wait_state(jid, "running")
    nodes = {n["name"]: n for n in json.loads(c.run("pbsnodes", "--json").stdout)}
    busy = nodes[record["node"]]
    assert busy["jobs"] == {jid: record["cpus"]} and busy["free_cpus"] == []
    assert busy["state"] == "job-exclusive"


def test_oversubscribed_cluster_says_its_cpus_are_shared(
    cluster: ClusterFactory,
) -> None:
    count = len(usable_cpus()) + 1  # one node more than there are cores
    c = cluster(nodes=count, cpus_per_node=1)
    nodes = json.loads(c.run("pbsnodes", "-a", "--json").stdout)
    assert len(nodes) == count
    shared = [n for n in nodes if n["oversubscribed"]]
    assert len(shared) >= 2
    for n in shared:
        assert n["shared_cpus"] == n["cpus"]
    text = c.run("pbsnodes", "-a").stdout
    assert text.count("are shared with other nodes") == len(shared)
    status = json.loads(c.run("mb", "status", "--json").stdout)
    flagged = [d["node"] for d in status["daemons"] if d.get("shared_cpus")]
    assert sorted(flagged) == sorted(n["name"] for n in shared)


# ------------------------------------------------------------- scheduling


@pytest.mark.parametrize("policy", ["easy", "fifo"])
def test_easy_backfills_a_short_job_and_fifo_does_not(
    cluster: ClusterFactory, policy: str
) -> None:
    c = cluster(nodes=1, cpus_per_node=2, policy=policy)
    assert json.loads(c.run("mb", "status", "--json").stdout)["up"]
    # One CPU busy for up to 30 s; a 2-CPU job must wait for it (the head).
    running = c.qsub("-l", "ncpus=1,walltime=30", "--", "sleep", "30")
    c.wait_state(running, "running")
    head = c.qsub("-l", "ncpus=2,walltime=10", "--", "true")
    # Fits in the idle CPU and ends (by its walltime) before the head can start.
    short = c.qsub("-l", "ncpus=1,walltime=5", "--", "sleep", "1")
    # Fits now too, but would still run when the head is due.
    long = c.qsub("-l", "ncpus=1,walltime=60", "--", "true")

    if policy == "easy":
        assert c.wait_state(short, "finished")["result"] == "completed"
        time.sleep(0.5)  # a pass after the short job's end
        h = c.job(head)
        assert h["state"] == "queued"
        assert "reserved to start in" in h["reason"], h["reason"]
        expected = c.job(running)["start_time"] + 30
        assert h["predicted_start"] == pytest.approx(expected, abs=2)
        lj = c.job(long)
        assert lj["state"] == "queued"
        assert f"would delay job {head}" in lj["reason"], lj["reason"]
    else:
        time.sleep(2.0)  # the short job would have started and ended by now
        s = c.job(short)
        assert s["state"] == "queued" and s["start_time"] is None
        assert f"behind job {head}" in s["reason"], s["reason"]
        assert c.job(head)["state"] == "queued"

    # Once the CPU is free the head runs first, then the rest.
    c.run("qdel", running)
    order = [head, long] if policy == "easy" else [head, short, long]
    records = [c.wait_state(j, "completed", timeout=20) for j in order]
    for before, after in zip(records, records[1:], strict=False):
        assert before["start_time"] <= after["start_time"]


# ------------------------------------------------------------- lifecycle


def test_mb_up_status_down_and_up_again(cluster: ClusterFactory) -> None:
    c = cluster(start=False)
    assert c.run("mb", "status", check=False).returncode == 1  # nothing runs yet
    up = c.run("mb", "up", "--nodes", "2", "--cpus-per-node", "1", timeout=60)
    names = ["broker", "server", "scheduler", "node-node0", "node-node1"]
    for name in names:
        assert f"started {name} (pid " in up.stdout, up.stdout

    status = json.loads(c.run("mb", "status", "--json").stdout)
    pids = c.pids()
    assert sorted(d["name"] for d in status["daemons"]) == sorted(names)
    assert status["up"] is True and status["home"] == str(c.home)
    url = c.paths.mqtt_url_file.read_text().strip()
    assert status["mqtt_url"] == url and url.startswith("mqtt://127.0.0.1:")
    for d in status["daemons"]:
        assert d["alive"] is True and d["pid"] == pids[d["name"]], d
        assert psutil.Process(d["pid"]).environ()["MB_HOME"] == str(c.home)
    by_name = {d["name"]: d for d in status["daemons"]}
    assert by_name["server"]["endpoint"] == f"ipc://{c.home}/run/server.sock"
    assert by_name["broker"]["endpoint"] == url
    assert [by_name[f"node-{n.name}"]["cpus"] for n in c.layout] == [
        n.cpus for n in c.layout
    ]

    running = c.qsub("--", "sleep", "60")
    c.wait_state(running, "running")
    job_procs = c.launched_procs(running)

    procs = [psutil.Process(p) for p in pids.values()]
    down = c.run("mb", "down")
    assert down.stdout.startswith("stopped ")
    _, alive = psutil.wait_procs([*procs, *job_procs], timeout=5)
    assert alive == [], alive
    assert procs_with(c.home) == []
    assert not any(c.paths.run.glob("*.pid"))
    status = c.run("mb", "status", "--json", check=False)
    assert status.returncode == 0 and json.loads(status.stdout)["up"] is False
    assert c.run("mb", "status", check=False).returncode == 1

    # The same home comes back and remembers what happened. (Started from this
    # process, the daemons are its children: the teardown's stop is quicker.)
    report = c.up()
    assert sorted(report.started) == sorted(names) and not report.already_running
    again = json.loads(c.run("mb", "status", "--json").stdout)
    assert again["up"] is True
    assert {d["name"] for d in again["daemons"]} == set(pids)
    assert not set(c.pids().values()) & set(pids.values())
    # mb down killed it with its node, and it is rerunnable (PBS's default):
    # back in the queue, not lost.
    record = c.job(running)
    assert record["state"] in ("queued", "running") and record["reruns"] == 1
    jid = c.qsub("--", "true")
    assert int(jid) > int(running)
    assert c.wait_state(jid, "finished")["result"] == "completed"


def test_commands_fail_fast_when_the_cluster_is_down(cluster: ClusterFactory) -> None:
    """After a clean stop, commands say at once that the cluster is down (the
    client skips the 10 s timeout when the server's socket file is absent)."""
    c = cluster(nodes=1)
    c.down()
    for command in (["qsub", "--", "true"], ["qstat"], ["pbsnodes"]):
        # What starting the command costs on this machine now (it loads the
        # same modules): the refusal may take that, not the 10 s timeout more.
        started = time.monotonic()
        c.run(command[0], "--help")
        startup = time.monotonic() - started
        started = time.monotonic()
        refused = c.run(*command, check=False, timeout=60)
        took = time.monotonic() - started
        assert refused.returncode == 1, refused
        assert refused.stderr.count("\n") == 1 and "mb up" in refused.stderr
        assert took < startup + 5, (
            f"{command[0]} took {took:.1f} s to say the cluster is down "
            f"(it starts in {startup:.1f} s)"
        )


def test_mb_down_is_quick_when_the_starter_still_runs(cluster: ClusterFactory) -> None:
    """Daemons started by a process that is still alive (a Python program calling
    ``lifecycle.up``, this test) become zombies when stopped, until that process
    reaps them. ``mb down`` must count a zombie as stopped instead of waiting
    STOP_GRACE for it and then again after SIGKILL, stage after stage."""
    c = cluster(nodes=1)
    pids = c.pids()
    started = time.monotonic()
    try:
        c.run("mb", "down", timeout=60)
    finally:
        for pid in pids.values():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    # Waiting for a zombie would take STOP_GRACE at least, once per stage.
    took = time.monotonic() - started
    assert took < lifecycle.STOP_GRACE, f"mb down took {took:.1f} s"


def test_two_clusters_share_nothing(cluster: ClusterFactory) -> None:
    a, b = cluster(nodes=1), cluster(nodes=1)
    assert a.endpoint != b.endpoint
    assert a.paths.mqtt_url_file.read_text() != b.paths.mqtt_url_file.read_text()
    ja = a.qsub("--", "sleep", "30")
    a.wait_state(ja, "running")
    jb = b.qsub("--", "true")
    assert jb == ja == "1"  # each numbers its own jobs
    assert b.wait_state(jb, "finished")["result"] == "completed"
    assert a.job(ja)["state"] == "running"
    b.down()
    assert a.job_procs(ja), "stopping one cluster killed the other's job"
