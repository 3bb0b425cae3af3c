"""``mb demo``: seed 004's job mix, live, under two schedulers one after the other.

Bode et al. (seed 004) ran 76 jobs on 64 CPUs under PBS FIFO and under Maui. Here
a local cluster of 4 nodes x 16 virtual CPUs (on however few real cores) runs a
mix drawn by the paper's recipe (:func:`minibatch.sim.paper_bode.bode_mix`), its
hours scaled to seconds, as real jobs (``jobs/examples/trace_job.sh``, which
holds its CPUs for its scaled run time), submitted at their scaled times as
``mb replay`` does: first under ``pbs-fifo``, then under Maui's backfill with
fairshare (``fairshare``: EASY over the accounts' fairshare). Each class of the
mix belongs to one user (the job's account), so fairshare has someone to favour.

Then it prints the two runs side by side, from the jobs the server recorded
(makespan, mean wait, the small jobs' wait, utilization, each also in the mix's
own hours), next to what the simulator predicts for the same mix, and writes
each run's plots. ``--quick`` runs the mix 6 times faster (under a minute on 2
cores, for CI); ``--top`` shows ``mb top`` while it runs, in a terminal.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import typer

from minibatch.cluster import lifecycle, probe
from minibatch.config import Config, Paths, load

#: (label, policy, params): the two schedulers, in the order they run.
POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("PBS FIFO", "pbs-fifo", {}),
    (
        "Maui: backfill + fairshare",
        "fairshare",
        {"fsuserweight": 0, "fsaccountweight": 1},
    ),
)
#: The mix's classes and the user (account) each belongs to.
OWNERS = {
    "large": "ana",
    "medium": "ben",
    "small": "cy",
    "debug": "dee",
    "failed": "dee",
}
NODES, CPUS = 4, 16
#: How much faster than the mix: its ~42 hours take ~100 s (~19 s quick).
SPEEDUP, QUICK_SPEEDUP = 1500.0, 8000.0
#: The shortest job, and how much longer than its run a job's walltime is at
#: least (whole seconds: a job must not meet its limit by its own start-up).
MIN_RUN, MARGIN = 0.2, 1
HOUR = 3600.0


class RunStats(msgspec.Struct, frozen=True):
    """One run's figures, in live seconds."""

    makespan: float
    mean_wait: float
    small_wait: float
    utilization: float


def mix(seed: int) -> list[Any]:
    """Seed 004's 76 jobs, each class under its owner, sized for 4 x 16 CPUs."""
    from minibatch.sim.machine import Machine, NodeSpec
    from minibatch.sim.paper_bode import bode_mix

    machine = Machine(nodes=tuple(NodeSpec(f"node{i}", CPUS) for i in range(NODES)))
    jobs = []
    for job in bode_mix(seed, cpus=NODES * CPUS):
        request = machine.request(job.procs, None, int(job.req_time))
        assert request is not None  # every job of the mix fits 64 CPUs
        jobs.append(
            msgspec.structs.replace(job, user=OWNERS[job.queue], request=request)
        )
    return jobs


def stats(jobs: Sequence[Any], classes: dict[int, str], capacity: int) -> RunStats:
    """The figures of a finished run; ``classes``: job id -> its mix class."""
    first = min(j.submit_time for j in jobs)
    last = max(j.end_time for j in jobs)
    waits = [j.start_time - j.submit_time for j in jobs]
    small = [j.start_time - j.submit_time for j in jobs if classes.get(j.id) == "small"]
    busy = sum(j.request.cpus * (j.end_time - j.start_time) for j in jobs)
    return RunStats(
        makespan=last - first,
        mean_wait=statistics.fmean(waits),
        small_wait=statistics.fmean(small) if small else 0.0,
        utilization=busy / (capacity * (last - first)),
    )


def simulated(
    jobs: list[Any], plan: Sequence[Any], policy: str, params: dict[str, Any]
) -> float:
    """The makespan the simulator gives the jobs as submitted (``plan``: live
    seconds, walltimes rounded up, as the cluster saw them) under ``policy``."""
    from minibatch.sim.machine import Machine, NodeSpec
    from minibatch.sim.runner import SimConfig, in_memory, simulate

    machine = Machine(nodes=tuple(NodeSpec(f"node{i}", CPUS) for i in range(NODES)))
    by_id = {j.id: j for j in jobs}
    scaled = []
    for sub in plan:
        job = by_id[sub.trace_id]
        request = msgspec.structs.replace(job.request, walltime=sub.walltime)
        scaled.append(
            msgspec.structs.replace(
                job, submit=sub.at, run_time=sub.run, req_time=float(sub.walltime),
                request=request,
            )
        )  # fmt: skip
    run = simulate(
        SimConfig(trace="demo", policy=policy, params=params),
        in_memory("demo", scaled, machine),
    )
    return max(r.end for r in run.records) - min(r.submit for r in run.records)


def table(runs: list[tuple[str, RunStats, float]], speedup: float) -> str:
    """The side-by-side table: live seconds, and the mix's hours in brackets."""
    from minibatch.metrics.table import grid

    def both(seconds: float) -> str:
        return f"{seconds:7.1f} s ({seconds * speedup / HOUR:5.1f} h)"

    rows = [
        ["makespan", *[both(s.makespan) for _, s, _ in runs]],
        ["mean wait", *[both(s.mean_wait) for _, s, _ in runs]],
        ["small jobs' wait", *[both(s.small_wait) for _, s, _ in runs]],
        ["utilization", *[f"{s.utilization:.1%}" for _, s, _ in runs]],
        ["makespan, simulated", *[both(sim) for _, _, sim in runs]],
    ]
    return grid(["76 jobs on 64 CPUs", *[label for label, _, _ in runs]], rows)


