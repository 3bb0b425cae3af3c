"""Seed 004's job mix, rebuilt from the paper's description, and its runs.

Bode et al., "The Portable Batch Scheduler and the Maui Scheduler on Linux
Clusters" (seed 004, §5.1): 76 jobs on 64 CPUs. Each candidate job gets a random
processor count (1..64), requested ("submit") time, work time (<= requested) and
submission delay (0..180 min); it is classified and kept only while its class is
below its quota: 22 Large (nproc > 50 %, work >= 70 % of requested), 31 Medium
(15-50 %), 15 Small (3-15 %; the paper's "30 % and 15 %" is read as 3 %), 4 Debug
(work > 40 % of requested, nproc < 10 %, not Small) and 4 Failed (work < 20 %);
the rest is rejected. The paper's own mix (its reference [7]) is not available, so
:func:`bode_mix` draws one per seed, with requested times uniform in 0.5-4 h, and
scales all times so that the work adds up to the paper's sequential maximum,
90.2 h. The theoretical minimum is Σ nproc·work / 64.
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any, Final

from minibatch.core.job import JobRequest
from minibatch.metrics.table import grid, number
from minibatch.policy import registry
from minibatch.sim.engine import Progress
from minibatch.sim.machine import Machine
from minibatch.sim.runner import SimConfig, in_memory, policy_ref, simulate, write_run
from minibatch.sim.swf import TraceJob

HOUR: Final = 3600.0

#: Class quotas of the paper's 76-job mix.
BODE_QUOTAS: Final = {"large": 22, "medium": 31, "small": 15, "debug": 4, "failed": 4}
#: Table 1 of the paper, hours.
BODE_TABLE: Final = {
    "PBS FIFO": 71.1,
    "Maui Scheduler": 66.75,
    "Maui without backfill": 66.71,
    "Theoretical Minimum": 53.6,
    "Sequential Maximum": 90.2,
}


def bode_class(nproc: int, work: float, req: float, cpus: int = 64) -> str | None:
    """The class of a candidate job, or None ("undefined", rejected)."""
    ratio = work / req
    if ratio < 0.2:
        return "failed"
    if ratio >= 0.7:
        if nproc > 0.5 * cpus:
            return "large"
        if nproc >= 0.15 * cpus:
            return "medium"
        if nproc >= 0.03 * cpus:
            return "small"
    if ratio > 0.4 and nproc < 0.1 * cpus:
        return "debug"
    return None


def bode_mix(seed: int, cpus: int = 64, sequential_h: float = 90.2) -> list[TraceJob]:
    """The 76-job mix for ``seed``; queue = class; times scaled to ``sequential_h``."""
    rng = random.Random(seed)
    left = dict(BODE_QUOTAS)
    drawn: list[tuple[str, int, float, float, float]] = []
    while any(left.values()):
        nproc = rng.randint(1, cpus)
        req = rng.uniform(0.5, 4.0) * HOUR
        work = rng.uniform(0.0, 1.0) * req
        delay = rng.uniform(0.0, 180.0) * 60.0
        kind = bode_class(nproc, work, req, cpus)
        if kind is None or left[kind] == 0 or work <= 0:
            continue
        left[kind] -= 1
        drawn.append((kind, nproc, req, work, delay))
    scale = sequential_h * HOUR / math.fsum(d[3] for d in drawn)
    jobs = []
    for i, (kind, nproc, req, work, delay) in enumerate(drawn, start=1):
        wall = math.ceil(req * scale)
        run = min(float(round(work * scale)), float(wall)) or 1.0
        jobs.append(
            TraceJob(
                id=i,
                user="u",
                group="g",
                queue=kind,
                submit=round(delay),
                run_time=run,
                procs=nproc,
                req_time=float(wall),
                mem_kb=None,
                request=JobRequest(ppn=nproc, walltime=wall),
            )
        )
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def swf_text(jobs: list[TraceJob], procs: int, title: str) -> str:
    """The jobs as an SWF document (so ``mb sim`` can replay them)."""
    lines = [
        "; Version: 2.2",
        f"; Computer: {title}",
        f"; MaxJobs: {len(jobs)}",
        f"; MaxProcs: {procs}",
        "; Note: queue (field 15) = class number in the order of the note below",
        f"; Note: classes {' '.join(sorted({j.queue for j in jobs}))}",
    ]
    classes = {c: k for k, c in enumerate(sorted({j.queue for j in jobs}))}
    for j in jobs:
        fields = [
            j.id,
            int(j.submit),
            -1,
            int(j.run_time),
            j.procs,
            -1,
            -1,
            j.procs,
            int(j.req_time),
            -1,
            1,
            j.user,
            j.group,
            -1,
            classes[j.queue],
            -1,
            -1,
            -1,
        ]
        lines.append(" ".join(str(f) for f in fields))
    return "\n".join(lines) + "\n"


Variant = tuple[str, str, dict[str, Any]]  # (label, policy, params)


def bode_variants() -> list[Variant]:
    """PBS FIFO (``pbs-fifo`` when installed, else strict ``fifo``), Maui, Maui
    without backfill."""
    pbs = "pbs-fifo" if "pbs-fifo" in registry.available() else "fifo"
    return [
        ("PBS FIFO", pbs, {}),
        ("Maui Scheduler", policy_ref("maui"), {}),
        ("Maui without backfill", policy_ref("maui"), {"backfill": False}),
    ]


def run_bode(
    out: Path, seeds: tuple[int, ...], progress: Progress | None = None
) -> tuple[dict[str, Any], str]:
    """Every variant on every seed's mix; the table beside the paper's Table 1."""
    machine = Machine.pool(64)
    variants = bode_variants()
    spans: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    minimum, sequential = [], []
    for seed in seeds:
        jobs = bode_mix(seed)
        minimum.append(sum(j.procs * j.run_time for j in jobs) / 64 / HOUR)
        sequential.append(sum(j.run_time for j in jobs) / HOUR)
        work = in_memory(f"bode-mix-{seed}", jobs, machine)
        if seed == seeds[0]:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"bode-mix-{seed}.swf").write_text(
                swf_text(jobs, 64, f"seed 004 job mix, seed {seed}")
            )
        for label, policy, params in variants:
            config = SimConfig(trace=f"bode-mix-{seed}", policy=policy, params=params)
            run = simulate(config, work, progress)
            spans[label].append(max(r.end for r in run.records) / HOUR)
            if seed == seeds[0]:
                write_run(run, out / f"seed{seed}" / _slug(label))
    ours = {**spans, "Theoretical Minimum": minimum, "Sequential Maximum": sequential}
    rows = []
    for label, paper in BODE_TABLE.items():
        values = ours[label]
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(
            [
                label,
                number(paper),
                f"{paper / BODE_TABLE['Theoretical Minimum']:.3f}",
                f"{mean:.2f} ± {sd:.2f}",
                f"{values[0]:.2f}",
                f"{_mean_ratio(values, minimum):.3f}",
            ]
        )
    wins = sum(
        1
        for a, b in zip(spans["Maui Scheduler"], spans["PBS FIFO"], strict=True)
        if a < b
    )
    pbs = variants[0][1]
    text = (
        f"## 76 jobs on 64 CPUs, {len(seeds)} mixes (seeds {seeds[0]}-{seeds[-1]})\n\n"
        f"PBS FIFO is `{pbs}`"
        + (" (strict FIFO: `pbs-fifo` is not installed)" if pbs == "fifo" else "")
        + "; Maui is `maui` (EASY over Maui's default priority, FIFO by queue "
        "time); Maui without backfill is `maui` with `backfill=false`. Total run "
        "time = last end, from the start of the submissions.\n\n```\n"
        + grid(
            [
                "hours",
                "paper",
                "paper / min",
                "ours mean ± sd",
                f"ours seed {seeds[0]}",
                "ours / min",
            ],
            rows,
        )
        + "```\n\n"
        f"Maui finishes before PBS FIFO in {wins} of {len(seeds)} mixes. Mix "
        f"{seeds[0]} is in `bode-mix-{seeds[0]}.swf`, its runs in `seed{seeds[0]}/`.\n"
    )
    return {"hours": ours, "maui_beats_pbs": wins, "pbs_policy": pbs}, text


def _mean_ratio(values: list[float], bases: list[float]) -> float:
    return statistics.fmean(v / b for v, b in zip(values, bases, strict=True))


def _slug(label: str) -> str:
    return label.lower().replace(" ", "-")
