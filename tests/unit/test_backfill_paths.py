"""Backfill's less travelled paths (found by mutation testing, docs/mutation.md):
parameters, node features, advance-reservation jobs with a selection, the
"no free CPUs" shortcut, a priority order, and memory per node."""

from __future__ import annotations

import msgspec
import pytest

from minibatch.core.snapshot import ClusterSnapshot, PendingView, ReservationView
from minibatch.errors import InvalidArgument
from minibatch.policy.backfill import (
    Backfill,
    BestFit,
    Conservative,
    Easy,
    pick_repeatedly,
    selection,
)
from minibatch.policy.balanced import BackfillBalanced, ImprovedBackfillBalanced
from minibatch.policy.planning import Pass
from tests.unit.test_policy_snapshots import job, node, running, snap, started


def reverse(s: ClusterSnapshot) -> list[PendingView]:
    return list(reversed(s.pending))


def with_upcoming(s: ClusterSnapshot, n: int = 10) -> ClusterSnapshot:
    return msgspec.structs.replace(s, upcoming=n)


def featured(s: ClusterSnapshot, features: dict[str, tuple[str, ...]]):
    nodes = tuple(
        msgspec.structs.replace(n, features=features.get(n.name, ())) for n in s.nodes
    )
    return msgspec.structs.replace(s, nodes=nodes)


def needs(view: PendingView, *features: str) -> PendingView:
    return msgspec.structs.replace(view, features=features)


# -------------------------------------------------------------- parameters


def test_defaults_and_presets():
    b = Backfill()
    assert (b.depth, b.selection, b.metric, b.order) == (1, None, "procs", None)
    assert Backfill(depth=0).depth == 0
    assert Backfill(depth="all").depth is None and Conservative().depth is None
    assert Easy().depth == 1 and Easy().selection is None and Easy().metric == "procs"
    assert Easy(order=reverse).order is reverse
    assert Conservative(order=reverse).order is reverse
    easy = Easy(select="bestfit", metric="seconds")
    assert isinstance(easy.selection, BestFit) and easy.metric == "seconds"
    assert easy.selection.metric == "seconds" and easy.selection.name == "bestfit"
    assert BestFit().metric == "procs"


def test_parameter_errors_name_the_parameter():
    with pytest.raises(InvalidArgument, match=r"^parameter depth: must be >= 0"):
        Backfill(depth=-1)
    with pytest.raises(InvalidArgument, match=r"^parameter metric: expected one of"):
        Backfill(metric="area")
    with pytest.raises(InvalidArgument, match=r"^parameter metric: expected one of"):
        BestFit("area")
    with pytest.raises(InvalidArgument, match=r"^parameter select: expected one of"):
        Backfill(select="worstfit")


def test_selection_by_name():
    assert selection("firstfit") is None
    chosen = selection("bestfit")
    assert isinstance(chosen, BestFit) and chosen.metric == "procs"
    assert selection("BestFit", "seconds").metric == "seconds"
    assert isinstance(selection("bb"), BackfillBalanced)
    assert isinstance(selection("ibb"), ImprovedBackfillBalanced)
    mine = BestFit("seconds")
    assert selection(mine) is mine


@pytest.mark.parametrize(
    ("metric", "first"),
    [("procs", 3), ("seconds", 2), ("procseconds", 4)],
)
def test_bestfit_metrics(metric, first):
    # One free 3-CPU node for long enough; candidates of different shapes. The
    # best one by the metric starts first (it is the only one: 3 CPUs).
    s = snap(
        [4],
        [running(1, {"n0": 1}, 0, 1000)],
        [
            job(9, 4, 10),  # the head: waits for all 4 CPUs at 1000
            job(2, 1, 900),  # seconds: 900 (procseconds 900)
            job(3, 3, 100),  # procs: 3 (procseconds 300)
            job(4, 2, 600),  # procseconds: 1200
        ],
    )
    plan = Easy(select="bestfit", metric=metric).plan(s)
    assert started(plan)[0] == first, plan


def test_pick_repeatedly_takes_the_lowest_score_and_skips_misfits():
    s = snap([2], [], [job(1, 3, 10), job(2, 1, 10), job(3, 2, 10), job(4, 1, 10)])
    p = Pass(s)
    pick_repeatedly(p, list(s.pending), lambda j: -float(j.request.ppn))
    plan = p.plan()
    # Job 1 never fits (3 CPUs on a 2-CPU node); job 3 is the widest that fits.
    assert started(plan) == [3]
    assert set(plan.reasons) == {1, 2, 4}
    s = snap([3], [], [job(1, 3, 10), job(2, 1, 10), job(3, 1, 10)])
    p = Pass(s)
    pick_repeatedly(p, [s.pending[1], s.pending[0], s.pending[2]], lambda j: 0.0)
    assert started(p.plan()) == [2, 3]  # ties: the earlier in the given order


# -------------------------------------------------------- submission order


