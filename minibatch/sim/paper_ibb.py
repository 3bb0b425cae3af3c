"""Seed 003 (Liu et al., IBB, NPC 2016): EASY vs BB vs IBB over CPUs and memory.

The paper compares BB and IBB by simulation on LANL-CM5 (1,024 nodes, 1 GB
each) and on a mix of LANL-CM5 and MetaCentrum, at several *relative loads*
(load relative to the trace's own), with average wait, response and slowdown
(its Fig. 1 and 2, given only as figures; the text says IBB gains "up to 65 %"
in wait and response on LANL-CM5 and "up to 60 %" on the mix, and quotes BB's
authors for "up to 50 %" better response than classical backfilling).

We have MetaCentrum wagap-2013 with its memory requests, on its 68 real nodes
(20 x 80 and 48 x 12 cores) with their memory (the Alea ``.machines`` file):

* **loads** 0.8, 1.0, 1.25 and 1.5: every submission time is divided by the
  load (arrivals closer together, same jobs, same run times and requests);
* **memory**: as the nodes have it, and a quarter of it (jobs that cannot fit
  any more are dropped by the usual filter), where memory, not CPUs, is
  often what a job waits for: the case K-resource balancing is meant for;
* **policies**: ``easy``, ``bb`` (one backfill per pass, as seed 003 describes
  BB), ``bb-rescan`` (``bb rescan=true``: again after each start until none
  fits) and ``ibb``; all EASY reservations, depth 1, only the backfill choice
  differs.

And a synthetic workload where memory binds as often as CPUs, the LANL-CM5
situation (1 GB per node, jobs asking both in proportion;
:mod:`minibatch.sim.synthetic`): 5,000 jobs on 64 nodes x 16 CPUs x 1 GB,
offered load 0.6 of both at relative load 1, the same loads and policies,
seeds 1-3 (their means in the table).

Each run is written to ``OUT/<memory>/load-<L>/<policy>/`` and
``OUT/synthetic/load-<L>/seed<S>/<policy>/`` (``jobs.csv``, ``summary.json``);
the text gives the means beside each other and the gains (IBB over BB, ...),
the way the paper reports its gains.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from minibatch.metrics.table import grid, number
from minibatch.sim.machine import Machine, NodeSpec
from minibatch.sim.parallel import Pool, SimTask, shared
from minibatch.sim.runner import (
    MachineSpec,
    SimConfig,
    Workload,
    in_memory,
    load,
    policy_ref,
    write_run,
)
from minibatch.sim.swf import MemoryUnit, TraceJob, find_trace, select_jobs
from minibatch.sim.synthetic import GB, cpu_memory_mix, offered

TRACE = "MetaCentrum-wagap-2013.swf.gz"
MACHINES = "MetaCentrum-wagap-2013.alea.swf.machines"
LOADS = (0.8, 1.0, 1.25, 1.5)
#: label -> (policy, parameters).
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "easy": ("easy", {}),
    "bb": ("bb", {}),
    "bb-rescan": ("bb", {"rescan": True}),
    "ibb": ("ibb", {}),
}
#: The gains in the tables: (column, policy, the policy it is compared with).
GAINS = (
    ("IBB vs BB", "ibb", "bb"),
    ("IBB vs rescan", "ibb", "bb-rescan"),
    ("IBB vs EASY", "ibb", "easy"),
    ("BB vs EASY", "bb", "easy"),
    ("rescan vs EASY", "bb-rescan", "easy"),
)
#: The synthetic CPU + memory workload: nodes x CPUs (1 GB each), jobs per
#: seed, the seeds, and the offered load at relative load 1.
SYNTHETIC_NODES = (64, 16)
SYNTHETIC_JOBS = 5000
SEEDS = (1, 2, 3)
SYNTHETIC_LOAD = 0.6
#: (folder, words, divisor of every node's memory)
MEMORY = (("memory", "memory as recorded", 1), ("memory-4", "a quarter of it", 4))
METRICS = (
    ("mean_wait_s", "mean wait (s)"),
    ("mean_response_s", "mean response (s)"),
    ("mean_slowdown", "mean slowdown"),
    ("mean_bounded_slowdown", "mean bounded slowdown"),
    ("utilization", "utilization"),
)
#: load -> policy label -> metric -> mean.
Table = dict[str, dict[str, dict[str, float]]]


def at_load(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """The same jobs arriving ``factor`` times as fast (relative load)."""
    return [msgspec.structs.replace(j, submit=j.submit / factor) for j in jobs]


def less_memory(machine: Machine, divisor: int) -> Machine:
    return Machine(
        nodes=tuple(
            NodeSpec(n.name, n.cpus, None if n.mem_kb is None else n.mem_kb // divisor)
            for n in machine.nodes
        )
    )


def wagap(base: Workload, divisor: int, factor: float) -> Workload:
    """The trace on its nodes with ``1 / divisor`` of their memory (jobs that
    no longer fit dropped), at relative load ``factor``."""
    machine = less_memory(base.machine, divisor)
    jobs = (
        base.jobs
        if divisor == 1
        else select_jobs(base.trace, machine, mem_unit=MemoryUnit.BYTES_PER_JOB)
    )
    return Workload(machine, at_load(jobs, factor), 0, 0.0, base.trace)


def _wagap(config: SimConfig, divisor: int, factor: float) -> Workload:
    return wagap(shared(config), divisor, factor)


def _mix(
    config: SimConfig,
    seed: int,
    factor: float,
    nodes: tuple[int, int],
    jobs: int,
    load: float,
) -> Workload:
    """Seed ``seed``'s synthetic workload at relative load ``factor``; the
    sizes are arguments, as a worker process has the module's own values."""
    machine = Machine.uniform(*nodes, GB)
    drawn = cpu_memory_mix(seed, jobs, machine, load)
    return in_memory(f"cpu-memory-{seed}", at_load(drawn, factor), machine)


