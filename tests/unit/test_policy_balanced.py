"""BB and IBB (seed 003): Eq. 1 and Eq. 2, and what each backfills.

The worked example: one node of 10 CPUs and 100 GB; a running job holds 6 CPUs
and 20 GB until 100, so S = (0.6, 0.2); the head needs all 10 CPUs and is
reserved at 100, so the candidates are the jobs that fit now and end by then:

==== ===== ====== ====================== =================================
job  CPUs  memory S + R^j                 Eq. 1 (balance x (1 - mean))
==== ===== ====== ====================== =================================
3    3     0 GB   (0.9, 0.2)              1.636 x 0.45 = 0.736
4    2     10 GB  (0.8, 0.3)              1.455 x 0.45 = 0.655
5    1     50 GB  (0.7, 0.7)              1.000 x 0.30 = 0.300
==== ===== ====== ====================== =================================

BB backfills one candidate per pass (seed 003: "it can only select one job to
backfill in one traversal"); ``rescan=true`` traverses again after each start.
"""

from __future__ import annotations

import pytest

from minibatch.errors import InvalidArgument
from minibatch.policy import registry
from minibatch.policy.backfill import Easy
from minibatch.policy.balanced import (
    BB,
    IBB,
    PASSED_OVER,
    balance,
    bb_score,
    ibb_accepts,
)
from tests.unit.test_policy_snapshots import GB, job, node, running, snap, started


def example():
    return snap(
        [node("a", 10, 100 * GB)],
        [running(1, {"a": 6}, 0, 100, mem_kb=20 * GB)],
        [
            job(2, 10, 50),
            job(3, 3, 50, mem_kb=0),
            job(4, 2, 50, mem_kb=10 * GB),
            job(5, 1, 50, mem_kb=50 * GB),
        ],
    )


def test_eq1_scores_of_the_example():
    s = (0.6, 0.2)
    assert bb_score(s, (0.3, 0.0)) == pytest.approx(0.9 / 0.55 * 0.45)
    assert bb_score(s, (0.2, 0.1)) == pytest.approx(0.8 / 0.55 * 0.45)
    assert bb_score(s, (0.1, 0.5)) == pytest.approx(0.3)


def test_eq2_accepts_what_does_not_worsen_the_balance():
    s = (0.6, 0.2)  # balance 1.5
    assert balance(s) == pytest.approx(1.5)
    assert not ibb_accepts(s, (0.3, 0.0))  # 1.636
    assert ibb_accepts(s, (0.2, 0.1))  # 1.455
    assert ibb_accepts((0.0, 0.0), (0.1, 0.1))  # idle counts as balanced
    assert not ibb_accepts((0.0, 0.0), (0.1, 0.0))
    assert ibb_accepts((0.5,), (0.5,))  # one resource: always


def test_bb_backfills_the_lowest_score_once_per_pass():
    plan = BB().plan(example())
    # One traversal: job 5 (0.300). Jobs 3 and 4 still fit; they wait for the
    # next pass (this test used to expect [5, 4]: BB traversed again).
    assert started(plan) == [5]
    assert plan.predicted == {2: 100.0}
    assert plan.reasons[3] == plan.reasons[4] == PASSED_OVER


def test_bb_rescan_backfills_the_lowest_score_per_traversal():
    plan = BB(rescan=True).plan(example())
    # Traversal 1: job 5 (0.300). S = (0.7, 0.7): job 4 scores 0.159, job 3
    # 0.176; job 4. S = (0.9, 0.8): job 3 needs 3 CPUs, 1 is free. Done.
    assert started(plan) == [5, 4]
    assert plan.predicted == {2: 100.0}
    assert plan.reasons[3].startswith("waiting for 3 CPUs (1 free)")


def two_that_fit():
    """S = (0.6, 0.2), balance 1.5; the head (10 CPUs) is reserved at 100.

    ==== ===== ====== ========== ======================= =====================
    job  CPUs  memory S + R^j    Eq. 1                   Eq. 2 (balance after)
    ==== ===== ====== ========== ======================= =====================
    3    1     30 GB  (0.7, 0.5) 1.167 x 0.40 = 0.467    1.167 <= 1.5
    4    2     30 GB  (0.8, 0.5) 1.231 x 0.35 = 0.431    1.231 <= 1.5
    ==== ===== ====== ========== ======================= =====================

    Together they take 3 of the 4 free CPUs and 60 of the 80 free GB: both fit.
    """
    return snap(
        [node("a", 10, 100 * GB)],
        [running(1, {"a": 6}, 0, 100, mem_kb=20 * GB)],
        [job(2, 10, 50), job(3, 1, 50, mem_kb=30 * GB), job(4, 2, 50, mem_kb=30 * GB)],
    )


def test_two_candidates_fit_bb_starts_one_rescan_and_ibb_both():
    s = two_that_fit()
    bb = BB().plan(s)
    assert started(bb) == [4]  # the lower Eq. 1, though behind job 3
    assert bb.reasons[3] == PASSED_OVER
    # After job 4, S = (0.8, 0.5): job 3 scores (0.9, 0.8) -> 1.059 x 0.15.
    assert started(BB(rescan=True).plan(s)) == [4, 3]
    # IBB, in order: job 3 (1.167 <= 1.5), then job 4 from S = (0.7, 0.5):
    # (0.9, 0.8) -> 1.059 <= 1.167. Both in the one traversal.
    assert started(IBB().plan(s)) == [3, 4]


@pytest.mark.parametrize(
    ("params", "expected"),
    [({}, [4]), ({"rescan": "false"}, [4]), ({"rescan": "true"}, [4, 3])],
)
def test_rescan_as_a_parameter(params, expected):
    assert started(registry.load("bb", params).plan(two_that_fit())) == expected


def test_rescan_must_be_true_or_false():
    with pytest.raises(InvalidArgument, match=r"^parameter rescan: expected true"):
        BB(rescan="twice")


def test_ibb_backfills_every_balancing_candidate_in_one_traversal():
    plan = IBB().plan(example())
    # Job 3 would raise max/mean from 1.5 to 1.636: skipped. Job 4 lowers it to
    # 1.455 and starts; then job 5 (1.059 <= 1.455) starts too.
    assert started(plan) == [4, 5]
    assert plan.reasons[3] == "not backfilled: would unbalance the machine (ibb)"
    assert plan.predicted == {2: 100.0}


def test_easy_first_fit_differs():
    assert started(Easy().plan(example())) == [3, 5]


def test_with_cpus_only_bb_is_best_fit_and_ibb_is_first_fit():
    s = snap(
        [10],
        [running(1, {"n0": 6}, 0, 100)],
        [job(2, 10, 50), job(3, 1, 50), job(4, 3, 50)],
    )
    assert started(BB().plan(s)) == [4]  # the largest, and only it this pass
    assert started(BB(rescan=True).plan(s)) == [4, 3]  # then the next
    assert started(IBB().plan(s)) == started(Easy().plan(s)) == [3, 4]


def test_select_by_name_on_backfill():
    from minibatch.policy.backfill import Backfill

    assert started(Backfill(select="bb").plan(example())) == [5]  # one per pass
    assert started(Backfill(select="ibb").plan(example())) == [4, 5]
