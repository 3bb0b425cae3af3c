"""What survives: a server killed with SIGKILL, garbage on the server's socket, a
node daemon killed with SIGKILL, and a scheduler that stops answering."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import msgspec
import psutil
import pytest
import zmq
from conftest import BIN, Cluster, ClusterFactory

from minibatch.core.job import JobResult
from minibatch.errors import ErrorCode
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import (
    Error,
    JobEnded,
    Kill,
    Launch,
    LaunchSpec,
    Ok,
    ServerStatus,
    Status,
)
from minibatch.protocol.scheduling import Wake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def kill9(pid: int) -> None:
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)  # reaps it when it is our child, as lifecycle's daemons are


# ----------------------------------------------------------- server crash


def test_server_sigkill_loses_no_acknowledged_job(cluster: ClusterFactory) -> None:
    # One CPU: everything queues behind the long job. A short periodic pass lets
    # the scheduler re-register quickly with the restarted server.
    c = cluster(nodes=1, scheduler={"interval": 1.0})
    # It burns its CPU until the test says stop, so it still runs after the
    # restart however long the restart takes on a busy machine.
    gate = c.work / "stop"
    long_job = c.qsub(
        "-N", "long", "--", "sh", "-c", f"while [ ! -e {gate} ]; do :; done"
    )
    c.wait_state(long_job, "running")
    # The node's start report (its session and start time) is in: the records
    # compared across the restart are final.
    c.wait_for(lambda: c.job(long_job)["session_id"], what="the start report")
    queued = [c.qsub("--", "true") for _ in range(3)]
    held = [c.qsub("-h", "--", "true") for _ in range(2)]
    waiting = c.qsub("-W", f"depend=afterok:{queued[0]}", "--", "true")
    before = {j["id"]: j for j in c.jobs()}
    assert {before[j]["state"] for j in queued} == {"queued"}
    assert {before[j]["state"] for j in held} == {"held"}
    assert before[waiting]["state"] == "waiting"
    job_pids = {p.pid for p in c.job_procs(long_job)}
    assert job_pids

    server = c.pids()["server"]
    kill9(server)
    assert "server" not in c.pids()
    # The job runs on while the server is gone.
    time.sleep(0.5)
    assert {p.pid for p in c.job_procs(long_job)} >= job_pids

    report = c.up()
    assert report.started == ["server"], report
    assert c.pids()["server"] != server
    after = {j["id"]: j for j in c.jobs()}
    assert after.keys() == before.keys()
    for jid, record in before.items():
        keep = ("state", "name", "cpus", "start_time", "submit_time", "depends")
        assert {k: after[jid][k] for k in keep} == {k: record[k] for k in keep}, jid

    assert c.job(long_job)["state"] == "running"
    stopped = time.time()
    gate.touch()
    done = c.wait_state(long_job, "finished", timeout=30)
    assert done["result"] == "completed" and done["exit_status"] == 0
    assert done["start_time"] == before[long_job]["start_time"]
    assert done["end_time"] >= stopped  # it ran until told to stop
    elapsed = done["end_time"] - done["start_time"]
    # Its CPU time survived the restart: what the kernel counted for a busy
    # loop on one CPU, however busy the machine was meanwhile.
    assert 0.0 < done["cputime_s"] <= elapsed + 0.5, (done["cputime_s"], elapsed)
    for jid in [*queued, waiting]:
        assert c.wait_state(jid, "finished", timeout=30)["result"] == "completed"
    assert c.job(waiting)["start_time"] >= c.job(queued[0])["end_time"]
    assert {c.job(j)["state"] for j in held} == {"held"}

    fresh = c.qsub("--", "true")
    assert int(fresh) > max(int(j) for j in before)
    assert c.wait_state(fresh, "finished")["result"] == "completed"


@pytest.mark.timeout(120)
def test_a_blocked_qsub_outlives_a_server_restart(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1)
    # The job ends when the test says so: after the restart, however long it took.
    gate = c.work / "end"
    script = f"while [ ! -e {gate} ]; do sleep 0.1; done; exit 4"
    qsub = subprocess.Popen(
        [str(BIN / "qsub"), "-W", "block=true", "--", "sh", "-c", script],
        cwd=c.work,
        # Its output buffered, as usual in a pipe: the id must come at once.
        env={k: v for k, v in c.env.items() if k != "PYTHONUNBUFFERED"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert qsub.stdout is not None and qsub.stderr is not None
        job = qsub.stdout.readline().strip()
        c.wait_state(job, "running")
        kill9(c.pids()["server"])
        lost = qsub.stderr.readline()
        assert lost.startswith(f"qsub: lost the server while waiting for job {job},")
        assert qsub.poll() is None  # still waiting
        assert c.up().started == ["server"]
        gate.touch()
        out, err = qsub.communicate(timeout=60)
    finally:
        if qsub.poll() is None:
            qsub.kill()
            qsub.wait()
    assert qsub.returncode == 4, err
    assert out == ""
    assert err.splitlines() == [
        f"qsub: the server is back; waiting for job {job}",
        f"qsub: job {job} ended with exit status 4",
    ]


# --------------------------------------------------------- socket garbage


class RawPeer:
    """A bare DEALER on the server's socket, for sending anything at all."""

    def __init__(self, c: Cluster, identity: bytes | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(c.endpoint)

    def ask(self, *frames: bytes) -> Any:
        self.sock.send_multipart(list(frames))
        reply = self.sock.recv_multipart()
        assert len(reply) == 1, reply
        return decode(reply[0])

    def close(self) -> None:
        self.sock.close(0)


def garbage() -> list[tuple[str, list[bytes], set[ErrorCode]]]:
    """(what, frames, acceptable error codes)."""
    bad = {ErrorCode.INVALID_MESSAGE}
    return [
        ("invalid msgpack", [b"\xc1 not msgpack at all"], bad),
        ("random bytes", [os.urandom(256)], bad | {ErrorCode.VERSION}),
        ("empty frame", [b""], bad),
        ("two frames", [encode(Status(), 7), b"extra"], bad),
        ("three empty frames", [b"", b"", b""], bad),
        ("wrong shape", [msgspec.msgpack.encode({"hello": "world"})], bad),
        ("short envelope", [msgspec.msgpack.encode([1, 2])], bad),
        ("unknown tag", [msgspec.msgpack.encode([1, 3, 0, {"type": "nope"}])], bad),
        (
            "missing fields",
            [msgspec.msgpack.encode([1, 4, 0, {"type": "job_ended"}])],
            bad,
        ),
        (
            "version 99, undecodable body",
            [msgspec.msgpack.encode([99, 5, 0, {"type": "no such type"}])],
            {ErrorCode.VERSION},
        ),
        ("a reply", [encode(Ok(), 8)], {ErrorCode.UNKNOWN_TYPE}),
        (
            "a server-to-node Kill",
            [encode(Kill(job=1, result=JobResult.CANCELLED), 9)],
            {ErrorCode.UNKNOWN_TYPE},
        ),
        (
            "a server-to-scheduler Wake",
            [encode(Wake(generation=1), 10)],
            {ErrorCode.UNKNOWN_TYPE},
        ),
    ]


def check_alive(c: Cluster) -> None:
    """qstat answers and one job per node runs to completion: all of them run
    at once (each waits for a file the test creates once all have started), so
    each node got one, however slowly they were submitted."""
    c.run("qstat", "-a")
    gate = c.work / f"alive-{time.monotonic_ns()}"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    jobs = [c.qsub("--", "sh", "-c", wait) for _ in c.layout]
    for jid in jobs:
        c.wait_state(jid, "running", timeout=30)
    assert {c.job(j)["node"] for j in jobs} == {n.name for n in c.layout}
    gate.touch()
    for jid in jobs:
        assert c.wait_state(jid, "finished", timeout=30)["result"] == "completed"


def test_garbage_on_the_socket_gets_error_replies(cluster: ClusterFactory) -> None:
    c = cluster()
    peer = RawPeer(c)
    try:
        for what, frames, codes in garbage():
            env = peer.ask(*frames)
            assert isinstance(env.body, Error), (what, env)
            assert env.body.code in codes, (what, env.body)
            assert env.body.message, what
        # The same connection still gets proper answers.
        env = peer.ask(encode(Status(), 42))
        assert env.re == 42 and isinstance(env.body, ServerStatus)
        # Launch is for nodes; the server refuses to take it as a request.
        spec = LaunchSpec(
            job=1,
            display_id="1",
            name="x",
            user="root",
            uid=0,
            gid=0,
            workdir="/",
            script=None,
            argv=["true"],
            env={},
            stdout_path="/dev/null",
            stderr_path="/dev/null",
            join=False,
            cpus=[0],
            hosts=["node0"],
            walltime=10,
            mem_kb=None,
        )
        env = peer.ask(encode(Launch(spec=spec), 43))
        assert isinstance(env.body, Error) and env.body.code == ErrorCode.UNKNOWN_TYPE
    finally:
        peer.close()
    check_alive(c)
    log = c.log("server")
    assert "Traceback" not in log, log


def test_envelope_of_an_unknown_version_is_refused(cluster: ClusterFactory) -> None:
    """A well-formed envelope with version 99 must get a VERSION error, not be
    served as if it were version 1 (its fields may mean something else)."""
    c = cluster(nodes=1)
    peer = RawPeer(c)
    try:
        for version in (99, 0, 2):
            frame = msgspec.msgpack.encode([version, 5, 0, {"type": "status"}])
            env = peer.ask(frame)
            assert isinstance(env.body, Error), (version, env.body)
            assert env.body.code == ErrorCode.VERSION, (version, env.body)
            assert str(version) in env.body.message
    finally:
        peer.close()


def test_node_report_for_an_unknown_job_changes_nothing(
    cluster: ClusterFactory,
) -> None:
    """A JobEnded from the cluster's owner (trusted as a daemon) about a job the
    server does not run is a no-op; from anyone else it would be refused."""
    c = cluster()
    before = c.run("qstat", "-x", "--json").stdout
    peer = RawPeer(c)
    try:
        ended = JobEnded(
            job=12345,
            result=JobResult.COMPLETED,
            exit_status=0,
            signal=None,
            end_time=time.time(),
            cputime_s=0.0,
            maxrss_kb=0,
        )
        env = peer.ask(encode(ended, 1))
        assert isinstance(env.body, Ok | Error), env
    finally:
        peer.close()
    assert c.run("qstat", "-x", "--json").stdout == before
    check_alive(c)


def test_garbage_under_a_node_identity_does_not_break_the_node(
    cluster: ClusterFactory,
) -> None:
    """Any local user may connect (the socket is 0777) and pick any ZMQ identity.
    One that once calls itself ``node:node0`` must not cut the real node0 off."""
    c = cluster()
    peer = RawPeer(c, identity=b"node:node0")
    try:
        for what, frames, codes in garbage()[:6]:
            env = peer.ask(*frames)
            assert isinstance(env.body, Error) and env.body.code in codes, what
    finally:
        peer.close()
    after = c.nodes()["node0"].last_heartbeat or 0.0
    # The server goes on taking node0's heartbeats: three more of them (a node
    # cut off would have its heartbeats refused, and be declared down).
    interval = c.config.node.heartbeat
    c.wait_for(
        lambda: (c.nodes()["node0"].last_heartbeat or 0.0) >= after + 2.5 * interval,
        timeout=30,
        what="node0's heartbeats after the garbage",
    )
    states = {name: n.state for name, n in c.nodes().items()}
    assert states == {"node0": "free", "node1": "free"}, states
    check_alive(c)


def test_an_impostor_does_not_receive_a_nodes_launch(cluster: ClusterFactory) -> None:
    """A client connected under a node's identity must not be handed the jobs
    (scripts, environments) the server launches on that node."""
    c = cluster(nodes=1)
    peer = RawPeer(c, identity=b"node:node0")
    peer.sock.setsockopt(zmq.RCVTIMEO, 3000)
    try:
        jid = c.qsub("-v", "SECRET=hunter2", "--", "true")
        try:
            frames = peer.sock.recv_multipart()
        except zmq.Again:
            frames = []
        got = [decode(f).body for f in frames]
        assert not any(isinstance(b, Launch) for b in got), got
    finally:
        peer.close()
    assert c.wait_state(jid, "finished", timeout=15)["result"] == "completed"


# ------------------------------------------------------------ node crash


def test_node_sigkill_without_cgroups_kills_and_requeues_on_restart(
    cluster: ClusterFactory,
) -> None:
    """Without cgroups a restarted daemon cannot supervise what it did not start:
    it kills the job's session and tree, and the job runs again."""
    c = cluster(server={"node_timeout": 2.0}, node={"cgroups": False})
    script = c.work / "victim.sh"
    script.write_text("#!/bin/sh\nsleep 120 &\nsetsid sleep 121 &\nwait\n")
    jid = c.qsub("-l", "walltime=300", str(script))
    record = c.wait_state(jid, "running")
    node = record["node"]
    procs = c.wait_for(lambda: (p := c.job_procs(jid)) and len(p) >= 3 and p)

    kill9(c.pids()[f"node-{node}"])
    c.wait_for(lambda: c.nodes()[node].state == "down", what="node down")
    pbsnodes = c.run("pbsnodes", "-l").stdout
    assert node in pbsnodes and "down" in pbsnodes
    # Nobody has seen its processes end: the job still runs, and so do they.
    assert c.job(jid)["state"] == "running"
    assert [p for p in procs if p.is_running()]

    report = c.up()
    assert report.started == [f"node-{node}"], report
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert alive == [], f"left over after the node restarted: {alive}"
    # Requeued (its node's report may follow the node's hello), started again.
    c.wait_for(lambda: c.job(jid)["reruns"] == 1, what="the job requeued")
    c.wait_state(jid, "running")
    c.run("qdel", jid)
    c.wait_state(jid, "finished")
    c.wait_for(lambda: c.job_procs(jid) == [], what="no process of the job")
    check_alive(c)


# ------------------------------------------------------- frozen scheduler


def test_upcoming_jobs_start_while_the_scheduler_is_frozen(
    cluster: ClusterFactory,
) -> None:
    """The server starts the last plan's upcoming jobs itself as CPUs free up,
    in order, so a stalled scheduler delays backfill, not the queue's head."""
    c = cluster(nodes=1, cpus_per_node=1)
    gate = c.work / "go"
    first = c.qsub("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    rest = [c.qsub("-N", f"next{i}", "--", "true") for i in range(3)]
    c.wait_state(first, "running")
    # A plan that saw all three has come back (its reasons replace the default).
    c.wait_for(
        lambda: all(c.job(j)["reason"] != "waiting for the scheduler" for j in rest),
        what="a plan covering the queue",
    )
    scheduler = psutil.Process(c.pids()["scheduler"])
    scheduler.suspend()
    try:
        c.wait_for(lambda: scheduler.status() == psutil.STATUS_STOPPED)
        assert [c.job(j)["state"] for j in rest] == ["queued"] * 3
        gate.touch()  # the CPU frees up while the scheduler cannot plan
        records = [c.wait_state(j, "finished", timeout=30) for j in rest]
        assert scheduler.status() == psutil.STATUS_STOPPED
    finally:
        scheduler.resume()
    assert [r["result"] for r in records] == ["completed"] * 3
    starts = [r["start_time"] for r in records]
    assert starts == sorted(starts)
    assert starts[0] >= c.job(first)["end_time"]


@pytest.mark.timeout(60)
def test_mb_up_on_a_running_cluster_starts_only_what_is_missing(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2)
    layout = {n.name: n.cpus for n in c.layout}
    dead = c.pids()["node-node1"]
    kill9(dead)
    proc = c.run("mb", "up")
    assert "started node-node1" in proc.stdout, proc.stdout
    for name, cpus in layout.items():
        assert f"  {name}: CPUs {cpus}" in proc.stdout, proc.stdout
    assert c.pids()["node-node1"] != dead
    assert c.nodes()["node1"].cpus == layout["node1"]
    # Flags that contradict the running layout change nothing.
    before = c.pids()
    refused = c.run("mb", "up", "--nodes", "1", check=False)
    assert refused.returncode == 2
    assert "running with another layout" in refused.stderr
    assert c.pids() == before


@pytest.mark.timeout(90)
def test_mb_down_keeps_the_queue_and_requeues_rerunnable_jobs(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2)
    rerun = c.qsub("--", "sleep", "60")
    once = c.qsub("-r", "n", "--", "sleep", "60")
    for job in (rerun, once):
        c.wait_state(job, "running")
    queued = [c.qsub("--", "true") for _ in range(3)]
    c.down()
    # Nothing acknowledged is lost, and nothing was started on a stopping node.
    c.up()
    assert c.job(once)["result"] == "cancelled"
    assert "not rerunnable" in c.job(once)["comment"]
    record = c.wait_state(rerun, "running", timeout=30)
    assert record["reruns"] == 1
    for job in queued:
        assert c.wait_state(job, "finished", timeout=30)["result"] == "completed"
    events = c.run("tracejob", rerun).stdout
    assert "requeued" in events


@pytest.mark.timeout(90)
def test_mb_up_after_mb_down_brings_the_same_nodes_back(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    layout = {n.name: n.cpus for n in c.layout}
    jid = c.qsub("-h", "-l", "nodes=2:ppn=1", "--", "true")  # needs both nodes
    c.down()
    proc = c.run("mb", "up", timeout=60)
    assert "the layout of the last mb up" in proc.stdout, proc.stdout
    for name, cpus in layout.items():
        assert f"  {name}: CPUs {cpus}" in proc.stdout, proc.stdout
    c.run("qrls", jid)
    c.wait_state(jid, "completed", timeout=30)


@pytest.mark.timeout(120)
def test_two_mb_up_at_once_start_one_cluster(cluster: ClusterFactory) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    c.down()
    ups = [
        subprocess.Popen(
            [str(BIN / "mb"), "up"],
            env=c.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in ups]
    assert [p.returncode for p in ups] == [0, 0], outs
    started = [out for out, _ in outs if "started node-node0" in out]
    assert len(started) == 1, outs  # the other found it running
    assert c.qsub("--", "true") and c.pids().keys() >= {"server", "node-node0"}
