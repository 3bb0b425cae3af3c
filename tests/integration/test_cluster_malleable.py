"""Malleable jobs on a real cluster: resized by hand, as the kernel sees them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path

import aiomqtt
import psutil
import pytest
from conftest import Cluster, ClusterFactory
from test_cluster_events import Subscriber, sh
from test_cluster_resilience import kill9

from minibatch.core.units import parse_cpu_list

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: Two busy threads; each SIGUSR1 appends the CPU list the file holds then.
SPIN = textwrap.dedent(
    """
    import os, signal, threading
    def told(sig, frame):
        with open("told", "a") as f:
            f.write(open(os.environ["MB_CPUSET_FILE"]).read())
    signal.signal(signal.SIGUSR1, told)
    def spin():
        while True:
            pass
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    threading.Event().wait()
    """
)


def thread_masks(c: Cluster, jid: str) -> list[set[int]]:
    """The affinity of every thread of every process of the job."""
    out = []
    for proc in c.job_procs(jid):
        for thread in proc.threads():
            try:
                out.append(os.sched_getaffinity(thread.id))
            except ProcessLookupError:
                continue
    return out


async def test_qalter_shrinks_and_expands_a_running_job(cluster: ClusterFactory):
    c = await asyncio.to_thread(cluster, nodes=1, cpus_per_node=2)
    both = set(c.layout[0].cpus)
    assert len(both) == 2
    host, port = c.paths.mqtt_url_file.read_text().strip()[7:].rsplit(":", 1)
    async with aiomqtt.Client(host, int(port)) as client:
        await client.subscribe("minibatch/v1/jobs/#")
        sub = Subscriber(client)
        try:
            jid = await sh(
                c, "qsub", "-l", "ncpus=2,malleable=1-2", "--",
                sys.executable, "-c", SPIN,
            )  # fmt: skip
            await asyncio.to_thread(c.launched_procs, jid)
            await asyncio.to_thread(
                c.wait_for, lambda: len(thread_masks(c, jid)) >= 3, what="threads"
            )
            assert all(m == both for m in thread_masks(c, jid))

            await sh(c, "qalter", "-l", "ncpus=1", jid)
            record = await asyncio.to_thread(c.wait_resizes, jid, 1)
            (cpu,) = record["cpus"]
            assert all(m == {cpu} for m in thread_masks(c, jid))
            told = c.work / "told"
            await asyncio.to_thread(
                c.wait_for, lambda: told.exists() and told.read_text(), what="signal"
            )
            assert told.read_text() == f"{cpu}\n"
            event = await sub.wait_topic(f"minibatch/v1/jobs/{jid}/resized")
            assert event["cpus"] == [cpu] and "2->1 CPUs" in event["detail"]
            cores = {p.cpu_num() for p in c.job_procs(jid)}
            assert cores == {cpu}

            # Bad input: a one-line error, nothing changes.
            for value, message in (("3", "more than 2"), ("0", "positive")):
                bad = c.run("qalter", "-l", f"ncpus={value}", jid, check=False)
                assert bad.returncode != 0 and message in bad.stderr
                assert len(bad.stderr.strip().splitlines()) == 1
            assert c.job(jid)["cpus"] == [cpu]

            await sh(c, "qalter", "-l", "ncpus=2", jid)
            record = await asyncio.to_thread(c.wait_resizes, jid, 2)
            assert set(record["cpus"]) == both
            assert all(m == both for m in thread_masks(c, jid))
            checkjob = await sh(c, "checkjob", jid)
            assert "Malleable: 1-2 CPUs, holds 2 now" in checkjob
            assert checkjob.count("Resized: ") == 2
            full = await sh(c, "qstat", "-f", jid)
            assert "Resource_List.malleable = 1-2" in full
            assert "2->1 CPUs" in full and "1->2 CPUs" in full
        finally:
            await sub.close()
    await sh(c, "qdel", jid)
    done = await asyncio.to_thread(c.wait_state, jid, "finished")
    [acct] = json.loads(await sh(c, "mb", "acct", "-j", jid, "--json"))
    assert [len(r["after"]) for r in acct["resizes"]] == [1, 2]
    elapsed = done["end_time"] - done["start_time"]
    assert elapsed < acct["allocated_cpu_s"] < 2 * elapsed  # less than 2 CPUs


async def test_rigid_and_finished_jobs_cannot_be_resized(cluster: ClusterFactory):
    c = await asyncio.to_thread(cluster, nodes=1, cpus_per_node=2)
    rigid = await sh(c, "qsub", "-l", "ncpus=1", "--", "sleep", "30")
    await asyncio.to_thread(c.wait_state, rigid, "running")
    bad = c.run("qalter", "-l", "ncpus=2", rigid, check=False)
    assert bad.returncode != 0 and "only pending jobs" in bad.stderr
    quick = await sh(c, "qsub", "-l", "ncpus=1,malleable=1-2", "--", "true")
    await asyncio.to_thread(c.wait_state, quick, "finished")
    gone = c.run("qalter", "-l", "ncpus=2", quick, check=False)
    assert gone.returncode != 0 and f"job {quick} has finished" in gone.stderr
    assert psutil.pid_exists(c.pids()["server"])


# ------------------------------------------------- a daemon killed mid-resize


def start_spinner(c: Cluster) -> tuple[str, set[int]]:
    """A running 2-CPU malleable job with its threads spinning; its CPUs."""
    jid = c.qsub("-l", "ncpus=2,malleable=1-2", "--", sys.executable, "-c", SPIN)
    c.wait_state(jid, "running")
    c.wait_for(lambda: len(thread_masks(c, jid)) >= 3, what="threads")
    return jid, set(c.layout[0].cpus)


def test_server_killed_mid_resize_ends_consistent(cluster: ClusterFactory):
    c = cluster(nodes=1, cpus_per_node=2, scheduler={"interval": 1.0})
    jid, both = start_spinner(c)
    c.run("qalter", "-l", "ncpus=1", jid)  # acknowledged: committed, pending
    kill9(c.pids()["server"])
    c.up()
    # The node's answer (re-sent), or the resize sent again after its hello,
    # closes the resize; what the server says the job holds is what it runs on.
    record = c.wait_resizes(jid, 1, timeout=20)
    assert not record["resizing"] and len(record["cpus"]) == 1
    assert all(m == set(record["cpus"]) for m in thread_masks(c, jid))
    assert c.nodes()[c.layout[0].name].free_cpus == sorted(both - set(record["cpus"]))
    c.run("qdel", jid)


def cgroup_cpus(pid: int) -> set[int]:
    """The CPUs of the cpuset cgroup process ``pid`` is in, as the kernel says."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, where = line.split(":", 2)
        if "cpuset" in names.split(","):
            text = Path(f"/sys/fs/cgroup/cpuset{where}/cpuset.cpus").read_text()
            return set(parse_cpu_list(text.strip()))
    raise AssertionError(f"pid {pid} is in no cpuset cgroup")


