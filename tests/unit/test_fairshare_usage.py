"""Fairshare usage windows (core/usage.py): hand-computed decay, ledger and
finished-job sums = reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.job import Allocation, Job, JobRequest, JobState
from minibatch.core.usage import (
    FairshareConfig,
    FinishedUsage,
    FsPolicy,
    UsageLedger,
    UsageRecord,
    fairshare_usage,
    processor_equivalent,
    record_from_job,
    window_usage,
)

CFG = FairshareConfig(interval=100.0, depth=3, decay=0.5)


def rec(jid: int, user: str, rate: float, start: float, end: float | None, group="g"):
    return UsageRecord(id=jid, user=user, group=group, rate=rate, start=start, end=end)


def test_windows_and_decay_by_hand():
    # now = 250: window 2 is [200, 300) (current), 1 is [100, 200), 0 is [0, 100).
    records = [rec(1, "u", 2, 50, 220), rec(2, "v", 1, 230, None, group="h")]
    wins = window_usage(records, 250.0, CFG)
    assert wins["users"]["u"] == [40.0, 200.0, 100.0]  # 20 s, 100 s, 50 s x 2 CPUs
    assert wins["users"]["v"] == [20.0, 0.0, 0.0]  # running: charged up to now
    view = fairshare_usage(records, 250.0, CFG)
    assert view.users == {"u": 40 + 0.5 * 200 + 0.25 * 100, "v": 20.0}
    assert view.groups == {"g": 165.0, "h": 20.0}
    assert view.accounts == {}
    # Two windows: the [0, 100) part is forgotten.
    shallow = fairshare_usage(records, 250.0, FairshareConfig(interval=100, depth=2))
    assert shallow.users["u"] == 40 + 200


def test_maui_guide_example_decay():
    # John used 60/0/10/50 of totals 110/125/100/150, FSDECAY 0.5 (6.3fairshare).
    cfg = FairshareConfig(interval=100.0, depth=4, decay=0.5)
    records = [
        rec(1, "john", 1, 300, 360),
        rec(2, "john", 1, 100, 110),
        rec(3, "john", 1, 0, 50),
        rec(4, "other", 1, 300, 350),
        rec(5, "other", 1.25, 200, 300),
        rec(6, "other", 1, 100, 190),
        rec(7, "other", 1, 0, 100),
    ]
    view = fairshare_usage(records, 399.0, cfg)
    share = view.users["john"] / sum(view.users.values())
    expected = (60 + 0.5 * 0 + 0.25 * 10 + 0.125 * 50) / (
        110 + 0.5 * 125 + 0.25 * 100 + 0.125 * 150
    )
    assert share == pytest.approx(expected)


def test_fspolicy_none_gives_nothing():
    cfg = FairshareConfig(policy=FsPolicy.NONE)
    assert fairshare_usage([rec(1, "u", 1, 0, 10)], 20, cfg).users == {}
    ledger = UsageLedger(cfg)
    ledger.start(1, "u", "g", "", 1, 0)
    assert ledger.view(5).users == {}


def test_config_is_validated():
    with pytest.raises(ValueError):
        FairshareConfig(depth=25)
    with pytest.raises(ValueError):
        FairshareConfig(decay=0)
    with pytest.raises(ValueError):
        FairshareConfig(interval=0)


def test_processor_equivalent_and_live_jobs():
    assert processor_equivalent(32, 512, 128, 1024) == 64.0  # 25 % CPUs, 50 % mem
    assert processor_equivalent(4, None, 128, None) == 4.0
    job = Job(
        id=7,
        name="x",
        user="ann",
        uid=1,
        gid=1,
        group="lab",
        workdir="/",
        request=JobRequest(nodes=2, ppn=2, walltime=100),
        submit_time=0.0,
        state=JobState.FINISHED,
        alloc=[Allocation("n0", [0, 1]), Allocation("n1", [2, 3])],
        start_time=10.0,
        end_time=60.0,
        account="proj",
    )
    r = record_from_job(job)
    assert r is not None
    assert (r.user, r.group, r.account, r.rate, r.start, r.end, r.walltime) == (
        "ann",
        "lab",
        "proj",
        4.0,
        10.0,
        60.0,
        100.0,
    )
    job.start_time = None
    assert record_from_job(job) is None


@st.composite
def histories(draw: st.DrawFn):
    """Jobs as (start, duration, rate, user), and a few query times."""
    jobs = draw(
        st.lists(
            st.tuples(
                st.integers(0, 1000),
                st.integers(0, 400),
                st.integers(1, 8),
                st.sampled_from(["a", "b", "c"]),
            ),
            max_size=25,
        )
    )
    cfg = FairshareConfig(
        interval=draw(st.sampled_from([30.0, 100.0, 250.0])),
        depth=draw(st.integers(1, 6)),
        decay=draw(st.sampled_from([1.0, 0.5, 0.9])),
    )
    queries = sorted(draw(st.lists(st.integers(0, 1600), min_size=1, max_size=6)))
    return jobs, cfg, queries


@settings(max_examples=80, deadline=None)
@given(histories())
def test_ledger_equals_reference(case):
    jobs, cfg, queries = case
    events: list[tuple[float, int, int]] = []  # (time, 0 = start 1 = end, job)
    for i, (start, dur, _, _) in enumerate(jobs):
        events += [(float(start), 0, i), (float(start + dur), 1, i)]
    events.sort()
    ledger = UsageLedger(cfg)
    done: list[UsageRecord] = []
    k = 0
    for now in queries:
        while k < len(events) and events[k][0] <= now:
            t, kind, i = events[k]
            start, dur, rate, user = jobs[i]
            if kind:
                ledger.end(i, t)
            else:
                ledger.start(i, user, "g" + user, "", rate, t)
            k += 1
        started = {i for _, kind, i in events[:k] if not kind}
        ended = {i for _, kind, i in events[:k] if kind}
        done = []
        for i in sorted(started):
            start, dur, rate, user = jobs[i]
            end = start + dur if i in ended else None
            done.append(rec(i, user, rate, start, end, group="g" + user))
        want = fairshare_usage(done, now, cfg)
        got = ledger.view(now)
        assert got.users.keys() == want.users.keys()
        for name, value in want.users.items():
            assert got.users[name] == pytest.approx(value, rel=1e-9, abs=1e-6)
        for name, value in want.groups.items():
            assert got.groups[name] == pytest.approx(value, rel=1e-9, abs=1e-6)


@settings(max_examples=80, deadline=None)
@given(histories(), st.sampled_from([FsPolicy.DEDICATEDPS, FsPolicy.NONE]))
def test_finished_sums_equal_reference_to_the_bit(case, policy):
    """What the server keeps (finished jobs summed as they end, running ones
    added at each view) is the reference over every record, bit for bit, as
    time passes and old windows are forgotten."""
    jobs, cfg, queries = case
    cfg = FairshareConfig(
        policy=policy, interval=cfg.interval, depth=cfg.depth, decay=cfg.decay
    )
    ends = sorted(range(len(jobs)), key=lambda i: (jobs[i][0] + jobs[i][1], i))
    kept = FinishedUsage(cfg)
    done: list[UsageRecord] = []
    k = 0
    for now in queries:
        while k < len(ends) and sum(jobs[ends[k]][:2]) <= now:
            i = ends[k]
            start, dur, rate, user = jobs[i]
            record = rec(i, user, rate, start, start + dur, group="g" + user)
            kept.add(record)
            done.append(record)
            k += 1
        finished = {r.id for r in done}
        running = [
            rec(i, user, rate, start, None, group="g" + user)
            for i, (start, _, rate, user) in enumerate(jobs)
            if i not in finished and start <= now
        ]
        assert kept.view(now, running) == fairshare_usage(done + running, now, cfg)
