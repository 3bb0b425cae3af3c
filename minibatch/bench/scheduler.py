"""``mb bench scheduler``: how long one scheduling pass takes on a busy cluster.

The snapshot is synthetic and reproducible (``--seed``): ``--nodes`` nodes of
``--cpus-per-node`` CPUs and 4 GB of memory per CPU, kept full by running jobs
(each started up to 12 h ago, with 5 min to 36 h of requested time left or
already overrunning), a few CPUs left free on some nodes, and ``--pending``
queued jobs shaped like a production log: sizes are powers of two from 1 CPU to
4 whole nodes (half of them 1-4 CPUs), requested times log-uniform from 5 min to
36 h, memory 0.5-4 GB per CPU. The policy plans it ``--repeat`` times; the median
wall time of one ``plan()`` call is ``pass_ms_median``.

``--mode stuck`` is the worst case for EASY, whose pass stops once no CPU is
free: CPUs stay free, running jobs hold all the memory, every queued job asks
for a different amount, so every job is tried on every node.

``--malleable F`` makes that share of the one-node jobs (running and queued)
malleable down to half their CPUs: the case SD-Policy (``sd``) works on, where
every queued job that does not fit is offered the running jobs as mates.

Targets (docs/benchmarks.md, "Scheduler pass"): 10,000 pending jobs on 128 x 32
CPUs in under 50 ms for ``easy``, under 200 ms for ``conservative`` (busy or
stuck; 2 s at 50,000, issue 12) and under 100 ms for ``sd`` with malleable
jobs. The result says whether the planning core ran compiled
(:mod:`minibatch.native`).
"""

from __future__ import annotations

import json
import math
import platform
import random
import statistics
import time
from typing import Annotated, Any

import typer

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, NodeView, PendingView, RunningView

GB = 1024 * 1024  # KB


