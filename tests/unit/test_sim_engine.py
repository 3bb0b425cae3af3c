"""The event loop on hand-made workloads: event order, validation, predictions."""

from __future__ import annotations

from typing import ClassVar

import pytest

from minibatch.core.snapshot import ClusterSnapshot, Plan, Start
from minibatch.policy.backfill import Easy
from minibatch.policy.fifo import Fifo
from minibatch.sim.engine import PlanRejected, RecordView, Simulator
from minibatch.sim.machine import Machine
from tests.conftest import trace_job as tj


def starts(outcomes) -> dict[int, float]:
    return {o.job.id: o.start for o in outcomes}


class Spy:
    """Records what each pass saw; starts nothing unless told to (wraps a policy)."""

    name: ClassVar[str] = "spy"

    def __init__(self, inner=None) -> None:
        self.inner = inner
        self.seen: list[tuple[float, list[int], list[int], int]] = []
        self.snaps: list[ClusterSnapshot] = []
        self.views: list[tuple[list, list]] = []

    def plan(self, snap: ClusterSnapshot) -> Plan:
        self.snaps.append(snap)
        self.views.append((list(snap.running), list(snap.pending)))
        self.seen.append(
            (
                snap.now,
                [p.id for p in snap.pending],
                [r.id for r in snap.running],
                sum(n.free_cpus for n in snap.nodes),
            )
        )
        if self.inner is not None:
            return self.inner.plan(snap)
        return Plan(generation=snap.generation)


def test_ends_are_applied_before_arrivals_and_one_pass_runs_per_instant():
    machine = Machine.pool(4)
    jobs = [
        tj(1, 0, 10, 4, machine=machine),
        tj(2, 10, 5, 4, machine=machine),  # arrives as job 1 ends
        tj(3, 10, 5, 1, machine=machine),  # same instant
    ]
    spy = Spy(Fifo())
    out = Simulator(spy, machine, jobs).run()
    assert starts(out) == {1: 0, 2: 10, 3: 15}
    # At t=10 job 1 has already ended: both arrivals are seen in one pass with
    # every CPU free; t=15 is job 2's end.
    assert [(t, p, r, f) for t, p, r, f in spy.seen] == [
        (0, [1], [], 4),
        (10, [2, 3], [], 4),
        (15, [3], [], 4),
    ]


def test_instants_with_an_empty_queue_need_no_pass():
    machine = Machine.pool(2)
    jobs = [tj(1, 0, 10, 1, machine=machine), tj(2, 100, 10, 1, machine=machine)]
    spy = Spy(Fifo())
    sim = Simulator(spy, machine, jobs)
    sim.run()
    assert [t for t, *_ in spy.seen] == [0, 100]  # not at the ends, 10 and 110
    assert sim.stats.instants == 4 and sim.stats.passes == 2


def test_the_policy_sees_requested_times_never_run_times():
    machine = Machine.pool(2)
    jobs = [tj(1, 0, 50, 2, req=400, machine=machine), tj(2, 1, 5, 2, req=70)]
    spy = Spy(Fifo())
    Simulator(spy, machine, jobs).run()
    with pytest.raises(RuntimeError, match="moved on"):
        list(spy.snaps[0].pending)  # a snapshot is dead once its pass is over
    assert spy.snaps[1].now == 1
    running, pending = spy.views[1]
    # Nothing in a running or pending view carries the run time (50 / 5).
    assert not any(hasattr(v, "run_time") for v in (*running, *pending))
    assert [(r.id, r.walltime, r.start_time) for r in running] == [(1, 400, 0)]
    assert [p.request.walltime for p in pending] == [70]


def test_jobs_run_their_trace_time_unless_killed_at_walltime():
    machine = Machine.pool(1)
    jobs = [tj(1, 0, 100, 1, req=60, machine=machine), tj(2, 0, 10, 1, req=20)]
    out = Simulator(Fifo(), machine, jobs).run()
    assert [(o.start, o.end) for o in out] == [(0, 100), (100, 110)]
    out = Simulator(Fifo(), machine, jobs, kill_at_walltime=True).run()
    assert [(o.start, o.end) for o in out] == [(0, 60), (60, 70)]


def test_easy_counts_an_overrunning_job_as_ending_now():
    machine = Machine.pool(4)
    jobs = [
        tj(1, 0, 100, 4, req=10, machine=machine),  # overruns its 10 s by far
        tj(2, 50, 10, 4, machine=machine),  # head: predicted to start "now" at 50
        tj(3, 60, 5, 1, machine=machine),  # cannot backfill: shadow is 60 (now)
    ]
    out = Simulator(Easy(), machine, jobs).run()
    by_id = {o.job.id: o for o in out}
    assert by_id[2].predicted == 50
    assert by_id[2].start == 100 and by_id[3].start == 110


