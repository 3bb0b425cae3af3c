"""``mb bench sim``: how fast the simulator replays a whole trace under a policy.

It reads the trace once, then simulates ``repeat`` times and keeps the median
wall time of the event loop (reading and scoring are reported apart). Beside it,
the bare loop of :mod:`minibatch.sim.baseline` replays the same jobs on a flat pool
(same semantics, no snapshots or plans) to show what the pure-policy design costs
on this machine; both must produce the same schedule, which is checked too.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any

from minibatch.metrics.table import grid, number
from minibatch.policy import registry
from minibatch.sim.baseline import bare_schedule
from minibatch.sim.engine import Simulator
from minibatch.sim.runner import SimConfig, load


def run(config: SimConfig, repeat: int = 3) -> dict[str, Any]:
    """Time ``repeat`` simulations of ``config``; medians and the checks."""
    work = load(config)
    jobs = work.jobs
    walls: list[float] = []
    starts: dict[int, float] = {}
    stats = None
    for _ in range(max(1, repeat)):
        sim = Simulator(
            registry.load(config.policy, config.params),
            work.machine,
            jobs,
            kill_at_walltime=config.kill_at_walltime,
        )
        t0 = time.perf_counter()
        outcomes = sim.run()
        walls.append(time.perf_counter() - t0)
        starts = {o.job.id: o.start for o in outcomes}
        stats = sim.stats
    wall = statistics.median(walls)
    result: dict[str, Any] = {
        "trace": config.trace,
        "policy": config.policy,
        "machine": work.machine.describe(),
        "jobs": len(jobs),
        "read_s": work.read_s,
        "wall_s": wall,
        "walls_s": walls,
        "jobs_per_s": len(jobs) / wall,
        "passes": stats.passes if stats else 0,
        "passes_per_s": (stats.passes if stats else 0) / wall,
        "mean_wait_s": sum(starts[j.id] - j.submit for j in jobs) / len(jobs),
        "python": platform.python_version(),
    }
    flat = len(work.machine.nodes) == 1 and not config.kill_at_walltime
    if flat and config.policy.lower() in ("fifo", "easy"):
        bare_walls = []
        bare: dict[int, float] = {}
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            easy = config.policy.lower() == "easy"
            bare = bare_schedule(jobs, work.machine.procs, easy)
            bare_walls.append(time.perf_counter() - t0)
        bare_wall = statistics.median(bare_walls)
        result["bare_wall_s"] = bare_wall
        result["bare_jobs_per_s"] = len(jobs) / bare_wall
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
        ["scheduling passes/s", number(result["passes_per_s"])],
        ["mean wait (s)", number(result["mean_wait_s"])],
    ]
    if "bare_jobs_per_s" in result:
        rows += [
            ["bare loop jobs/s (same semantics)", number(result["bare_jobs_per_s"])],
            [
                "bare loop: same schedule",
                "yes" if result["bare_same_schedule"] else "NO",
            ],
        ]
    return grid(["mb bench sim", ""], rows)
