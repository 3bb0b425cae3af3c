"""Plain-text tables of summaries: one run, several runs side by side, groups."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: (summary key prefix, label, unit) of the per-job metrics, in display order.
PER_JOB_ROWS: tuple[tuple[str, str], ...] = (
    ("wait_s", "wait (s)"),
    ("response_s", "response (s)"),
    ("slowdown", "slowdown"),
    ("bounded_slowdown", "bounded slowdown (tau 10 s)"),
)

#: (summary key, label) of the whole-run metrics, in display order.
RUN_ROWS: tuple[tuple[str, str], ...] = (
    ("jobs", "jobs"),
    ("utilization", "utilization"),
    ("makespan_s", "makespan (s)"),
    ("throughput_jobs_per_h", "throughput (jobs/h)"),
    ("eet_violated_pct", "jobs past their EET (%)"),
    ("median_veet_u_pct", "VEET_u median over users (%)"),
    ("p90_veet_u_pct", "VEET_u p90 over users (%)"),
    ("median_wt_u_cpu_s", "WT_u median over users (CPU s)"),
    ("total_wt_cpu_s", "WT total (CPU s)"),
    ("mean_abs_prediction_error_s", "|predicted - real start| mean (s)"),
    ("malleable_jobs", "malleable jobs"),
    ("guest_pct", "jobs started on lent CPUs (%)"),
    ("resized_jobs", "jobs resized while running"),
    ("wall_s", "simulation wall time (s)"),
    ("jobs_per_s", "simulated jobs/s"),
)


def number(value: Any) -> str:
    """A number for a table: thousands separators, at most 3 significant decimals."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    if isinstance(value, int) or value == int(value) and abs(value) >= 1000:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to width; the first left-aligned, the rest right-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)]) + "\n"


def run_table(summary: Mapping[str, Any]) -> str:
    """One run: per-job metrics with mean/median/p90/p99/max, then run metrics."""
    stats = ("mean", "median", "p90", "p99", "max")
    rows = [
        [label, *(number(summary.get(f"{s}_{key}")) for s in stats)]
        for key, label in PER_JOB_ROWS
    ]
    text = grid(["metric", *stats], rows)
    runs = [[label, number(summary[key])] for key, label in RUN_ROWS if key in summary]
    return text + "\n" + grid(["", "value"], runs)


def compare_table(names: Sequence[str], summaries: Sequence[Mapping[str, Any]]) -> str:
    """Several runs side by side: every metric of :func:`run_table`, one column each."""
    rows: list[list[str]] = []
    for key, label in PER_JOB_ROWS:
        for stat in ("mean", "median", "p90", "p99"):
            rows.append(
                [
                    f"{label} {stat}",
                    *(number(s.get(f"{stat}_{key}")) for s in summaries),
                ]
            )
    for key, label in RUN_ROWS:
        if any(key in s for s in summaries):
            rows.append([label, *(number(s.get(key)) for s in summaries)])
    return grid(["metric", *names], rows)


def group_table(rows: Sequence[Mapping[str, Any]], by: str, limit: int = 0) -> str:
    """Per-group rows of ``summary.per_group``; ``limit`` keeps the busiest groups."""
    chosen = list(rows)
    if limit and len(chosen) > limit:
        chosen = sorted(chosen, key=lambda r: -r["jobs"])[:limit]
    columns = [k for k in chosen[0] if k != by] if chosen else []
    body = [[str(r[by]), *(number(r.get(c)) for c in columns)] for r in chosen]
    return grid([by, *columns], body)
