"""SWF reading, the job filter, and the export of live runs."""

from __future__ import annotations

import gzip

import pytest

from minibatch.core.job import (
    Allocation,
    Dependency,
    DependKind,
    Job,
    JobRequest,
    JobResult,
    JobState,
)
from minibatch.errors import InvalidArgument
from minibatch.sim.machine import Machine
from minibatch.sim.swf import (
    Estimates,
    MemoryUnit,
    export_swf,
    machine_nodes_from_header,
    parse_line,
    parse_swf,
    read_swf,
    select_jobs,
)

HEADER = """; Version: 2.2
; Computer: test machine
; MaxNodes: 16
; MaxProcs: 64
; Note: a note: with a colon
"""


def line(
    job: int,
    submit: float,
    run: float,
    alloc: int,
    req_procs: int = -1,
    req_time: float = -1,
    req_mem: float = -1,
    user: int = 1,
    wait: float = -1,
    queue: int = 1,
) -> str:
    fields = [job, submit, wait, run, alloc, -1, -1, req_procs, req_time, req_mem]
    fields += [1, user, 1, -1, queue, -1, -1, -1]
    return " ".join(str(f) for f in fields)


def test_parse_line_reads_all_18_fields_in_order():
    rec = parse_line("7 100 20 300 4 250.5 1024 8 3600 2048 1 42 3 9 2 1 5 60")
    assert rec == (
        7,
        100,
        20,
        300,
        4,
        250.5,
        1024,
        8,
        3600,
        2048,
        1,
        42,
        3,
        9,
        2,
        1,
        5,
        60,
    )
    assert rec.req_procs == 8 and rec.req_time == 3600 and rec.user == 42
    assert rec.queue == 2 and rec.preceding_job == 5 and rec.think_time == 60


@pytest.mark.parametrize(
    "bad",
    [
        "1 2 3",
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 x",
        "1 nan 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18",  # a simulation never ends
        "1 2 3 inf 5 6 7 8 9 10 11 12 13 14 15 16 17 18",
    ],
)
def test_malformed_lines_are_refused_with_the_line(bad):
    with pytest.raises(InvalidArgument, match="SWF line"):
        parse_line(bad)


def test_header_gives_the_machine_size_and_keeps_comments():
    trace = parse_swf((HEADER + line(1, 0, 10, 1)).splitlines())
    assert trace.machine_procs() == 64
    assert trace.header["Computer"] == "test machine"
    assert "Note: a note: with a colon" in trace.comments
    only_nodes = parse_swf(["; MaxNodes: 128", line(1, 0, 10, 1)])
    assert only_nodes.machine_procs() == 128
    assert parse_swf([line(1, 0, 10, 1)]).machine_procs() is None


def test_plain_and_gzip_files_read_the_same(tmp_path):
    text = HEADER + "\n".join(line(i, i * 10, 5, 1) for i in range(1, 6)) + "\n"
    plain = tmp_path / "t.swf"
    plain.write_text(text)
    packed = tmp_path / "t.swf.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_swf(plain).records == read_swf(packed).records
    assert len(read_swf(packed).records) == 5
    with pytest.raises(InvalidArgument, match="missing.swf.* not found"):
        read_swf(tmp_path / "missing.swf")


def test_filter_rules():
    records = parse_swf(
        [
            line(1, 1000, 0, 4),  # run 0: dropped
            line(2, 1010, -1, 4),  # run unknown: dropped
            line(3, 1020, 50, 4, req_procs=8, req_time=100),  # requested procs win
            line(4, 1030, 50, 0, req_procs=-1),  # no processors: dropped
            line(5, 1040, 50, 65),  # wider than the machine: dropped
            line(6, 1050, 70, 64),  # exactly the machine: kept
            line(7, 1005, 30, 2, req_time=-1),  # no requested time: the run time
        ]
    ).records
    jobs = select_jobs(records, Machine.pool(64))
    assert [j.id for j in jobs] == [7, 3, 6]  # ordered by submit
    by_id = {j.id: j for j in jobs}
    assert by_id[3].procs == 8 and by_id[3].req_time == 100
    assert by_id[3].request == JobRequest(nodes=1, ppn=8, walltime=100)
    assert by_id[7].req_time == 30
    # Submit times are rebased to the earliest kept job (job 7 at 1005).
    assert [j.submit for j in jobs] == [0, 15, 45]


def test_exact_estimates_and_limit_in_file_order():
    records = parse_swf(
        [line(i, 100 - i, 10 * i, 1, req_time=1000) for i in range(1, 6)]
    ).records
    jobs = select_jobs(records, Machine.pool(4), limit=3, estimates=Estimates.EXACT)
    # The first three records of the file, whatever their submit order.
    assert sorted(j.id for j in jobs) == [1, 2, 3]
    assert all(j.req_time == j.run_time for j in jobs)
    assert [j.id for j in jobs] == [3, 2, 1]