def test_predicted_start_is_the_easy_shadow_at_submission():
    machine = Machine.pool(4)
    jobs = [
        tj(1, 0, 100, 3, machine=machine),
        tj(2, 10, 50, 4, machine=machine),  # head at submission: shadow 100
        tj(3, 20, 30, 1, machine=machine),  # backfilled at once: predicted 20
        tj(4, 30, 500, 1, machine=machine),  # would delay the head: waits, no pred.
    ]
    out = {o.job.id: o for o in Simulator(Easy(), machine, jobs).run()}
    assert out[1].predicted == 0 and out[1].start == 0
    assert out[2].predicted == 100 and out[2].start == 100
    assert out[3].predicted == 20 and out[3].start == 20
    assert out[4].predicted is None and out[4].start == 150
    # FIFO predicts nothing: only the job started at its submission has one.
    fifo = {o.job.id: o.predicted for o in Simulator(Fifo(), machine, jobs).run()}
    assert fifo == {1: 0, 2: None, 3: None, 4: None}


def test_jobs_are_placed_on_named_nodes_with_memory():
    machine = Machine.uniform(2, 4, mem_kb=1000)
    jobs = [
        tj(1, 0, 10, 2, machine=machine, mem_kb=800),
        tj(2, 0, 10, 2, machine=machine, mem_kb=800),  # memory forces n1
        tj(3, 0, 10, 6, machine=machine),  # 2 nodes x 3 CPUs: waits for both
    ]
    out = {o.job.id: o for o in Simulator(Fifo(), machine, jobs).run()}
    assert out[1].nodes == ("n0",) and out[2].nodes == ("n1",)
    assert out[3].nodes == ("n0", "n1") and out[3].start == 10


class Greedy:
    """A buggy policy: starts every pending job on the first node."""

    name: ClassVar[str] = "greedy"

    def plan(self, snap: ClusterSnapshot) -> Plan:
        return Plan(
            generation=snap.generation,
            starts=[Start(p.id, (snap.nodes[0].name,)) for p in snap.pending],
        )


class Stranger:
    name: ClassVar[str] = "stranger"

    def __init__(self, start: Start) -> None:
        self.start = start

    def plan(self, snap: ClusterSnapshot) -> Plan:
        return Plan(generation=snap.generation, starts=[self.start])


def test_a_start_the_server_would_refuse_is_a_policy_bug():
    machine = Machine.uniform(2, 2)
    jobs = [tj(1, 0, 10, 2, machine=machine), tj(2, 0, 10, 2, machine=machine)]
    with pytest.raises(PlanRejected, match="free CPUs"):
        Simulator(Greedy(), machine, jobs).run()
    with pytest.raises(PlanRejected, match="not queued"):
        Simulator(Stranger(Start(99, ("n0",))), machine, jobs).run()
    with pytest.raises(PlanRejected, match="does not exist"):
        Simulator(Stranger(Start(1, ("n7",))), machine, jobs).run()
    wide = [tj(1, 0, 10, 4, machine=machine)]
    with pytest.raises(PlanRejected, match="distinct nodes"):
        Simulator(Stranger(Start(1, ("n0", "n0"))), machine, wide).run()


def test_a_policy_that_never_starts_a_job_is_reported():
    class Idle:
        name: ClassVar[str] = "idle"

        def plan(self, snap: ClusterSnapshot) -> Plan:
            return Plan(generation=snap.generation)

    with pytest.raises(PlanRejected, match="never started"):
        Simulator(Idle(), Machine.pool(2), [tj(1, 0, 10, 1)]).run()


def test_duplicate_job_ids_are_refused():
    with pytest.raises(ValueError, match="unique"):
        Simulator(Fifo(), Machine.pool(2), [tj(1, 0, 1, 1), tj(1, 5, 1, 1)])


def test_record_view_is_a_read_only_sequence():
    class Clock:
        version = 0

    items = {3: "a", 1: "b", 2: "c"}
    clock = Clock()
    view: RecordView[str] = RecordView(items.values(), clock)  # type: ignore[arg-type]
    assert list(view) == ["a", "b", "c"] and len(view) == 3
    assert view[0] == "a" and view[-1] == "c" and view[1:] == ("b", "c")
    assert "b" in view and view.index("c") == 2
    with pytest.raises(IndexError):
        view[3]
    clock.version += 1
    with pytest.raises(RuntimeError):
        len(view)


def test_progress_is_reported_up_to_the_total():
    calls: list[tuple[int, int]] = []
    jobs = [tj(i, i, 1, 1) for i in range(1, 5000)]
    Simulator(
        Fifo(), Machine.pool(2), jobs, progress=lambda a, b: calls.append((a, b))
    ).run()
    assert calls[0] == (4096, 4999) and calls[-1] == (4999, 4999)
