"""Seed 002's evaluation: SD-Policy against static EASY backfill.

D'Amico et al. (ICPP 2019) compare SD-Policy with static backfill on Cirne-model
workloads (with requested times as users give them, and exact: workloads 1 and
2), on real logs (RICC, CEA-Curie) and in a real run, under several
``MAX_SLOWDOWN`` cut-offs and both run-time models, and report makespan,
response time and slowdown normalized to static backfill (Figures 1-3, 8, 9),
and the share of jobs scheduled with malleability.

Here: a synthetic workload in the spirit of the Cirne model (the model itself is
not available: :func:`synthetic`), with inflated and with exact requested
times, and the whole SDSC-SP2 log; every job malleable down to half its CPUs
(``--malleable all``, the paper's workloads are all malleable), under EASY and
SD-Policy with ``max_slowdown`` dynamic, 10 and unlimited, with the ideal and
the worst-case run-time model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minibatch.core.resize import RuntimeModel
from minibatch.metrics.table import grid, number
from minibatch.sim.engine import Progress
from minibatch.sim.machine import Machine
from minibatch.sim.malleable import make_malleable
from minibatch.sim.runner import (
    MachineSpec,
    SimConfig,
    SimRun,
    Workload,
    in_memory,
    load,
    policy_ref,
    simulate,
    write_run,
)
from minibatch.sim.swf import TraceJob, find_trace

#: (label, policy, parameters, run-time model) compared on every workload.
VARIANTS: tuple[tuple[str, str, dict[str, Any], RuntimeModel], ...] = (
    ("easy", "easy", {}, RuntimeModel.IDEAL),
    ("sd-dyn", "sd", {}, RuntimeModel.IDEAL),
    ("sd-10", "sd", {"max_slowdown": 10}, RuntimeModel.IDEAL),
    ("sd-inf", "sd", {"max_slowdown": "inf"}, RuntimeModel.IDEAL),
    ("sd-dyn-worst", "sd", {}, RuntimeModel.WORST),
)
#: Summary keys in the table, with their labels; the first three are
#: normalized to EASY as the paper's figures are.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("mean_slowdown", "slowdown"),
    ("mean_response_s", "response (s)"),
    ("makespan_s", "makespan (s)"),
    ("mean_wait_s", "wait (s)"),
    ("guest_pct", "on lent CPUs (%)"),
    ("resized_jobs", "resized"),
)
SDSC = "SDSC-SP2-1998-4.2-cln.swf.gz"
PROCS = 128


def synthetic(
    seed: int,
    jobs: int = 3000,
    procs: int = PROCS,
    load: float = 1.0,
    exact: bool = False,
) -> list[TraceJob]:
    """A Cirne-like workload: power-of-two sizes up to half the machine, mostly
    small; log-uniform run times from a minute to 12 hours; requested times
    1-5 x the run time (or exact); Poisson arrivals at the offered ``load``."""
    rng = random.Random(seed)
    machine = Machine.pool(procs)
    sizes = [2**k for k in range(int(math.log2(procs // 2)) + 1)]
    weights = [1.0 / (k + 1) for k in range(len(sizes))]
    drawn = []
    for _ in range(jobs):
        size = rng.choices(sizes, weights)[0]
        run = round(math.exp(rng.uniform(math.log(60), math.log(12 * 3600))))
        req = run if exact else math.ceil(run * rng.uniform(1, 5))
        drawn.append((size, run, req))
    work = sum(size * run for size, run, _ in drawn) / jobs
    gap = work / (procs * load)  # mean seconds between arrivals
    out, t = [], 0.0
    for jid, (size, run, req) in enumerate(drawn, start=1):
        t += rng.expovariate(1 / gap)
        request = machine.request(size, None, req)
        assert request is not None
        out.append(
            TraceJob(
                id=jid,
                user=f"u{rng.randrange(50)}",
                group="g",
                queue="1",
                submit=round(t),
                run_time=float(run),
                procs=size,
                req_time=float(req),
                mem_kb=None,
                request=request,
            )
        )
    return out


def run_sd(
    out: Path, progress: Progress | None, say: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    """Every variant on the synthetic workloads (seeds 1-3) and on SDSC-SP2."""
    result: dict[str, Any] = {}
    sections = []
    machine = Machine.pool(PROCS)
    for exact in (False, True):
        name = "cirne-exact" if exact else "cirne"
        per_seed = []
        for seed in (1, 2, 3):
            jobs = make_malleable(synthetic(seed, exact=exact), machine, 1.0)
            work = in_memory(f"{name}-{seed}", jobs, machine)
            per_seed.append(_runs(work, out / name / f"seed{seed}", progress, say))
        summaries = {
            label: _mean([runs[label].summary for runs in per_seed])
            for label, *_ in VARIANTS
        }
        result[name] = summaries
        sections.append(
            _section(
                f"{name}: 3,000 synthetic jobs on {PROCS} processors, requested "
                f"times {'exact' if exact else '1-5 x the run time'}, means of "
                "seeds 1-3",
                summaries,
            )
        )
    say("sd: SDSC-SP2")
    config = SimConfig(
        trace=str(find_trace(SDSC)), machine=MachineSpec(procs=PROCS), malleable=1.0
    )
    work = load(config)
    runs = _runs(work, out / "sdsc-sp2", progress, say)
    summaries = {label: run.summary for label, run in runs.items()}
    result["sdsc-sp2"] = summaries
    sections.append(
        _section(
            f"sdsc-sp2: all {len(work.jobs):,} jobs of {SDSC}, {PROCS} processors",
            summaries,
        )
    )
    return result, "\n".join(sections)


def _runs(
    work: Workload, out: Path, progress: Progress | None, say: Callable[[str], None]
) -> dict[str, SimRun]:
    runs = {}
    for label, policy, params, model in VARIANTS:
        say(f"sd: {work.trace.header.get('Computer', '')} {label}")
        config = SimConfig(
            trace=str(work.trace.header.get("Computer", "")),
            policy=policy_ref(policy),
            params=params,
            malleable=1.0,
            runtime_model=model,
        )
        run = simulate(config, work, progress)
        write_run(run, out / label)
        runs[label] = run
    return runs


def _mean(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: sum(s.get(key, 0.0) for s in summaries) / len(summaries)
        for key, _ in COLUMNS
    }


def _section(title: str, summaries: dict[str, dict[str, Any]]) -> str:
    easy = summaries["easy"]
    rows = []
    for label, *_ in VARIANTS:
        s = summaries[label]
        cells = [label]
        for k, (key, _) in enumerate(COLUMNS):
            value = s.get(key, 0.0)
            text = number(value)
            if k < 3 and label != "easy" and easy.get(key):
                text += f" ({100 * (value / easy[key] - 1):+.0f} %)"
            cells.append(text)
        rows.append(cells)
    return f"## {title}\n\n```\n" + grid(["", *(c for _, c in COLUMNS)], rows) + "```\n"
