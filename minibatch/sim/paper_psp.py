"""Seed 000's PSP scenarios, rebuilt from the paper's description, and runs.

Rocchetti, Iturriaga, Nesmachnow, "Including accurate user estimates in HPC
schedulers" (seed 000, PSP, §5.2): 1,000 jobs of 20 users, powers of two
from 1 to 16 cores, run times up to 10 days, and per-user estimate accuracy by
scenario (Table 2): BE all users in [0, 0.2), GE in [0.8, 1], CF the Cluster FING
groups g1..g6 (21/21/18/17/19/4 % of users), CFG the groups reweighted
12/12/9/8/10/49 %, DI CF where every user improves every 5 submitted jobs (by
(1 - a)·0.1 if a <= 0.5, else a·0.1), HDI the same for half of the users. A job's
requested time is its run time / its accuracy (jittered ±10 % around the user's
level, kept inside the user's group unless the user learns). Cores are 1/2/4/8/16
with weights 45/15/15/15/10 (FING: 44 % sequential), run times 40 % in 1-10 min,
60 % log-uniform in 10 min-10 days; submissions are uniform over the span that
gives the offered ``load``. :func:`psp_workload` builds one per (scenario, seed).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from minibatch.core.job import JobRequest
from minibatch.metrics.table import grid, number
from minibatch.policy.psp import TAGS, accuracy_bin
from minibatch.sim.engine import Progress
from minibatch.sim.machine import Machine
from minibatch.sim.runner import (
    SimConfig,
    SimRun,
    in_memory,
    policy_ref,
    simulate,
    write_run,
)
from minibatch.sim.swf import TraceJob

#: Cluster FING accuracy groups g1..g6 (§5.1).
FING_GROUPS: Final = (
    (0.0, 0.05),
    (0.05, 0.15),
    (0.15, 0.25),
    (0.25, 0.35),
    (0.35, 0.60),
    (0.60, 1.0),
)
SCENARIOS: Final = ("BE", "GE", "CF", "CFG", "DI", "HDI")
#: Users per group out of 20 (largest remainders of the paper's percentages).
_CF_USERS: Final = (4, 4, 4, 3, 4, 1)
_CFG_USERS: Final = (2, 2, 2, 2, 2, 10)
#: Table 3 of the paper, minutes, classes a1..a5 (None: empty class).
PSP_TABLE: Final[dict[str, tuple[float | None, ...]]] = {
    "BE": (820.05, None, None, None, None),
    "GE": (None, None, None, None, 796.18),
    "CF": (1093.12, 637.53, 519.30, 450.30, None),
    "CFG": (1488.60, 986.33, 759.15, 706.35, 517.35),
    "DI": (None, 1030.25, 804.93, 534.15, 424.43),
    "HDI": (1091.58, 837.51, 781.38, 509.70, 484.20),
}
PSP_USERS: Final = 20
PSP_JOBS: Final = 1000


@dataclass(frozen=True)
class PspWorkload:
    jobs: list[TraceJob]
    #: Each user's accuracy level when they submit their first job.
    start_level: dict[str, float]


def _levels(scenario: str, rng: random.Random) -> list[tuple[float, float]]:
    if scenario == "BE":
        return [(0.0, 0.2)] * PSP_USERS
    if scenario == "GE":
        return [(0.8, 1.0)] * PSP_USERS
    counts = _CFG_USERS if scenario == "CFG" else _CF_USERS
    ranges = [FING_GROUPS[g] for g, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(ranges)
    return ranges


def psp_workload(scenario: str, seed: int, procs: int, load: float) -> PspWorkload:
    """One PSP scenario instance: 1,000 jobs of 20 users at offered ``load``."""
    rng = random.Random(f"{scenario}:{seed}")
    wl = random.Random(seed)  # the same jobs in every scenario of a seed
    users = [f"user{i:02d}" for i in range(PSP_USERS)]
    bounds = dict(zip(users, _levels(scenario, rng), strict=True))
    level = {u: max(0.01, rng.uniform(lo, hi)) for u, (lo, hi) in bounds.items()}
    start = dict(level)
    learns = (
        set(users)
        if scenario == "DI"
        else set(users[::2])
        if scenario == "HDI"
        else set()
    )
    shapes = []
    for _ in range(PSP_JOBS):
        cores = wl.choices((1, 2, 4, 8, 16), weights=(45, 15, 15, 15, 10))[0]
        if wl.random() < 0.4:
            run = wl.uniform(60.0, 600.0)
        else:
            run = math.exp(wl.uniform(math.log(600.0), math.log(10 * 86400.0)))
        shapes.append((wl.choice(users), cores, round(run)))
    span = sum(c * r for _, c, r in shapes) / (procs * load)
    submits = sorted(wl.uniform(0.0, span) for _ in shapes)
    submitted: dict[str, int] = {}
    jobs = []
    for i, ((user, cores, run), submit) in enumerate(
        zip(shapes, submits, strict=True), start=1
    ):
        acc = level[user] * rng.uniform(0.9, 1.1)
        # A user who does not learn stays inside their group's interval (the
        # margin covers the rounding of the requested time to whole seconds).
        lo, hi = (0.0, 1.0) if user in learns else bounds[user]
        acc = min(hi - 0.01 if hi < 1.0 else 1.0, max(lo + 0.01, 0.005, acc))
        wall = max(int(run), round(run / acc))
        jobs.append(
            TraceJob(
                id=i,
                user=user,
                group="g",
                queue=scenario,
                submit=round(submit),
                run_time=float(run),
                procs=cores,
                req_time=float(wall),
                mem_kb=None,
                request=JobRequest(ppn=cores, walltime=wall),
            )
        )
        submitted[user] = submitted.get(user, 0) + 1
        if user in learns and submitted[user] % 5 == 0:
            a = level[user]
            level[user] = min(1.0, a + ((1 - a) * 0.1 if a <= 0.5 else a * 0.1))
    return PspWorkload(jobs, start)


def class_waits(run: SimRun) -> dict[str, list[float]]:
    """Per accuracy class (the user's PSP bin at the end): each user's mean wait."""
    done = sorted(run.records, key=lambda r: (r.end, r.job))
    recent: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    for r in done:
        recent.setdefault(r.user, []).append(min(1.0, r.run_time / r.req_time))
        waits.setdefault(r.user, []).append(r.wait)
    out: dict[str, list[float]] = {tag: [] for tag in TAGS.values()}
    for user, accs in recent.items():
        last = accs[-10:]
        tag = TAGS[accuracy_bin(sum(last) / len(last))]
        out[tag].append(statistics.fmean(waits[user]))
    return out


#: (label, policy, parameters) of the PSP experiment; the first is compared
#: with the paper. ``psp+age``: PSP as a Maui component beside the queue time,
#: one bin worth 4 hours queued (the paper's SLURM multifactor had an age factor).
PSP_VARIANTS: Final[tuple[tuple[str, str, dict[str, Any]], ...]] = (
    ("psp", "psp", {}),
    ("psp+age", "maui", {"pspbinweight": 240, "queuetimeweight": 1}),
    ("easy", "easy", {}),
)
_PSP_TITLES: Final = {
    "psp": "PSP (`psp`: EASY ordered by PSP priority, ties by submission)",
    "psp+age": (
        "PSP + queue time (`maui`, PSPBINWEIGHT 240, QUEUETIMEWEIGHT 1: one bin "
        "= 4 h queued), EASY"
    ),
    "easy": "Plain EASY (`easy`), for reference",
}


def run_psp(
    out: Path,
    seeds: tuple[int, ...],
    procs: int,
    load: float,
    progress: Progress | None = None,
    say: Callable[[str], None] = print,
) -> tuple[dict[str, Any], str]:
    """Every scenario x seed under each variant; Table 3 beside the first."""
    machine = Machine.pool(procs)
    result: dict[str, Any] = {}
    tables = {}
    for label, policy, params in PSP_VARIANTS:
        rows = []
        for scenario in SCENARIOS:
            say(f"psp-scenarios: {label} {scenario}")
            per_class: dict[str, list[float]] = {tag: [] for tag in TAGS.values()}
            for seed in seeds:
                w = psp_workload(scenario, seed, procs, load)
                config = SimConfig(
                    trace=f"psp-{scenario}-{seed}",
                    policy=policy_ref(policy),
                    params=params,
                )
                run = simulate(config, in_memory(scenario, w.jobs, machine), progress)
                if seed == seeds[0]:
                    write_run(run, out / scenario / label)
                for tag, values in class_waits(run).items():
                    per_class[tag].extend(values)
            means = {
                t: statistics.fmean(v) / 60 if v else None for t, v in per_class.items()
            }
            result.setdefault(label, {})[scenario] = {
                "mean_wait_min": means,
                "users": {t: len(v) for t, v in per_class.items()},
            }
            paper = PSP_TABLE[scenario]
            cells = []
            for k, tag in enumerate(TAGS.values()):
                ours = (
                    ""
                    if means[tag] is None
                    else f"{means[tag]:,.0f} ({len(per_class[tag])})"
                )
                theirs = "" if paper[k] is None else f"{paper[k]:,.0f}"
                cells.append(f"{ours} / {theirs}" if label == "psp" else ours)
            filled = [m for m in means.values() if m is not None]
            ratio = (
                filled[0] / filled[-1] if len(filled) > 1 and filled[-1] else math.nan
            )
            if label == "psp":
                given = [m for m in paper if m is not None]
                theirs_ratio = given[0] / given[-1] if len(given) > 1 else math.nan
                rows.append(
                    [scenario, *cells, f"{number(ratio)} / {number(theirs_ratio)}"]
                )
            else:
                rows.append([scenario, *cells, number(ratio)])
        head = ["scenario", *(f"{t}" for t in TAGS.values()), "lowest / highest"]
        tables[label] = grid(head, rows)
    text = (
        f"## {len(SCENARIOS)} scenarios x {len(seeds)} workloads, {PSP_JOBS:,} jobs "
        f"of {PSP_USERS} users on {procs} cores, offered load {load}\n\n"
        "Mean wait in minutes of the users of each accuracy class (the class of "
        "their last 10 jobs at the end), users pooled over the workloads; in "
        "brackets the number of users; after the slash the paper's Table 3. "
        "lowest / highest: the lowest class's wait over the highest class's.\n\n"
        + "".join(
            f"{_PSP_TITLES[label]}:\n\n```\n{tables[label]}```\n\n"
            for label, _, _ in PSP_VARIANTS
        )
    )
    return result, text
