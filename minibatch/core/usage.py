"""Fairshare usage windows and PSP accuracy history, from job records.

Pure accounting, shared by the server (which hands the results to the policy in
the :class:`~minibatch.core.snapshot.ClusterSnapshot`) and the simulator. No IO,
no wall clock: every function takes ``now``.

**Fairshare usage** (Maui 6.3fairshare, src/MFS.c; ``shared/batch-systems.md``
§2.3). Time is cut into windows of ``FSINTERVAL`` seconds aligned to multiples of
it (window *w* is ``[w·I, (w+1)·I)``); window 0 is the current one, window *i* the
*i*-th before it. A job charges ``FSPOLICY``'s metric while it runs:

* ``DEDICATEDPS``: dedicated processors x seconds (the default when enabled);
* ``DEDICATEDPES``: processor-equivalents x seconds (:func:`processor_equivalent`);
* ``NONE`` (Maui's default): no fairshare at all, the views are empty.

Each window gets the part of a job's run that falls inside it (a running job up
to ``now``), for its user, group and account. The decayed usage of an entity is

    U = Σ_{i=0}^{FSDEPTH-1} FSDECAY^i · used[i]

(the current window undecayed, as in Maui's code). Percentages against the total
(:mod:`minibatch.policy.fairshare`) are U / Σ_users U, which is Maui's
Σ d^i·used / Σ d^i·total because the total is the sum over users. Defaults are
Maui's code truth: ``FSINTERVAL`` 12 h, ``FSDEPTH`` 8, ``FSDECAY`` 1.0.

Two implementations give the same numbers (tested against each other):
:func:`fairshare_usage` recomputes from records (simple, the reference; the server
can call it on its accounting), :class:`UsageLedger` keeps running sums as jobs
start and end (the simulator; a pass costs O(entities), not O(jobs)).

**PSP accuracy** (seed 000, Rocchetti et al.): a finished job's accuracy is
run time / requested time, clamped to [0, 1]; a user's history is the accuracies
of their last :data:`HISTORY` (10) finished jobs by end time, oldest first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Final

import msgspec

from minibatch.core.job import Job, allocated_cpu_seconds
from minibatch.core.snapshot import FairshareView

#: PSP looks at the accuracy of a user's last 10 finished jobs.
HISTORY: Final = 10
#: Maui's MAX_FSDEPTH.
MAX_FSDEPTH: Final = 24


class FsPolicy(StrEnum):
    """Maui ``FSPOLICY``: what a running job charges per second."""

    NONE = "NONE"
    DEDICATEDPS = "DEDICATEDPS"
    DEDICATEDPES = "DEDICATEDPES"


class FairshareConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Maui's fairshare accounting parameters (code defaults, policy enabled).

    ``policy`` defaults to ``DEDICATEDPS``: who builds a ledger wants fairshare;
    a scheduler that must follow Maui's "off unless configured" passes ``NONE``.
    """

    policy: FsPolicy = FsPolicy.DEDICATEDPS
    interval: float = 43200.0
    depth: int = 8
    decay: float = 1.0

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"FSINTERVAL must be > 0, not {self.interval}")
        if not 1 <= self.depth <= MAX_FSDEPTH:
            raise ValueError(f"FSDEPTH must be 1..{MAX_FSDEPTH}, not {self.depth}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"FSDECAY must be in (0, 1], not {self.decay}")

    @property
    def enabled(self) -> bool:
        return self.policy is not FsPolicy.NONE


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One job as accounting sees it.

    ``rate`` is what it charges per second under the configured ``FSPOLICY``
    (dedicated CPUs, or processor-equivalents); ``end`` None means still running.
    ``walltime`` (requested seconds) is only needed for PSP accuracy.
    """

    id: int
    user: str
    group: str = ""
    account: str = ""
    rate: float
    start: float
    end: float | None = None
    walltime: float = 0.0


def processor_equivalent(
    cpus: int, mem_kb: int | None, total_cpus: int, total_mem_kb: int | None
) -> float:
    """Maui's PE: the largest share of any resource, in processors.

    25 % of the CPUs and 50 % of the memory of a 128-processor machine is 64.
    """
    if total_cpus <= 0:
        return float(cpus)
    share = cpus / total_cpus
    if mem_kb and total_mem_kb:
        share = max(share, mem_kb / total_mem_kb)
    return share * total_cpus


def record_from_job(
    job: Job, policy: FsPolicy = FsPolicy.DEDICATEDPS
) -> UsageRecord | None:
    """A server :class:`Job` as a usage record; None if it never started.

    Under ``DEDICATEDPES`` the caller should rebuild ``rate`` with
    :func:`processor_equivalent` (it needs the cluster's totals).
    """
    if job.start_time is None:
        return None
    cpus: float = sum(len(a.cpus) for a in job.alloc) or job.request.cpus
    if job.resizes and job.end_time is not None and job.end_time > job.start_time:
        # A resized job is charged the CPUs it held over its run, spread evenly.
        cpus = allocated_cpu_seconds(job, job.end_time) / (
            job.end_time - job.start_time
        )
    return UsageRecord(
        id=job.id,
        user=job.user,
        group=job.group,
        account=job.account,
        rate=float(cpus),
        start=job.start_time,
        end=job.end_time,
        walltime=float(job.request.walltime),
    )


# ------------------------------------------------------------ reference


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


_KINDS: Final = ("users", "groups", "accounts")


def _charges(
    rec: UsageRecord, end: float, first: int, last: int, interval: float
) -> Iterator[tuple[str, str, int, float]]:
    """(kind, name, window, usage) of ``rec``'s run up to ``end`` in windows
    ``first``..``last``; nothing for "" names."""
    if end <= rec.start or rec.rate <= 0:
        return
    names = (rec.user, rec.group, rec.account)
    for w in range(max(first, math.floor(rec.start / interval)), last + 1):
        part = _overlap(rec.start, end, w * interval, (w + 1) * interval)
        if part <= 0:
            continue
        for kind, name in zip(_KINDS, names, strict=True):
            if name:
                yield kind, name, w, part * rec.rate


def window_usage(
    records: Iterable[UsageRecord], now: float, config: FairshareConfig
) -> dict[str, dict[str, list[float]]]:
    """Undecayed usage per window: ``{"users"|"groups"|"accounts": {name: [w0..]}}``.

    ``w0`` is the current window (up to ``now``); the list has ``FSDEPTH`` entries.
    Entities with no usage in any window are left out; "" names are left out.
    """
    interval, depth = config.interval, config.depth
    current = math.floor(now / interval)
    oldest = current - depth + 1
    out: dict[str, dict[str, list[float]]] = {k: {} for k in _KINDS}
    for rec in records:
        end = now if rec.end is None else min(rec.end, now)
        for kind, name, w, used in _charges(rec, end, oldest, current, interval):
            row = out[kind].setdefault(name, [0.0] * depth)
            row[current - w] += used
    return out


def decayed(windows: list[float], decay: float) -> float:
    """Σ decay^i · windows[i] (window 0 = current)."""
    return math.fsum(u * decay**i for i, u in enumerate(windows))


def _view(wins: dict[str, dict[str, list[float]]], decay: float) -> FairshareView:
    users, groups, accounts = (
        {n: decayed(w, decay) for n, w in wins[kind].items()} for kind in _KINDS
    )
    return FairshareView(users=users, groups=groups, accounts=accounts)


def fairshare_usage(
    records: Iterable[UsageRecord], now: float, config: FairshareConfig
) -> FairshareView:
    """The snapshot's :class:`FairshareView` at ``now``, from job records.

    Records are finished or running jobs (``end`` None); only what they ran before
    ``now`` counts. Empty under ``FSPOLICY NONE``.
    """
    if not config.enabled:
        return FairshareView()
    return _view(window_usage(records, now, config), config.decay)


class FinishedUsage:
    """What finished jobs used, per entity and window, kept as they end.

    :meth:`view` with the running jobs is :func:`fairshare_usage` of the
    finished records (added in the same order) and the running ones, to the
    last bit, but costs O(entities x FSDEPTH + running jobs) instead of
    O(every job of the last FSDEPTH windows): a server that finishes a job a
    millisecond would otherwise walk days of jobs at each recomputation. A
    finished job counts up to its end even if ``now`` is earlier (a node's clock
    ahead of the server's by the report's travel time), where the reference
    stops at ``now``.
    """

    def __init__(self, config: FairshareConfig) -> None:
        self.config = config
        #: kind -> name -> absolute window -> usage, in the order jobs ended.
        self._used: dict[str, dict[str, dict[int, float]]] = {k: {} for k in _KINDS}
        #: The oldest window still kept (None: nothing forgotten yet).
        self._oldest: int | None = None

    def add(self, rec: UsageRecord) -> None:
        """A finished job's record (``end`` set)."""
        assert rec.end is not None
        interval = self.config.interval
        first = math.floor(rec.start / interval)
        if self._oldest is not None:
            first = max(first, self._oldest)
        last = math.floor(rec.end / interval)
        for kind, name, w, used in _charges(rec, rec.end, first, last, interval):
            windows = self._used[kind].setdefault(name, {})
            windows[w] = windows.get(w, 0.0) + used

    def view(self, now: float, running: Iterable[UsageRecord]) -> FairshareView:
        """The :class:`FairshareView` at ``now`` (empty under ``FSPOLICY NONE``)."""
        cfg = self.config
        if not cfg.enabled:
            return FairshareView()
        current = math.floor(now / cfg.interval)
        oldest = current - cfg.depth + 1
        self._forget(oldest)
        out: dict[str, dict[str, list[float]]] = {k: {} for k in _KINDS}
        for kind, names in self._used.items():
            for name, windows in names.items():
                for w, used in windows.items():
                    if w <= current:
                        row = out[kind].setdefault(name, [0.0] * cfg.depth)
                        row[current - w] += used
        for rec in running:
            end = now if rec.end is None else min(rec.end, now)
            for kind, name, w, used in _charges(
                rec, end, oldest, current, cfg.interval
            ):
                row = out[kind].setdefault(name, [0.0] * cfg.depth)
                row[current - w] += used
        return _view(out, cfg.decay)

    def _forget(self, oldest: int) -> None:
        """Drop the windows before ``oldest`` (and who has none left)."""
        if self._oldest is not None and oldest <= self._oldest:
            return
        self._oldest = oldest
        for names in self._used.values():
            for name in list(names):
                windows = names[name]
                for w in [w for w in windows if w < oldest]:
                    del windows[w]
                if not windows:
                    del names[name]


# ------------------------------------------------------------ incremental


class _Entity:
    """One user, group or account: finished history and what runs now.

    In the current window k, usage = ``past`` (decayed windows before k) + ``cur``
    (finished work inside k) + ``rate``·now - ``anchor``, where ``anchor`` is
    Σ rate·max(start, k·I) over its running jobs.
    """

    __slots__ = ("hist", "past", "cur", "rate", "anchor", "jobs")

    def __init__(self) -> None:
        self.hist: dict[int, float] = {}
        self.past = 0.0
        self.cur = 0.0
        self.rate = 0.0
        self.anchor = 0.0
        self.jobs = 0


class UsageLedger:
    """Running fairshare sums; :meth:`view` equals :func:`fairshare_usage`.

    Feed it every start and end in time order; ``view(now)`` is O(entities).
    Times must not go backwards.
    """

    def __init__(self, config: FairshareConfig) -> None:
        self.config = config
        self._window = 0
        self._kinds: tuple[dict[str, _Entity], ...] = ({}, {}, {})
        self._running: dict[int, tuple[tuple[_Entity, ...], float, float]] = {}

    def start(
        self, job_id: int, user: str, group: str, account: str, rate: float, t: float
    ) -> None:
        """Job ``job_id`` starts charging ``rate`` per second at ``t``."""
        self._roll(t)
        ents = tuple(
            kind.setdefault(name, _Entity()) if name else None
            for kind, name in zip(self._kinds, (user, group, account), strict=True)
        )
        held = tuple(e for e in ents if e is not None)
        for e in held:
            e.rate += rate
            e.anchor += rate * t
            e.jobs += 1
        self._running[job_id] = (held, rate, t)

    def end(self, job_id: int, t: float) -> None:
        """Job ``job_id`` stops charging at ``t`` (unknown ids are ignored)."""
        self._roll(t)
        item = self._running.pop(job_id, None)
        if item is None:
            return
        held, rate, start = item
        since = max(start, self._window * self.config.interval)
        for e in held:
            e.rate -= rate
            e.anchor -= rate * since
            e.cur += rate * (t - since)
            e.jobs -= 1
            if not e.jobs:
                e.rate = e.anchor = 0.0  # no float dust left behind

    def _roll(self, t: float) -> None:
        """Move to the window of ``t``: close the windows in between."""
        cfg = self.config
        k = math.floor(t / cfg.interval)
        if k <= self._window:
            return
        old, interval = self._window, cfg.interval
        # Running jobs: their work in windows old..k-1 becomes history.
        for held, rate, start in self._running.values():
            for w in range(old, k):
                part = _overlap(start, k * interval, w * interval, (w + 1) * interval)
                if part > 0:
                    for e in held:
                        e.hist[w] = e.hist.get(w, 0.0) + rate * part
        first = k - cfg.depth + 1
        for kind in self._kinds:
            for e in kind.values():
                if e.cur:
                    e.hist[old] = e.hist.get(old, 0.0) + e.cur
                    e.cur = 0.0
                e.anchor = e.rate * k * interval
                e.hist = {w: u for w, u in e.hist.items() if w >= first}
                e.past = math.fsum(u * cfg.decay ** (k - w) for w, u in e.hist.items())
        self._window = k

    def view(self, now: float) -> FairshareView:
        """Decayed usage per user, group and account at ``now``."""
        if not self.config.enabled:
            return FairshareView()
        self._roll(now)
        users, groups, accounts = (
            {
                name: value
                for name, e in kind.items()
                if (value := e.past + e.cur + e.rate * now - e.anchor) > 0
            }
            for kind in self._kinds
        )
        return FairshareView(users=users, groups=groups, accounts=accounts)


# ------------------------------------------------------------ PSP accuracy


def accuracy(run: float, requested: float) -> float:
    """Run time / requested time, in [0, 1] (an overrun counts as 1)."""
    if requested <= 0:
        return 1.0
    return min(1.0, max(0.0, run / requested))


def accuracy_history(records: Iterable[UsageRecord]) -> dict[str, tuple[float, ...]]:
    """Each user's last :data:`HISTORY` accuracies, oldest first (finished jobs)."""
    done = sorted(
        (r for r in records if r.end is not None),
        key=lambda r: (r.end, r.id),
    )
    ledger = AccuracyLedger()
    for r in done:
        assert r.end is not None
        ledger.record(r.user, r.end - r.start, r.walltime)
    return ledger.view()


class AccuracyLedger:
    """Users' recent accuracies, updated as jobs end; :meth:`view` for snapshots."""

    def __init__(self) -> None:
        self._recent: dict[str, deque[float]] = {}
        self._view: dict[str, tuple[float, ...]] | None = {}

    def record(self, user: str, run: float, requested: float) -> None:
        recent = self._recent.get(user)
        if recent is None:
            recent = self._recent[user] = deque(maxlen=HISTORY)
        recent.append(accuracy(run, requested))
        self._view = None

    def view(self) -> dict[str, tuple[float, ...]]:
        """User -> accuracies; rebuilt after a change, else the same (read-only)
        dict, so a snapshot per pass costs nothing."""
        if self._view is None:
            self._view = {u: tuple(d) for u, d in self._recent.items()}
        return self._view
