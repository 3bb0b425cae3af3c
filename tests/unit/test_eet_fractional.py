"""EET with fractional submit times, as a live cluster's accounting has them.

Algorithm 1 (seed 001) works in whole 1-second blocks; a job submitted inside a
block can only take capacity from the next one on, so its arrival is rounded
*up*. Rounded down, a job that starts the instant it is submitted and runs
exactly its run time would end after its own EET and count as a violation.
"""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.metrics.eet import expected_end_times, per_user
from minibatch.metrics.records import JobRecord

#: An epoch second of today's magnitude: live submit times look like this.
EPOCH = 1_790_000_000


def rec(
    job: int,
    submit: float,
    run: float,
    procs: int,
    user: str = "u",
    wait: float = 0.0,
) -> JobRecord:
    return JobRecord(
        job=job,
        user=user,
        submit=submit,
        start=submit + wait,
        end=submit + wait + run,
        procs=procs,
        req_time=run,
    )


def per_second(jobs: list[tuple[int, int, int]], share: Fraction) -> list[int]:
    """Algorithm 1 as printed (whole-second arrivals), one step per second."""
    horizon = max(a for a, _, _ in jobs) + sum(
        math.ceil(r * t / min(Fraction(r), share)) for _, r, t in jobs
    )
    cap = [share] * (int(horizon) + 2)
    out = []
    for arrival, req, run in jobs:
        left, t = Fraction(req * run), arrival
        while left > 0:
            take = min(cap[t], req)
            cap[t] -= take
            left -= take
            t += 1
        out.append(t)
    return out


def test_a_fractional_arrival_starts_in_the_next_block():
    # Table 1's first job (2 CPUs x 4 s, share 3), submitted half a second late:
    # its blocks are 1..4, so its EET is 5, not 4.
    assert expected_end_times([rec(1, 0.5, 4, 2)], capacity=6, share=3) == {1: 5}
    assert expected_end_times([rec(1, 0.999, 4, 2)], capacity=6, share=3) == {1: 5}
    # A whole second stays where it is, float noise included.
    assert expected_end_times([rec(1, 1.0, 4, 2)], capacity=6, share=3) == {1: 5}
    noisy = rec(1, 1.0 + 1e-12, 4, 2)
    assert expected_end_times([noisy], capacity=6, share=3) == {1: 5}


def test_table_1_shifted_by_a_fraction_is_table_1_one_block_later():
    # Job 2 (submitted at 1.25) rounds up to 2, behind job 1 (0.25 -> 1).
    records = [rec(1, 0.25, 4, 2), rec(2, 1.25, 1, 2)]
    assert expected_end_times(records, capacity=6, share=3) == {1: 5, 2: 4}


def test_live_epoch_times():
    # Submitted at EPOCH + 0.3, started at once, ran 10 s on 1 of 2 CPUs.
    r = rec(7, EPOCH + 0.3, 10.0, 1)
    eet = expected_end_times([r], capacity=2)
    assert eet == {7: EPOCH + 11}
    (user,) = per_user([r], eet)
    assert (user.violated, user.veet_pct, user.wt_cpu_s) == (0, 0.0, 0.0)


def test_a_job_that_waited_is_late_by_what_it_lost():
    # EET EPOCH + 11 (arrival rounds up to EPOCH + 1); it started 3.2 s late and
    # ends at EPOCH + 13.5: late by 2.5 s on 2 CPUs.
    r = rec(1, EPOCH + 0.3, 10.0, 2, wait=3.2)
    eet = expected_end_times([r], capacity=4)
    assert eet == {1: EPOCH + 11}
    (user,) = per_user([r], eet)
    assert user.violated == 1
    assert math.isclose(user.wt_cpu_s, 2 * 2.5, rel_tol=1e-6)


def test_blocks_longer_than_a_second_round_up_too():
    # 60-second blocks: submitted at 30 s, the job's first block is [60, 120).
    eet = expected_end_times([rec(1, 30.0, 120.0, 1)], capacity=1, block=60.0)
    assert eet == {1: 180.0}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 30),
            st.sampled_from([0.0, 0.001, 0.25, 0.5, 0.75, 0.999]),
            st.integers(1, 5),
            st.integers(1, 12),
        ),
        min_size=1,
        max_size=10,
    ),
    st.integers(1, 6),
    st.sampled_from([0, EPOCH]),
)
def test_fractional_arrivals_equal_the_loop_with_arrivals_rounded_up(
    raw, share, offset
):
    jobs = sorted(raw, key=lambda j: j[0] + j[1])
    records = [
        rec(i, offset + whole + frac, run, req)
        for i, (whole, frac, req, run) in enumerate(jobs)
    ]
    eet = expected_end_times(records, capacity=share, share=share)
    arrivals = [(whole + (frac > 0), req, run) for whole, frac, req, run in jobs]
    expected = per_second(arrivals, Fraction(share))
    assert [eet[i] - offset for i in range(len(jobs))] == expected


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False).map(lambda x: round(x, 3)),
            st.integers(1, 4),
            st.floats(0.5, 30, allow_nan=False).map(lambda x: round(x, 2)),
            st.sampled_from(["a", "b"]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([0, EPOCH]),
)
def test_a_job_that_starts_when_submitted_never_violates_its_eet(raw, offset):
    """Whatever the shares: EET >= arrival + run time, and nobody's wait was
    zero and late."""
    records = [
        rec(i, offset + submit, run, procs, user)
        for i, (submit, procs, run, user) in enumerate(raw)
    ]
    eet = expected_end_times(records, capacity=4)
    for r in records:
        assert eet[r.job] >= r.end, (r, eet[r.job])
    assert all(u.violated == 0 for u in per_user(records, eet))
