"""A scheduler killed with SIGKILL and started again (``mb up``): what was
submitted while it was gone is scheduled after the restart, what ran keeps
running, and no job is started twice.

Every job appends its id to one log when it starts, so a second start of any job
shows as a second line, whatever the server's records say.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def kill9(pid: int) -> None:
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)  # reaps it when it is our child, as lifecycle's daemons are


def logged(c: Cluster, name: str, gate: Path | None = None) -> str:
    """Submit a job that logs its start, then waits for ``gate`` if given."""
    log = c.work / "starts.log"
    script = f'echo "$MB_JOBID" >> {log}'
    if gate is not None:
        script += f"; while [ ! -e {gate} ]; do sleep 0.05; done"
    return c.qsub("-N", name, "--", "sh", "-c", script)


def starts(c: Cluster) -> list[str]:
    log = c.work / "starts.log"
    return log.read_text().split() if log.exists() else []


def started_once(c: Cluster, job: str) -> None:
    record = c.job(job)
    assert record["reruns"] == 0, record
    events = c.run("tracejob", job).stdout
    assert events.count("started") == 1, events
    assert starts(c).count(job) == 1, (job, starts(c))


def test_jobs_submitted_while_the_scheduler_is_dead_run_after_its_restart(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=2)
    gate1, gate2 = c.work / "gate1", c.work / "gate2"
    r1 = logged(c, "r1", gate1)
    r2 = logged(c, "r2", gate2)
    for job in (r1, r2):
        c.wait_state(job, "running")
    c.wait_for(lambda: sorted(starts(c)) == sorted([r1, r2]), what="both logged")

    old = c.pids()["scheduler"]
    kill9(old)
    assert "scheduler" not in c.pids()
    late = [logged(c, f"late{i}") for i in range(3)]
    gate1.touch()  # a CPU frees up while nobody schedules
    assert c.wait_state(r1, "finished", timeout=30)["result"] == "completed"
    for job in late:
        record = c.job(job)
        assert record["state"] == "queued" and record["start_time"] is None, record

    restarted = time.time()
    report = c.up()
    assert report.started == ["scheduler"], report
    assert c.pids()["scheduler"] != old
    for job in late:
        record = c.wait_state(job, "finished", timeout=30)
        assert record["result"] == "completed", record
        assert record["start_time"] >= restarted, (record, restarted)
    # The job that ran through the restart was left alone (started_once below
    # checks it was not started again).
    record = c.job(r2)
    assert record["state"] == "running" and record["start_time"] < restarted
    gate2.touch()
    assert c.wait_state(r2, "finished", timeout=30)["result"] == "completed"
    for job in (r1, r2, *late):
        started_once(c, job)
    assert sorted(starts(c)) == sorted([r1, r2, *late])
    assert c.all_job_procs() == []


def test_a_scheduler_killed_mid_burst_starts_nothing_twice(
    cluster: ClusterFactory,
) -> None:
    """Killed right after a burst of submissions (most likely in the middle of a
    pass, between its snapshot and its plan), twice over."""
    c = cluster(nodes=2)
    jobs: list[str] = []
    for round_ in range(2):
        jobs += [logged(c, f"b{round_}-{i}") for i in range(6)]
        kill9(c.pids()["scheduler"])
        assert c.up().started == ["scheduler"]
    for job in jobs:
        assert c.wait_state(job, "finished", timeout=60)["result"] == "completed"
    for job in jobs:
        started_once(c, job)
    assert sorted(starts(c)) == sorted(jobs)
    log = c.log("server")
    assert "Traceback" not in log, log
