"""The scheduler's copy of the queue: deltas give what a full shipment gives."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.job import Job, JobOptions, JobState
from minibatch.core.snapshot import ClusterSnapshot
from minibatch.protocol import decode, encode
from minibatch.protocol.scheduling import PendingDelta, Wake
from minibatch.scheduler.mirror import NONE, QueueMirror
from minibatch.server.queue import PendingQueue
from tests.unit.test_job_model import job as a_job

pytestmark = pytest.mark.timeout(120)


def job(jid: int, submit: float, priority: int = 0, queue: str = "batch") -> Job:
    return a_job(
        id=jid,
        submit_time=submit,
        state=JobState.QUEUED,
        queue=queue,
        options=JobOptions(priority=priority),
    )


def wire(snap: ClusterSnapshot, delta: PendingDelta) -> Wake:
    """What the scheduler receives: the wake after encoding and decoding."""
    body = decode(encode(Wake(generation=1, snapshot=snap, delta=delta))).body
    assert isinstance(body, Wake)
    return body


def ship(
    queue: PendingQueue, whole: bool = True, base: int | None = None
) -> tuple[ClusterSnapshot, PendingDelta]:
    pending = queue.ordered()
    if not whole:  # a filter (a QOS limit, say) left the first job out
        pending = pending[1:]
    delta = queue.ship(whole and len(pending) == len(queue), base)
    snap = ClusterSnapshot(now=0.0, generation=1, nodes=(), running=(), pending=pending)
    if delta.base >= 0:
        snap = msgspec.structs.replace(snap, pending=())
    return snap, delta


def priorities(queue: str) -> float:
    return 10.0 if queue == "fast" else 0.0


# One step: submit (at a time, with a priority, in a queue), leave, alter (out
# and in again, with another priority), ship (filtered or not), lose a wake.
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.floats(0, 50, allow_nan=False),
            st.integers(-2, 2),
            st.sampled_from(["batch", "fast"]),
        ),
        st.tuples(st.just("discard"), st.integers(0, 40)),
        st.tuples(st.just("alter"), st.integers(0, 40), st.integers(-2, 2)),
        st.tuples(st.just("ship"), st.booleans()),
        st.tuples(st.just("lose")),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_deltas_give_the_queue_a_full_shipment_gives(
    script: list[tuple[Any, ...]],
) -> None:
    queue = PendingQueue(priorities)
    mirror = QueueMirror()
    jobs: dict[int, Job] = {}
    next_id = 1
    fetches = 0
    for step in script:
        if step[0] == "add":
            jobs[next_id] = job(next_id, step[1], step[2], step[3])
            queue.add(jobs[next_id])
            next_id += 1
        elif step[0] == "discard" and step[1] in jobs:
            queue.discard(jobs.pop(step[1]).id)
        elif step[0] == "alter" and step[1] in jobs:
            jobs[step[1]] = job(step[1], jobs[step[1]].submit_time, step[2])
            queue.discard(step[1])
            queue.add(jobs[step[1]])
        elif step[0] == "lose":
            ship(queue)  # a wake the scheduler never saw
        elif step[0] == "ship":
            whole = step[1]
            expected = queue.ordered() if whole else queue.ordered()[1:]
            wake = wire(*ship(queue, whole))
            assert wake.snapshot is not None
            got = mirror.apply(wake.snapshot, wake.delta)
            if got is None:  # out of step: the scheduler asks for all of it
                fetches += 1
                assert mirror.version == NONE
                again = wire(*ship(queue, whole, mirror.version))
                assert again.snapshot is not None and again.delta is not None
                got = mirror.apply(again.snapshot, again.delta)
            assert got is not None
            assert list(got.pending) == list(expected)
    assert fetches <= sum(1 for s in script if s[0] == "lose")


def test_a_pass_ships_what_changed_and_a_stranger_gets_it_whole() -> None:
    queue = PendingQueue()
    for i in range(1, 1001):
        queue.add(job(i, float(i)))
    mirror = QueueMirror()
    first = wire(*ship(queue))
    assert first.snapshot is not None and first.delta is not None
    assert first.delta.base == NONE and len(first.snapshot.pending) == 1000
    assert mirror.apply(first.snapshot, first.delta) is not None
    queue.discard(500)
    queue.add(job(1001, 0.5))  # ranks first: the copy is sorted again
    wake = wire(*ship(queue))
    assert wake.snapshot is not None and wake.delta is not None
    assert wake.snapshot.pending == [] and wake.delta.removed == [500]
    assert [p.id for p in wake.delta.added] == [1001]
    got = mirror.apply(wake.snapshot, wake.delta)
    assert got is not None and list(got.pending) == list(queue.ordered())
    # A scheduler started meanwhile holds nothing: it asks with base -1.
    assert QueueMirror().apply(wake.snapshot, wake.delta) is None
    snap, delta = ship(queue, base=NONE)
    assert delta.base == NONE and len(snap.pending) == 1000