#: A run's folder -> its means.
Means = dict[Path, dict[str, float]]


def run_ibb(
    out: Path, pool: Pool | None = None, say: Callable[[str], None] = print
) -> tuple[dict[str, Any], str]:
    """Every (memory, load, policy), then the synthetic workload, on ``pool``
    (default: here, one after the other); the results and the text for
    results.md."""
    config = SimConfig(
        trace=str(find_trace(TRACE).resolve()),
        machine=MachineSpec(machines_file=str(find_trace(MACHINES).resolve())),
        mem_unit=MemoryUnit.BYTES_PER_JOB,
    )
    # Every run goes to the pool at once, workers build their workload from a
    # config and these few numbers; the tables read the means back by folder.
    planned = [
        (
            out / folder / f"load-{factor}",
            config,
            partial(_wagap, divisor=d, factor=factor),
        )
        for folder, _, d in MEMORY
        for factor in LOADS
    ] + [
        (
            out / "synthetic" / f"load-{factor}" / f"seed{seed}",
            SimConfig(trace="synthetic cpu+memory"),
            partial(
                _mix,
                seed=seed,
                factor=factor,
                nodes=SYNTHETIC_NODES,
                jobs=SYNTHETIC_JOBS,
                load=SYNTHETIC_LOAD,
            ),
        )
        for seed in SEEDS
        for factor in LOADS
    ]
    means = _runs(planned, pool or Pool(workers=1), say)
    base = load(config)
    results: dict[str, Any] = {}
    texts = []
    for folder, words, divisor in MEMORY:
        work = wagap(base, divisor, 1.0)
        machine, jobs = work.machine, work.jobs
        table: Table = {
            str(factor): _row(means, out / folder / f"load-{factor}")
            for factor in LOADS
        }
        results[folder] = {"jobs": len(jobs), "loads": table}
        texts.append(
            _section(
                f"MetaCentrum wagap-2013, {words}",
                f"{len(jobs):,} jobs on {machine.describe()} "
                f"({(machine.mem_kb or 0) // GB:,} GiB in all).",
                table,
            )
        )
    result, text = _synthetic(out / "synthetic", means)
    results["synthetic"] = result
    texts.append(text)
    return results, "\n".join(texts)


