"""Maui's side of a real cluster: reservations, QOS, the Maui views, live policy.

Every test starts real daemons and drives them with the real commands
(``setres``, ``showq``, ``mb policy`` ...). Requests ``nobody`` may not make are
sent from a child process that became ``nobody`` (see test_cluster_identity).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.protocol.messages import (
    QueryReservations,
    ReleaseReservation,
    SetPolicy,
    SetReservation,
)
from tests.integration.conftest import Cluster, ClusterFactory, toml_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROOT = os.geteuid() == 0


@pytest.fixture
def shared() -> Iterator[Callable[..., Cluster]]:
    """Clusters whose home other users can traverse (so nobody reaches the socket)."""
    made: list[Cluster] = []

    def factory(nodes: int = 2, policy: str = "easy", **config: Any) -> Cluster:
        home = Path(tempfile.mkdtemp(prefix="mb-maui-", dir="/tmp"))
        home.chmod(0o755)
        cpus = usable_cpus()
        layout = plan_nodes(nodes, 1, cpus, nodes > len(cpus), None)
        c = Cluster(home, layout, True)
        made.append(c)
        c.paths.config.write_text(toml_text(policy, config))
        c.up()
        return c

    try:
        yield factory
    finally:
        for c in made:
            c.teardown()
            shutil.rmtree(c.home, ignore_errors=True)


def refused_for_nobody(c: Cluster, message: Any) -> str:
    """Send ``message`` as nobody; it must be refused for permission. The text."""
    from tests.integration.test_cluster_identity import as_nobody

    kind, value = as_nobody(c.endpoint, message)
    assert kind == "error", value
    assert value[0] == 7, value  # ErrorCode.PERMISSION
    return str(value[1])


def sh(seconds: float) -> list[str]:
    return ["--", "sleep", str(seconds)]


# ------------------------------------------------------------ reservations


def test_setres_showres_releaseres_permissions_and_restart(shared) -> None:
    c = shared(nodes=2, scheduler={"interval": 1.0})
    out = c.run("setres", "-u", "root", "-s", "+1:00:00", "-d", "30:00", "-c", "1")
    assert re.match(r"reservation 'root\.1' created on 1 node \(1 tasks\)", out.stdout)
    shown = c.run("showres").stdout
    assert "root.1" in shown and "User I" in shown and "1 reservation located" in shown
    assert "users: root" in shown
    bad = c.run("setres", "-d", "10:00", "-c", "5", check=False)
    assert bad.returncode == 1 and "cannot reserve 5 CPUs" in bad.stderr
    if ROOT:
        start = time.time() + 3600
        why = refused_for_nobody(c, SetReservation(start=start, duration=60, cpus=1))
        assert "only operators may create reservations" in why
        refused_for_nobody(c, ReleaseReservation(names=["root.1"]))

    # A reservation is state: it survives a SIGKILL of the server.
    server = c.pids()["server"]
    proc = psutil.Process(server)
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)
    assert c.up().started == ["server"]
    assert "root.1" in c.run("showres", "root.1").stdout

    # Running jobs that would overlap a window make setres fail, naming them.
    job = c.qsub("-l", "walltime=00:10:00,nodes=1:ppn=1", *sh(30))
    other = c.qsub("-l", "walltime=00:10:00,nodes=1:ppn=1", *sh(30))
    c.wait_state(job, "running")
    c.wait_state(other, "running")
    busy = c.run("setres", "-s", "+00:01:00", "-d", "60", "-n", "1", check=False)
    assert busy.returncode == 1
    assert re.search(r"held by job \d+ until", busy.stderr), busy.stderr
    released = c.run("releaseres", "root.1").stdout
    assert "released User reservation 'root.1'" in released
    assert "0 reservations located" in c.run("showres").stdout
    gone = c.run("releaseres", "root.1", check=False)
    assert gone.returncode == 1 and "unknown reservation 'root.1'" in gone.stderr


def test_downtime_keeps_jobs_off_and_short_jobs_fill_the_gap(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    c.run("setres", "-s", "+00:00:06", "-d", "5", "-n", "node0", "-N", "maint")
    with c.client() as client:
        (window,) = client.call(QueryReservations(names=["maint"])).reservations
    long_job = c.qsub("-l", "walltime=00:00:20", *sh(0.5))
    short = c.qsub("-l", "walltime=00:00:02", *sh(0.2))
    done = c.wait_state(short, "completed", timeout=30)
    assert done["end_time"] <= window.start  # it filled the gap before the window
    assert c.job(long_job)["state"] == "queued"
    shown = c.run("showres", "-n").stdout
    assert re.search(r"node0 +System +maint +1 ", shown), shown
    # It starts once the window is over (and not before: its 20 s would cross it).
    started = c.wait_state(long_job, "running", timeout=40)
    assert started["start_time"] >= window.end


def test_advres_job_runs_inside_its_reservation(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2)
    c.run("setres", "-u", "root", "-s", "+00:00:02", "-d", "60", "-c", "1", "-N", "lab")
    shown = c.run("showres", "lab").stdout
    node, cpus = re.search(r"CPUs: (node\d):(\S+)", shown).groups()
    unknown = c.run("qsub", "-l", "advres=nope", *sh(1), check=False)
    assert unknown.returncode == 1 and "unknown reservation 'nope'" in unknown.stderr
    too_long = c.run("qsub", "-l", "advres=lab,walltime=2:00:00", *sh(1), check=False)
    assert too_long.returncode == 1 and "longer than" in too_long.stderr
    inside = c.qsub("-l", "advres=lab,walltime=00:00:20", *sh(1))
    outside = c.qsub("-l", "walltime=00:05:00", *sh(5))
    # The job outside may not use the reserved CPU during the window.
    run_out = c.wait_state(outside, "running")
    assert run_out["hosts"] != [node]
    run_in = c.wait_state(inside, "running", timeout=10)
    assert run_in["hosts"] == [node]
    assert ",".join(map(str, run_in["cpus"])) == cpus.replace("-", ",")
    with c.client() as client:
        (resv,) = client.call(QueryReservations(names=["lab"])).reservations
    assert run_in["start_time"] >= resv.start
    checked = c.run("checkjob", outside).stdout
    assert "State: Running" in checked and "PSP: bin" in checked


# ------------------------------------------------------------------ views


def test_showq_showstart_showbf(cluster: ClusterFactory) -> None:
    c = cluster(
        nodes=2,
        qos=[{"name": "debug", "max_jobs_per_user": 1}],
    )
    running = c.qsub("-N", "runner", "-l", "walltime=00:01:00,qos=debug", *sh(30))
    c.wait_state(running, "running")
    wide = c.qsub("-l", "nodes=2:ppn=1,walltime=00:00:30", *sh(1))
    held = c.qsub("-h", *sh(1))
    dep = c.qsub("-W", f"depend=afterok:{running}", *sh(1))
    throttled = c.qsub("-l", "qos=debug", *sh(1))
    c.wait_for(lambda: c.job(wide)["predicted_start"], what="a predicted start")
    out = c.run("showq").stdout
    active, eligible, blocked = re.split(r"\n(?=ELIGIBLE JOBS|BLOCKED JOBS)", out)
    assert re.search(rf"\b{running}\s+root\s+Running\s+1\b", active)
    assert "1 Active Job " in active and "1 of     2 Processors Active" in active
    assert re.search(rf"\b{wide}\s+root\s+Idle\s+2\s+00:00:30 .*reserved", eligible)
    assert re.search(rf"\b{held}\s+root\s+UserHold", blocked)
    assert re.search(rf"\b{dep}\s+root\s+Depend .*dependency on {running}", blocked)
    assert re.search(rf"\b{throttled}\s+root\s+Idle .*blocked by QOS 'debug'", blocked)
    assert "Total Jobs: 5   Active Jobs: 1   Eligible Jobs: 1   Blocked Jobs: 3" in out

    start = c.run("showstart", wide).stdout
    assert start.startswith(f"job {wide} requires 2 procs for 00:00:30")
    predicted = c.job(wide)["predicted_start"]
    assert f"on {time.strftime('%a %b %e %H:%M', time.localtime(predicted))}" in start
    assert "Earliest start in" in start
    none = c.run("showstart", held).stdout
    assert "no start time predicted" in none and "held" in none

    bf = c.run("showbf").stdout
    assert re.search(r"1 proc +available with no timelimit", bf), bf
    # 00:01:00 when showbf runs within half a second of the runner's start.
    assert re.search(r"1 more in +00:(00:[0-5]\d|01:00)", bf), bf
    prio = c.run("diagnose", "-p").stdout
    assert "Serv(QTime)" in prio and re.search(rf"^{wide}\s", prio, re.M)
    assert "FS Policy: DEDICATEDPS" in c.run("diagnose", "-f").stdout
    checked = c.run("checkjob", wide).stdout
    assert "StartPriority:" in checked and "Reservation: starts in" in checked


def test_qos_is_validated_and_its_priority_orders_the_queue(
    cluster: ClusterFactory,
) -> None:
    c = cluster(
        nodes=1,
        policy="minibatch.policy.priority:Maui",
        scheduler={"params": {"qosweight": 1.0}},
        default_qos="normal",
        qos=[
            {"name": "normal"},
            {"name": "high", "priority": 1000.0},
            {"name": "short", "max_walltime": "00:01:00"},
        ],
    )
    unknown = c.run("qsub", "-h", "-l", "qos=gold", *sh(1))
    assert "QOS gold does not exist here" in unknown.stderr  # the default, noted
    assert c.job(unknown.stdout.strip())["qos"] == "normal"
    c.run("qdel", unknown.stdout.strip())
    long_ = c.run("qsub", "-l", "qos=short,walltime=00:02:00", *sh(1), check=False)
    assert (
        long_.returncode == 1 and "exceeds the maximum of QOS 'short'" in long_.stderr
    )
    assert c.jobs(finished=False) == []
    blocker = c.qsub("-l", "walltime=00:00:10", *sh(1.5))
    c.wait_state(blocker, "running")
    low = c.qsub("-l", "walltime=00:00:10", *sh(0.1))
    high = c.qsub("-l", "qos=high,walltime=00:00:10", *sh(0.1))
    done_low = c.wait_state(low, "completed", timeout=15)
    done_high = c.wait_state(high, "completed", timeout=15)
    assert done_high["start_time"] < done_low["start_time"]


# ------------------------------------------------------------ live policy


def test_policy_switch_applies_from_the_next_pass(shared) -> None:
    c = shared(nodes=2, scheduler={"interval": 1.0})
    assert "policy:     easy" in c.run("mb", "policy", "show").stdout
    bad = c.run("mb", "policy", "set", "nope", check=False)
    assert bad.returncode == 1 and "unknown policy 'nope'" in bad.stderr
    badp = c.run("mb", "policy", "set", "fifo", "--param", "depth=2", check=False)
    assert badp.returncode == 1 and "bad parameters for policy 'fifo'" in badp.stderr
    if ROOT:
        refused_for_nobody(c, SetPolicy(name="fifo"))

    long_job = c.qsub("-l", "walltime=00:01:00", *sh(30))
    c.wait_state(long_job, "running")
    assert c.run("mb", "policy", "set", "fifo").stdout.strip() == "policy set to fifo"
    c.wait_for(
        lambda: "scheduler:  fifo" in c.run("mb", "policy", "show").stdout,
        what="the scheduler to switch",
    )
    head = c.qsub("-l", "nodes=2:ppn=1,walltime=00:00:30", *sh(1))
    small = c.qsub("-l", "walltime=00:00:05", *sh(1))
    # fifo: nothing passes the blocked head, though the small job would fit.
    c.wait_for(lambda: c.job(small)["reason"] not in ("", "waiting for the scheduler"))
    time.sleep(1.5)
    record = c.job(small)
    assert record["state"] == "queued", record
    assert "fifo" in record["reason"], record
    c.run("mb", "policy", "set", "easy")
    assert c.wait_state(small, "running")["hosts"], "easy backfills the small job"
    assert c.job(head)["state"] == "queued"
    shown = c.run("mb", "policy", "show", "--json").stdout
    assert '"name": "easy"' in shown and '"set_by": "root"' in shown