def test_memory_becomes_a_requirement_only_when_the_machine_has_memory():
    records = parse_swf(
        [line(1, 0, 10, 2, req_mem=1000), line(2, 0, 10, 2, req_mem=4000)]
    ).records
    assert all(j.request.mem_kb is None for j in select_jobs(records, Machine.pool(4)))
    # 4 procs, 6000 KB: job 2 needs 2 x 4000 KB and is dropped as infeasible.
    jobs = select_jobs(records, Machine.pool(4, mem_kb=6000))
    assert [(j.id, j.request.mem_kb) for j in jobs] == [(1, 2000)]
    per_job = select_jobs(
        parse_swf([line(1, 0, 10, 2, req_mem=2048 * 1024)]).records,
        Machine.pool(4, mem_kb=10**6),
        mem_unit=MemoryUnit.BYTES_PER_JOB,
    )
    assert per_job[0].mem_kb == 2048


def test_jobs_wider_than_a_node_are_spread_evenly():
    machine = Machine.uniform(4, 8)
    records = parse_swf(
        [line(1, 0, 10, 8), line(2, 0, 10, 9), line(3, 0, 10, 20), line(4, 0, 10, 33)]
    ).records
    shapes = {
        j.id: (j.request.nodes, j.request.ppn) for j in select_jobs(records, machine)
    }
    assert shapes == {1: (1, 8), 2: (2, 5), 3: (3, 7)}  # 33 > 32 CPUs: dropped


def _job(id: int, submit: float, start: float | None, end: float | None, **kw) -> Job:
    return Job(
        id=id,
        name=f"j{id}",
        user="alice",
        uid=1000,
        gid=100,
        group="users",
        workdir="/tmp",
        request=kw.pop("request", JobRequest(ppn=2, walltime=60, mem_kb=4096)),
        submit_time=submit,
        state=JobState.FINISHED,
        start_time=start,
        end_time=end,
        result=kw.pop("result", JobResult.COMPLETED),
        alloc=kw.pop("alloc", [Allocation("n0", [0, 1])] if start is not None else []),
        **kw,
    )


def test_export_swf_round_trips_through_the_reader():
    jobs = [
        _job(3, 1_700_000_010.0, 1_700_000_012.0, 1_700_000_042.0, cputime_s=50.0),
        _job(1, 1_700_000_000.0, 1_700_000_000.0, 1_700_000_030.0),
        _job(
            4,
            1_700_000_020.0,
            None,
            None,
            result=JobResult.CANCELLED,
            depends=[Dependency(DependKind.AFTEROK, 3)],
        ),
    ]
    text = export_swf(jobs, nodes=[("n0", 4), ("n1", 4)])
    trace = parse_swf(text.splitlines())
    assert trace.header["UnixStartTime"] == "1700000000"
    assert trace.machine_procs() == 8
    assert machine_nodes_from_header(trace) == [("n0", 4), ("n1", 4)]
    one, three, four = trace.records
    assert (one.job, one.submit, one.wait, one.run, one.alloc_procs) == (1, 0, 0, 30, 2)
    assert (three.submit, three.wait, three.run, three.avg_cpu) == (10, 2, 30, 25)
    assert (three.req_procs, three.req_time, three.req_mem) == (2, 60, 2048)
    assert (three.status, three.user, three.group) == (1, 1000, 100)
    # Never started: no wait, run or allocation; cancelled; its dependency kept.
    assert (four.wait, four.run, four.alloc_procs, four.status) == (-1, -1, -1, 5)
    assert four.preceding_job == 3
    kept = select_jobs(trace, Machine.pool(8))
    assert [j.id for j in kept] == [1, 3]
    assert [j.submit + j.wait for j in kept] == [0, 12]


def test_export_keeps_sub_second_times_when_asked():
    jobs = [_job(1, 100.0, 100.25, 101.5)]
    rec = parse_swf(export_swf(jobs, decimals=3).splitlines()).records[0]
    assert (rec.wait, rec.run) == (0.25, 1.25)
    rec = parse_swf(export_swf(jobs).splitlines()).records[0]
    assert (rec.wait, rec.run) == (0, 1)


def test_a_gzip_trace_cut_short_is_one_clear_error(tmp_path):
    import gzip

    whole = gzip.compress(
        ("\n".join(line(i, i, 10, 1) for i in range(1, 2000))).encode()
    )
    cut = tmp_path / "cut.swf.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InvalidArgument, match="not a whole gzip file"):
        read_swf(cut)


def test_the_job_filter_counts_what_it_leaves_out():
    records = [
        parse_line(line(1, 0, 100, 500)),  # wider than the machine
        parse_line(line(2, 10, 0, 4)),  # no run time
        parse_line(line(3, 12, 100, 4)),
    ]
    left_out: dict[str, int] = {}
    jobs = select_jobs(records, Machine.pool(128), left_out=left_out)
    assert [j.id for j in jobs] == [3]
    assert left_out == {"wider than the machine": 1, "no run time": 1}
