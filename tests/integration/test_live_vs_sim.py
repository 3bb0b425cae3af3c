"""A real live run, exported with ``mb acct --swf`` and replayed with ``mb compare
--live-vs-sim``: the whole path a user takes to compare a cluster with the
simulator.

The workload runs on one CPU and the first job waits on a file the test creates,
so the order is fixed (the others queue behind it) however busy the machine is;
only orders and the export's own rounding are asserted, never durations. Every
job runs for a second at least: SWF has whole seconds, and the simulator's job
filter drops a job whose run time rounds to 0 (docs/simulator.md).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import psutil
import pytest
from conftest import ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def swf_jobs(text: str) -> dict[int, list[float]]:
    """The SWF's job lines by job id (the 18 fields, as numbers)."""
    jobs = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(";"):
            fields = [float(f) for f in line.split()]
            assert len(fields) == 18, line
            jobs[int(fields[0])] = fields
    return jobs


def test_acct_swf_of_a_live_run_replays_in_mb_compare(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    gate = c.work / "go"
    first = c.qsub(
        "-N",
        "first",
        "--",
        "sh",
        "-c",
        # At least a second: a run of 0 whole seconds is not a job to replay.
        f"sleep 1; while [ ! -e {gate} ]; do sleep 0.05; done",
    )
    c.wait_state(first, "running")
    second = c.qsub("-N", "second", "-l", "walltime=60", "--", "sleep", "1")
    fails = c.qsub("-N", "fails", "--", "sh", "-c", "sleep 1; exit 3")
    third = c.qsub("-N", "third", "-l", "ncpus=1,walltime=30", "--", "sleep", "1")
    never = c.qsub("-h", "-N", "never", "--", "true")
    c.run("qdel", never)
    gate.touch()
    for job in (first, second, third):
        assert c.wait_state(job, "finished", timeout=30)["result"] == "completed"
    assert c.wait_state(fails, "finished", timeout=30)["result"] == "failed"
    live = {j: c.job(j) for j in (first, second, fails, third, never)}

    swf = c.run("mb", "acct", "--swf").stdout
    header = {
        key.strip(): value.strip()
        for key, _, value in (
            line[1:].partition(":") for line in swf.splitlines() if line[:1] == ";"
        )
    }
    assert header["MinibatchNodes"] == "node0:1", header
    assert header["MaxProcs"] == "1"
    origin = min(r["submit_time"] for r in live.values())
    assert int(header["UnixStartTime"]) == int(origin)
    rows = swf_jobs(swf)
    assert sorted(rows) == sorted(int(j) for j in live)
    # Status (field 11): 1 completed, 0 failed, 5 cancelled; never started: -1s.
    status = {str(k): int(v[10]) for k, v in rows.items()}
    assert status == {first: 1, second: 1, third: 1, fails: 0, never: 5}
    assert rows[int(never)][2:5] == [-1, -1, -1]
    for job in (first, second, fails, third):
        record, fields = live[job], rows[int(job)]
        # Whole seconds, each field rounded on its own: within a second.
        assert abs(fields[1] - (record["submit_time"] - origin)) <= 0.5
        recorded_start = fields[1] + fields[2]
        assert abs(recorded_start - (record["start_time"] - origin)) <= 1.0
        assert fields[4] == 1 and fields[7] == 1  # allocated and requested CPUs
    # Sub-second times, when asked for: exact to the millisecond.
    fine = swf_jobs(c.run("mb", "acct", "--swf", "--swf-decimals", "3").stdout)
    for job in (first, second, fails, third):
        record, fields = live[job], fine[int(job)]
        assert fields[1] + fields[2] == pytest.approx(
            record["start_time"] - origin, abs=0.002
        )
        assert fields[3] == pytest.approx(
            record["end_time"] - record["start_time"], abs=0.002
        )
    trace = tmp_path / "live.swf"
    trace.write_text(swf)

    out = tmp_path / "replay"
    proc = c.run(
        "mb", "compare", str(trace), "--live-vs-sim", "--policy", "easy",
        "--out", str(out), "--no-plots", "--no-progress", timeout=60,
    )  # fmt: skip
    assert "easy: simulated vs recorded start" in proc.stdout, proc.stdout
    stats = json.loads((out / "live_vs_sim.json").read_text())
    ran = [first, second, fails, third]
    assert stats["jobs"] == len(ran), stats
    with (out / "starts.csv").open() as f:
        starts = {row["job"]: row for row in csv.DictReader(f)}
    assert sorted(starts) == sorted(ran)
    for job, row in starts.items():
        assert float(row["trace_start"]) == rows[int(job)][1] + rows[int(job)][2]
        assert float(row["delta"]) == pytest.approx(
            float(row["sim_start"]) - float(row["trace_start"])
        )
    # One CPU: the replay runs them one at a time, in the order they ran live.
    with (out / "jobs.csv").open() as f:
        replay = sorted(csv.DictReader(f), key=lambda r: float(r["start"]))
    assert [r["job"] for r in replay] == sorted(
        ran, key=lambda j: live[j]["start_time"]
    )
    for before, after in zip(replay, replay[1:], strict=False):
        assert float(before["end"]) <= float(after["start"]), (before, after)
    for r in replay:
        assert float(r["start"]) >= float(r["submit"])


def test_a_node_down_and_unused_is_not_part_of_the_exported_machine(
    cluster: ClusterFactory,
) -> None:
    # Left down by an earlier layout, say: replaying on it would add a CPU.
    c = cluster(
        nodes=2,
        cpus_per_node=1,
        features={"node0": ["here"]},
        server={"node_timeout": 2.0},
    )
    jid = c.qsub("-l", "nodes=1:ppn=1:here", "--", "sleep", "1")
    c.wait_state(jid, "completed")
    node1 = c.pids()["node-node1"]
    # Held before the kill: its keeper reaps it at once.
    victim = psutil.Process(node1)
    victim.kill()
    victim.wait(5)
    c.wait_for(lambda: c.nodes()["node1"].state == "down", what="node1 down")
    swf = c.run("mb", "acct", "--swf").stdout
    assert "; MinibatchNodes: node0:1\n" in swf, swf
    assert "; MaxProcs: 1\n" in swf, swf
