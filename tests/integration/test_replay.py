"""``mb replay``: the first jobs of a real trace (SDSC-SP2), 10,000 times faster,
run on a live cluster of two 1-CPU nodes, then scored against the simulator.

What is asserted is what the cluster recorded: each trace job the simulator
keeps for these nodes became one live job, named after it and charged to its
trace user, that held its requested CPUs, ran the job program to its end and
completed; the export and the comparison cover exactly those jobs. Durations
are only bounded from below (a sleep never ends early), never windowed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import ClusterFactory

from minibatch.sim.machine import Machine, NodeSpec
from minibatch.sim.swf import read_swf, select_jobs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRACE = "SDSC-SP2-1998-4.2-cln.swf.gz"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_trace_replayed_live_and_scored(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    out = tmp_path / "replay"
    proc = c.run(
        "mb", "replay", TRACE, "--speedup", "10000", "--limit", "4",
        "--out", str(out), timeout=90,
    )  # fmt: skip
    machine = Machine(nodes=(NodeSpec("node0", 1), NodeSpec("node1", 1)))
    kept = select_jobs(read_swf(TRACE), machine, limit=4)
    mapping = read_csv(out / "replay.csv")
    assert [int(m["trace_job"]) for m in mapping] == [j.id for j in kept]
    live = [m["job"] for m in mapping]
    assert len(set(live)) == len(kept)
    for row, trace_job in zip(mapping, kept, strict=True):
        job = c.job(row["job"])
        assert job["name"] == f"trace{trace_job.id}"
        assert job["account"] == f"trace-user-{trace_job.user}"
        assert (job["state"], job["result"]) == ("finished", "completed"), job
        assert job["exit_status"] == 0
        held = [cpu for alloc in job["alloc"] for cpu in alloc["cpus"]]
        assert len(held) == trace_job.procs == 1
        assert job["end_time"] - job["start_time"] >= float(row["run_s"])
        output = (out / "output").glob(f"trace{trace_job.id}.o{row['job']}")
        text = next(output).read_text()
        assert f"done seconds={row['run_s']}" in text, text
    # The progress line counted them all, and the comparison is of those jobs.
    assert "4/4 submitted, 0 queued, 0 running, 4 finished" in proc.stderr
    assert "simulated vs recorded start" in proc.stdout, proc.stdout
    swf_ids = [
        line.split()[0]
        for line in (out / "live.swf").read_text().splitlines()
        if line and not line.startswith(";")
    ]
    assert sorted(swf_ids) == sorted(live)
    assert sorted(r["job"] for r in read_csv(out / "starts.csv")) == sorted(live)
    stats = json.loads((out / "live_vs_sim.json").read_text())
    assert stats["jobs"] == len(kept)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "easy"  # the cluster's own, by default


def test_bad_input_is_refused_before_any_job(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    c = cluster(nodes=1, cpus_per_node=1)
    not_swf = tmp_path / "notes.swf"
    not_swf.write_text("; a header\nthis is not a job\n")
    cases = [
        ((TRACE, "--speedup", "0"), "--speedup must be a positive number"),
        ((TRACE, "--speedup", "-5"), "--speedup must be a positive number"),
        (("no-such-trace.swf",), "trace 'no-such-trace.swf' not found"),
        ((str(not_swf),), f"{not_swf} is not an SWF trace: SWF line has 5 fields"),
        ((TRACE, "--limit", "2", "--policy", "nosuch"), "unknown policy 'nosuch'"),
        ((TRACE, "--limit", "2", "--param", "bogus=1"), "bad parameters"),
        ((TRACE, "--policy", "nosuch:Policy"), "cannot load policy 'nosuch:Policy'"),
    ]
    for args, message in cases:
        proc = c.run("mb", "replay", *args, "--out", str(tmp_path / "o"), check=False)
        assert proc.returncode == 2, proc
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc
    assert c.jobs() == []
    assert not (tmp_path / "o").exists()


def test_no_cluster(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = cluster(nodes=1, start=False)
    proc = c.run("mb", "replay", TRACE, "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 1
    assert "mb up" in proc.stderr and "Traceback" not in proc.stderr
