"""What ``mb top`` draws, as functions of the model and the time (so that a test
reads exactly what a terminal shows), and the widgets that call them with their
own width: the nodes' CPU cells, the utilization sparkline, the reservations'
time line, and a running job's elapsed time against its walltime."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from minibatch.core.units import format_cpu_list, format_duration, humanize_duration
from minibatch.live.model import LiveCluster, LiveJob

#: Job colours (backgrounds). Many, so that two jobs side by side rarely share
#: one; the id is printed in the cell anyway.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a",
    "#637939", "#7b4173", "#e7ba52", "#3182bd",
)  # fmt: skip
IDLE = Style(color="grey50")
UNUSABLE = Style(color="red", dim=True)
#: Widest a CPU cell gets; longer ids (array elements) are cut.
MAX_CELL = 7
#: The time line's candidate spans (seconds): the first that shows every start.
SPANS = (900, 3600, 6 * 3600, 86400, 7 * 86400)
SPARK = "▁▂▃▄▅▆▇█"


def colour(key: str) -> str:
    """A job's (or reservation's) colour: a hash of its id, so it is the same
    in every run and on every node (a resize shows as cells taking it)."""
    return PALETTE[zlib.crc32(key.encode()) % len(PALETTE)]


def job_style(job_id: str) -> Style:
    """A cell of the job: its colour behind its id, in black or white."""
    colour_ = colour(job_id)
    red, green, blue = (int(colour_[i : i + 2], 16) for i in (1, 3, 5))
    light = 0.299 * red + 0.587 * green + 0.114 * blue > 150
    return Style(bgcolor=colour_, color="black" if light else "white", bold=True)


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def relative(t: float | None, now: float) -> str:
    """A time to come as a person reads it: ``in 4 min``; ``now`` when past."""
    if t is None:
        return "-"
    if t <= now + 0.5:
        return "now"
    return f"in {humanize_duration(t - now)}"


# ----------------------------------------------------------------- nodes


def node_text(model: LiveCluster, width: int) -> Text:
    """Every node as a row of CPU cells, each with the id of the job on it in
    the job's colour; a node wider than ``width`` goes on over more lines."""
    names = sorted(model.nodes)
    if not names:
        return Text("no nodes yet", style=IDLE)
    cells = {name: model.cells(name) for name in names}
    ids = [j for row in cells.values() for _, j in row if j is not None]
    cell = min(MAX_CELL, max([1, *map(len, ids)]) + 2)
    label = max(len(n) for n in names) + 1
    states = {n: model.nodes[n].state for n in names}
    state_width = max(len(s) for s in states.values()) + 1
    margin = label + state_width
    per_line = max(1, (width - margin) // cell)
    out = Text(no_wrap=True, overflow="crop")
    for i, name in enumerate(names):
        if i:
            out.append("\n")
        out.append(f"{name:<{label}}", style="bold")
        state = states[name]
        usable = state not in ("down", "offline")
        out.append(f"{state:<{state_width}}", style="" if usable else "red")
        for k, (_, job) in enumerate(cells[name]):
            if k and k % per_line == 0:
                out.append("\n" + " " * margin)
            if job is not None:
                shown = job if len(job) <= cell - 2 else job[: cell - 3] + "…"
                out.append(shown.center(cell), style=job_style(job))
            else:
                out.append("·".center(cell), style=IDLE if usable else UNUSABLE)
    return out


class NodeGrid(Widget):
    """The nodes' CPU cells (see :func:`node_text`)."""

    DEFAULT_CSS = "NodeGrid { height: auto; }"

    def __init__(self, model: LiveCluster, **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model

    def render(self) -> Text:
        return node_text(self.model, self.size.width)


# ----------------------------------------------------------- utilization


def sparkline(
    samples: Iterable[tuple[float, int, int]], now: float, window: float, width: int
) -> str:
    """Busy CPUs over the last ``window`` seconds, one column per
    ``window / width`` seconds (the mean there); blank before the first sample."""
    sums = [0.0] * width
    counts = [0] * width
    step = window / max(1, width)
    for t, busy, total in samples:
        column = int((t - (now - window)) / step)
        if 0 <= column < width and total > 0:
            sums[column] += busy / total
            counts[column] += 1
    return "".join(
        SPARK[min(len(SPARK) - 1, int(s / c * len(SPARK)))] if c else " "
        for s, c in zip(sums, counts, strict=True)
    )


def utilization_text(model: LiveCluster, now: float, width: int) -> Text:
    window = model.history
    out = Text(no_wrap=True, overflow="crop")
    if model.samples:
        _, busy, total = model.samples[-1]
        share = f" ({busy / total:.0%})" if total else ""
        out.append(f"{busy}/{total} CPUs busy{share}", style="bold")
        fractions = [b / t for _, b, t in model.samples if t]
        if fractions:
            mean = sum(fractions) / len(fractions)
            span = humanize_duration(now - model.samples[0][0])
            out.append(f", mean {mean:.0%} over {span}")
    else:
        out.append("no samples yet", style=IDLE)
    out.append("\n")
    out.append(sparkline(model.samples, now, window, width), style="green")
    left = f"-{humanize_duration(window)}"
    out.append("\n" + left + "now".rjust(max(0, width - len(left))), style=IDLE)
    return out


class Utilization(Widget):
    """Busy CPUs now and over the model's history (see :func:`sparkline`)."""

    DEFAULT_CSS = "Utilization { height: 3; }"

    def __init__(self, model: LiveCluster, now: Callable[[], float], **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model
        self.now = now

    def render(self) -> Text:
        return utilization_text(self.model, self.now(), self.size.width)


# ---------------------------------------------------------- reservations


def timeline_text(
    reservations: Mapping[str, Mapping[str, Any]], now: float, width: int
) -> Text:
    """Each reservation as a bar on a time line from now on, its span the first
    of :data:`SPANS` that shows every reservation's start."""
    if not reservations:
        return Text("no reservations", style=IDLE)
    starts = [float(r.get("start", now)) for r in reservations.values()]
    span = next((s for s in SPANS if max(starts) < now + s), SPANS[-1])
    label = min(24, max(len(n) for n in reservations) + 1)
    detail = len("9999 CPUs in 999 min ")
    columns = max(10, width - label - detail)
    out = Text(no_wrap=True, overflow="crop")
    for start, name in sorted(zip(starts, reservations, strict=True)):
        resv = reservations[name]
        end = float(resv.get("end", now))
        first = max(0, int((start - now) / span * columns))
        last = min(columns, max(first + 1, int((end - now) / span * columns)))
        cpus = sum(len(c) for c in (resv.get("nodes") or {}).values())
        out.append(f"{name[: label - 1]:<{label}}", style="bold")
        out.append(f"{cpus:>4} CPUs {relative(start, now):<10.10} ", style=IDLE)
        out.append("·" * first, style=IDLE)
        out.append("█" * (last - first), style=colour(name))
        out.append("·" * (columns - last) + "\n", style=IDLE)
    axis = [" "] * columns
    marks = [(0, "now")] + [(columns * q // 4, f"+{humanize_duration(span * q / 4)}")
                            for q in (1, 2, 3)]  # fmt: skip
    for column, mark in marks:
        axis[column : column + len(mark)] = mark
    out.append(" " * (label + detail) + "".join(axis)[:columns], style=IDLE)
    return out


class Timeline(Widget):
    """The reservations on a time line (see :func:`timeline_text`)."""

    DEFAULT_CSS = "Timeline { height: auto; }"

    def __init__(self, model: LiveCluster, now: Callable[[], float], **kw: Any) -> None:
        super().__init__(**kw)
        self.model = model
        self.now = now

    def render(self) -> Text:
        return timeline_text(self.model.reservations, self.now(), self.size.width)


# ------------------------------------------------------------------ jobs


def elapsed_text(job: LiveJob, now: float, width: int = 12) -> Text:
    """``HH:MM:SS/HH:MM:SS`` and a bar of the walltime used (red past 90%)."""
    elapsed = max(0.0, now - (job.start_time or now))
    if job.walltime <= 0:
        return Text(f"{format_duration(elapsed)}/no limit")
    used = min(1.0, elapsed / job.walltime)
    filled = round(used * width)
    out = Text(f"{format_duration(elapsed)}/{format_duration(job.walltime)} ")
    out.append("█" * filled, style="red" if used > 0.9 else "green")
    out.append("░" * (width - filled), style=IDLE)
    return out


def where(job: LiveJob) -> str:
    return " ".join(f"{n}:{format_cpu_list(sorted(c))}" for n, c in job.alloc.items())


def pass_text(model: LiveCluster, now: float) -> Text:
    """The policy in force and what the last scheduling pass did."""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("policy ", style=IDLE)
    out.append(model.policy or "?", style="bold")
    if model.params:
        out.append(" " + " ".join(f"{k}={v}" for k, v in model.params.items()))
    last = model.last_pass()
    if last is None:
        return out.append("   no scheduling pass since mb top started", style=IDLE)
    out.append(f"   last pass {clock(last.time)} ", style=IDLE)
    out.append(f"({humanize_duration(now - last.time)} ago): ", style=IDLE)
    out.append(f"{last.started} started", style="bold green" if last.started else "")
    out.append(", ")
    out.append(f"{last.backfilled} backfilled", style="bold" if last.backfilled else "")
    out.append(f", {last.reserved} reserved, {last.pending} pending, ")
    return out.append(f"{last.duration_ms:.1f} ms")


def queue_row(job: LiveJob, now: float) -> Sequence[str | Text]:
    rank = "" if job.rank is None else str(job.rank + 1)
    return (
        rank, Text(job.id, style=job_style(job.id)), job.name, job.user,
        str(job.ncpus), format_duration(job.walltime), job.state,
        job.reason, relative(job.predicted_start, now),
    )  # fmt: skip


def running_row(job: LiveJob, now: float) -> Sequence[str | Text]:
    return (
        Text(job.id, style=job_style(job.id)), job.name, job.user,
        str(sum(len(c) for c in job.alloc.values()) or job.ncpus), where(job),
        elapsed_text(job, now),
    )  # fmt: skip
