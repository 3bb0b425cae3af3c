"""SD-Policy (seed 002) on hand-built snapshots: when it shrinks which mates."""

from __future__ import annotations

import msgspec
import pytest

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import PendingView, Resize, RunningView, Start
from minibatch.errors import InvalidArgument
from minibatch.policy.sd import SlowdownDriven
from tests.unit.test_policy_snapshots import Like, snap, started


def mate(
    id: int,
    held: int,
    rng: tuple[int, int] = (1, 8),
    *,
    ppn: int | None = None,
    start: float = 0.0,
    submit: float = 0.0,
    walltime: float = 1000.0,
    node: str = "n0",
) -> RunningView:
    return RunningView(
        id=id,
        user="u",
        nodes=((node, held),),
        mem_kb_per_node=None,
        start_time=start,
        walltime=walltime,
        malleable=rng,
        ppn=ppn or held,
        submit_time=submit,
        req_walltime=walltime,
    )


def pending(
    id: int, ppn: int, rng: tuple[int, int] | None = None, walltime: int = 100
) -> PendingView:
    return PendingView(
        id=id,
        user="u",
        group="g",
        request=JobRequest(ppn=ppn, walltime=walltime, malleable=rng),
        submit_time=float(id),
    )


def test_a_malleable_job_starts_on_cpus_one_mate_lends():
    # Two mates fill the node until t=1000; the guest would wait 1000 s.
    s = snap([4], [mate(1, 2, (1, 2)), mate(2, 2, (1, 2))], [pending(3, 2, (1, 2))])
    plan = SlowdownDriven().plan(s)
    # Eq. 1: the least total penalty is one mate lending one CPU (sharing 0.5).
    assert plan.starts == [Start(3, ("n0",), 1)]
    assert plan.resizes == [Like(job=1, cpus=1, guest=3)]


def test_two_mates_when_one_cannot_lend_enough():
    s = snap([4], [mate(1, 2, (1, 2)), mate(2, 2, (1, 2))], [pending(3, 2, (2, 2))])
    plan = SlowdownDriven().plan(s)
    assert plan.starts == [Start(3, ("n0",), 0)]
    assert sorted(plan.resizes, key=lambda r: r.job) == [
        Resize(1, 1, guest=3),
        Resize(2, 1, guest=3),
    ]
    one = SlowdownDriven(mates=1).plan(s)
    assert not one.starts and not one.resizes and 3 in one.predicted


def test_mates_never_go_below_their_minimum_or_past_the_sharing_factor():
    s = snap([4], [mate(1, 4, (4, 8))], [pending(2, 2, (1, 2))])
    assert not SlowdownDriven().plan(s).resizes  # at its minimum
    s = snap([8], [mate(1, 8, (1, 8))], [pending(2, 8, (1, 8))])
    plan = SlowdownDriven(sharing_factor=0.25).plan(s)
    assert plan.resizes == [Like(job=1, cpus=6)] and plan.starts[0].ppn == 2


def test_the_penalty_cut_off_keeps_slowed_jobs_alone():
    s = snap([4], [mate(1, 4, (1, 4), start=500)], [pending(2, 2, (1, 2))], now=500)
    # Its predicted slowdown is 1.5 (it waited 500 s for 1,000).
    assert not SlowdownDriven(max_slowdown=1.5).plan(s).starts
    assert SlowdownDriven(max_slowdown=1.6).plan(s).starts
    # Dynamic: the mean predicted slowdown of the running jobs; a mate that
    # waited long (slowdown 3) is kept out when the others are at 1.
    waited = mate(1, 4, (1, 4), start=2000, submit=0, node="n0")
    fresh = mate(3, 4, (1, 4), start=2000, submit=2000, node="n1")
    s2 = snap([4, 4], [waited, fresh], [pending(2, 2, (1, 2))], now=2000)
    plan = SlowdownDriven().plan(s2)
    assert plan.resizes == [Like(job=3, guest=2)]


def test_only_when_it_beats_the_static_end():
    # The mate ends in 50 s: waiting (end at 150) beats running shrunk (200).
    s = snap([4], [mate(1, 4, (2, 4), walltime=50)], [pending(2, 4, (2, 4))])
    plan = SlowdownDriven().plan(s)
    assert not plan.starts and plan.predicted == {2: 50}
    # It would (at 100 < 140), but it must also end inside its mate's
    # allocation: shrunk, the mate still ends by 80.
    s = snap([4], [mate(1, 4, (2, 4), walltime=40)], [pending(2, 2, (1, 2), 100)])
    assert not SlowdownDriven().plan(s).starts
    s = snap([4], [mate(1, 4, (2, 4), walltime=60)], [pending(2, 2, (1, 2), 100)])
    assert SlowdownDriven().plan(s).starts


