"""Run a policy on a trace and keep what happened: records, summary, files.

:func:`load` reads a trace and applies the job filter for a machine,
:func:`simulate` replays it under a policy and scores it, :func:`write_run` writes
``jobs.csv`` and ``summary.json`` (the formats ``mb report`` reads back).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minibatch import native
from minibatch.core.resize import RuntimeModel
from minibatch.core.units import parse_size_kb
from minibatch.errors import InvalidArgument
from minibatch.metrics import eet as eet_metrics
from minibatch.metrics.records import JobRecord, from_outcomes, write_csv
from minibatch.metrics.summary import describe, summarize
from minibatch.policy import registry
from minibatch.policy.ordered import PRESETS
from minibatch.sim import downtime
from minibatch.sim.downtime import Downtime
from minibatch.sim.engine import Progress, SimStats, Simulator
from minibatch.sim.machine import Machine, NodeSpec
from minibatch.sim.malleable import make_malleable
from minibatch.sim.swf import (
    Estimates,
    MemoryUnit,
    SwfTrace,
    TraceJob,
    machine_nodes_from_header,
    read_swf,
    select_jobs,
)


@dataclass(frozen=True)
class MachineSpec:
    """How the user described the machine (``--procs``, ``--nodes`` ...)."""

    procs: int | None = None
    nodes: int | None = None
    cpus_per_node: int | None = None
    mem: str | None = None
    machines_file: str | None = None

    def build(self, trace: SwfTrace) -> Machine:
        """The machine; the trace header gives the size when none was given."""
        mem_kb = parse_size_kb(self.mem) if self.mem else None
        if self.machines_file is not None:
            if self.mem is not None:
                raise InvalidArgument("--machines gives node memory; drop --mem")
            return read_alea_machines(self.machines_file)
        if self.nodes is not None or self.cpus_per_node is not None:
            if self.nodes is None or self.cpus_per_node is None:
                raise InvalidArgument("--nodes and --cpus-per-node go together")
            if self.procs is not None:
                raise InvalidArgument(
                    "give --procs or --nodes/--cpus-per-node, not both"
                )
            return Machine.uniform(self.nodes, self.cpus_per_node, mem_kb)
        if self.procs is not None:
            return Machine.pool(self.procs, mem_kb)
        listed = machine_nodes_from_header(trace)
        if listed:
            return Machine(nodes=tuple(NodeSpec(n, c, mem_kb) for n, c in listed))
        size = trace.machine_procs()
        if size is None:
            raise InvalidArgument(
                "the trace header has no MaxProcs/MaxNodes: give --procs N "
                "or --nodes N --cpus-per-node C"
            )
        return Machine.pool(size, mem_kb)


def read_alea_machines(path: str | Path, with_mem: bool = True) -> Machine:
    """Nodes from an Alea ``.machines`` file: ``id name nodes cpus speed mem_kb``.

    Nodes are named ``<name><i>`` (``zewura0`` ...). ``with_mem`` False leaves
    memory out of the model.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(f"no such machines file: {p}")
    nodes: list[NodeSpec] = []
    for line in p.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0].startswith(("#", ";")):
            continue
        if len(parts) < 6 or not all(
            x.isdigit() for x in (parts[2], parts[3], parts[5])
        ):
            raise InvalidArgument(f"malformed machines line in {p}: {line!r}")
        count, cpus, mem = int(parts[2]), int(parts[3]), int(parts[5])
        nodes.extend(
            NodeSpec(f"{parts[1]}{i}", cpus, mem if with_mem else None)
            for i in range(count)
        )
    if not nodes:
        raise InvalidArgument(f"no nodes in {p}")
    return Machine(nodes=tuple(nodes))


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulation's outcome."""

    trace: str
    policy: str = "easy"
    params: dict[str, Any] = field(default_factory=dict)
    machine: MachineSpec = field(default_factory=MachineSpec)
    limit: int | None = None
    estimates: Estimates = Estimates.TRACE
    kill_at_walltime: bool = False
    mem_unit: MemoryUnit = MemoryUnit.KB_PER_PROC
    #: Windows with CPUs reserved for nobody (:mod:`minibatch.sim.downtime`).
    downtimes: tuple[Downtime, ...] = ()
    #: The share of jobs made malleable, their range as shares of their request,
    #: and how their run time follows their CPUs (:mod:`minibatch.sim.malleable`).
    malleable: float = 0.0
    malleable_range: tuple[float, float] = (0.5, 1.0)
    runtime_model: RuntimeModel = RuntimeModel.IDEAL

    def describe(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "policy": self.policy,
            "params": self.params,
            "limit": self.limit,
            "estimates": self.estimates.value,
            "kill_at_walltime": self.kill_at_walltime,
            "mem_unit": self.mem_unit.value,
            "downtimes": [list(d) for d in self.downtimes],
            "malleable": self.malleable,
            "malleable_range": list(self.malleable_range),
            "runtime_model": self.runtime_model.value,
        }


