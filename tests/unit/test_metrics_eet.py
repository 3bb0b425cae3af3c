"""EET (seed 001, Algorithm 1), VEET_u, WT_u and the violation heatmap."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.metrics.eet import expected_end_times, heatmap, per_user
from minibatch.metrics.records import JobRecord


def rec(
    job: int,
    submit: float,
    run: float,
    procs: int,
    user: str = "u",
    wait: float = 0.0,
    mem_kb: int | None = None,
) -> JobRecord:
    return JobRecord(
        job=job,
        user=user,
        submit=submit,
        start=submit + wait,
        end=submit + wait + run,
        procs=procs,
        req_time=run,
        mem_kb=mem_kb,
    )


def algorithm_1(jobs: list[tuple[int, int, int]], capacity: Fraction) -> list[int]:
    """Algorithm 1 of seed 001 as printed: one loop iteration per second.

    ``jobs`` are (arrival, request, runtime) in arrival order. Exact arithmetic,
    so that a share like 3/7 is not blurred by float round-off.
    """
    # Every job at worst runs alone at the share's rate after the last arrival.
    stretch = sum(math.ceil(r * t / min(r, capacity)) for _, r, t in jobs)
    horizon = max(a for a, _, _ in jobs) + stretch + 2
    cap = [capacity] * int(horizon)
    eets = []
    for arrival, req, runtime in jobs:
        job_capacity = req * runtime
        time = arrival
        while job_capacity > 0:
            consumed = min(cap[time], req)
            cap[time] -= consumed
            job_capacity -= consumed
            time += 1
        eets.append(time)
    return eets


def test_table_1_of_the_paper_gives_4_and_3():
    records = [rec(1, 0, 4, 2), rec(2, 1, 1, 2)]
    assert expected_end_times(records, capacity=6, share=3) == {1: 4, 2: 3}


def test_default_share_is_machine_size_over_users():
    # Two users on 6 CPUs -> 3 each: user a's jobs are Table 1 again.
    records = [rec(1, 0, 4, 2, "a"), rec(2, 1, 1, 2, "a"), rec(3, 0, 2, 6, "b")]
    eet = expected_end_times(records, capacity=6)
    assert (eet[1], eet[2]) == (4, 3)
    assert eet[3] == 4  # 6 CPUs x 2 s through a 3-CPU share: twice as long


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 5), st.integers(1, 12)),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 6),
)
def test_segment_implementation_equals_the_per_second_loop(raw, capacity):
    jobs = sorted(raw, key=lambda j: j[0])
    records = [rec(i, a, t, r) for i, (a, r, t) in enumerate(jobs)]
    eet = expected_end_times(records, capacity=capacity, share=capacity)
    assert [eet[i] for i in range(len(jobs))] == algorithm_1(jobs, Fraction(capacity))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 4), st.integers(1, 9)),
        min_size=1,
        max_size=10,
    )
)
def test_fractional_shares_match_the_loop_too(raw):
    # 3 CPUs for 7 users: a share of 3/7 CPU, as on real traces.
    jobs = sorted(raw, key=lambda j: j[0])
    records = [rec(i, a, t, r) for i, (a, r, t) in enumerate(jobs)]
    eet = expected_end_times(records, capacity=3, share=3 / 7)
    assert [eet[i] for i in range(len(jobs))] == algorithm_1(jobs, Fraction(3, 7))


def test_the_latest_resource_wins():
    # CPU share 4 (no stretch), memory share 1000 KB: 4000 KB for 10 s -> 40 s.
    records = [rec(1, 0, 10, 2, mem_kb=4000), rec(2, 0, 10, 2)]
    eet = expected_end_times(records, capacity=4, share=4, mem_capacity_kb=1000)
    assert eet == {1: 40, 2: 10}


def test_veet_and_weighted_tardiness():
    records = [
        rec(1, 0, 4, 2, "a"),  # EET 4, ends 4: met
        rec(2, 1, 1, 2, "a", wait=5),  # EET 3, ends 7: late by 4 on 2 CPUs
        rec(3, 0, 1, 1, "b", wait=0.5),  # EET 1, ends 1.5: late by 0.5
    ]
    eet = expected_end_times(records, capacity=6, share=3)
    a, b = per_user(records, eet)
    assert (a.user, a.jobs, a.violated, a.veet_pct, a.wt_cpu_s) == (
        "a",
        2,
        1,
        50.0,
        8.0,
    )
    assert (b.violated, b.veet_pct, b.wt_cpu_s) == (1, 100.0, 0.5)


def test_heatmap_marks_tardiness_from_the_latest_good_start():
    # EET 600 (run 300 s from 0 on a 1-CPU share of 2-CPU job... = 600 s).
    late = rec(1, 0, 300, 2, "a", wait=420)  # ends 720: late by 120 s = 2 cells
    ok = rec(2, 0, 60, 1, "b")
    eet = expected_end_times([late, ok], capacity=2, share=1)
    assert eet == {1: 600, 2: 60}
    hm = heatmap([late, ok], eet, cell_s=60)
    assert hm.users == ["a", "b"] and hm.cell_s == 60
    # From EET - run = 300 s (cell 5), two cells.
    assert [i for i, v in enumerate(hm.cells[0]) if v] == [5, 6]
    assert not any(hm.cells[1])


def test_heatmap_cells_widen_on_long_schedules():
    records = [rec(1, 0, 10, 1), rec(2, 10**7, 10, 1, wait=10**6)]
    eet = expected_end_times(records, capacity=1)
    hm = heatmap(records, eet, max_cells=1000)
    assert hm.cell_s % 60 == 0 and hm.cell_s >= (11 * 10**6) / 1000
    assert len(hm.cells[0]) <= 1002
    assert sum(1 for v in hm.cells[0] if v) == math.ceil(10**6 / hm.cell_s)
