"""Fault injection: daemons killed with SIGKILL at random moments while real jobs
flow (issue 10, item 4).

500 short jobs are submitted in bursts (through the API, and one a burst with
``qsub``) while the resource manager, the scheduler and the node daemons are
killed several times each, a seeded :class:`random.Random` picking the order
and the moments (each kill follows a burst by 0-0.4 s), and started again with
``c.up()``; a long job per node runs through all of it. Once everything has
drained, only outcomes are checked:

* every acknowledged job exists and ended exactly once, completed (or, when it
  ended while no daemon of its node ran, node_fail: its exit status is
  unknown); nothing is
  left running, and no daemon logged a traceback;
* a job ran once (its own side effect, a line appended with ``>>``, i.e.
  ``O_APPEND``, is there once), unless the server requeued it because its node
  daemon was killed in the milliseconds between forking it and recording its
  pid, and then at most once per run;
* one accounting record each (``mb acct --json``), and in the PBS accounting
  log one Q and one E record each, one S record per run and one R record per
  requeue;
* the long jobs were re-adopted by every restarted daemon of their node (the
  node's log says ``job N: re-adopted``) and never requeued.

The MQTT broker is killed for a while too: jobs submitted and run meanwhile are
not affected and no command hangs.

The last tests reproduce what these found, each fixed since: a restarted node
daemon re-adopted and killed the other nodes' jobs (one spool for every node);
a job that ended while its node daemon was dead, or after the new daemon
re-adopted it but before its hello, ran again; a restarted broker came back on
another port, so events stopped until the server restarted.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import aiomqtt
import psutil
import pytest
from conftest import Cluster, ClusterFactory

from minibatch.core.job import JobRequest, JobSpec
from minibatch.errors import MinibatchError
from minibatch.net.client import Client
from minibatch.protocol.messages import Status, Submit

# Serial: its kills land in windows of milliseconds that a busy machine shifts.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

#: Short jobs submitted during the faults (the issue says 500).
SHORT_JOBS = 500
#: Jobs per burst (20 bursts, two per fault).
BURST = 25
SEED = 20261125


def kill9(pid: int) -> None:
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)  # reaps it when it is our child, as lifecycle's daemons are


def short_spec(c: Cluster, ids: Path, rng: random.Random) -> JobSpec:
    """What ``qsub -- /bin/sh -c 'echo $PBS_JOBID >> ids; sleep 0.0N'`` sends."""
    pause = f"0.0{rng.randrange(10)}"
    return JobSpec(
        name="short",
        workdir=str(c.work),
        request=JobRequest(ppn=1, walltime=120),
        argv=["/bin/sh", "-c", f"echo $PBS_JOBID >> {ids}; sleep {pause}"],
        stdout_path="/dev/null",
        stderr_path="/dev/null",
    )


class Submitter(threading.Thread):
    """Submits ``total`` acknowledged short jobs in bursts, most through the
    API (fast), one per burst with the ``qsub`` command; a refusal or a
    timeout (the server is dead) is counted and the stream goes on.

    Paced by the faults: the test kills a daemon after every ``PER_FAULT``
    bursts (:meth:`wait_bursts`), and the stream stays at most that far ahead
    of the faults (:meth:`fault_done`), so jobs flow through all of them."""

    PER_FAULT = 2

    def __init__(self, c: Cluster, ids: Path, total: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.c, self.ids, self.total = c, ids, total
        self.rng = random.Random(seed)
        self.acked: list[str] = []
        #: Requests that got no acknowledgement (the job may exist anyway).
        self.unanswered = 0
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._bursts = 0
        self._faults = 0

    def wait_bursts(self, fault: int) -> None:
        """Until the bursts before fault number ``fault`` (from 0) are in."""
        with self._cond:
            want = (fault + 1) * self.PER_FAULT - 1
            self._cond.wait_for(
                lambda: self._bursts >= want or not self.is_alive(), 120
            )

    def fault_done(self, last: bool = False) -> None:
        with self._cond:
            self._faults = 1 << 30 if last else self._faults + 1
            self._cond.notify_all()

    def _may_go_on(self) -> bool:
        return self._bursts < (self._faults + 1) * self.PER_FAULT

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _run(self) -> None:
        client = None
        while len(self.acked) < self.total:
            with self._cond:
                self._cond.wait_for(self._may_go_on, 120)
            for i in range(min(BURST, self.total - len(self.acked))):
                if i == 0:
                    self._qsub()
                    continue
                if client is None:
                    client = self.c.client(timeout=3.0)
                try:
                    reply = client.call(
                        Submit(spec=short_spec(self.c, self.ids, self.rng))
                    )
                except MinibatchError:
                    self.unanswered += 1
                    client.close()
                    client = None
                    time.sleep(0.1)
                    continue
                self.acked += [str(j) for j in reply.ids]
            with self._cond:
                self._bursts += 1
                self._cond.notify_all()
            time.sleep(self.rng.uniform(0.05, 0.3))
        if client is not None:
            client.close()

    def _qsub(self) -> None:
        pause = f"0.0{self.rng.randrange(10)}"
        body = f"echo $PBS_JOBID >> {self.ids}; sleep {pause}"
        proc = self.c.run(
            "qsub", "-o", "/dev/null", "-e", "/dev/null", "--", "/bin/sh", "-c", body,
            check=False, timeout=60,
        )  # fmt: skip
        if proc.returncode == 0:
            self.acked.append(proc.stdout.strip())
        else:
            self.unanswered += 1


def registered(c: Cluster) -> bool:
    """Whether the server knows every node by its running daemon (a restarted
    daemon says hello up to a heartbeat after it started)."""
    pids = c.pids()
    return all(n.pid == pids.get(f"node-{name}") for name, n in c.nodes().items())


def drained(c: Cluster) -> bool:
    with c.client(timeout=10.0) as client:
        counts: dict[str, int] = client.call(Status()).jobs
    return not any(counts.values())


def accounting_log(c: Cluster) -> dict[str, collections.Counter[str]]:
    """Record type -> how many records of it each job id has."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for path in sorted((c.home / "state" / "accounting").iterdir()):
        for line in path.read_text().splitlines():
            _stamp, kind, job, _keys = line.split(";", 3)
            out[kind][job] += 1
    return out


