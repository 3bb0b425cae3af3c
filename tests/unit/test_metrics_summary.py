"""User-agnostic metrics, groupings, records from live jobs and jobs.csv."""

from __future__ import annotations

import math

import msgspec
import pytest

from minibatch.core.job import Allocation, Job, JobRequest, JobResult, JobState
from minibatch.metrics.records import JobRecord, from_jobs, read_csv, write_csv
from minibatch.metrics.summary import (
    bounded_slowdown,
    describe,
    per_group,
    percentile,
    slowdown,
    summarize,
    utilization,
    utilization_series,
)


def rec(job, submit, start, end, procs=1, user="u", queue="1") -> JobRecord:
    return JobRecord(
        job=job,
        user=user,
        submit=submit,
        start=start,
        end=end,
        procs=procs,
        req_time=end - start,
        queue=queue,
    )


def test_percentiles_interpolate_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)  # numpy.percentile: 7.6
    assert percentile(values, 100) == 10.0
    stats = describe([10.0, 1.0, 4.0, 3.0, 2.0])
    assert (stats.mean, stats.median, stats.max) == (4.0, 3.0, 10.0)
    assert math.isnan(describe([]).mean)


def test_slowdowns_follow_their_definitions():
    short = rec(1, 0, 100, 102)  # waited 100 s, ran 2 s
    assert slowdown(short) == 51.0  # 102 / 2
    assert bounded_slowdown(short) == pytest.approx(10.2)  # 102 / max(2, 10)
    assert bounded_slowdown(rec(2, 0, 0, 5)) == 1.0  # never below 1
    instant = rec(3, 0, 4, 4)  # a live job that ended at once
    assert slowdown(instant) == 4.0  # run floored at 1 s


def test_summary_of_a_small_run():
    records = [
        rec(1, 0, 0, 10, procs=2),
        rec(2, 0, 10, 20, procs=2),
        rec(3, 5, 10, 30, procs=1),
    ]
    s = summarize(records, capacity=4)
    assert s["jobs"] == 3
    assert s["mean_wait_s"] == 5.0  # waits 0, 10, 5
    assert s["median_wait_s"] == 5.0 and s["max_wait_s"] == 10.0
    assert s["mean_response_s"] == pytest.approx((10 + 20 + 25) / 3)
    assert s["makespan_s"] == 30.0
    # 2*10 + 2*10 + 1*20 processor-seconds out of 4 x 30.
    assert s["utilization"] == pytest.approx(60 / 120)
    assert s["throughput_jobs_per_h"] == pytest.approx(3 / 30 * 3600)
    assert math.isnan(summarize(records, capacity=None)["utilization"])
    assert s["predicted_jobs"] == 0 and math.isnan(s["mean_abs_prediction_error_s"])


def test_prediction_error_covers_the_jobs_with_a_predicted_start():
    started_at_once = msgspec.structs.replace(rec(1, 0, 0, 10), predicted_start=0.0)
    reserved = msgspec.structs.replace(rec(2, 0, 10, 20), predicted_start=16.0)
    unknown = rec(3, 5, 10, 30)
    s = summarize([started_at_once, reserved, unknown], capacity=4)
    assert s["predicted_jobs"] == 2
    assert s["mean_abs_prediction_error_s"] == 3.0  # |0 - 0| and |10 - 16|
    assert s["median_abs_prediction_error_s"] == 3.0


def test_utilization_series_integrates_exactly():
    records = [rec(1, 0, 0, 10, procs=2), rec(2, 0, 5, 15, procs=2)]
    starts, busy = utilization_series(records, capacity=4, bins=3)
    assert starts == [0.0, 5.0, 10.0]
    assert busy == [0.5, 1.0, 0.5]
    assert math.fsum(b * 5 * 4 for b in busy) == utilization(records, 4) * 4 * 15


def test_groups_by_user_class_and_size():
    records = [
        rec(1, 0, 0, 10, procs=1, user="10", queue="2"),
        rec(2, 0, 10, 20, procs=64, user="2", queue="2"),
        rec(3, 0, 30, 40, procs=8, user="10", queue="3"),
    ]
    users = per_group(records, "user", eet={1: 10, 2: 15, 3: 40})
    assert [r["user"] for r in users] == ["2", "10"]  # numeric order
    assert users[0]["veet_pct"] == 100.0 and users[0]["wt_cpu_s"] == 64 * 5
    assert users[1]["jobs"] == 2 and users[1]["mean_wait_s"] == 15.0
    assert users[1]["veet_pct"] == 0.0
    classes = per_group(records, "class")
    assert [(r["class"], r["jobs"]) for r in classes] == [("2", 2), ("3", 1)]
    sizes = per_group(records, "size")
    assert [r["size"] for r in sizes] == ["1", "17-64", "5-16"]
    with pytest.raises(ValueError, match="unknown grouping"):
        per_group(records, "colour")


def test_jobs_csv_round_trip(tmp_path):
    records = [
        JobRecord(
            job=7,
            user="alice",
            submit=0.0,
            start=12.5,
            end=40.0,
            procs=4,
            req_time=60.0,
            group="g",
            queue="3",
            mem_kb=2048,
            nodes=("n0", "n1"),
            predicted_start=10.0,
            trace_start=11.0,
        ),
        rec(8, 1, 1, 2),
    ]
    path = tmp_path / "jobs.csv"
    write_csv(path, records, eet={7: 33.0})
    header, first, second = path.read_text().splitlines()
    assert header.startswith(
        "job,user,submit,start,end,procs,req_time,run_time,wait,predicted_start,eet"
    )
    assert first.startswith("7,alice,0,12.5,40,4,60,27.5,12.5,10,33,g,3,2048,n0+n1,11")
    assert second.split(",")[9:11] == ["", ""]  # no prediction, no EET
    assert read_csv(path) == records


def test_records_from_live_jobs_skip_jobs_that_never_ran():
    def job(id, start, end, alloc):
        return Job(
            id=id,
            name="j",
            user="bob",
            uid=1,
            gid=1,
            group="g",
            workdir="/",
            request=JobRequest(nodes=2, ppn=2, walltime=300, mem_kb=100),
            submit_time=100.0,
            state=JobState.FINISHED,
            result=JobResult.COMPLETED,
            start_time=start,
            end_time=end,
            alloc=alloc,
            first_predicted_start=None if start is None else 100.0,
        )

    jobs = [
        job(2, 105.0, 130.0, [Allocation("n0", [0, 1]), Allocation("n1", [2, 3])]),
        job(1, None, None, []),
    ]
    (r,) = from_jobs(jobs)
    assert (r.job, r.user, r.procs, r.req_time, r.nodes) == (
        2,
        "bob",
        4,
        300,
        ("n0", "n1"),
    )
    assert (r.wait, r.run_time, r.response) == (5.0, 25.0, 30.0)
    assert r.predicted_start == 100.0  # the first plan's, kept after the end
