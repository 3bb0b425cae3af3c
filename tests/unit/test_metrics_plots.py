"""Plots: CPU rows of the Gantt chart, and every plot file written as PNG and SVG."""

from __future__ import annotations

from minibatch.metrics import plots
from minibatch.metrics.eet import expected_end_times
from minibatch.metrics.records import JobRecord


def rec(job, start, end, procs, nodes=(), user="u", submit=0.0) -> JobRecord:
    return JobRecord(
        job=job,
        user=user,
        submit=submit,
        start=start,
        end=end,
        procs=procs,
        req_time=end - start,
        nodes=nodes,
    )


def test_cpu_rows_take_the_lowest_free_cpus_and_never_overlap():
    records = [
        rec(1, 0, 10, 2),  # rows 0-1
        rec(2, 0, 5, 1),  # row 2
        rec(3, 5, 20, 2),  # row 2 freed at 5, then row 3: runs (2,2)
        rec(4, 10, 12, 3),  # rows 0, 1, 4
    ]
    rows = plots.cpu_rows(records, [("pool", 5)])
    assert rows == [[(0, 2)], [(2, 1)], [(2, 2)], [(0, 2), (4, 1)]]
    two_nodes = [rec(1, 0, 10, 4, nodes=("a", "b")), rec(2, 0, 10, 1, nodes=("b",))]
    assert plots.cpu_rows(two_nodes, [("a", 3), ("b", 3)]) == [
        [(0, 2), (3, 2)],
        [(5, 1)],
    ]


def test_report_and_comparison_plots_are_written(tmp_path):
    records = [
        rec(1, 0, 100, 2, user="a"),
        rec(2, 50, 400, 2, user="b", submit=10),
        rec(3, 400, 450, 4, user="a", submit=20),
    ]
    eet = expected_end_times(records, capacity=4)
    paths = plots.report_plots(records, eet, [("pool", 4)], tmp_path, "test")
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"{base}.{ext}"
        for base in ("gantt", "utilization", "eet_heatmap", "boxplots")
        for ext in ("png", "svg")
    )
    for p in paths:
        head = p.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<?xml" in head
    runs = {"x": (records, eet), "y": (records, eet)}
    more = plots.boxplots(runs, tmp_path / "cmp" / "box")
    more += plots.compare_heatmaps(runs, 4, tmp_path / "cmp" / "heat")
    more += plots.compare_utilization({"x": records}, 4, tmp_path / "cmp" / "util")
    assert all(p.stat().st_size > 1000 for p in more) and len(more) == 6