#: What the server logs, with a traceback, when the broker dies under its MQTT
#: client's write (asyncio's handler, from paho's socket callback; reported):
#: noise, the publisher buffers and reconnects.
BROKER_DIED = "ERROR asyncio: Exception in callback BaseSelectorEventLoop.add_writer"


def logged_errors(c: Cluster, allowed: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Each daemon's log records that came with a traceback, but ``allowed`` ones."""
    found: dict[str, list[str]] = {}
    for name in c.pids():
        header = ""
        for line in c.log(name).splitlines():
            if line[:4].isdigit():  # a record's first line: "2026-11-25 ..."
                header = line
            elif line.startswith("Traceback") and not any(a in header for a in allowed):
                found.setdefault(name, []).append(header)
    return found


def check_outcomes(
    c: Cluster, acked: list[str], ids: Path, allowed: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """What every fault test asserts once the cluster has drained; returns the
    jobs' records. ``allowed``: log records with a traceback that may occur."""
    assert len(set(acked)) == len(acked), "an id was acknowledged twice"
    jobs = c.jobs()
    by_id = {j["id"]: j for j in jobs}
    assert len(by_id) == len(jobs)
    missing = set(acked) - set(by_id)
    assert not missing, f"acknowledged jobs lost: {sorted(missing, key=int)}"
    for j in jobs:
        assert j["state"] == "finished", j
        # A job that ended while no daemon of its node listened: how is not
        # known, and an unknown end is not a success (node_fail, not rerun).
        unseen = "exit status unknown" in j["comment"]
        assert j["result"] == ("node_fail" if unseen else "completed"), j
    # The job's own side effect: one line per run it made.
    runs = collections.Counter(ids.read_text().split())
    assert set(runs) == set(by_id), set(runs) ^ set(by_id)
    for jid, j in by_id.items():
        if j["reruns"] == 0:
            assert runs[jid] == 1, (jid, runs[jid], j)
        else:
            # Requeued: its daemon was killed as it started the job, before
            # it knew the pid (the job may have run: rerunnable, as -r y
            # allows), or the launch was lost with it. Never more than that.
            assert 1 <= runs[jid] <= j["reruns"] + 1, (jid, runs[jid], j)
    # One accounting record per job, in the database and in the PBS log.
    acct = json.loads(c.run("mb", "acct", "--json").stdout)
    assert collections.Counter(r["id"] for r in acct) == dict.fromkeys(by_id, 1)
    log = accounting_log(c)
    assert log["E"] == dict.fromkeys(by_id, 1), "E records"
    assert log["Q"] == dict.fromkeys(by_id, 1), "Q records"
    assert log["S"] == {jid: j["reruns"] + 1 for jid, j in by_id.items()}
    assert log["R"] == {jid: j["reruns"] for jid, j in by_id.items() if j["reruns"]}
    c.wait_for(lambda: not c.all_job_procs(), what="no job process left")
    assert logged_errors(c, allowed) == {}
    return jobs


def long_job(c: Cluster, flag: Path, runs: Path, *qsub_args: str) -> str:
    """A job that runs until ``flag`` exists, then appends its id to ``runs``."""
    script = c.work / "long.sh"
    body = f"while [ ! -e {flag} ]; do sleep 0.05; done\necho $PBS_JOBID >> {runs}\n"
    script.write_text("#!/bin/sh\n" + body)
    jid = c.qsub(*qsub_args, str(script))
    c.wait_state(jid, "running")
    c.launched_procs(jid)
    return jid


@pytest.mark.timeout(240)
def test_sigkill_server_scheduler_and_nodes_while_jobs_flow(
    cluster: ClusterFactory,
) -> None:
    nodes = 2
    rng = random.Random(SEED + nodes)
    # 2 CPUs per node (on 2 cores): one for a long job, one for the stream.
    # A short periodic pass is the safety net after restarts.
    names = [f"node{i}" for i in range(nodes)]
    c = cluster(
        nodes=nodes,
        cpus_per_node=2,
        scheduler={"interval": 1.0},
        features={name: [name] for name in names},
    )
    ids, flag = c.work / "ids", c.work / "go"
    long_jobs = {
        node: long_job(c, flag, ids, "-l", f"nodes=1:ppn=1:{node},walltime=600")
        for node in names
    }
    for node, jid in long_jobs.items():
        assert c.job(jid)["node"] == node

    # Each daemon killed several times (each node twice).
    victims = ["server", "scheduler"] * 3 + [f"node-{n}" for n in names] * (4 - nodes)
    rng.shuffle(victims)
    submitter = Submitter(c, ids, SHORT_JOBS, rng.randrange(1 << 30))
    submitter.start()
    readopted: collections.Counter[str] = collections.Counter()
    try:
        for fault, victim in enumerate(victims):
            # Right after a burst, while its jobs start and end (and the next
            # burst may be under way).
            submitter.wait_bursts(fault)
            time.sleep(rng.uniform(0.0, 0.4))
            if victim.startswith("node-"):
                readopted[long_jobs[victim.removeprefix("node-")]] += 1
            kill9(c.pids()[victim])
            time.sleep(rng.uniform(0.1, 1.0))
            report = c.up(wait=60)
            assert report.started == [victim], report
            # c.up() is back before a new node daemon's hello (the server had
            # not noticed the old one died): wait, so that the next fault does
            # not kill it before it has re-adopted its jobs.
            c.wait_for(lambda: registered(c), timeout=30, what="nodes registered")
            submitter.fault_done()
    finally:
        submitter.fault_done(last=True)
        submitter.join(120)
    assert not submitter.is_alive() and submitter.error is None, submitter.error
    assert len(submitter.acked) == SHORT_JOBS

    flag.touch()
    c.wait_for(lambda: drained(c), timeout=120, interval=0.5, what="all jobs ended")
    jobs = check_outcomes(c, [*long_jobs.values(), *submitter.acked], ids)
    assert len(jobs) <= len(long_jobs) + SHORT_JOBS + submitter.unanswered
    # The long jobs ran through every fault: re-adopted by each new daemon of
    # their node, never requeued.
    for node, jid in long_jobs.items():
        record = c.job(jid)
        assert record["reruns"] == 0, record
        assert c.log(f"node-{node}").count(f"job {jid}: re-adopted") == readopted[jid]


# ------------------------------------------------------------ the broker


async def finished_event(c: Cluster, ids: Path) -> dict[str, Any]:
    """Subscribe to the cluster's broker, submit a job, and return its
    ``finished`` event."""
    url = c.paths.mqtt_url_file.read_text().strip()
    host, port = url.removeprefix("mqtt://").rsplit(":", 1)
    async with aiomqtt.Client(host, int(port)) as client:
        await client.subscribe("minibatch/v1/jobs/+/finished")
        jid = await asyncio.to_thread(
            c.qsub, "--", "/bin/sh", "-c", f"echo $PBS_JOBID >> {ids}"
        )
        async with asyncio.timeout(60):
            async for message in client.messages:
                if str(message.topic) == f"minibatch/v1/jobs/{jid}/finished":
                    assert isinstance(message.payload, bytes)
                    payload: dict[str, Any] = json.loads(message.payload)
                    return payload
    raise AssertionError("unreachable")


@pytest.mark.timeout(180)
def test_jobs_run_while_the_broker_is_dead(cluster: ClusterFactory) -> None:
    rng = random.Random(SEED + 1)
    c = cluster(nodes=2, cpus_per_node=1)
    ids = c.work / "ids"
    broker = c.pids()["broker"]
    acked: list[str] = []

    def burst(client: Client) -> None:
        for _ in range(40):
            reply = client.call(Submit(spec=short_spec(c, ids, rng)))
            acked.extend(str(j) for j in reply.ids)
        acked.append(c.qsub("--", "/bin/sh", "-c", f"echo $PBS_JOBID >> {ids}"))
        c.run("qstat", "-a")

    with c.client() as client:
        burst(client)
        # While the burst's events are being published.
        time.sleep(rng.uniform(0.0, 0.3))
        kill9(broker)
        assert "broker" not in c.pids()
        for _ in range(4):
            burst(client)
        c.wait_for(lambda: drained(c), timeout=120, interval=0.5, what="jobs ended")
        assert "broker" not in c.pids(), "the broker came back by itself"
        c.run("qstat", "-x")
        c.run("pbsnodes", "-a")

        report = c.up(wait=60)
        assert report.started == ["broker"], report
        assert c.pids()["broker"] != broker
        burst(client)  # and once it is back
    c.wait_for(lambda: drained(c), timeout=60, interval=0.5, what="all jobs ended")
    check_outcomes(c, acked, ids, allowed=(BROKER_DIED,))


# ------------------------------------------------ found by the tests above


@pytest.mark.timeout(90)
@pytest.mark.parametrize("keeper_too", [False, True], ids=["daemon", "and-keeper"])
def test_a_job_that_ends_while_its_node_daemon_is_dead_runs_once(
    cluster: ClusterFactory, keeper_too: bool
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    runs = c.work / "runs"
    jid = c.qsub("--", "/bin/sh", "-c", f"sleep 1; echo $PBS_JOBID >> {runs}")
    after = c.qsub("-W", f"depend=afterok:{jid}", "--", "touch", str(c.work / "ran"))
    c.wait_state(jid, "running")
    c.launched_procs(jid)
    node = psutil.Process(c.pids()["node-node0"])
    if keeper_too:
        keeper = node.parent()
        assert keeper is not None and "minibatch.node.keeper" in keeper.cmdline()
        kill9(keeper.pid)
    kill9(node.pid)
    # The job ends by itself while no daemon watches it.
    c.wait_for(lambda: not c.job_procs(jid), timeout=30, what="the job's end")
    c.up(wait=60)
    record = c.wait_state(jid, "finished", timeout=60)
    assert "ended while its node daemon was down" in record["comment"], record
    # Run once either way: it did run.
    assert runs.read_text().split() == [jid], c.run("tracejob", jid).stdout
    assert record["reruns"] == 0, record
    if not keeper_too:
        # Its keeper kept how it ended.
        assert (record["result"], record["exit_status"]) == ("completed", 0), record
        assert c.wait_state(after, "finished")["result"] == "completed"
        assert (c.work / "ran").exists()
        return
    # Nobody saw how it ended: not a success (an afterok dependent would run
    # on a failure).
    assert record["result"] == "node_fail", record
    assert record["exit_status"] is None, record
    assert c.wait_state(after, "finished")["result"] == "cancelled"
    assert not (c.work / "ran").exists()


@pytest.mark.timeout(120)
def test_events_flow_again_once_a_killed_broker_is_restarted(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    ids = c.work / "ids"
    # Events on the server's connection: the broker's side of it is in
    # TIME_WAIT once the broker is killed.
    assert asyncio.run(finished_event(c, ids))["result"] == "completed"
    url = c.paths.mqtt_url_file.read_text()
    kill9(c.pids()["broker"])
    assert c.up(wait=60).started == ["broker"]
    assert c.paths.mqtt_url_file.read_text() == url
    assert asyncio.run(finished_event(c, ids))["result"] == "completed"


@pytest.mark.timeout(90)
def test_a_restarted_node_daemon_leaves_other_nodes_jobs_alone(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2, cpus_per_node=1, features={"node1": ["n1"]})
    flag, runs = c.work / "go", c.work / "runs"
    jid = long_job(c, flag, runs, "-l", "nodes=1:ppn=1:n1")
    assert c.job(jid)["node"] == "node1"
    kill9(c.pids()["node-node0"])
    c.up(wait=60)
    c.wait_for(lambda: registered(c), timeout=30, what="node0 registered")
    time.sleep(1.0)  # what the server tells node0 at its hello has happened
    flag.touch()
    record = c.wait_state(jid, "finished", timeout=30)
    assert f"job {jid}" not in c.log("node-node0"), c.log("node-node0")
    assert record["result"] == "completed", record
    assert runs.read_text().split() == [jid]


@pytest.mark.timeout(90)
def test_a_readopted_job_that_ends_before_the_hello_runs_once(
    cluster: ClusterFactory,
) -> None:
    # A longer heartbeat widens the window: the first hello of a new daemon
    # is refused at once (ZMQ_IMMEDIATE, not connected yet) and sent again a
    # heartbeat later.
    c = cluster(nodes=1, cpus_per_node=1, node={"heartbeat": 3.0})
    flag, runs = c.work / "go", c.work / "runs"
    jid = long_job(c, flag, runs)
    kill9(c.pids()["node-node0"])
    c.up(wait=60)  # returns at once: the server has not noticed the node died
    c.wait_for(
        lambda: f"job {jid}: re-adopted" in c.log("node-node0"), what="re-adoption"
    )
    flag.touch()
    record = c.wait_state(jid, "finished", timeout=30)
    assert runs.read_text().split() == [jid], c.run("tracejob", jid).stdout
    assert record["reruns"] == 0 and record["result"] == "completed", record
