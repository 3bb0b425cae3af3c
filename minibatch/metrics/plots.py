"""Plots of a run or of several runs, as PNG and SVG (matplotlib, Agg backend).

matplotlib is imported inside the functions, so that commands which never plot
(qsub, qstat) do not pay for importing it. Every function writes ``<base>.png`` and
``<base>.svg`` and returns their paths. Large collections (a Gantt chart of 50,000
jobs) are rasterized inside the SVG so that it stays small.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minibatch.metrics import eet as eet_metrics
from minibatch.metrics.records import JobRecord
from minibatch.metrics.summary import utilization_series

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: A run to plot: its records and their EETs.
Run = tuple[Sequence[JobRecord], Mapping[int, float]]


def _figure(rows: int = 1, height: float = 4.0, **kw: Any) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(11, height), squeeze=False, **kw)
    return fig, axes[:, 0]


def _colormap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")


def save(fig: Figure, base: Path) -> list[Path]:
    """Write ``base.png`` and ``base.svg`` and close the figure."""
    import matplotlib.pyplot as plt

    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".png"), base.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def time_unit(span: float) -> tuple[float, str]:
    """A readable unit for a time axis spanning ``span`` seconds."""
    if span > 3 * 86400:
        return 86400.0, "days"
    if span > 3 * 3600:
        return 3600.0, "hours"
    if span > 180:
        return 60.0, "minutes"
    return 1.0, "seconds"


def cpu_rows(
    records: Sequence[JobRecord], nodes: Sequence[tuple[str, int]]
) -> list[list[tuple[int, int]]]:
    """A CPU row for every processor each job held, as the server would pick them.

    Rows are numbered node after node. Replaying starts and ends in time order
    (ends first at an instant), each job takes the lowest free CPU ids of each of
    its nodes (the server's rule); a job without nodes takes them on the first
    node. Returns, per record, its runs of consecutive rows as (first, count).
    """
    offset, free = {}, {}
    base = 0
    for name, cpus in nodes:
        offset[name] = base
        free[name] = list(range(cpus))
        base += cpus
    first = nodes[0][0] if nodes else ""
    events: list[tuple[float, int, int]] = []
    for i, r in enumerate(records):
        events.append((r.start, 1, i))
        events.append((r.end, 0, i))
    events.sort()
    held: dict[int, list[tuple[str, list[int]]]] = {}
    rows: list[list[tuple[int, int]]] = [[] for _ in records]
    for _, kind, i in events:
        r = records[i]
        names = r.nodes or (first,)
        if kind == 0:
            for name, ids in held.pop(i, []):
                for cpu in ids:
                    heapq.heappush(free[name], cpu)
            continue
        per_node = max(1, r.procs // len(names))
        taken = []
        for name in names:
            pool = free.get(name)
            if pool is None:
                continue
            ids = [heapq.heappop(pool) for _ in range(min(per_node, len(pool)))]
            taken.append((name, ids))
            rows[i].extend(_runs([offset[name] + c for c in ids]))
        held[i] = taken
    return rows


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for cpu in sorted(ids):
        if runs and runs[-1][0] + runs[-1][1] == cpu:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((cpu, 1))
    return runs


def gantt(
    records: Sequence[JobRecord],
    nodes: Sequence[tuple[str, int]],
    base: Path,
    title: str = "",
) -> list[Path]:
    """Gantt chart: CPUs (rows) x time, one rectangle per job, coloured by user."""
    from matplotlib.collections import PolyCollection

    fig, (ax,) = _figure(height=5.0)
    t0 = min((r.submit for r in records), default=0.0)
    span = max((r.end for r in records), default=1.0) - t0
    scale, unit = time_unit(span)
    users = {u: i for i, u in enumerate(sorted({r.user for r in records}))}
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    polys, colors = [], []
    for r, runs in zip(records, cpu_rows(records, nodes), strict=True):
        x0, x1 = (r.start - t0) / scale, (r.end - t0) / scale
        for row, count in runs:
            polys.append([(x0, row), (x1, row), (x1, row + count), (x0, row + count)])
            colors.append(cmap(users[r.user] % 20))
    ax.add_collection(
        PolyCollection(polys, facecolors=colors, edgecolors="none", rasterized=True)
    )
    total = sum(c for _, c in nodes)
    ax.set_xlim(0, max(span / scale, 1e-9))
    ax.set_ylim(0, total)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("CPU")
    ax.set_title(title or "Gantt chart (colour = user)")
    return save(fig, base)


def utilization(
    records: Sequence[JobRecord], capacity: int, base: Path, title: str = ""
) -> list[Path]:
    """Busy fraction of the machine over time."""
    fig, (ax,) = _figure(height=3.0)
    _utilization_axis(ax, {"": records}, capacity)
    ax.set_title(title or "utilization over time")
    return save(fig, base)


def _utilization_axis(
    ax: Any, runs: Mapping[str, Sequence[JobRecord]], capacity: int
) -> None:
    spans = [
        (min(r.submit for r in recs), max(r.end for r in recs))
        for recs in runs.values()
        if recs
    ]
    if not spans:
        return
    t0 = min(a for a, _ in spans)
    scale, unit = time_unit(max(b for _, b in spans) - t0)
    for label, recs in runs.items():
        starts, busy = utilization_series(recs, capacity)
        ax.step(
            [(s - t0) / scale for s in starts], busy, where="post", label=label or None
        )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("utilization")
    ax.set_xlabel(f"time ({unit})")
    if any(runs):
        ax.legend(loc="lower right", fontsize="small")


def eet_heatmap(
    records: Sequence[JobRecord],
    eet: Mapping[int, float],
    capacity: int,
    base: Path,
    title: str = "",
) -> list[Path]:
    """Violated EETs per user over time, CPU usage below (seed 001, Fig. 7)."""
    fig, axes = _figure(
        rows=2, height=6.0, gridspec_kw={"height_ratios": [3, 1]}, sharex=True
    )
    hm = eet_metrics.heatmap(records, dict(eet))
    _heatmap_axes(axes[0], axes[1], hm, records, capacity)
    axes[0].set_title(title or "violated EETs per user (seed 001, Fig. 7)")
    return save(fig, base)


def _heatmap_axes(
    ax: Any,
    usage_ax: Any,
    hm: eet_metrics.Heatmap,
    records: Sequence[JobRecord],
    capacity: int,
    vmax: int | None = None,
    last: bool = True,
) -> None:
    """Draw ``hm`` on ``ax`` and the CPU usage on ``usage_ax`` below it."""
    import numpy

    if not hm.cells:
        return
    scale, unit = time_unit(len(hm.cells[0]) * hm.cell_s)
    extent = (0.0, len(hm.cells[0]) * hm.cell_s / scale, len(hm.users), 0.0)
    # Cells without violations stay white, as in the paper's figure.
    cells = numpy.ma.masked_equal(numpy.array(hm.cells), 0)
    from matplotlib.colors import LogNorm

    # A log scale: one late job must stay visible next to hundreds.
    top = max(vmax or int(cells.max() or 1), 2)
    image = ax.imshow(
        cells,
        aspect="auto",
        interpolation="nearest",
        cmap=_colormap("plasma_r"),
        extent=extent,
        norm=LogNorm(vmin=1, vmax=top),
    )
    ax.set_ylabel(f"user ({len(hm.users)})")
    # Shrink both axes alike so that the map and the usage strip stay aligned.
    ax.figure.colorbar(image, ax=[ax, usage_ax], label="violated EETs", pad=0.01)
    starts, busy = utilization_series(records, capacity)
    usage_ax.fill_between(
        [(s - hm.t0) / scale for s in starts], busy, step="post", alpha=0.6
    )
    usage_ax.set_ylim(0, 1.05)
    usage_ax.set_ylabel("CPU usage")
    if last:
        usage_ax.set_xlabel(f"time ({unit}); cell = {hm.cell_s:g} s")


def boxplots(runs: Mapping[str, Run], base: Path, title: str = "") -> list[Path]:
    """Box plots over users of VEET_u and WT_u, and over jobs of the wait time."""
    fig, axes = _figure(rows=3, height=10.0)
    labels = list(runs)
    veet, wt, wait = [], [], []
    for records, eet in runs.values():
        users = eet_metrics.per_user(records, dict(eet))
        veet.append([u.veet_pct for u in users])
        # Log axes cannot show 0: a user without tardiness sits at 1 CPU s.
        wt.append([max(u.wt_cpu_s, 1.0) for u in users])
        wait.append([max(r.wait, 1.0) for r in records])
    for ax, data, ylabel, log in (
        (axes[0], veet, "VEET_u (% of a user's jobs past EET)", False),
        (axes[1], wt, "WT_u (CPU s, log; 0 drawn at 1)", True),
        (axes[2], wait, "wait per job (s, log; 0 drawn at 1)", True),
    ):
        ax.boxplot(data, showfliers=True, flierprops={"markersize": 2})
        ax.set_xticks(range(1, len(labels) + 1), labels)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
    axes[0].set_title(title or "per-user EET metrics (seed 001, Fig. 6) and waits")
    return save(fig, base)


def compare_heatmaps(
    runs: Mapping[str, Run], capacity: int, base: Path, title: str = ""
) -> list[Path]:
    """One heatmap + usage strip per run, stacked, on a common time axis."""
    count = len(runs)
    ratios = [3, 1] * count
    fig, axes = _figure(
        rows=2 * count,
        height=4.5 * count,
        gridspec_kw={"height_ratios": ratios},
        sharex=True,
    )
    maps = {
        label: eet_metrics.heatmap(recs, dict(e)) for label, (recs, e) in runs.items()
    }
    # One colour scale for all runs, so that darker means worse across them.
    vmax = max((max(map(max, hm.cells), default=0) for hm in maps.values()), default=1)
    for k, (label, (records, _)) in enumerate(runs.items()):
        _heatmap_axes(
            axes[2 * k], axes[2 * k + 1], maps[label], records, capacity,
            vmax=max(vmax, 1), last=k == count - 1,
        )  # fmt: skip
        axes[2 * k].set_title(label)
    fig.suptitle(title or "violated EETs per user (seed 001, Fig. 7)")
    return save(fig, base)


def compare_utilization(
    runs: Mapping[str, Sequence[JobRecord]], capacity: int, base: Path
) -> list[Path]:
    fig, (ax,) = _figure(height=3.5)
    _utilization_axis(ax, runs, capacity)
    ax.set_title("utilization over time")
    return save(fig, base)


def report_plots(
    records: Sequence[JobRecord],
    eet: Mapping[int, float],
    nodes: Sequence[tuple[str, int]],
    out: Path,
    label: str = "",
) -> list[Path]:
    """Every plot of one run into ``out``: gantt, utilization, eet_heatmap, boxplots."""
    capacity = sum(c for _, c in nodes)
    suffix = f" ({label})" if label else ""
    paths = gantt(records, nodes, out / "gantt", f"Gantt chart{suffix}")
    paths += utilization(records, capacity, out / "utilization", f"utilization{suffix}")
    paths += eet_heatmap(records, eet, capacity, out / "eet_heatmap")
    paths += boxplots({label or "run": (records, eet)}, out / "boxplots")
    return paths