@pytest.mark.parametrize("select", ["firstfit", "bestfit"])
def test_plans_say_whether_their_order_is_submission_order(select):
    s = with_upcoming(snap([2], [running(1, {"n0": 1}, 0, 100)], [job(2, 2, 10)]))
    plan = Easy(select=select).plan(s)
    assert plan.upcoming == [2] and plan.upcoming_by_submission is True
    plan = Easy(select=select, order=reverse).plan(s)
    assert plan.upcoming == [2] and plan.upcoming_by_submission is False


def test_no_free_cpus_gives_one_reason_and_keeps_the_upcoming_order():
    s = with_upcoming(
        snap([2], [running(1, {"n0": 2}, 0, 100)], [job(2, 2, 10), job(3, 1, 10)])
    )
    plan = Easy().plan(s)
    assert plan.default_reason == "queued behind job 2 (no free CPUs)"
    assert (plan.upcoming, plan.upcoming_by_submission) == ([2, 3], True)
    plan = Easy(order=reverse).plan(s)
    assert plan.default_reason == "queued behind job 3 (no free CPUs)"
    assert (plan.upcoming, plan.upcoming_by_submission) == ([3, 2], False)
    plan = Backfill(depth=0).plan(s)
    assert plan.default_reason == "queued behind the running jobs (no free CPUs)"
    assert plan.predicted == {}


# ----------------------------------------------------------- node features


def xe_cluster(pending, run=()):
    """n0 has feature xe (2 CPUs), n1 has none (2 CPUs)."""
    return featured(snap([2, 2], list(run), pending), {"n0": ("xe",)})


def test_a_job_with_a_feature_starts_on_a_node_that_has_it():
    s = xe_cluster([needs(job(1, 1, 10), "xe"), job(2, 2, 10)])
    plan = Easy().plan(s)
    assert started(plan) == [1, 2]
    assert plan.starts[0].nodes == ("n0",) and plan.starts[1].nodes == ("n1",)


def test_a_waiting_job_with_a_feature_is_the_reserved_head():
    busy = [running(9, {"n0": 2}, 0, 100)]
    s = xe_cluster([needs(job(1, 1, 10), "xe"), job(2, 3, 10), job(3, 1, 500)], busy)
    plan = Easy().plan(s)
    # Job 1 holds the one reservation (on n0 at 100); job 2 gets none (EASY);
    # job 3 backfills on n1, which job 1's reservation does not touch.
    assert plan.predicted == {1: 100.0}
    assert started(plan) == [3]
    assert "reserved to start in" in plan.reasons[1]
    assert "reserved" not in plan.reasons[2]


def test_jobs_with_features_count_in_the_reservation_depth():
    busy = [running(9, {"n0": 2}, 0, 100), running(8, {"n1": 2}, 0, 200)]
    pending = [
        needs(job(1, 2, 10), "xe"),
        needs(job(2, 2, 10), "xe"),
        job(3, 2, 10),
        job(4, 1, 10),
    ]
    plan = Backfill(depth=2).plan(xe_cluster(pending, busy))
    assert plan.predicted == {1: 100.0, 2: 110.0}
    assert 3 not in plan.reasons and 4 not in plan.reasons
    assert plan.default_reason == "queued behind job 1 (no free CPUs)"


def test_a_job_with_a_feature_in_the_backfill_walk():
    # Behind the reserved head, a featured job that fits starts; one that does
    # not fit gets the reason why, and later jobs are still considered.
    busy = [running(9, {"n0": 1}, 0, 50), running(8, {"n1": 2}, 0, 100)]
    pending = [
        job(1, 4, 10),  # never fits: no 4-CPU node
        job(2, 2, 200),  # the head: both CPUs of n0 at 50
        needs(job(3, 1, 10), "xe"),  # n0's free CPU, done by 10
        needs(job(4, 2, 10), "xe"),  # does not fit now
        job(5, 1, 10),  # n1's free CPU
    ]
    s = featured(snap([2, 3], busy, pending), {"n0": ("xe",)})
    plan = Easy().plan(s)
    assert plan.predicted == {2: 50.0}
    assert started(plan) == [3, 5]
    assert [st.nodes for st in plan.starts] == [("n0",), ("n1",)]
    assert "2 CPUs" in plan.reasons[4], plan.reasons


# -------------------------------------------- advance-reservation jobs


ALICE = ReservationView(
    name="alice", start=0.0, end=1000.0, nodes=(("n0", 2),), users=("alice",)
)


def in_resv(id: int, ppn: int, walltime: int) -> PendingView:
    return job(id, ppn, walltime, user="alice", advres="alice")


@pytest.mark.parametrize("select", ["firstfit", "bestfit"])
def test_reservation_jobs_have_their_own_depth(select):
    # Inside 'alice' (2 CPUs of n0), one job runs until 100; three wait. The
    # first that does not fit is reserved, the one after it is not (depth 1),
    # and a short one that fits starts in the reservation.
    s = snap(
        [2, 2],
        [running(9, {"n0": 1}, 0, 100, advres="alice", user="alice")],
        [in_resv(1, 2, 50), in_resv(2, 2, 50), in_resv(3, 1, 50), job(4, 2, 10)],
        reservations=[ALICE],
    )
    plan = Easy(select=select).plan(s)
    assert plan.predicted == {1: 100.0}
    assert sorted(started(plan)) == [3, 4]
    assert "reserved" not in plan.reasons[2]
    assert [st.nodes for st in plan.starts if st.job == 3] == [("n0",)]


