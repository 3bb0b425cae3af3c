"""The queue of jobs waiting to be scheduled, and what the last plan said of them.

Snapshots share the queue's immutable :class:`PendingView` records, so a pass costs
no per-job work on the server beyond copying references. Order is priority order
(queue priority, then the job's ``-p`` priority, then submission order, ties
by id: :attr:`PendingView.rank`); jobs mostly arrive in that order, so sorting is
needed only after a release or a satisfied dependency, and is done lazily.

Each job also keeps the start predicted by the first plan whose snapshot saw it
after it was queued (:meth:`PendingQueue.planned_start`), as the simulator keeps
the prediction made at a job's submission: what ``jobs.csv`` compares with the
real start.

The scheduler keeps a copy of the queue (:mod:`minibatch.scheduler.mirror`);
each snapshot shipped to it carries only the jobs that entered or left the
queue since the last (:meth:`PendingQueue.ship`), so a pass over 100,000
queued jobs does not encode and decode them all.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator

from minibatch.core.job import Job
from minibatch.core.snapshot import PendingView, Plan
from minibatch.protocol.scheduling import PendingDelta
from minibatch.server.records import pending_view

Rank = tuple[float, int, float, int]

#: Unseen entries kept one by one; beyond, only the earliest is (conservative).
_MAX_UNSEEN = 1024
#: Snapshots remembered while their plans are out (a plan for a forgotten one
#: just gives no shortcut).
_MAX_SNAPSHOTS = 16


class PendingQueue:
    """Args:
    queue_priority: a queue's priority, by the queue's name.
    """

    def __init__(self, queue_priority: Callable[[str], float] = lambda _: 0.0) -> None:
        self._queue_priority = queue_priority
        self._views: dict[int, PendingView] = {}
        self._sorted = True
        self._last: Rank = (-math.inf, 0, 0.0, 0)
        self._reasons: dict[int, str] = {}
        self._predicted: dict[int, float] = {}
        self._default = ""
        self._plan_time = 0.0
        #: The last plan's ``upcoming``, consumed by :mod:`minibatch.server.dispatch`.
        self.upcoming: deque[int] = deque()
        #: Entries into the queue so far, how many each snapshot saw (by its
        #: generation), and (entry number, (submit time, id)) of each entry the
        #: last plan's snapshot did not see: such a job may outrank upcoming ones.
        self._entries = 0
        self._seen_at: dict[int, int] = {}
        self._unseen: list[tuple[int, Rank]] = []
        #: The last plan's ``upcoming_by_submission``.
        self.by_submission = False
        #: Queued jobs no plan has seen yet (entry number by id, in entry
        #: order), and the starts the first plan to see the others predicted.
        self._unjudged: dict[int, int] = {}
        self._first: dict[int, float] = {}
        #: The queue as last shipped to the scheduler: its version, whether it
        #: was the whole queue (a filtered one is no base for a delta), and the
        #: jobs that entered or left it since.
        self._version = 0
        self._mirrored = False
        self._touched: set[int] = set()

    def __iter__(self) -> Iterator[int]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def add(self, job: Job) -> None:
        view = pending_view(job, self._queue_priority(job.queue))
        key = view.rank
        if key < self._last:
            self._sorted = False
        else:
            self._last = key
        self._views[job.id] = view
        self._touched.add(job.id)
        self._note(key)
        self._unjudged.pop(job.id, None)  # re-added: to the end, in entry order
        self._unjudged[job.id] = self._entries

    def unblocked(self) -> None:
        """Jobs left out of snapshots (over a QOS limit) may be eligible again:
        as if a job of unknown rank had entered the queue."""
        self._note((-math.inf, -(2**62), -math.inf, -1))

    def _note(self, key: Rank) -> None:
        self._entries += 1
        if len(self._unseen) >= _MAX_UNSEEN:
            # Only the earliest key matters; keep it under the newest number.
            self._unseen = [(self._entries, min(min(k for _, k in self._unseen), key))]
        else:
            self._unseen.append((self._entries, key))

    @property
    def unseen_min(self) -> Rank | None:
        """The highest rank queued since the last plan's snapshot."""
        return min((k for _, k in self._unseen), default=None)

    def snapshot_taken(self, generation: int) -> None:
        self._seen_at[generation] = self._entries
        if len(self._seen_at) > _MAX_SNAPSHOTS:  # plans stopped coming back
            del self._seen_at[min(self._seen_at)]

    def rank(self, job_id: int) -> Rank:
        return self._views[job_id].rank

    def discard(self, job_id: int) -> None:
        if self._views.pop(job_id, None) is not None:
            self._touched.add(job_id)
        self._unjudged.pop(job_id, None)
        self._first.pop(job_id, None)

    def ordered(self) -> tuple[PendingView, ...]:
        if not self._sorted:
            order = sorted(self._views.values(), key=lambda p: p.rank)
            self._views = {p.id: p for p in order}
            self._sorted = True
        return tuple(self._views.values())

    def ship(self, whole: bool, base: int | None = None) -> PendingDelta:
        """The next version of the scheduler's copy of the queue, as a delta
        from ``base`` (None: the last version shipped) when the scheduler holds
        that version of the whole queue; else ``base`` -1: ship the snapshot's
        ``pending`` in full. ``whole``: that ``pending`` is the whole queue (no
        job left out by a QOS limit, a stopped queue or an array's limit)."""
        last = self._version
        self._version += 1
        delta = PendingDelta(version=self._version)
        if self._mirrored and whole and base in (None, last):
            views = self._views
            removed = [j for j in self._touched if j not in views]
            added = [views[j] for j in self._touched if j in views]
            delta = PendingDelta(
                version=self._version, base=last, removed=removed, added=added
            )
        self._mirrored = whole
        self._touched.clear()
        return delta

    def take_notes(self, plan: Plan, snapshot_time: float) -> None:
        """Keep the plan's reasons, predicted starts and upcoming jobs (replacing
        the last plan's)."""
        self._reasons, self._predicted = plan.reasons, plan.predicted
        seen = self._seen_at.get(plan.generation)
        self._seen_at = {g: n for g, n in self._seen_at.items() if g > plan.generation}
        if seen is None:  # not a snapshot of ours (a restart): no shortcut
            self.upcoming = deque()
        else:
            self.upcoming = deque(plan.upcoming)
            self.by_submission = plan.upcoming_by_submission
            self._unseen = [(n, k) for n, k in self._unseen if n > seen]
            self._judge(plan.predicted, seen)
        self._default, self._plan_time = plan.default_reason, snapshot_time

    def _judge(self, predicted: dict[int, float], seen: int) -> None:
        """Keep the predictions of a plan for the jobs its snapshot (which saw
        entries up to ``seen``) was the first to see."""
        judged = []
        for jid, entry in self._unjudged.items():
            if entry > seen:
                break  # entry order: the rest came later
            judged.append(jid)
        for jid in judged:
            del self._unjudged[jid]
            when = predicted.get(jid)
            if when is not None:
                self._first[jid] = when

    def planned_start(self, job: Job) -> float | None:
        """The predicted start ``job``, starting now, keeps: the first plan's
        that saw it queued; if none had seen it yet, the plan starting it is the
        first, and it predicted no wait: when the job was queued."""
        if job.id in self._unjudged:
            return job.submit_time if job.queued_since is None else job.queued_since
        return self._first.get(job.id)

    def explain(self, job: Job) -> None:
        """Fill a queued job's reason and predicted start from the last plan."""
        reason = self._reasons.get(job.id)
        if reason is None and job.submit_time <= self._plan_time:
            reason = self._default  # the plan saw it but stopped early
        job.reason = reason or "waiting for the scheduler"
        job.predicted_start = self._predicted.get(job.id)
