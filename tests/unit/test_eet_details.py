"""EET, VEET_u, WT_u and the heatmap, exactly (mutants of these survived the
older tests; docs/mutation.md)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

from minibatch.metrics.eet import Heatmap, expected_end_times, heatmap, per_user
from minibatch.metrics.records import JobRecord
from tests.unit.test_eet_fractional import per_second, rec


def done(job: int, user: str, submit: float, start: float, end: float) -> JobRecord:
    return JobRecord(
        job=job, user=user, submit=submit, start=start, end=end, procs=1, req_time=1
    )


# ------------------------------------------------------------------ EET


def test_a_job_that_ran_no_time_expects_to_end_on_arrival():
    records = [rec(1, 5.0, 0.0, 1), rec(2, 5.0, 3.0, 1)]
    assert expected_end_times(records, capacity=1) == {1: 5, 2: 8}


def test_negative_times_are_times_too():
    assert expected_end_times([rec(1, -10.0, 4.0, 1)], capacity=1) == {1: -6}


def test_a_long_job_on_a_fractional_share_gets_no_extra_block():
    # 46 CPUs for 10 users: 4.6 each. 8 CPUs x 953,948 s poured at 4.6 per
    # block is 1,659,040 blocks exactly; the float quotient is a hair above.
    eet = expected_end_times([rec(1, 0.0, 953_948.0, 8)], capacity=46, share=46 / 10)
    assert eet == {1: 1_659_040}


def test_many_jobs_of_one_user_match_the_loop():
    # Enough jobs that the share's past is forgotten several times over.
    rng = random.Random(7)
    jobs, t = [], 0
    for _ in range(400):
        t += rng.choice([0, 0, 1, 2, 5])
        jobs.append((t, rng.randint(1, 4), rng.randint(1, 9)))
    records = [rec(i, a, run, req) for i, (a, req, run) in enumerate(jobs)]
    for share in (3, Fraction(5, 2)):
        eet = expected_end_times(records, capacity=float(share), share=float(share))
        assert [eet[i] for i in range(len(jobs))] == per_second(jobs, Fraction(share))


def test_memory_is_shared_between_users_too():
    # 2 users, 4000 KB: 2000 KB each. User a's second job asks 4000 KB for 10 s:
    # 40,000 KB-s at 2000 per second is 20 s; its first job asks no memory.
    records = [
        JobRecord(job=1, user="a", submit=0, start=0, end=10, procs=1, req_time=10),
        JobRecord(
            job=2, user="a", submit=0, start=0, end=10, procs=1, req_time=10,
            mem_kb=4000,
        ),
        JobRecord(
            job=3, user="b", submit=0, start=0, end=10, procs=1, req_time=10,
            mem_kb=1000,
        ),
    ]  # fmt: skip
    eet = expected_end_times(records, capacity=4, mem_capacity_kb=4000)
    assert eet == {1: 10, 2: 20, 3: 10}


def test_per_user_counts_every_violation():
    records = [
        done(1, "10", 0, 5, 6),  # EET 1: late by 5
        done(2, "10", 0, 0, 1),  # EET 2 (behind job 1 on a 1-CPU share): met
        done(3, "10", 0, 9, 10),  # EET 3: late by 7
        done(4, "2", 0, 0, 1),
    ]
    eet = expected_end_times(records, capacity=2, share=1)
    assert eet == {1: 1, 2: 2, 3: 3, 4: 1}
    n2, n10 = per_user(records, eet)
    assert (n2.user, n10.user) == ("2", "10")  # numerically, as trace user ids
    assert (n10.jobs, n10.violated, n10.wt_cpu_s) == (3, 2, 12.0)
    assert math.isclose(n10.veet_pct, 200 / 3)
    assert (n2.violated, n2.veet_pct) == (0, 0.0)


# -------------------------------------------------------------- heatmap


def test_heatmap_cells_exactly():
    records = [
        done(1, "a", 1000, 1300, 1400),  # EET 1200: late 200 from cell 1, 4 cells
        done(2, "a", 1010, 1100, 1130),  # EET 1129.5: late 0.5, one cell (1)
        done(3, "b", 1000, 1000, 1060),  # on time
        done(4, "c", 1000, 1010, 1100),  # EET 1050: late 50 from cell 0
    ]
    eet = {1: 1200.0, 2: 1129.5, 3: 1060.0, 4: 1050.0}
    hm = heatmap(records, eet)
    assert (hm.users, hm.t0, hm.cell_s) == (["a", "b", "c"], 1000, 60.0)
    # Span 400 s: 7 cells and one more.
    assert hm.cells == [
        [0, 2, 1, 1, 1, 0, 0, 0],
        [0] * 8,
        [1, 0, 0, 0, 0, 0, 0, 0],
    ]


def test_heatmap_users_in_natural_order_and_empty_input():
    records = [done(1, "10", 0, 0, 1), done(2, "2", 0, 0, 1)]
    assert heatmap(records, {1: 1.0, 2: 1.0}).users == ["2", "10"]
    assert heatmap([], {}) == Heatmap(users=[], t0=0.0, cell_s=60.0, cells=[])


def test_heatmap_widens_cells_only_past_the_limit():
    # 300 s in 30-s cells is exactly 10 cells: not past a limit of 10.
    records = [done(1, "a", 0, 0, 300)]
    hm = heatmap(records, {1: 300.0}, cell_s=30.0, max_cells=10)
    assert hm.cell_s == 30.0 and len(hm.cells[0]) == 11
    # The default limit is 2000 one-minute cells: 2000.5 minutes need 2-minute ones.
    records = [done(1, "a", 0, 0, 120_030)]
    assert heatmap(records, {1: 120_030.0}).cell_s == 120.0
    # 11e6 s in at most 1000 cells: whole minutes of at least 11,000 s.
    records = [done(1, "a", 0, 0, 11_000_000)]
    hm = heatmap(records, {1: 11_000_000.0}, max_cells=1000)
    assert hm.cell_s == 11_040.0


def test_a_share_cut_into_many_pieces_matches_the_loop():
    # Every job has its own width and arrives a second after the previous one,
    # so the share's past holds more than a hundred distinct pieces when the
    # last ones arrive (and is forgotten in chunks meanwhile).
    jobs = [(k, 1 + k % 7, 40 + (k * 13) % 37) for k in range(160)]
    records = [rec(i, a, run, req) for i, (a, req, run) in enumerate(jobs)]
    eet = expected_end_times(records, capacity=10.0, share=10.0)
    assert [eet[i] for i in range(len(jobs))] == per_second(jobs, Fraction(10))
