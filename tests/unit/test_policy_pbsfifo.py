"""PBS FIFO (seed 004): start anything that fits; a starving job halts the rest."""

from __future__ import annotations

import msgspec
import pytest

from minibatch.errors import InvalidArgument
from minibatch.policy import registry
from minibatch.policy.pbsfifo import PbsFifo
from minibatch.sim.engine import Simulator
from minibatch.sim.machine import Machine
from tests.conftest import trace_job
from tests.unit.test_policy_snapshots import Like, job, running, snap, started

H = 3600.0


def test_starts_anything_that_fits_skipping_what_does_not():
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 100)],
        [job(2, 4, 10), job(3, 1, 500), job(4, 1, 10)],
    )
    plan = PbsFifo().plan(s)
    assert plan.starts == [Like(job=3), Like(job=4)]  # not strict FIFO
    assert plan.reasons[2].startswith("waiting for 4 CPUs")
    assert plan.predicted == {}


def test_a_starving_job_halts_every_other_start():
    # Job 2 has waited 25 h; the machine has room for job 3 but it must wait.
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 30 * H)],
        [job(2, 4, 10, submit=0.0), job(3, 1, 10, submit=24 * H)],
        now=25 * H,
    )
    plan = PbsFifo().plan(s)
    assert started(plan) == []
    assert plan.predicted == {2: 30 * H}
    assert "starving (eligible 25.0 h, more than 24.0 h)" in plan.reasons[2]
    assert plan.default_reason == "held back: job 2 is starving (pbs-fifo)"
    # Before 24 h it does not starve yet.
    young = snap(
        [4],
        [running(1, {"n0": 2}, 0, 30 * H)],
        [job(2, 4, 10, submit=2 * H), job(3, 1, 10, submit=24 * H)],
        now=25 * H,
    )
    assert started(PbsFifo().plan(young)) == [3]


def test_starving_jobs_go_first_then_the_rest():
    s = snap(
        [4],
        [],
        [job(5, 1, 10, submit=2 * H - 60), job(2, 3, 10, submit=0.0)],
        now=2 * H,
    )
    plan = PbsFifo(starve_after="1:00:00").plan(s)
    assert started(plan) == [2, 5]


def test_a_starving_job_that_can_never_run_halts_nothing():
    s = snap([4], [], [job(2, 8, 10, submit=0.0), job(3, 1, 10)], now=30 * H)
    plan = PbsFifo().plan(s)
    assert started(plan) == [3]
    assert plan.reasons[2].endswith("no usable node has room for it now")


def test_the_mechanism_can_be_turned_off():
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 30 * H)],
        [job(2, 4, 10, submit=0.0), job(3, 1, 10)],
        now=25 * H,
    )
    assert started(PbsFifo(help_starving_jobs="false").plan(s)) == [3]
    assert started(registry.load("pbs-fifo", {"starve_after": 100 * H}).plan(s)) == [3]


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({"starve_after": "soon"}, "starve_after"),
        ({"starve_after": -5}, "starve_after"),
        ({"help_starving_jobs": "maybe"}, "help_starving_jobs"),
    ],
)
def test_bad_parameters_are_named(params, word):
    with pytest.raises(InvalidArgument, match=f"parameter {word}"):
        PbsFifo(**params)


def test_a_stream_of_small_jobs_cannot_starve_a_wide_one_for_ever():
    # One CPU job every 10 s, each 40 s long, keeps a 4-CPU job (arrived at 1)
    # out. At 101 it starves: nothing else starts, the machine drains (the
    # last small job ends at 140), it runs 140-190, then the stream resumes.
    machine = Machine.pool(4)
    jobs = [trace_job(1, 0, 40, 1), trace_job(100, 1, 50, 4)]
    jobs += [trace_job(k, 10.0 * k, 40, 1) for k in range(2, 30)]
    out = {
        o.job.id: o for o in Simulator(PbsFifo(starve_after=100), machine, jobs).run()
    }
    assert out[100].start == 140.0
    waited = [o.start for o in out.values() if 101 < o.job.submit < 190]
    assert waited and min(waited) == 190.0
    # Without the mechanism it waits until the stream ends.
    free = Simulator(PbsFifo(help_starving_jobs=False), machine, jobs).run()
    assert {o.job.id: o.start for o in free}[100] > 300


def test_held_time_does_not_count_toward_starving():
    # Submitted 25 h ago but eligible only for the last hour (held before):
    # not starving, so job 3 starts beside it.
    held_long = msgspec.structs.replace(
        job(2, 4, 10, submit=0.0), eligible_since=24 * H
    )
    s = snap(
        [4],
        [running(1, {"n0": 2}, 0, 30 * H)],
        [held_long, job(3, 1, 10, submit=24 * H)],
        now=25 * H,
    )
    assert started(PbsFifo().plan(s)) == [3]
    eligible_long = msgspec.structs.replace(held_long, eligible_since=0.5 * H)
    s = msgspec.structs.replace(s, pending=(eligible_long, s.pending[1]))
    assert started(PbsFifo().plan(s)) == []  # eligible 24.5 h: starving