def test_conservative_reserves_every_reservation_job():
    s = snap(
        [2, 2],
        [running(9, {"n0": 2}, 0, 100, advres="alice", user="alice")],
        [in_resv(1, 2, 50), in_resv(2, 2, 50)],
        reservations=[ALICE],
    )
    assert Conservative().plan(s).predicted == {1: 100.0, 2: 150.0}


# ------------------------------------------------------- memory per node


def test_a_job_without_memory_fits_a_node_whose_memory_is_all_taken():
    s = snap(
        [node("n0", 2, 1000)],
        [running(9, {"n0": 1}, 0, 100, mem_kb=1000)],
        [job(1, 1, 10)],
    )
    assert started(Easy().plan(s)) == [1]
    assert started(Backfill(depth=0).plan(s)) == [1]


def test_memory_per_node_is_rounded_up_as_the_server_books_it():
    # 1001 KB over 2 nodes is 501 KB on each: two such jobs do not fit on two
    # nodes of 1001 KB, whatever the order of the walk.
    s = snap(
        [node("n0", 4, 1001), node("n1", 4, 1001)],
        [],
        [job(1, 1, 10, nodes=2, mem_kb=1001), job(2, 1, 10, nodes=2, mem_kb=1001)],
    )
    for policy in (Easy(), Backfill(depth=0), Conservative()):
        assert started(policy.plan(s)) == [1], policy


BOB = ReservationView(
    name="bob", start=0.0, end=1000.0, nodes=(("n1", 2),), users=("bob",)
)


def test_each_reservation_has_a_depth_of_its_own():
    s = snap(
        [2, 2, 2],
        [
            running(8, {"n0": 2}, 0, 100, advres="alice", user="alice"),
            running(9, {"n1": 2}, 0, 200, advres="bob", user="bob"),
        ],
        [in_resv(1, 2, 50), job(2, 2, 50, user="bob", advres="bob")],
        reservations=[ALICE, BOB],
    )
    assert Easy().plan(s).predicted == {1: 100.0, 2: 200.0}


def test_a_reservation_job_does_not_end_the_walk_before_the_head():
    # Job 1 (in alice) waits; job 2 (general, blocked) must still be reserved,
    # and job 3 must not backfill over it.
    s = snap(
        [2, 2],
        [
            running(8, {"n0": 2}, 0, 100, advres="alice", user="alice"),
            running(9, {"n1": 1}, 0, 50),
        ],
        [in_resv(1, 2, 50), job(2, 2, 50), job(3, 1, 500)],
        reservations=[ALICE],
    )
    plan = Easy().plan(s)
    assert plan.predicted == {1: 100.0, 2: 50.0}
    assert started(plan) == []


@pytest.mark.parametrize("select", ["firstfit", "bestfit"])
def test_jobs_after_a_reservation_job_in_the_backfill_walk(select):
    # General CPUs: n1 (2, one busy until 50). The head (job 1) is reserved;
    # then alice's jobs: one is reserved in alice, the next waits; then a
    # short general job backfills on n1's free CPU.
    s = snap(
        [2, 2],
        [
            running(8, {"n0": 2}, 0, 100, advres="alice", user="alice"),
            running(9, {"n1": 1}, 0, 50),
        ],
        [job(1, 2, 50), in_resv(2, 2, 50), in_resv(3, 2, 50), job(4, 1, 10)],
        reservations=[ALICE],
    )
    plan = Easy(select=select).plan(s)
    assert plan.predicted == {1: 50.0, 2: 100.0}
    assert started(plan) == [4]
    assert "reserved" not in plan.reasons[3]


def test_no_free_general_cpu_still_lets_reservation_jobs_start():
    s = snap(
        [2, 2],
        [running(9, {"n1": 2}, 0, 50)],
        [job(1, 2, 50), job(2, 1, 10), in_resv(3, 2, 50)],
        reservations=[ALICE],
    )
    plan = Easy().plan(s)
    assert plan.predicted == {1: 50.0}
    assert started(plan) == [3]
    assert plan.reasons[2].startswith("waiting for 1 CPU")


def test_reasons_of_jobs_that_do_not_fit_behind_the_head():
    s = snap(
        [4],
        [running(9, {"n0": 3}, 0, 100)],
        [job(1, 4, 10), job(2, 2, 10), job(3, 2, 10), job(4, 2, 100)],
    )
    plan = Easy().plan(s)
    assert plan.predicted == {1: 100.0}
    # Neither fits now, and both would be done before the head's start.
    assert plan.reasons[2] == plan.reasons[3] == "waiting for 2 CPUs (1 free)"
    # Ends exactly when the head starts: it does not fit now, that is all.
    assert plan.reasons[4] == "waiting for 2 CPUs (1 free)"
    # Wider than any node's free CPUs, behind the head.
    s = snap([4], [running(9, {"n0": 3}, 0, 100)], [job(1, 4, 10), job(2, 3, 10)])
    assert Easy().plan(s).reasons[2] == "waiting for 3 CPUs (1 free)"
