"""A bare FCFS/EASY event loop on a flat processor pool: the yardstick.

No snapshots, no plans, no policy objects: processor counts, a heap of ends and a
list for the queue, the way a throw-away simulator is written. It implements the
same semantics as ``engine`` + ``policy.fifo``/``policy.backfill`` on one node
(ends before arrivals at an instant, one pass per instant, EASY's head shadow from
requested ends with ties released together and overrunning jobs ending now), so

* the tests check that both give the very same schedule, job by job, and
* ``mb bench sim`` reports how much the pure-policy design costs next to it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from minibatch.sim.swf import TraceJob


def bare_schedule(
    jobs: Sequence[TraceJob], procs: int, easy: bool, ties_together: bool = True
) -> dict[int, float]:
    """Start time of every job under FCFS (``easy`` False) or EASY; by job id.

    ``ties_together`` False is the other common EASY variant: the shadow search
    stops at the first single release that lets the head fit, so the head's extra
    processors leave out other jobs ending at that same instant. It is here only
    to show that this one rule explains the gap to the reference numbers of
    ``shared/traces/README.md`` (docs/simulator.md, "EASY, exactly").
    """
    order = sorted(jobs, key=lambda j: (j.submit, j.id))
    # queue entries: (id, procs, requested time, run time)
    queue: list[tuple[int, int, float, float]] = []
    running: dict[int, tuple[float, int]] = {}  # id -> (requested end, procs)
    ends: list[tuple[float, int]] = []
    start: dict[int, float] = {}
    free = procs
    i, n = 0, len(order)
    while i < n or ends:
        now = (
            ends[0][0]
            if ends and (i >= n or ends[0][0] <= order[i].submit)
            else (order[i].submit)
        )
        while ends and ends[0][0] <= now:
            _, jid = heapq.heappop(ends)
            free += running.pop(jid)[1]
        while i < n and order[i].submit <= now:
            j = order[i]
            queue.append((j.id, j.request.cpus, float(j.request.walltime), j.run_time))
            i += 1
        if not queue:
            continue
        k = 0
        while k < len(queue) and queue[k][1] <= free:
            jid, p, req, run = queue[k]
            free -= p
            running[jid] = (now + req, p)
            heapq.heappush(ends, (now + run, jid))
            start[jid] = now
            k += 1
        del queue[:k]
        if not easy or not queue or free == 0:
            continue
        shadow, extra = _shadow(queue[0][1], free, running, now, ties_together)
        kept = [queue[0]]
        for entry in queue[1:]:
            jid, p, req, run = entry
            if free == 0 or p > free:
                kept.append(entry)
                continue
            if now + req <= shadow:
                pass
            elif p <= extra:
                extra -= p
            else:
                kept.append(entry)
                continue
            free -= p
            running[jid] = (now + req, p)
            heapq.heappush(ends, (now + run, jid))
            start[jid] = now
        queue[:] = kept
    return start


def _shadow(
    need: int,
    free: int,
    running: dict[int, tuple[float, int]],
    now: float,
    ties_together: bool,
) -> tuple[float, int]:
    """(shadow time, extra processors) of a head needing ``need`` processors."""
    releases = sorted((max(end, now), p) for end, p in running.values())
    avail = free
    i = 0
    while i < len(releases):
        when = releases[i][0]
        avail += releases[i][1]
        i += 1
        while ties_together and i < len(releases) and releases[i][0] == when:
            avail += releases[i][1]
            i += 1
        if avail >= need:
            return when, avail - need
    return float("inf"), 0
