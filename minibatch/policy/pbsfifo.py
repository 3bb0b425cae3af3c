"""PBS's default FIFO scheduler with its "starving jobs" mechanism (seed 004).

Seed 004 (Bode et al., *The Portable Batch Scheduler and the Maui Scheduler on
Linux Clusters*, 2000) describes it: despite its name it "is not strictly a FIFO
scheduler": it "loops through the queued job list and starts any job [which]
fits in the available resources", which "effectively prevents large jobs from
ever starting". So "once a job has been eligible to run ... longer than some
predefined time (the default is 24 hours)" it is *starving*, and "the scheduler
halts starting of new jobs until the starving job can be started", not even on
nodes the starving job could not use.

Algorithm (one pass): the starving jobs (eligible for ``starve_after`` seconds
or more) come first, in priority order: each starts if it fits; the first that
does not stops the pass (nothing else starts) and gets its earliest start as a
prediction (nothing else starting, that start holds when jobs end by their
requested times). A starving job that can never start (its nodes are down, its
reservation does not admit it) halts nothing. If every starving job started,
walk the rest of the queue in priority order and start every job that fits,
skipping those that do not. Fits
means on its nodes, for its requested time, clear of advance reservations (a
job inside an advance reservation fits in that reservation's CPUs).

Eligible time, as PBS's ``eligible_time``: the time a job has spent queued,
not held and with its dependencies met (``now - eligible_since``; the server
accrues it across holds and releases). A job without one (the simulator's,
never held) counts from its submission.

Guarantee: a starving job never waits for a job that started after it began
starving. Without starving jobs nothing is kept idle: every job that fits starts.

Parameters: ``starve_after`` (seconds or ``HH:MM:SS``, default 24 h; PBS's
``max_starve``), ``help_starving_jobs`` (true; false turns the mechanism off),
``order`` (a priority function, given in code).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar

from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.core.units import humanize_duration
from minibatch.policy.base import Order, as_bool, as_order, as_seconds
from minibatch.policy.planning import Pass

DAY = 24 * 3600.0


class PbsFifo:
    name: ClassVar[str] = "pbs-fifo"

    def __init__(
        self,
        starve_after: float | str = DAY,
        help_starving_jobs: bool | str = True,
        order: Order | None = None,
    ) -> None:
        self.starve_after = as_seconds("starve_after", starve_after)
        self.help_starving_jobs = as_bool("help_starving_jobs", help_starving_jobs)
        self.order = as_order("order", order)

    def plan(self, snap: ClusterSnapshot) -> Plan:
        p = Pass(snap)
        queue: Sequence[PendingView] = (
            snap.pending if self.order is None else self.order(snap)
        )
        now = snap.now
        starving: list[PendingView] = []
        others: list[PendingView] = []
        if self.help_starving_jobs:
            cut = now - self.starve_after
            for job in queue:
                (starving if job.eligible_from <= cut else others).append(job)
        else:
            others = list(queue)
        for job in starving:
            found = p.fit(job)
            if found is not None:
                p.start(job, *found)
            elif self._halt(p, job):
                # Only the starving jobs may start until this one has.
                held_back = f"held back: job {job.id} is starving (pbs-fifo)"
                return p.plan(held_back, starving)
        for job in others:
            found = p.fit(job)
            if found is None:
                p.reasons[job.id] = p.reason(job)
            else:
                p.start(job, *found)
        return p.plan(order=itertools.chain(starving, others))

    def _halt(self, p: Pass, job: PendingView) -> bool:
        """``job`` is starving and does not fit: it gets its earliest start and
        nothing else starts. False if it can never start (it halts nothing)."""
        view = p.book.view_for(job)
        if view is None:
            p.reasons[job.id] = p.book.refusals[job.id]
            return False
        waited = humanize_duration(p.now - job.eligible_from)
        limit = humanize_duration(self.starve_after)
        note = f"starving (eligible {waited}, more than {limit}); nothing else starts"
        return bool(p.reserve(job, view, job.advres, f"{p.reason(job)}; {note}"))