def run_demo(
    quick: bool = False, top: bool = False, seed: int = 1, out: str = "mb-demo",
    keep: bool = False,
) -> None:  # fmt: skip
    paths = Paths.from_env()
    config = load(paths)
    speedup = QUICK_SPEEDUP if quick else SPEEDUP
    jobs = mix(seed)
    target = Path(out)
    typer.secho(
        f"seed 004's job mix (seed {seed}): {len(jobs)} jobs of 1-64 CPUs on "
        f"{NODES} nodes x {CPUS} virtual CPUs, {speedup:g}x faster than the mix; "
        f"first {POLICIES[0][0]}, then {POLICIES[1][0]}",
        bold=True,
    )
    _up(paths, config)
    runs: list[tuple[str, RunStats, float]] = []
    work = _workload(paths, jobs, speedup, target, runs)
    try:
        if top and sys.stdout.isatty() and sys.stdin.isatty():
            _with_top(paths, config, work)
        else:
            work(_Progress())
        typer.echo()
        text = table(runs, speedup)
        typer.echo(text, nl=False)
        (target / "demo.txt").write_text(text)
        typer.echo(f"\nplots and job records of each run in {target}/")
    finally:
        if keep:
            typer.echo("the cluster is still up (qstat, pbsnodes -a, mb top); mb down")
        else:
            typer.echo("stopped " + ", ".join(lifecycle.down(paths)))


def _up(paths: Paths, config: Config) -> None:
    from minibatch.cluster.layout import layout_for_up

    with lifecycle.one_at_a_time(paths, 60):
        running = probe.load_layout(paths) if probe.running(paths) else None
        layout = layout_for_up(config, NODES, CPUS, True, running)
        report = lifecycle.up(paths, config, layout)
    typer.echo(f"cluster up in {paths.home}: {', '.join(report.started) or 'running'}")


Report = Callable[[str], None]


def _workload(
    paths: Paths,
    jobs: list[Any],
    speedup: float,
    target: Path,
    runs: list[tuple[str, RunStats, float]],
) -> Callable[[Report], None]:
    """Both runs, one after the other, appending their figures to ``runs``."""
    from minibatch.cli import common
    from minibatch.cli.replay import jobs_of, run, submitter
    from minibatch.metrics.records import from_jobs
    from minibatch.protocol.messages import SetPolicy
    from minibatch.sim import replay

    classes = {j.id: j.queue for j in jobs}

    def work(report: Report) -> None:
        for label, policy, params in POLICIES:
            common.call(SetPolicy(name=policy, params=params))
            report(f"{label}: policy {policy} {params or ''}")
            out = target / policy
            (out / "output").mkdir(parents=True, exist_ok=True)
            plan = replay.schedule(jobs, speedup, MIN_RUN, MARGIN)
            ids = run(plan, submitter(replay.program(), out / "output"), report)
            done = jobs_of(ids)
            by_trace = {
                jid: classes[sub.trace_id] for sub, jid in zip(plan, ids, strict=True)
            }
            runs.append(
                (
                    label,
                    stats(done, by_trace, NODES * CPUS),
                    simulated(jobs, plan, policy, params),
                )
            )
            _plots(from_jobs(done), out, label)

    return work


def _plots(records: Any, out: Path, label: str) -> None:
    from minibatch.metrics import eet as eet_metrics
    from minibatch.metrics.plots import report_plots
    from minibatch.metrics.records import write_csv

    nodes = [(f"node{i}", CPUS) for i in range(NODES)]
    eet = eet_metrics.expected_end_times(records, NODES * CPUS)
    write_csv(out / "jobs.csv", records, eet)
    report_plots(records, eet, nodes, out, label)


class _Progress:
    """Progress lines: in a terminal one line redrawn in place, else one every
    few seconds (a log stays short), the last of a run always."""

    EVERY = 3.0

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0

    def __call__(self, line: str) -> None:
        done = " 0 queued, 0 running" in line or "submitted" not in line
        if self.tty:
            end = "\n" if done else ""
            sys.stdout.write(f"\r\033[K  {line}{end}")
            sys.stdout.flush()
        elif done or time.monotonic() - self.last >= self.EVERY:
            self.last = time.monotonic()
            typer.echo(f"  {line}")


def _with_top(paths: Paths, config: Config, work: Callable[[Report], None]) -> None:
    """``mb top`` in the foreground while ``work`` runs beside it, quietly,
    until the work is done; leaving ``mb top`` (q) early goes back to progress
    lines."""
    from minibatch.top.app import run_top

    quiet = threading.Event()
    quiet.set()
    failed: list[BaseException] = []
    progress = _Progress()

    def background() -> None:
        try:
            work(lambda line: None if quiet.is_set() else progress(line))
        except BaseException as exc:  # shown once the terminal is ours again
            failed.append(exc)

    worker = threading.Thread(target=background, name="demo-workload", daemon=True)
    worker.start()
    run_top(paths, config, until=lambda: not worker.is_alive())
    quiet.clear()
    worker.join()
    if failed:
        raise failed[0]