def test_a_grown_job_gives_back_what_it_holds_beyond_its_request():
    grown = mate(1, 4, (1, 4), ppn=2)
    s = snap([4], [grown], [pending(2, 2)])
    plan = SlowdownDriven().plan(s)
    # The resize comes first (the server applies resizes before starts).
    assert plan.starts == [Start(2, ("n0",), 0)]
    assert plan.resizes == [Resize(1, 2)]
    # Any shape may use it: a rigid job on two nodes.
    s = snap([4, 4], [grown, mate(3, 2, (1, 2), node="n1")], [pending(2, 2)])
    wide = msgspec.structs.replace(
        s,
        pending=(
            msgspec.structs.replace(
                s.pending[0], request=JobRequest(nodes=2, ppn=2, walltime=100)
            ),
        ),
    )
    plan = SlowdownDriven().plan(wide)
    assert started(plan) == [2] and plan.resizes == [Resize(1, 2)]
    # A rigid job never shrinks a job below what it asked for.
    s = snap([4], [mate(1, 4, (1, 4))], [pending(2, 2)])
    assert not SlowdownDriven().plan(s).starts
    # Nothing waits: the grown job keeps its CPUs.
    assert not SlowdownDriven().plan(snap([4], [grown])).resizes


def test_a_guest_never_delays_the_reserved_head():
    # Job 3 on two CPUs lent by job 1 would stretch job 1 past 100, where the
    # head (job 2, the whole node) is reserved.
    s = snap(
        [4],
        [mate(1, 4, (2, 4), walltime=100)],
        [pending(2, 4), pending(3, 2, (1, 2), 50)],
    )
    plan = SlowdownDriven().plan(s)
    assert not plan.starts and not plan.resizes and plan.predicted[2] == 100


def test_the_sharing_factor_bounds_what_a_mate_lends_in_all():
    s = snap([8], [mate(1, 8, (1, 8))], [pending(2, 4, (2, 4)), pending(3, 4, (2, 4))])
    plan = SlowdownDriven().plan(s)
    assert plan.starts == [Start(2, ("n0",), 0)]
    assert plan.resizes == [Resize(1, 4, guest=2)]


def test_lenders_count_where_idle_cpus_alone_would_do():
    # Two idle CPUs reach the guest's minimum, but it starts bigger with its
    # mate's help (a start on idle CPUs alone is not a malleable start).
    s = snap([4], [mate(1, 2, (1, 2))], [pending(2, 4, (2, 4))])
    plan = SlowdownDriven().plan(s)
    assert plan.starts == [Start(2, ("n0",), 3)]
    assert plan.resizes == [Resize(1, 1, guest=2)]


def test_idle_cpus_grow_malleable_jobs_when_nothing_waiting_can_use_them():
    s = snap([8], [mate(1, 2, (1, 4)), mate(2, 2, (1, 8))])
    plan = SlowdownDriven().plan(s)
    assert sorted(plan.resizes, key=lambda r: r.job) == [
        Resize(1, 4),
        Resize(2, 4),
    ]
    assert not SlowdownDriven(expand=False).plan(s).resizes
    # A waiting job that fits takes the CPUs first.
    s = snap([8], [mate(1, 2, (1, 8))], [pending(2, 4)])
    plan = SlowdownDriven().plan(s)
    assert started(plan) == [2] and plan.resizes == [Resize(1, 4)]


def test_static_backfill_still_comes_first():
    rigid = msgspec.structs.replace(mate(1, 2, walltime=500), malleable=None)
    s = snap([4], [rigid], [pending(2, 2), pending(3, 4), pending(4, 2, None, 400)])
    plan = SlowdownDriven().plan(s)
    assert started(plan) == [2] and plan.predicted[3] == 500


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_slowdown": "x"}, "max_slowdown"),
        ({"max_slowdown": 0.5}, "must be >= 1"),
        ({"sharing_factor": 0}, "sharing_factor"),
        ({"sharing_factor": "half"}, "sharing_factor"),
        ({"mates": 0}, "mates"),
    ],
)
def test_bad_parameters_are_named(params, message):
    with pytest.raises(InvalidArgument, match=message):
        SlowdownDriven(**params)
