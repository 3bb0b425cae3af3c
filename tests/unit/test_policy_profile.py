"""The availability profile against a brute-force model, second by second.

The model keeps, per node and per whole second, the free CPUs, memory and GPUs;
a window fits if every second of it has room. Releases, starts and reservations
land on whole seconds, so the model and the profile must agree exactly: on what
fits now, on each node's earliest start, and on the earliest start of a job
over several nodes (first fit at that time).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.policy.book import Book
from minibatch.policy.profile import Profile
from tests.unit.test_policy_snapshots import job, node, running, snap

HORIZON = 400  # seconds modelled: past every release and reservation


class Model:
    def __init__(self, free: list[tuple[int, int | None, int | None]]) -> None:
        self.rows = [
            [list(f) for _ in range(HORIZON + 30)] for f in free
        ]  # per node, per second: [cpus, mem, gpus]

    def change(self, i: int, start: int, end: int, c: int, m: int, g: int) -> None:
        for t in range(start, min(end, len(self.rows[i]))):
            row = self.rows[i][t]
            row[0] += c
            if row[1] is not None:
                row[1] += m
            if row[2] is not None:
                row[2] += g

    def ok(self, i: int, t: int, ppn: int, mem: int, gpus: int) -> bool:
        c, m, g = self.rows[i][t]
        return (
            c >= ppn
            and (not mem or m is None or m >= mem)
            and (not gpus or (g is not None and g >= gpus))
        )

    def window(self, i: int, t: int, w: int, shape: tuple[int, int, int, int]) -> bool:
        _, ppn, mem, gpus = shape
        return all(self.ok(i, s, ppn, mem, gpus) for s in range(t, t + w))

    def earliest(
        self, shape: tuple[int, int, int, int], w: int
    ) -> tuple[int, list[int]] | None:
        for t in range(HORIZON + 1):
            fit = [i for i in range(len(self.rows)) if self.window(i, t, w, shape)]
            if len(fit) >= shape[0]:
                return t, fit[: shape[0]]
        return None


@st.composite
def worlds(draw: st.DrawFn):
    count = draw(st.integers(1, 4))
    with_mem = draw(st.booleans())
    with_gpus = draw(st.booleans())
    caps = [
        (
            draw(st.integers(1, 6)),
            draw(st.integers(0, 10)) if with_mem else None,
            draw(st.integers(0, 3)) if with_gpus else None,
        )
        for _ in range(count)
    ]
    releases = [
        [
            (
                draw(st.integers(1, 40)),
                draw(st.integers(1, 3)),
                draw(st.integers(0, 3)),
                draw(st.integers(0, 1)),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        for _ in range(count)
    ]
    ops = draw(
        st.lists(
            st.tuples(
                st.integers(1, min(3, count)),  # nodes
                st.integers(1, 4),  # ppn
                st.integers(0, 4),  # mem
                st.integers(0, 1),  # gpus
                st.integers(1, 25),  # walltime
            ),
            max_size=12,
        )
    )
    return caps, releases, ops


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_profile_agrees_with_the_second_by_second_model(world):
    caps, releases, ops = world
    names = tuple(f"n{i}" for i in range(len(caps)))
    plain = all(m is None and g is None for _, m, g in caps)
    prof = Profile(
        0.0,
        names,
        [c for c, _, _ in caps],
        [m for _, m, _ in caps],
        [g for _, _, g in caps],
        plain,
    )
    model = Model([(c, m, g) for c, m, g in caps])
    steps = []
    for i, rel in enumerate(releases):
        node_steps = []
        for t, c, m, g in rel:
            node_steps.append((float(t), c) if plain else (float(t), c, m, g))
            model.change(i, t, 10**6, c, m, g)
        steps.append(node_steps)
    prof.build(steps)
    for count, ppn, mem, gpus, w in ops:
        shape = (count, ppn, mem if not plain else 0, gpus if not plain else 0)
        # Fits now: the same nodes as the model's first fit over [0, w).
        now_nodes = [i for i in range(len(caps)) if model.window(i, 0, w, shape)]
        expected_now = now_nodes[:count] if len(now_nodes) >= count else None
        assert prof.fit_now(shape, float(w)) == expected_now
        # Every node's earliest start, and the job's.
        for i in range(len(caps)):
            got = prof.next_start(i, shape, float(w), 0.0)
            want = next(
                (t for t in range(HORIZON + 1) if model.window(i, t, w, shape)), None
            )
            assert got == (None if want is None else float(want))
        found = prof.earliest(shape, float(w), 0.0)
        want = model.earliest(shape, w)
        assert found == (None if want is None else (float(want[0]), want[1]))
        if found is not None:  # reserve it, as a policy would
            t, where = found
            for i in where:
                prof.add(i, t, t + w, -shape[1], -shape[2], -shape[3], 1)
                model.change(i, int(t), int(t) + w, -shape[1], -shape[2], -shape[3])


def test_an_overrunning_job_releases_now_but_not_for_starting_now():
    s = snap([4], [running(1, {"n0": 4}, start=0, walltime=10)], now=50)
    book = Book(s)
    book.build()
    general = book.general
    assert general.fit_now((1, 4, 0, 0), 60.0) is None  # its CPUs are still busy
    assert general.earliest((1, 4, 0, 0), 10.0, 50.0) == (50.0, [0])


def test_releases_at_one_instant_count_together():
    s = snap([4], [running(1, {"n0": 2}, 0, 100), running(2, {"n0": 2}, 0, 100)])
    book = Book(s)
    book.build()
    assert book.general.earliest((1, 4, 0, 0), 5.0, 0.0) == (100.0, [0])


def test_down_nodes_give_nothing_back():
    s = snap([4], [running(1, {"n0": 2, "gone": 2}, 0, 100)])
    book = Book(s)
    book.build()
    assert book.general.segments(0) == [(0.0, 2, None, None), (100.0, 4, None, None)]


def test_memory_and_gpus_are_profiled_per_node():
    s = snap(
        [node("a", 8, 10, 1), node("b", 8, 10, 0)],
        [running(1, {"a": 1}, 0, 50, mem_kb=8, gpus=1)],
    )
    book = Book(s)
    book.build()
    # A GPU job can only go to a, once job 1 gives its GPU back.
    assert book.general.earliest((1, 1, 0, 1), 5.0, 0.0) == (50.0, [0])
    # A memory-hungry job goes to b now.
    assert book.general.fit_now((1, 1, 9, 0), 5.0) == [1]
    # Two nodes with 9 KB each: when a's memory comes back.
    assert book.general.earliest((2, 1, 9, 0), 5.0, 0.0) == (50.0, [0, 1])


def test_start_without_future_is_kept_for_the_build():
    s = snap([4], [running(1, {"n0": 2}, 0, 100)], [job(2, 2, 30)])
    book = Book(s)
    general = book.general
    general.add(0, None, 30.0, -2, 0, 0)  # job 2 starts before anything is built
    book.build()
    assert general.segments(0) == [
        (0.0, 0, None, None),
        (30.0, 2, None, None),
        (100.0, 4, None, None),
    ]
