"""Predicted starts in jobs.csv: the policy's at submission, and the submit time
of a job started then (so the prediction metric covers every job a policy can
say something of)."""

from __future__ import annotations

from pathlib import Path

from minibatch.metrics.records import read_csv
from minibatch.sim.runner import MachineSpec, SimConfig, simulate, write_run
from minibatch.sim.swf import find_trace

TRACE = str(find_trace("SDSC-SP2-1998-4.2-cln.swf.gz"))


def run(policy: str, out: Path):
    config = SimConfig(
        trace=TRACE, policy=policy, machine=MachineSpec(procs=128), limit=400
    )
    result = simulate(config)
    jobs_csv, _ = write_run(result, out)
    return result.summary, read_csv(jobs_csv)


def test_conservative_gives_every_job_in_jobs_csv_a_predicted_start(tmp_path):
    summary, rows = run("conservative", tmp_path)
    assert len(rows) == 400
    assert all(r.predicted_start is not None for r in rows)
    at_once = [r for r in rows if r.start == r.submit]
    assert at_once and all(r.predicted_start == r.submit for r in at_once)
    assert summary["predicted_jobs"] == 400


def test_easy_predicts_for_jobs_started_at_submission_and_for_heads(tmp_path):
    summary, rows = run("easy", tmp_path)
    for r in rows:
        if r.start == r.submit:
            assert r.predicted_start == r.submit
    predicted = [r for r in rows if r.predicted_start is not None]
    heads = [r for r in predicted if r.start != r.submit]
    # A head may be predicted "now" (its shadow is an overdue job's end).
    assert heads and all(r.predicted_start >= r.submit for r in heads)
    assert summary["predicted_jobs"] == len(predicted)
