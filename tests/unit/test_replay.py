"""``mb replay``'s plan, without a cluster: scaled times, the shortest run, the
walltime margin, and the qsub command line each trace job becomes."""

from __future__ import annotations

import pytest

from minibatch.cli.qsub import make_spec
from minibatch.errors import InvalidArgument
from minibatch.sim.machine import Machine
from minibatch.sim.replay import (
    MARGIN,
    PROGRAM,
    Submission,
    mapping_csv,
    program,
    qsub_args,
    schedule,
)
from tests.conftest import trace_job


def test_times_are_divided_by_the_speedup() -> None:
    machine = Machine.uniform(2, 2)
    jobs = [
        trace_job(7, 0.0, 6000.0, 1, req=12000.0, machine=machine, user="37"),
        trace_job(9, 1200.0, 30.0, 4, req=60.0, machine=machine),
        trace_job(8, 600.0, 3000.0, 2, req=2000.0, machine=machine),
    ]
    plan = schedule(jobs, 600.0)
    assert [s.trace_id for s in plan] == [7, 8, 9]  # by submission
    first, overran, short = plan
    assert first == Submission(7, 0.0, "37", 1, 1, 10.0, 20)
    # Ran past its request in the trace: time to end, MARGIN seconds more.
    assert (overran.at, overran.run, overran.walltime) == (1.0, 5.0, 5 + MARGIN)
    # 0.05 s would be no job to the simulator's filter: at least a second.
    assert (short.at, short.run, short.walltime) == (2.0, 1.0, 1 + MARGIN)
    assert (short.nodes, short.ppn) == (2, 2)


@pytest.mark.parametrize("speedup", [0.0, -1.0, float("nan")])
def test_a_speedup_must_be_positive(speedup: float) -> None:
    with pytest.raises(InvalidArgument, match="--speedup must be a positive"):
        schedule([], speedup)


def test_each_submission_is_a_qsub_command_line() -> None:
    sub = Submission(11, 0.5, "153", 2, 3, 2.883, 5)
    argv = qsub_args(sub, program(), "/tmp/out")
    made = make_spec(argv, environ={}, workdir="/tmp", mail=False)
    assert made is not None
    spec = made[0]
    assert spec.name == "trace11" and spec.account == "trace-user-153"
    assert (spec.request.nodes, spec.request.ppn, spec.request.walltime) == (2, 3, 5)
    assert spec.argv == [str(PROGRAM), "2.883"]
    assert spec.join and spec.stdout_path is not None
    assert spec.stdout_path.startswith("/tmp/out")


def test_the_mapping_names_trace_and_live_jobs() -> None:
    plan = [Submission(11, 0.0, "153", 1, 1, 2.883, 5)]
    assert mapping_csv(plan, [42]).splitlines() == [
        "trace_job,job,trace_user,submit_s,nodes,ppn,run_s,walltime_s",
        "11,42,153,0.000,1,1,2.883,5",
    ]
