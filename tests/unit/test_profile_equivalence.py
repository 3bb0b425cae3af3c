"""The product's profile and searches against a plain reference, on random input.

:class:`~tests.unit.profile_reference.ReferenceProfile` answers every question
the obvious way (no bounds, caches or holes). Two properties:

* plans (in plain Python: the reference is patched into the book, which
  compiled code would not see): conservative, EASY and backfilling with a
  depth plan random snapshots
  (nodes with CPUs, memory and GPUs; running jobs ending at various times, some
  past their requested time; pending jobs of random shapes; some snapshots
  "stuck", the running jobs holding all the memory; advance reservations) the
  same with either profile: the same starts, predicted starts and reasons;
* searches: long random sequences of questions and placements (many earliest
  starts between placements, as a conservative pass asks) get the same answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch import native
from minibatch.core.snapshot import ClusterSnapshot, Plan
from minibatch.policy import book, registry
from minibatch.policy.profile import Profile
from tests.unit.profile_reference import ReferenceProfile
from tests.unit.test_policy_properties import snapshots
from tests.unit.test_policy_snapshots import job, node, running, snap

POLICIES = [
    ("conservative", {}),
    ("easy", {}),
    ("backfill", {"depth": 2}),
    ("backfill", {"depth": 4, "select": "bestfit"}),
]


def plans(s: ClusterSnapshot, name: str, params: dict) -> tuple[Plan, Plan]:
    """The plan of policy ``name`` with the product's profile and with the
    reference's (patched in: plain Python only, see below)."""
    product = registry.load(name, params).plan(s)
    built: list[object] = []

    class Counted(ReferenceProfile):
        def __init__(self, *args, **kw) -> None:
            built.append(self)
            super().__init__(*args, **kw)

    with mock.patch.object(book, "Profile", Counted):
        reference = registry.load(name, params).plan(s)
    # Conservative always plans in a book (EASY may not need one).
    assert built or name != "conservative", "the reference profile was not used"
    return product, reference


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    """Busy nodes and a queue of random shapes; with ``stuck``, the running
    jobs hold all the memory while CPUs stay free."""
    now = float(draw(st.integers(0, 100)))
    count = draw(st.integers(1, 6))
    with_mem = draw(st.booleans())
    with_gpus = draw(st.integers(0, 3)) == 0
    stuck = with_mem and draw(st.booleans())
    caps, runs, jid = [], [], 1000
    for i in range(count):
        name, cpus = f"n{i}", draw(st.integers(1, 8))
        mem = draw(st.integers(8, 64)) if with_mem else None
        gpus = draw(st.integers(0, 2)) if with_gpus else 0
        caps.append(node(name, cpus, mem, gpus))
        left, mem_left, gpus_left = cpus, mem, gpus
        while left > 1 and draw(st.integers(0, 3)):
            take = draw(st.integers(1, left - 1))
            m = None if mem_left is None else draw(st.integers(0, mem_left))
            g = draw(st.integers(0, gpus_left))
            jid += 1
            start = now - draw(st.integers(0, 60))
            runs.append(
                running(
                    jid,
                    {name: take},
                    start,
                    draw(st.integers(1, 150)),  # some already past it
                    mem_kb=m,
                    gpus=g,
                )
            )
            left -= take
            mem_left = None if mem_left is None else mem_left - (m or 0)
            gpus_left -= g
        if stuck and mem_left:
            jid += 1
            runs.append(
                running(
                    jid, {name: 1}, now - 1, draw(st.integers(5, 150)), mem_kb=mem_left
                )
            )
    pending = []
    for k in range(draw(st.integers(1, 30))):
        nodes = draw(st.integers(1, min(3, count)))
        mem = (
            draw(st.integers(1, 24)) * nodes
            if with_mem and draw(st.booleans())
            else None
        )
        pending.append(
            job(
                k + 1,
                draw(st.integers(1, 8)),
                draw(st.integers(1, 150)),
                nodes=nodes,
                mem_kb=mem,
                gpus=draw(st.integers(0, 2)) if with_gpus else 0,
                submit=float(k),
            )
        )
    return snap(caps, runs, pending, now=now)


