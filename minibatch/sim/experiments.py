"""Named, reproducible comparisons: ``mb experiment NAME``.

An experiment fixes everything that determines its numbers: the workloads (trace,
machine, filter options), the policies, and the seeds. Traces are replayed
deterministically, so a run is repeatable bit for bit; seeds only matter for
experiments that sample windows of a trace (``window``): seed *s* picks the
window starting at ``random.Random(s).randrange(jobs - window + 1)``.

Trace files are looked up by name in ``$MB_TRACES`` (directories separated by
``:``) and then in ``./traces``. Each experiment writes, under its output
directory, one folder per workload with a folder per policy (``jobs.csv``,
``summary.json``), the comparison plots, and ``results.md`` with the table and
the command that made it.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from minibatch.errors import InvalidArgument
from minibatch.metrics.table import compare_table, grid, number
from minibatch.sim.compare import compare_plots
from minibatch.sim.engine import Progress
from minibatch.sim.runner import (
    MachineSpec,
    SimConfig,
    SimRun,
    Workload,
    load,
    simulate,
    write_run,
    write_summary,
)
from minibatch.sim.swf import MemoryUnit, find_trace

SDSC = "SDSC-SP2-1998-4.2-cln.swf.gz"
WAGAP = "MetaCentrum-wagap-2013.swf.gz"
WAGAP_MACHINES = "MetaCentrum-wagap-2013.alea.swf.machines"


@dataclass(frozen=True)
class WorkloadSpec:
    """A trace on a machine, with the filter options."""

    name: str
    trace: str
    machine: MachineSpec
    limit: int | None = None
    mem_unit: MemoryUnit = MemoryUnit.KB_PER_PROC
    note: str = ""


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    description: str
    workloads: tuple[WorkloadSpec, ...]
    policies: tuple[str, ...]
    seeds: tuple[int, ...] = ()
    window: int | None = None
    params: dict[str, dict[str, Any]] = field(default_factory=dict)


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            name="fcfs-vs-easy",
            title="FCFS vs EASY on SDSC-SP2 and MetaCentrum",
            description=(
                "Strict FCFS (fifo) against EASY backfilling (easy) on the whole "
                "SDSC-SP2 log (128 processors, flat pool) and on the MetaCentrum "
                "wagap-2013 data set, once as a flat pool of its 2,176 cores "
                "(memory ignored, as the classic simulators do) and once on its "
                "real 68 nodes (20 x 80 and 48 x 12 cores) with memory as a "
                "second resource."
            ),
            workloads=(
                WorkloadSpec("sdsc-sp2", SDSC, MachineSpec(procs=128)),
                WorkloadSpec(
                    "metacentrum-flat",
                    WAGAP,
                    MachineSpec(procs=2176),
                    mem_unit=MemoryUnit.BYTES_PER_JOB,
                ),
                WorkloadSpec(
                    "metacentrum-nodes",
                    WAGAP,
                    MachineSpec(machines_file=WAGAP_MACHINES),
                    mem_unit=MemoryUnit.BYTES_PER_JOB,
                    note="nodes and memory from the Alea .machines file",
                ),
            ),
            policies=("fifo", "easy"),
        ),
        Experiment(
            name="easy-windows",
            title="FCFS vs EASY on ten 5,000-job windows of SDSC-SP2",
            description=(
                "How much the FCFS/EASY gap depends on where in the log one looks: "
                "ten windows of 5,000 consecutive valid jobs, chosen by seeds 1-10."
            ),
            workloads=(WorkloadSpec("sdsc-sp2", SDSC, MachineSpec(procs=128)),),
            policies=("fifo", "easy"),
            seeds=tuple(range(1, 11)),
            window=5000,
        ),
    )
}


def _config(spec: WorkloadSpec, policy: str, exp: Experiment) -> SimConfig:
    machine = spec.machine
    if machine.machines_file is not None:
        machine = replace(machine, machines_file=str(find_trace(machine.machines_file)))
    return SimConfig(
        trace=str(find_trace(spec.trace)),
        policy=policy,
        params=exp.params.get(policy, {}),
        machine=machine,
        limit=spec.limit,
        mem_unit=spec.mem_unit,
    )


def window(work: Workload, size: int, seed: int) -> Workload:
    """``size`` consecutive jobs of ``work``, starting where seed ``seed`` says."""
    if size >= len(work.jobs):
        return work
    first = random.Random(seed).randrange(len(work.jobs) - size + 1)
    return replace(work, jobs=work.jobs[first : first + size])


Reporter = Callable[[str], None]


def run_experiment(
    name: str,
    out: Path,
    *,
    plots: bool = True,
    progress: Progress | None = None,
    say: Reporter = print,
) -> dict[str, Any]:
    """Run experiment ``name`` into ``out``; its results (also in ``summary.json``)."""
    exp = EXPERIMENTS.get(name)
    if exp is None:
        raise InvalidArgument(
            f"unknown experiment {name!r} (known: {', '.join(EXPERIMENTS)})"
        )
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"experiment": exp.name, "workloads": {}}
    sections = [f"# {exp.title}\n", exp.description + "\n", _command(exp, out)]
    for spec in exp.workloads:
        say(f"{exp.name}: {spec.name}")
        work = load(_config(spec, exp.policies[0], exp))
        if exp.seeds and exp.window:
            result, text = _windows(exp, spec, work, out / spec.name, progress)
        else:
            result, text = _whole(exp, spec, work, out / spec.name, plots, progress)
        results["workloads"][spec.name] = result
        sections.append(text)
    write_summary(out / "summary.json", results)
    (out / "results.md").write_text("\n".join(sections))
    return results


def _command(exp: Experiment, out: Path) -> str:
    return f"Made with `mb experiment {exp.name} --out {out}`.\n"


def _whole(
    exp: Experiment,
    spec: WorkloadSpec,
    work: Workload,
    out: Path,
    plots: bool,
    progress: Progress | None,
) -> tuple[dict[str, Any], str]:
    runs: list[SimRun] = []
    for policy in exp.policies:
        run = simulate(_config(spec, policy, exp), work, progress)
        write_run(run, out / policy)
        runs.append(run)
    if plots:
        compare_plots(runs, out, f"{spec.name}: {', '.join(exp.policies)}")
    names = list(exp.policies)
    summaries = [r.summary for r in runs]
    head = runs[0]
    text = (
        f"## {spec.name}\n\n"
        f"{len(head.records):,} jobs of `{spec.trace}` on {head.machine.describe()}"
        f"{'; ' + spec.note if spec.note else ''}.\n\n"
        "```\n"
        + compare_table(names, summaries)
        + "```\n\n"
        + (
            f"Plots: `{spec.name}/boxplots.png`, `{spec.name}/eet_heatmaps.png`, "
            f"`{spec.name}/utilization.png`.\n"
            if plots
            else ""
        )
    )
    return dict(zip(names, summaries, strict=True)), text


#: Summary keys aggregated over windows.
WINDOW_KEYS: tuple[str, ...] = (
    "mean_wait_s",
    "median_wait_s",
    "mean_bounded_slowdown",
    "utilization",
    "eet_violated_pct",
    "median_veet_u_pct",
)


def _windows(
    exp: Experiment,
    spec: WorkloadSpec,
    work: Workload,
    out: Path,
    progress: Progress | None,
) -> tuple[dict[str, Any], str]:
    per_policy: dict[str, list[dict[str, Any]]] = {p: [] for p in exp.policies}
    for seed in exp.seeds:
        part = window(work, exp.window or len(work.jobs), seed)
        for policy in exp.policies:
            run = simulate(_config(spec, policy, exp), part, progress)
            write_run(run, out / f"seed{seed}" / policy)
            per_policy[policy].append(run.summary)
    rows = []
    for key in WINDOW_KEYS:
        cells = [key]
        for policy in exp.policies:
            values = [s[key] for s in per_policy[policy]]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{number(statistics.fmean(values))} ± {number(spread)}")
        rows.append(cells)
    first, *others = exp.policies
    wins = {
        p: sum(
            1
            for a, b in zip(per_policy[first], per_policy[p], strict=True)
            if b["mean_wait_s"] < a["mean_wait_s"]
        )
        for p in others
    }
    text = (
        f"## {spec.name}, {len(exp.seeds)} windows of {exp.window:,} jobs\n\n"
        f"Seeds {', '.join(map(str, exp.seeds))}; mean ± standard deviation over "
        "windows.\n\n```\n"
        + grid(["metric", *exp.policies], rows)
        + "```\n\n"
        + "".join(
            f"{p} has a lower mean wait than {first} in {n} of {len(exp.seeds)} "
            "windows.\n"
            for p, n in wins.items()
        )
    )
    result = {p: per_policy[p] for p in exp.policies}
    return {"windows": result, "wins": wins}, text


def describe_all() -> str:
    """The experiments ``mb experiment --list`` shows."""
    return "".join(f"{e.name:<16} {e.title}\n" for e in EXPERIMENTS.values())
