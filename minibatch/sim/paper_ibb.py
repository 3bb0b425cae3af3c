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
* **policies**: ``easy``, ``bb``, ``ibb`` (all EASY reservations, depth 1;
  only the backfill choice differs).

Each run is written to ``OUT/<memory>/load-<L>/<policy>/`` (``jobs.csv``,
``summary.json``); the text gives the means beside each other and IBB's gain
over BB and over EASY, the way the paper reports its gains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from minibatch.metrics.table import grid, number
from minibatch.sim.engine import Progress
from minibatch.sim.machine import Machine, NodeSpec
from minibatch.sim.runner import (
    MachineSpec,
    SimConfig,
    Workload,
    load,
    simulate,
    write_run,
)
from minibatch.sim.swf import MemoryUnit, TraceJob, find_trace, select_jobs

TRACE = "MetaCentrum-wagap-2013.swf.gz"
MACHINES = "MetaCentrum-wagap-2013.alea.swf.machines"
LOADS = (0.8, 1.0, 1.25, 1.5)
POLICIES = ("easy", "bb", "ibb")
#: (folder, words, divisor of every node's memory)
MEMORY = (("memory", "memory as recorded", 1), ("memory-4", "a quarter of it", 4))
METRICS = (
    ("mean_wait_s", "mean wait (s)"),
    ("mean_response_s", "mean response (s)"),
    ("mean_slowdown", "mean slowdown"),
    ("mean_bounded_slowdown", "mean bounded slowdown"),
    ("utilization", "utilization"),
)


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


def run_ibb(
    out: Path, progress: Progress | None = None, say: Callable[[str], None] = print
) -> tuple[dict[str, Any], str]:
    """Every (memory, load, policy); the results and the text for results.md."""
    config = SimConfig(
        trace=str(find_trace(TRACE)),
        machine=MachineSpec(machines_file=str(find_trace(MACHINES))),
        mem_unit=MemoryUnit.BYTES_PER_JOB,
    )
    base = load(config)
    results: dict[str, Any] = {}
    texts = []
    for folder, words, divisor in MEMORY:
        machine = less_memory(base.machine, divisor)
        jobs = (
            base.jobs
            if divisor == 1
            else select_jobs(base.trace, machine, mem_unit=config.mem_unit)
        )
        table: dict[str, dict[str, dict[str, float]]] = {}
        for factor in LOADS:
            work = Workload(machine, at_load(jobs, factor), 0, 0.0, base.trace)
            row: dict[str, dict[str, float]] = {}
            for policy in POLICIES:
                say(f"bb-vs-ibb: {words}, load {factor}, {policy}")
                run = simulate(replace(config, policy=policy), work, progress)
                write_run(run, out / folder / f"load-{factor}" / policy)
                row[policy] = {k: float(run.summary[k]) for k, _ in METRICS}
            table[str(factor)] = row
        results[folder] = {"jobs": len(jobs), "loads": table}
        texts.append(_section(words, machine, len(jobs), table))
    return results, "\n".join(texts)


def gain(new: float, old: float) -> str:
    """How much lower ``new`` is than ``old``, in percent (negative: higher)."""
    return "n/a" if old == 0 else f"{100 * (old - new) / old:+.0f} %"


def _section(
    words: str,
    machine: Machine,
    jobs: int,
    table: dict[str, dict[str, dict[str, float]]],
) -> str:
    head = ["load", "metric", *POLICIES, "IBB vs BB", "IBB vs EASY", "BB vs EASY"]
    rows = []
    for factor, row in table.items():
        for key, label in METRICS:
            e, b, i = (row[p][key] for p in POLICIES)
            if key == "utilization":
                rows.append(
                    [factor, label, *(f"{v:.3f}" for v in (e, b, i)), "", "", ""]
                )
            else:
                rows.append(
                    [
                        factor,
                        label,
                        number(e),
                        number(b),
                        number(i),
                        gain(i, b),
                        gain(i, e),
                        gain(b, e),
                    ]
                )
    return (
        f"## MetaCentrum wagap-2013, {words}\n\n"
        f"{jobs:,} jobs on {machine.describe()} "
        f"({(machine.mem_kb or 0) // 1024**2:,} GiB in all). Gains are how much "
        "lower the first policy's mean is (positive: better).\n\n```\n"
        + grid(head, rows)
        + "```\n"
    )
