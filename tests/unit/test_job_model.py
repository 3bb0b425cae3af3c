"""The job model's small functions: PBS letters, the CPU-seconds a job held and
its eligible time (mutants of these survived the older tests; docs/mutation.md)."""

from __future__ import annotations

import pytest

from minibatch.core.job import (
    Allocation,
    Job,
    JobRequest,
    JobResult,
    JobState,
    ResizeEvent,
    allocated_cpu_seconds,
    eligible_time,
    state_letter,
)


def job(**kw) -> Job:
    fields = dict(
        id=1,
        name="j",
        user="u",
        uid=1,
        gid=1,
        group="g",
        workdir="/tmp",
        request=JobRequest(ppn=2),
        submit_time=0.0,
        state=JobState.RUNNING,
    )
    fields.update(kw)
    return Job(**fields)


@pytest.mark.parametrize(
    ("state", "result", "letter"),
    [
        (JobState.QUEUED, None, "Q"),
        (JobState.HELD, None, "H"),
        (JobState.WAITING, None, "W"),
        (JobState.RUNNING, None, "R"),
        (JobState.EXITING, None, "E"),
        (JobState.FINISHED, JobResult.COMPLETED, "C"),
        (JobState.FINISHED, JobResult.FAILED, "F"),
        (JobState.FINISHED, JobResult.CANCELLED, "F"),
        (JobState.FINISHED, JobResult.TIMEOUT, "F"),
    ],
)
def test_state_letters(state, result, letter):
    assert state_letter(state, result) == letter


def test_cpu_seconds_of_a_job_that_never_started_are_zero():
    assert allocated_cpu_seconds(job(state=JobState.QUEUED), now=500.0) == 0.0


def test_cpu_seconds_of_a_job_without_resizes():
    two = [Allocation("n0", [0, 1])]
    done = job(alloc=two, start_time=100.0, end_time=100.5, state=JobState.FINISHED)
    assert allocated_cpu_seconds(done, now=900.0) == 1.0  # 2 CPUs x 0.5 s
    live = job(alloc=two, start_time=100.0)
    assert allocated_cpu_seconds(live, now=100.25) == 0.5  # up to now
    assert allocated_cpu_seconds(live, now=99.0) == 0.0  # clocks disagree: none


def test_cpu_seconds_integrate_over_resizes_up_to_now():
    shrunk = ResizeEvent(time=110.0, node="n0", before=[0, 1], after=[0])
    live = job(alloc=[Allocation("n0", [0])], start_time=100.0, resizes=[shrunk])
    assert allocated_cpu_seconds(live, now=110.5) == 2 * 10 + 1 * 0.5
    assert allocated_cpu_seconds(live, now=109.0) == 2 * 9  # before the resize


def test_eligible_time_below_a_second():
    queued = job(state=JobState.QUEUED, queued_since=100.0, eligible_s=0.0)
    assert eligible_time(queued, now=100.25) == 0.25
    assert eligible_time(queued, now=99.0) == 0.0
    running = job(eligible_s=3.5)
    assert eligible_time(running, now=1e9) == 3.5
