"""``mb bench sim``: how fast the simulator replays a whole trace under a policy.

It reads the trace once, then simulates ``repeat`` times and keeps the median
wall and CPU time of the event loop (reading and scoring are reported apart).
Beside it, the bare loop of :mod:`minibatch.sim.baseline` replays the same jobs
on a flat pool (same semantics, no snapshots or plans) to show what the
pure-policy design costs on this machine; both must produce the same schedule,
which is checked too.

:func:`depth_curve` times every pass of one more run by the number of jobs
queued, for the cost of a pass as the queue deepens (``--depth-curve``).
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from typing import Any

from minibatch import native
from minibatch.metrics.table import grid, number
from minibatch.policy import registry
from minibatch.sim.baseline import bare_schedule
from minibatch.sim.engine import Simulator
from minibatch.sim.runner import SimConfig, Workload, load


def run(
    config: SimConfig, repeat: int = 3, work: Workload | None = None
) -> dict[str, Any]:
    """Time ``repeat`` simulations of ``config``; medians and the checks.

    Each simulation is followed by a bare-loop run when there is one, so that
    both see the same machine load; CPU time is kept beside wall time, as it
    varies less on a machine others use.
    """
    work = work or load(config)
    jobs = work.jobs
    easy = config.policy.lower() == "easy"
    flat = len(work.machine.nodes) == 1 and not config.kill_at_walltime
    bare_too = flat and config.policy.lower() in ("fifo", "easy")
    walls: list[float] = []
    cpus: list[float] = []
    bare_walls: list[float] = []
    bare_cpus: list[float] = []
    starts: dict[int, float] = {}
    bare: dict[int, float] = {}
    stats = None
    for _ in range(max(1, repeat)):
        sim = Simulator(
            registry.load(config.policy, config.params),
            work.machine,
            jobs,
            kill_at_walltime=config.kill_at_walltime,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        outcomes = sim.run()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        starts = {o.job.id: o.start for o in outcomes}
        stats = sim.stats
        if bare_too:
            t0, c0 = time.perf_counter(), time.process_time()
            bare = bare_schedule(jobs, work.machine.procs, easy)
            bare_walls.append(time.perf_counter() - t0)
            bare_cpus.append(time.process_time() - c0)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    result: dict[str, Any] = {
        "trace": config.trace,
        "policy": config.policy,
        "machine": work.machine.describe(),
        "jobs": len(jobs),
        "read_s": work.read_s,
        "wall_s": wall,
        "walls_s": walls,
        "jobs_per_s": len(jobs) / wall,
        "cpu_s": cpu,
        "cpu_jobs_per_s": len(jobs) / cpu,
        "passes": stats.passes if stats else 0,
        "passes_per_s": (stats.passes if stats else 0) / wall,
        "quiet_passes": stats.quiet if stats else 0,
        "mean_wait_s": sum(starts[j.id] - j.submit for j in jobs) / len(jobs),
        "python": platform.python_version(),
        # The planning core compiled (minibatch/native.py) or plain Python.
        "compiled": native.compiled(),
        "planning_core": native.describe(),
    }
    if bare_too:
        bare_wall, bare_cpu = (
            statistics.median(bare_walls),
            statistics.median(bare_cpus),
        )
        result["bare_wall_s"] = bare_wall
        result["bare_jobs_per_s"] = len(jobs) / bare_wall
        result["bare_cpu_jobs_per_s"] = len(jobs) / bare_cpu
        result["cpu_vs_bare"] = bare_cpu / cpu
        result["bare_same_schedule"] = bare == starts
    return result


def render(result: dict[str, Any]) -> str:
    rows = [
        ["trace", str(result["trace"])],
        ["policy", str(result["policy"])],
        ["machine", str(result["machine"])],
        ["jobs", number(result["jobs"])],
        ["read + filter (s)", number(result["read_s"])],
        ["simulation, median wall (s)", number(result["wall_s"])],
        ["simulated jobs/s", number(result["jobs_per_s"])],
        ["simulated jobs/s by CPU time", number(result["cpu_jobs_per_s"])],
        ["scheduling passes/s", number(result["passes_per_s"])],
        [
            "passes / quiet passes skipped",
            f"{result['passes']:,} / {result['quiet_passes']:,}",
        ],
        ["mean wait (s)", number(result["mean_wait_s"])],
        ["planning core", str(result["planning_core"])],
    ]
    if "bare_jobs_per_s" in result:
        rows += [
            ["bare loop jobs/s (same semantics)", number(result["bare_jobs_per_s"])],
            ["bare loop jobs/s by CPU time", number(result["bare_cpu_jobs_per_s"])],
            ["simulator / bare loop, by CPU time", number(result["cpu_vs_bare"])],
            [
                "bare loop: same schedule",
                "yes" if result["bare_same_schedule"] else "NO",
            ],
        ]
    return grid(["mb bench sim", ""], rows)


def depth_curve(
    config: SimConfig, work: Workload | None = None
) -> list[dict[str, Any]]:
    """The policy's time per pass by queue depth, from one simulation.

    Passes are grouped by the jobs queued, in powers of two (1, 2-3, 4-7 ...);
    per group: passes, their mean depth, the mean and median time of a pass,
    and the mean time per queued job (mean time / mean depth), which does not
    grow with the depth when a pass costs at most linearly in it.
    """
    work = work or load(config)
    groups: dict[int, list[tuple[int, float]]] = {}

    def meter(depth: int, seconds: float) -> None:
        groups.setdefault(depth.bit_length(), []).append((depth, seconds))

    Simulator(
        registry.load(config.policy, config.params),
        work.machine,
        work.jobs,
        kill_at_walltime=config.kill_at_walltime,
        meter=meter,
    ).run()
    rows = []
    for bits in sorted(groups):
        passes = groups[bits]
        depth = statistics.fmean(d for d, _ in passes)
        mean = statistics.fmean(t for _, t in passes)
        rows.append(
            {
                "depth_from": (1 << bits) >> 1,
                "depth_to": (1 << bits) - 1,
                "passes": len(passes),
                "mean_depth": depth,
                "mean_us": mean * 1e6,
                "median_us": statistics.median(t for _, t in passes) * 1e6,
                "us_per_queued_job": mean * 1e6 / depth if depth else math.nan,
            }
        )
    return rows


def render_curve(rows: list[dict[str, Any]]) -> str:
    header = ["jobs queued", "passes", "mean depth", "mean us", "median us", "us/job"]
    return grid(
        header,
        [
            [
                f"{r['depth_from']:,}-{r['depth_to']:,}",
                number(r["passes"]),
                number(r["mean_depth"]),
                number(r["mean_us"]),
                number(r["median_us"]),
                number(r["us_per_queued_job"]),
            ]
            for r in rows
        ],
    )
