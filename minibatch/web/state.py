"""What the page is sent: a :class:`~minibatch.live.model.LiveCluster` as JSON.

Pure, so every case is tested without a browser. The page gets the whole view
each time (no deltas): it is a few tens of kilobytes, sent at most a few times a
second, and a page that missed a message is never wrong for long.

Only what ``qstat`` shows every user goes out (ids, names, owners, sizes, states,
times, where jobs run), never a script, environment or argument: the model holds
none, and :class:`PublicCluster` keeps the arguments out of the event log.

The Gantt chart's rows are the nodes' CPUs. Ended and running jobs sit on the
CPUs they had; a waiting job has a predicted start but no CPUs yet, so the chart
packs it onto the rows that are free by then (as the walltimes say): a picture of
the plan, not a promise of where it will run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from minibatch.live.model import LiveCluster, LiveJob

#: Waiting jobs sent (in priority order); the page says how many more wait.
QUEUE_SHOWN = 200
#: Ended jobs sent (the most recent), enough to fill the chart's past.
ENDED_SHOWN = 1000
#: Event log lines sent (the most recent).
LOG_SHOWN = 200


class Bar(msgspec.Struct, kw_only=True):
    """One job on one Gantt row."""

    job: str
    row: int
    #: ``ended``, ``running`` or ``planned`` (a waiting job at its predicted start).
    kind: str
    start: float
    #: None: still running (the page draws it up to now).
    end: float | None = None
    #: When the walltime runs out (running and planned jobs; None: no walltime).
    limit: float | None = None


class PublicCluster(LiveCluster):
    """A :class:`LiveCluster` whose log leaves out the submission's arguments.

    The ``submitted`` event's detail is the ``qsub`` command line, which may
    hold secrets (``-v TOKEN=...``): ``qstat`` shows it to the job's owner only,
    and the page is for everyone.
    """

    def apply(self, topic: str, payload: Mapping[str, Any], now: float) -> str:
        if topic.startswith("jobs/") and topic.endswith("/submitted"):
            payload = {k: v for k, v in payload.items() if k != "detail"}
        return super().apply(topic, payload, now)


def _natural(name: str) -> list[Any]:
    """``node2`` before ``node10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def rows(model: LiveCluster) -> list[tuple[str, int]]:
    """The Gantt rows: every CPU of every node, nodes in natural order."""
    return [
        (node.name, cpu)
        for node in sorted(model.nodes.values(), key=lambda n: _natural(n.name))
        for cpu in node.cpus
    ]


def _limit(job: LiveJob, start: float) -> float | None:
    return start + job.walltime if job.walltime > 0 else None


def bars(model: LiveCluster, queue: list[LiveJob], now: float) -> list[Bar]:
    """Ended and running jobs on their CPUs, then the waiting jobs of ``queue``
    that have a predicted start, packed onto the rows free by then."""
    index = {key: i for i, key in enumerate(rows(model))}
    out: list[Bar] = []
    # When each row is expected free: the walltime of what runs there.
    free_at = [float("-inf")] * len(index)
    for job in model.ended()[-ENDED_SHOWN:]:
        if job.start_time is None or job.end_time is None:
            continue
        for row in _rows_of(job, index):
            out.append(
                Bar(
                    job=job.id,
                    row=row,
                    kind="ended",
                    start=job.start_time,
                    end=job.end_time,
                )
            )
    for job in model.running():
        start = job.start_time if job.start_time is not None else now
        limit = _limit(job, start)
        for row in _rows_of(job, index):
            out.append(
                Bar(job=job.id, row=row, kind="running", start=start, limit=limit)
            )
            # Past its walltime but not yet reported ended: free any moment.
            free_at[row] = float("inf") if limit is None else max(limit, now)
    planned = [j for j in queue if j.predicted_start is not None]
    planned.sort(key=lambda j: j.predicted_start or now)  # stable: ties by rank
    for job in planned:
        start = max(float(job.predicted_start or now), now)
        limit = _limit(job, start)
        # Rows free by the start first (top down), else those freed soonest.
        order = sorted(range(len(free_at)), key=lambda r: (free_at[r] > start, r))
        chosen = order[: job.ncpus]
        if any(free_at[r] > start for r in chosen):
            chosen = sorted(range(len(free_at)), key=lambda r: (free_at[r], r))
            chosen = chosen[: job.ncpus]
        for row in sorted(chosen):
            out.append(
                Bar(
                    job=job.id,
                    row=row,
                    kind="planned",
                    start=start,
                    end=limit,
                    limit=limit,
                )
            )
            free_at[row] = float("inf") if limit is None else limit
    return out


def _rows_of(job: LiveJob, index: dict[tuple[str, int], int]) -> list[int]:
    """The rows of the CPUs ``job`` has (or had); CPUs of vanished nodes have none."""
    found = (index.get((node, cpu)) for node, cpus in job.alloc.items() for cpu in cpus)
    return sorted(r for r in found if r is not None)


def view(
    model: LiveCluster, problem: str, now: float, policies: list[str] | None = None
) -> dict[str, Any]:
    """Everything the page shows, as of ``now``; ``policies``: those a what-if
    may try (none: the page has no what-if panel)."""
    queue = model.queue()
    shown = queue[:QUEUE_SHOWN]
    nodes = sorted(model.nodes.values(), key=lambda n: _natural(n.name))
    return {
        "now": now,
        "version": model.version,
        "problem": problem,
        "policy": model.policy,
        "params": model.params,
        "last_pass": model.last_pass(),
        "nodes": [
            {
                "name": n.name,
                "state": n.state,
                "comment": n.comment,
                "cells": model.cells(n.name),
            }
            for n in nodes
        ],
        "rows": rows(model),
        "bars": bars(model, shown, now),
        "running": model.running(),
        "queue": shown,
        "queued": len(queue),
        "ended": model.ended()[-ENDED_SHOWN:],
        "log": list(model.log)[-LOG_SHOWN:],
        "history": model.history,
        "policies": policies or [],
    }


def encode(
    model: LiveCluster, problem: str, now: float, policies: list[str] | None = None
) -> bytes:
    """:func:`view` as one line of JSON (an SSE ``data:`` line holds no newline)."""
    return msgspec.json.encode(view(model, problem, now, policies))