def snapshot(
    pending: int,
    nodes: int = 128,
    cpus: int = 32,
    seed: int = 1,
    stuck: bool = False,
    malleable: float = 0.0,
) -> ClusterSnapshot:
    """The benchmark's cluster: full of running jobs, ``pending`` jobs queued.

    ``stuck``: the worst case for a pass that stops when no CPU is free: CPUs
    stay free on every node but running jobs hold all the memory, and every
    queued job asks for a different amount of memory, so nothing can start and
    each job is tried on every node.
    """
    rng = random.Random(seed)
    now = 1_000_000.0
    mem = cpus * 4 * GB
    free = {f"n{i}": cpus for i in range(nodes)}
    free_mem = dict.fromkeys(free, mem)
    running: list[RunningView] = []
    jid = 0
    for name in free:
        # Fill each node with jobs of 1-16 CPUs; leave 0-3 CPUs idle.
        idle = rng.choice((1, 2, 3, 4)) if stuck else rng.choice((0, 0, 0, 1, 2, 3))
        while free[name] > idle:
            size = min(free[name] - idle, 2 ** rng.randint(0, 4))
            per = rng.choice((1, 2, 3)) * GB // 2 * size
            if stuck and free[name] - size == idle:
                per = free_mem[name]  # the last job takes what memory is left
            jid += 1
            left = math.exp(rng.uniform(math.log(300), math.log(36 * 3600)))
            if rng.random() < 0.03:
                left = -rng.uniform(1, 600)  # overrunning
            start = now - rng.uniform(0, 12 * 3600)
            running.append(
                RunningView(
                    id=jid,
                    user=f"u{rng.randrange(50)}",
                    nodes=((name, size),),
                    mem_kb_per_node=per,
                    start_time=start,
                    walltime=now - start + left,
                    malleable=_range(rng, size, malleable),
                    ppn=size,
                    submit_time=start - rng.uniform(0, 3600),
                    req_walltime=now - start + left,
                )
            )
            free[name] -= size
            free_mem[name] -= per
    views = tuple(
        NodeView(
            name=n,
            cpus=cpus,
            free_cpus=free[n],
            mem_kb=mem,
            free_mem_kb=free_mem[n],
        )
        for n in free
    )
    queue: list[PendingView] = []
    for k in range(pending):
        jid += 1
        procs = 2 ** min(int(rng.expovariate(0.45)), 7)
        procs = min(procs, 4 * cpus)
        count = -(-procs // cpus)
        ppn = -(-procs // count)
        wall = int(math.exp(rng.uniform(math.log(300), math.log(36 * 3600))))
        queue.append(
            PendingView(
                id=jid,
                user=f"u{rng.randrange(50)}",
                group="g",
                request=JobRequest(
                    nodes=count,
                    ppn=ppn,
                    mem_kb=int(
                        (rng.uniform(0.5, 4) if stuck else rng.choice((0.5, 1, 2, 4)))
                        * GB
                    )
                    * procs,
                    walltime=wall,
                    malleable=_range(rng, ppn, malleable) if count == 1 else None,
                ),
                submit_time=now - pending + k,
            )
        )
    return ClusterSnapshot(
        now=now, generation=1, nodes=views, running=tuple(running), pending=queue
    )


def _range(rng: random.Random, cpus: int, share: float) -> tuple[int, int] | None:
    """Down to half its CPUs, for ``share`` of the jobs."""
    return ((cpus + 1) // 2, cpus) if rng.random() < share else None


def run(
    pending: int = 10_000,
    policy: str = "easy",
    nodes: int = 128,
    cpus: int = 32,
    repeat: int = 5,
    seed: int = 1,
    mode: str = "busy",
    malleable: float = 0.0,
) -> dict[str, Any]:
    """Time ``repeat`` passes of ``policy`` on the benchmark snapshot."""
    from minibatch import native
    from minibatch.policy import registry

    snap = snapshot(
        pending, nodes, cpus, seed, stuck=mode == "stuck", malleable=malleable
    )
    pol = registry.load(policy)
    walls: list[float] = []
    plan = None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        plan = pol.plan(snap)
        walls.append((time.perf_counter() - t0) * 1000)
    assert plan is not None
    return {
        "policy": policy,
        "pending": pending,
        "running": len(snap.running),
        "nodes": nodes,
        "cpus_per_node": cpus,
        "free_cpus": sum(n.free_cpus for n in snap.nodes),
        "seed": seed,
        "mode": mode,
        "malleable": malleable,
        "repeat": len(walls),
        "pass_ms_median": statistics.median(walls),
        "pass_ms_min": min(walls),
        "passes_ms": walls,
        "starts": len(plan.starts),
        "resizes": len(plan.resizes),
        "predicted": len(plan.predicted),
        "python": platform.python_version(),
        # The planning core compiled (minibatch/native.py) or plain Python.
        "compiled": native.compiled(),
        "planning_core": native.describe(),
    }


def render(result: dict[str, Any]) -> str:
    from minibatch.metrics.table import grid, number

    rows = [
        ["policy", str(result["policy"])],
        ["snapshot", str(result["mode"])],
        [
            "cluster",
            f"{result['nodes']} nodes x {result['cpus_per_node']} CPUs, "
            f"{result['running']:,} running, {result['free_cpus']} CPUs free",
        ],
        ["pending jobs", number(result["pending"])],
        ["one pass, median (ms)", number(result["pass_ms_median"])],
        ["one pass, fastest (ms)", number(result["pass_ms_min"])],
        ["malleable share", number(result["malleable"])],
        ["jobs started", number(result["starts"])],
        ["resizes", number(result["resizes"])],
        ["starts predicted", number(result["predicted"])],
        ["planning core", str(result["planning_core"])],
    ]
    return grid(["mb bench scheduler", ""], rows)


def bench_scheduler(
    pending: Annotated[
        int, typer.Option("--pending", min=0, help="Queued jobs in the snapshot.")
    ] = 10_000,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Policy name.")
    ] = "easy",
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Nodes.")] = 128,
    cpus_per_node: Annotated[
        int, typer.Option("--cpus-per-node", min=1, help="CPUs of each node.")
    ] = 32,
    repeat: Annotated[int, typer.Option(min=1, help="Passes; the median is kept.")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic snapshot.")] = 1,
    mode: Annotated[
        str,
        typer.Option(
            help="busy: a full cluster; stuck: CPUs free but no memory (worst case)."
        ),
    ] = "busy",
    malleable: Annotated[
        float,
        typer.Option(help="Share of one-node jobs that are malleable (0-1)."),
    ] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Wall time of one scheduling pass with many pending jobs."""
    from minibatch.cli import common
    from minibatch.errors import InvalidArgument

    with common.reporting("mb bench scheduler"):
        if pending < 0 or nodes < 1 or cpus_per_node < 1:
            raise InvalidArgument("--pending >= 0, --nodes and --cpus-per-node >= 1")
        if mode not in ("busy", "stuck"):
            raise InvalidArgument(f"--mode must be busy or stuck, not {mode!r}")
        if not 0 <= malleable <= 1:
            raise InvalidArgument("--malleable is a share between 0 and 1")
        result = run(
            pending, policy, nodes, cpus_per_node, repeat, seed, mode, malleable
        )
        if as_json:
            typer.echo(json.dumps(result, indent=2))
            return
        typer.echo(render(result), nl=False)