def _runs(
    planned: Sequence[tuple[Path, SimConfig, Callable[[SimConfig], Workload]]],
    pool: Pool,
    say: Callable[[str], None],
) -> Means:
    """Every policy on every planned workload: each run written to its folder
    (``planned``'s folder / label), and its means."""
    tasks = [
        (
            where / label,
            SimTask(replace(config, policy=policy_ref(policy), params=params), build),
        )
        for where, config, build in planned
        for label, (policy, params) in POLICIES.items()
    ]
    say(f"bb-vs-ibb: {len(tasks)} runs")
    means: Means = {}
    for (folder, _), run in zip(tasks, pool.each([t for _, t in tasks]), strict=True):
        write_run(run, folder)
        means[folder] = {k: float(run.summary[k]) for k, _ in METRICS}
    return means


def _row(means: Means, where: Path) -> dict[str, dict[str, float]]:
    """Every policy's means on the workload whose runs are in ``where``."""
    return {label: means[where / label] for label in POLICIES}


def _synthetic(out: Path, means: Means) -> tuple[dict[str, Any], str]:
    """The synthetic CPU + memory workload: every (load, policy), seeds 1-3."""
    machine = Machine.uniform(*SYNTHETIC_NODES, GB)
    per_seed: dict[str, list[dict[str, dict[str, float]]]] = {}
    loads = []
    for seed in SEEDS:
        jobs = cpu_memory_mix(seed, SYNTHETIC_JOBS, machine, SYNTHETIC_LOAD)
        loads.append(offered(jobs, machine))
        for factor in LOADS:
            row = _row(means, out / f"load-{factor}" / f"seed{seed}")
            per_seed.setdefault(str(factor), []).append(row)
    table: Table = {
        factor: {
            label: {
                k: statistics.fmean(row[label][k] for row in rows) for k, _ in METRICS
            }
            for label in POLICIES
        }
        for factor, rows in per_seed.items()
    }
    cpu = statistics.fmean(c for c, _ in loads)
    mem = statistics.fmean(m for _, m in loads)
    lead = (
        f"{SYNTHETIC_JOBS:,} jobs per seed (`minibatch/sim/synthetic.py`) on "
        f"{machine.describe()}; offered load at relative load 1: CPUs "
        f"{cpu:.2f}, memory {mem:.2f}. Means of seeds "
        f"{', '.join(map(str, SEEDS))}."
    )
    result = {"jobs": SYNTHETIC_JOBS, "seeds": per_seed, "loads": table}
    return result, _section("Synthetic CPU + memory mix, 1 GB per node", lead, table)


def gain(new: float, old: float) -> str:
    """How much lower ``new`` is than ``old``, in percent (negative: higher)."""
    return "n/a" if old == 0 else f"{100 * (old - new) / old:+.0f} %"


def _section(title: str, lead: str, table: Table) -> str:
    head = ["load", "metric", *POLICIES, *(column for column, _, _ in GAINS)]
    rows = []
    for factor, row in table.items():
        for key, label in METRICS:
            values = [row[p][key] for p in POLICIES]
            if key == "utilization":
                cells = [f"{v:.3f}" for v in values] + [""] * len(GAINS)
            else:
                cells = [number(v) for v in values]
                cells += [gain(row[new][key], row[old][key]) for _, new, old in GAINS]
            rows.append([factor, label, *cells])
    return (
        f"## {title}\n\n{lead} Gains are how much lower the first policy's "
        "mean is (positive: better).\n\n```\n" + grid(head, rows) + "```\n"
    )