@dataclass
class Workload:
    """A filtered trace on a machine, ready to simulate (shared between policies)."""

    machine: Machine
    jobs: list[TraceJob]
    records_in_trace: int
    read_s: float
    trace: SwfTrace
    #: Records the job filter left out, by reason (docs/simulator.md).
    left_out: dict[str, int] = field(default_factory=dict)


def load(config: SimConfig) -> Workload:
    """Read the trace and apply the job filter for the configured machine."""
    t0 = time.perf_counter()
    trace = read_swf(config.trace)
    machine = config.machine.build(trace)
    left_out: dict[str, int] = {}
    jobs = select_jobs(
        trace,
        machine,
        limit=config.limit,
        estimates=config.estimates,
        mem_unit=config.mem_unit,
        left_out=left_out,
    )
    if not jobs:
        raise InvalidArgument(f"no job of {config.trace} passes the filter")
    jobs = make_malleable(jobs, machine, config.malleable, config.malleable_range)
    took = time.perf_counter() - t0
    return Workload(machine, jobs, len(trace.records), took, trace, left_out)


def in_memory(name: str, jobs: list[TraceJob], machine: Machine) -> Workload:
    """A workload built in code (a synthetic job mix), not read from a trace."""
    return Workload(machine, jobs, len(jobs), 0.0, SwfTrace(header={"Computer": name}))


def policy_ref(name: str) -> str:
    """``name`` if installed, else its ``module:Class`` from the presets not yet
    registered as entry points (so experiments run before ``pip install``)."""
    return name if name in registry.available() else PRESETS.get(name, name)


@dataclass
class SimRun:
    """One finished simulation and its scores."""

    config: SimConfig
    machine: Machine
    records: list[JobRecord]
    eet: dict[int, float]
    summary: dict[str, Any]
    stats: SimStats


def simulate(
    config: SimConfig,
    workload: Workload | None = None,
    progress: Progress | None = None,
) -> SimRun:
    """Replay the workload under ``config.policy`` and compute every metric."""
    work = workload or load(config)
    policy = registry.load(config.policy, config.params)
    origin = min((j.submit for j in work.jobs), default=0.0)
    sim = Simulator(
        policy,
        work.machine,
        work.jobs,
        kill_at_walltime=config.kill_at_walltime,
        progress=progress,
        reservations=downtime.place(list(config.downtimes), work.machine, origin),
        runtime_model=config.runtime_model,
    )
    t0 = time.perf_counter()
    outcomes = sim.run()
    wall = time.perf_counter() - t0
    records = from_outcomes(outcomes)
    return score(config, work, records, wall, sim.stats)


def score(
    config: SimConfig,
    work: Workload,
    records: list[JobRecord],
    wall: float,
    stats: SimStats,
) -> SimRun:
    machine = work.machine
    eet = eet_metrics.expected_end_times(
        records,
        machine.procs,
        mem_capacity_kb=machine.mem_kb if any(r.mem_kb for r in records) else None,
    )
    summary: dict[str, Any] = {
        **config.describe(),
        "machine": machine.describe(),
        "machine_procs": machine.procs,
        "machine_nodes": [[n.name, n.cpus, n.mem_kb] for n in machine.nodes],
        "trace_records": work.records_in_trace,
        "left_out": dict(work.left_out),
    }
    summary.update(summarize(records, machine.procs))
    summary.update(eet_summary(records, eet))
    summary.update(
        {
            "wall_s": wall,
            "jobs_per_s": len(records) / wall if wall > 0 else math.nan,
            "read_s": work.read_s,
            # What the speed above was measured with (minibatch/native.py).
            "planning_core": native.describe(),
            "instants": stats.instants,
            "passes": stats.passes,
            "quiet_passes": stats.quiet,
        }
    )
    return SimRun(config, machine, records, eet, summary, stats)


def eet_summary(records: list[JobRecord], eet: dict[int, float]) -> dict[str, Any]:
    """Share of jobs past their EET, and VEET_u / WT_u over users."""
    users = eet_metrics.per_user(records, eet)
    violated = sum(u.violated for u in users)
    veet = describe(u.veet_pct for u in users)
    wt = describe(u.wt_cpu_s for u in users)
    return {
        "users": len(users),
        "eet_violated_pct": 100.0 * violated / len(records) if records else math.nan,
        "mean_veet_u_pct": veet.mean,
        "median_veet_u_pct": veet.median,
        "p90_veet_u_pct": veet.p90,
        "median_wt_u_cpu_s": wt.median,
        "p90_wt_u_cpu_s": wt.p90,
        "total_wt_cpu_s": math.fsum(u.wt_cpu_s for u in users),
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_summary(path: str | Path, summary: dict[str, Any]) -> None:
    """``summary.json``; NaN (undefined) values are written as null."""
    Path(path).write_text(json.dumps(_json_safe(summary), indent=2) + "\n")


def write_run(run: SimRun, out: str | Path) -> tuple[Path, Path]:
    """Write ``out/jobs.csv`` and ``out/summary.json``; their paths."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    jobs_csv, summary_json = directory / "jobs.csv", directory / "summary.json"
    write_csv(jobs_csv, run.records, run.eet)
    write_summary(summary_json, run.summary)
    return jobs_csv, summary_json
