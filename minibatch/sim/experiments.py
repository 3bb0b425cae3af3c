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

An experiment's policies are labels: a label in ``variants`` names a policy and
its parameters (``"fairshare-fifo": ("fairshare", {"backfill": False})``), any
other label is a policy name. The paper reproductions on synthetic workloads
(seed 004's job mix, seed 000's PSP scenarios) have their own ``runner``
(:mod:`minibatch.sim.paper_bode`, :mod:`minibatch.sim.paper_psp`).
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from minibatch.errors import InvalidArgument
from minibatch.metrics import eet as eet_metrics
from minibatch.metrics.summary import percentile
from minibatch.metrics.table import compare_table, grid, number
from minibatch.sim import paper_bode, paper_psp
from minibatch.sim.compare import compare_plots
from minibatch.sim.parallel import Pool, SimTask, shared
from minibatch.sim.runner import (
    MachineSpec,
    SimConfig,
    SimRun,
    Workload,
    policy_ref,
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
    #: label -> (policy, parameters).
    variants: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    #: A synthetic experiment: (output dir, pool, say) -> (results, text).
    runner: Runner | None = None
    #: Text appended to each workload's section: (labels, runs) -> text.
    extra: Callable[[list[str], list[SimRun]], str] | None = None


Runner = Callable[[Path, Pool, Callable[[str], None]], tuple[dict[str, Any], str]]


def _veet_text(labels: list[str], runs: list[SimRun]) -> str:
    """Seed 001's Fig. 6 in numbers: VEET_u and WT_u over users."""
    rows = []
    for label, run in zip(labels, runs, strict=True):
        users = eet_metrics.per_user(run.records, run.eet)
        veet = sorted(u.veet_pct for u in users)
        wt = sorted(u.wt_cpu_s for u in users)
        fair = sum(1 for v in veet if v <= 35.0)
        rows.append(
            [
                label,
                *(number(percentile(veet, q)) for q in (50, 75, 90)),
                f"{100 * fair / len(veet):.0f} %",
                str(sum(1 for v in veet if v >= 100.0)),
                *(number(percentile(wt, q)) for q in (75, 90)),
                f"{sum(wt):.3g}",
            ]
        )
    head = ["", "VEET_u median", "p75", "p90", "users <= 35 %", "users at 100 %"]
    head += ["WT_u p75", "WT_u p90", "WT total"]
    return (
        f"Per user ({len(veet)} users; seed 001, Fig. 6):\n\n```\n"
        + grid(head, rows)
        + "```\n\n"
    )


def _bode(
    out: Path, pool: Pool, say: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    return paper_bode.run_bode(out, tuple(range(1, 21)))


def _psp(
    out: Path, pool: Pool, say: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    return paper_psp.run_psp(out, (1, 2, 3, 4), PSP_PROCS, PSP_LOAD, say=say)


def _sd(
    out: Path, pool: Pool, say: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    from minibatch.sim import paper_sd

    return paper_sd.run_sd(out, None, say)


def _ibb(
    out: Path, pool: Pool, say: Callable[[str], None]
) -> tuple[dict[str, Any], str]:
    from minibatch.sim import paper_ibb

    return paper_ibb.run_ibb(out, pool, say)


#: The PSP scenarios' machine and offered load (docs/results.md says why).
PSP_PROCS = 128
PSP_LOAD = 1.1


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
        Experiment(
            name="fairshare-eet",
            title="fifo / fairshare fifo / backfill / fairshare + backfill (seed 001)",
            description=(
                "Toth & Klusacek's comparison (seed 001, Fig. 5-7): strict FIFO and "
                "EASY, each without and with Maui fairshare priorities (`fairshare`: "
                "every user aimed at an equal share, usage in dedicated CPU-seconds "
                "over 8 windows of 12 h, no decay), scored with the classic metrics "
                "and with VEET_u / WT_u and the violated-EET heatmaps. The paper "
                "used 5 months of MetaCentrum's zewura cluster (17,250 jobs, 70 "
                "users); we use MetaCentrum wagap-2013 on its 68 nodes with memory "
                "(17,897 jobs, 75 users) and the SDSC-SP2 log."
            ),
            workloads=(
                WorkloadSpec(
                    "metacentrum-nodes",
                    WAGAP,
                    MachineSpec(machines_file=WAGAP_MACHINES),
                    mem_unit=MemoryUnit.BYTES_PER_JOB,
                    note="nodes and memory from the Alea .machines file",
                ),
                WorkloadSpec("sdsc-sp2", SDSC, MachineSpec(procs=128)),
            ),
            policies=("fifo", "fairshare-fifo", "easy", "fairshare-easy"),
            variants={
                "fairshare-fifo": ("fairshare", {"backfill": False}),
                "fairshare-easy": ("fairshare", {}),
            },
            extra=_veet_text,
        ),
        Experiment(
            name="bode-mix",
            title="PBS FIFO vs Maui on seed 004's 76-job mix",
            description=(
                "Bode et al. (seed 004, Table 1): the total run time of a 76-job "
                "mix on 64 CPUs under PBS FIFO, Maui and Maui without backfill, "
                "against the theoretical minimum and the sequential maximum. The "
                "paper's mix is not available: 20 mixes are drawn from its "
                "description (minibatch/sim/paper_bode.py)."
            ),
            workloads=(),
            policies=(),
            runner=_bode,
        ),
        Experiment(
            name="psp-scenarios",
            title="PSP: waiting time per accuracy class, six scenarios (seed 000)",
            description=(
                "Rocchetti et al. (seed 000, Tables 2-3): 1,000 jobs of 20 users "
                "whose runtime estimates are bad (BE), good (GE), as at Cluster "
                "FING (CF), FING with good estimates (CFG), improving (DI) or half "
                "improving (HDI), under PSP; the mean wait of each accuracy class."
            ),
            workloads=(),
            policies=(),
            runner=_psp,
        ),
        Experiment(
            name="bb-vs-ibb",
            title="EASY vs BB vs IBB over CPUs and memory, at several loads (seed 003)",
            description=(
                "Liu et al. (seed 003, Fig. 1-2): EASY backfilling against its "
                "K-resource variants Backfill Balanced (one backfill per pass, "
                "lowest Eq. 1; and with rescan=true, again after each start) and "
                "Improved Backfill Balanced (every candidate passing Eq. 2, in one "
                "traversal), on MetaCentrum wagap-2013 on its 68 nodes with "
                "memory, at relative loads 0.8-1.5 (submission times divided by "
                "the load), with the nodes' memory as recorded and cut to a "
                "quarter, and on a synthetic CPU + memory mix with 1 GB per node "
                "where memory binds as often as CPUs (minibatch/sim/paper_ibb.py)."
            ),
            workloads=(),
            policies=(),
            runner=_ibb,
        ),
        Experiment(
            name="sd",
            title="SD-Policy vs static EASY backfill with malleable jobs (seed 002)",
            description=(
                "D'Amico et al. (seed 002, Figures 1-3 and 8): EASY backfilling "
                "against SD-Policy with MAX_SLOWDOWN dynamic, 10 and unlimited, "
                "and with the worst-case run-time model, on a Cirne-like "
                "synthetic workload (inflated and exact requested times, 3 "
                "seeds) and on the whole SDSC-SP2 log, every job malleable down "
                "to half its CPUs (minibatch/sim/paper_sd.py)."
            ),
            workloads=(),
            policies=(),
            runner=_sd,
        ),
    )
}


def _config(spec: WorkloadSpec, label: str, exp: Experiment) -> SimConfig:
    policy, params = exp.variants.get(label, (label, exp.params.get(label, {})))
    # Full paths: workers elsewhere (a Dask cluster) find the files by them.
    machine = spec.machine
    if machine.machines_file is not None:
        machine = replace(
            machine, machines_file=str(find_trace(machine.machines_file).resolve())
        )
    return SimConfig(
        trace=str(find_trace(spec.trace).resolve()),
        policy=policy_ref(policy),
        params=params,
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


def windowed(config: SimConfig, size: int, seed: int) -> Workload:
    """:func:`window` of ``config``'s workload, where the run happens."""
    return window(shared(config), size, seed)


Reporter = Callable[[str], None]


def run_experiment(
    name: str,
    out: Path,
    *,
    plots: bool = True,
    pool: Pool | None = None,
    say: Reporter = print,
) -> dict[str, Any]:
    """Run experiment ``name`` into ``out`` on ``pool`` (default: here, one run
    after the other); its results (also in ``summary.json``)."""
    exp = EXPERIMENTS.get(name)
    if exp is None:
        raise InvalidArgument(
            f"unknown experiment {name!r} (known: {', '.join(EXPERIMENTS)})"
        )
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"experiment": exp.name, "workloads": {}}
    sections = [f"# {exp.title}\n", exp.description + "\n", _command(exp, out)]
    pool = pool or Pool(workers=1)
    if exp.runner is not None:
        result, text = exp.runner(out, pool, say)
        results["result"] = result
        sections.append(text)
    # One batch for every workload, so that no core waits for a workload's
    # last run; each workload's runs are written as soon as they are all done.
    batches = [_tasks(exp, spec) for spec in exp.workloads]
    done = pool.each([task for batch in batches for task in batch])
    for spec, batch in zip(exp.workloads, batches, strict=True):
        say(f"{exp.name}: {spec.name}")
        runs = itertools.islice(done, len(batch))
        if exp.seeds and exp.window:
            result, text = _windows(exp, spec, runs, out / spec.name)
        else:
            result, text = _whole(exp, spec, list(runs), out / spec.name, plots)
        results["workloads"][spec.name] = result
        sections.append(text)
    write_summary(out / "summary.json", results)
    (out / "results.md").write_text("\n".join(sections))
    return results


def _command(exp: Experiment, out: Path) -> str:
    return f"Made with `mb experiment {exp.name} --out {out}`.\n"


def _tasks(exp: Experiment, spec: WorkloadSpec) -> list[SimTask]:
    """The runs of ``spec``: window by window (policy after policy), or a run
    per policy on the whole workload."""
    if exp.seeds and exp.window:
        return [
            SimTask(
                _config(spec, policy, exp),
                partial(windowed, size=exp.window, seed=seed),
            )
            for seed in exp.seeds
            for policy in exp.policies
        ]
    return [SimTask(_config(spec, label, exp)) for label in exp.policies]


def _whole(
    exp: Experiment,
    spec: WorkloadSpec,
    done: list[SimRun],
    out: Path,
    plots: bool,
) -> tuple[dict[str, Any], str]:
    runs: list[SimRun] = []
    for label, run in zip(exp.policies, done, strict=True):
        write_run(run, out / label)
        # Plots and tables name runs by label (two labels may share a policy).
        runs.append(replace(run, config=replace(run.config, policy=label)))
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
        + ("\n" + exp.extra(names, runs) if exp.extra is not None else "")
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
    exp: Experiment, spec: WorkloadSpec, done: Iterable[SimRun], out: Path
) -> tuple[dict[str, Any], str]:
    per_policy: dict[str, list[dict[str, Any]]] = {p: [] for p in exp.policies}
    runs = zip(itertools.product(exp.seeds, exp.policies), done, strict=True)
    for (seed, policy), run in runs:
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