def test_node_killed_mid_resize_readopts_and_resizes(cluster: ClusterFactory):
    c = cluster(nodes=1, cpus_per_node=2, server={"node_timeout": 3.0})
    jid, both = start_spinner(c)
    procs = c.job_procs(jid)
    assert cgroup_cpus(procs[0].pid) == both
    node = c.layout[0].name
    c.run("qalter", "-l", "ncpus=1", jid)
    kill9(c.pids()[f"node-{node}"])
    assert c.up().started == [f"node-{node}"]
    # Re-adopted, and the resize the server still owed it applied.
    record = c.wait_resizes(jid, 1)
    assert record["state"] == "running" and len(record["cpus"]) == 1, record
    (cpu,) = record["cpus"]
    assert all(m == {cpu} for m in thread_masks(c, jid))
    assert cgroup_cpus(procs[0].pid) == {cpu}
    c.run("qdel", jid)
    c.wait_state(jid, "finished", timeout=60)  # TERM, its grace, KILL: on a busy box
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert alive == [] and c.job_procs(jid) == []
    c.wait_for(lambda: c.nodes()[node].state == "free", what="the node back")
    assert c.nodes()[node].free_cpus == sorted(both)
    # It runs a malleable job again.
    again, _ = start_spinner(c)
    c.run("qalter", "-l", "ncpus=1", again)
    assert len(c.wait_resizes(again, 1)["cpus"]) == 1
    c.run("qdel", again)