if native.compiled():
    # Compiled, the book calls its Profile directly: there is no module
    # attribute to patch. The two properties below then run in a plain-Python
    # interpreter; tests/unit/test_native.py holds the compiled plans to the
    # plain ones, byte for byte.
    @pytest.mark.timeout(600)
    def test_plans_match_the_reference_in_plain_python() -> None:
        names = [
            "test_plans_match_the_reference_on_busy_and_stuck_clusters",
            "test_plans_match_the_reference_with_advance_reservations",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            + [f"{__file__}::{name}" for name in names],
            env={**os.environ, "MB_PURE_PYTHON": "1"},
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "2 passed" in done.stdout, done.stdout[-2000:]

else:

    @settings(max_examples=300, deadline=None)
    @given(clusters(), st.sampled_from(POLICIES))
    def test_plans_match_the_reference_on_busy_and_stuck_clusters(s, policy):
        product, reference = plans(s, *policy)
        assert product == reference

    @settings(max_examples=150, deadline=None)
    @given(snapshots(), st.sampled_from(POLICIES))
    def test_plans_match_the_reference_with_advance_reservations(s, policy):
        product, reference = plans(s, *policy)
        assert product == reference


@st.composite
def sessions(draw: st.DrawFn):
    """Nodes with releases, then questions and placements."""
    count = draw(st.integers(2, 8))
    with_mem, with_gpus = draw(st.booleans()), draw(st.booleans())
    caps = [
        (
            draw(st.integers(1, 8)),
            draw(st.integers(0, 16)) if with_mem else None,
            draw(st.integers(0, 2)) if with_gpus else None,
        )
        for _ in range(count)
    ]
    releases = [
        [
            (
                float(draw(st.integers(0, 200))),
                draw(st.integers(1, 4)),
                draw(st.integers(0, 8)),
                draw(st.integers(0, 1)),
            )
            for _ in range(draw(st.integers(0, 4)))
        ]
        for _ in range(count)
    ]
    ops = draw(
        st.lists(
            st.tuples(
                st.integers(1, 3),  # nodes
                st.integers(1, 8),  # ppn
                st.integers(0, 12),  # memory per node
                st.integers(0, 1),  # gpus
                st.integers(1, 120),  # walltime
                st.integers(0, 4),  # 0: start now if it fits; else reserve
            ),
            min_size=1,
            max_size=60,
        )
    )
    return caps, releases, ops


def _profiles(caps, releases):
    names = tuple(f"n{i}" for i in range(len(caps)))
    plain = all(m is None and g is None for _, m, g in caps)
    out = []
    for cls in (Profile, ReferenceProfile):
        prof = cls(
            0.0,
            names,
            [c for c, _, _ in caps],
            [m for _, m, _ in caps],
            [g for _, _, g in caps],
            plain,
        )
        prof.build(
            [[(t, c) if plain else (t, c, m, g) for t, c, m, g in r] for r in releases]
        )
        out.append(prof)
    return out


def _replay(caps, releases, ops) -> tuple[Profile, ReferenceProfile]:
    """Ask and place ``ops`` in both profiles; they must answer alike."""
    product, reference = _profiles(caps, releases)
    plain = product.plain
    for count, ppn, mem, gpus, w, how in ops:
        count = min(count, len(caps))
        shape = (count, ppn, 0 if plain else mem, 0 if plain else gpus)
        now_fit = product.fit_now(shape, float(w))
        assert now_fit == reference.fit_now(shape, float(w))
        if how == 0 and now_fit is not None:
            for p in (product, reference):
                for i in now_fit:
                    p.add(i, None, float(w), -shape[1], -shape[2], -shape[3])
            continue
        found = product.earliest(shape, float(w), 0.0)
        assert found == reference.earliest(shape, float(w), 0.0)
        if found is not None:
            t, where = found
            for p in (product, reference):
                for i in where:
                    p.add(i, t, t + w, -shape[1], -shape[2], -shape[3], len(ops))
    for i in range(len(caps)):
        assert product.segments(i) == reference.segments(i)
    return product, reference


@settings(max_examples=300, deadline=None)
@given(sessions())
def test_searches_match_the_reference_between_placements(session):
    _replay(*session)


@st.composite
def proportional(draw: st.DrawFn):
    """Nodes with 4 units of memory per CPU, free and given back as much per
    CPU; jobs asking up to 4 per CPU (memory cannot decide: the bounds leave
    it out), and now and then 5 (from then on it may, and the bounds keep it)."""
    count = draw(st.integers(2, 8))
    caps = [(c, 4 * c, None) for c in (draw(st.integers(1, 8)) for _ in range(count))]
    releases = [
        [
            (float(draw(st.integers(0, 200))), c, 4 * c, 0)
            for c in (draw(st.integers(1, 4)) for _ in range(draw(st.integers(0, 4))))
        ]
        for _ in range(count)
    ]
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        ppn = draw(st.integers(1, 8))
        per_cpu = draw(st.sampled_from((0, 1, 2, 4, 4, 4, 4, 4, 4, 5)))
        ops.append(
            (
                draw(st.integers(1, 3)),
                ppn,
                per_cpu * ppn,
                0,
                draw(st.integers(1, 120)),
                draw(st.integers(0, 4)),
            )
        )
    return caps, releases, ops


@settings(max_examples=300, deadline=None)
@given(proportional())
def test_searches_match_the_reference_when_memory_cannot_decide(session):
    _replay(*session)


def test_memory_leaves_the_bounds_only_while_no_take_asks_more_per_cpu():
    caps = [(4, 16, None), (2, 8, None)]
    product, _ = _replay(caps, [[(50.0, 4, 16, 0)], []], [(1, 4, 16, 0, 100, 1)] * 3)
    search = product._search
    assert search is not None and search.spare == 4  # 16 per 4 CPUs free
    product.add(1, 10.0, 20.0, -1, -5, 0)  # 5 per CPU: memory may now decide
    assert search.spare == 0
