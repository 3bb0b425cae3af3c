"""A synthetic CPU + memory workload where memory binds as often as CPUs.

Seed 003 simulates LANL-CM5 with 1 GB per node: there, unlike on MetaCentrum
(about 1 GB asked per core of nodes with 6.8 GB per core), memory is as scarce
as CPUs, and a job asks for both roughly in proportion. We do not have that
trace with memory, so :func:`cpu_memory_mix` draws such a workload:

* **machine**: identical nodes with memory (``paper_ibb`` uses 64 nodes x 16
  CPUs x 1 GB). Not nodes of one CPU, as the CM-5's were: a job takes whole
  nodes there, so its memory share can never exceed its CPU share and memory
  never binds first;
* **sizes**: powers of two from 1 CPU to a quarter of the machine, the small
  ones more likely (weight ``1 / (k + 1)`` for ``2**k`` CPUs);
* **memory**: ``f`` times the job's CPU share of a node's memory, ``f``
  log-normal with mean 1 and ``spread`` (the standard deviation of ``ln f``;
  ln 2 by default: two jobs in three ask between half and twice their CPU
  share), ``ln f`` clipped to +-ln(min(CPUs per node, what leaves the job at
  most half the machine's memory)). The machine-wide demand for CPUs and for
  memory is then about equal (within 5 %); about 63 % of the jobs are
  CPU-heavy, the others memory-heavy, and more so. A memory-heavy job spreads
  over more nodes with fewer CPUs on each (the largest power of two that
  leaves its memory room on a node), as users do with memory-hungry MPI jobs;
* **times**: run times log-uniform from a minute to 12 hours, requested times
  1-5 x the run time (rounded up to a minute), Poisson arrivals at the offered
  ``load`` of the more demanded of the two resources.

Deterministic for a seed (``random.Random(seed)``).
"""

from __future__ import annotations

import math
import random

from minibatch.core.job import JobRequest
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob

#: 1 GB in KB, every node's memory.
GB = 1024**2


def cpu_memory_mix(
    seed: int,
    jobs: int,
    machine: Machine,
    load: float = 1.0,
    spread: float = math.log(2),
) -> list[TraceJob]:
    """``jobs`` jobs for ``machine`` (identical nodes with memory), arriving at
    the offered ``load`` of CPUs or memory, whichever is higher."""
    first = machine.nodes[0]
    cpus, node_mem = first.cpus, first.mem_kb
    if node_mem is None or any(
        (n.cpus, n.mem_kb) != (cpus, node_mem) for n in machine.nodes
    ):
        raise ValueError("cpu_memory_mix needs identical nodes with memory")
    count = len(machine.nodes)
    total = count * cpus
    rng = random.Random(seed)
    sizes = [2**k for k in range(int(math.log2(total // 4)) + 1)]
    weights = [1.0 / (k + 1) for k in range(len(sizes))]
    drawn = []
    for _ in range(jobs):
        size = rng.choices(sizes, weights)[0]
        # Memory per CPU relative to the node's; at most half the machine.
        most = math.log(min(cpus, total / 2 / size))
        f = math.exp(max(-most, min(most, rng.gauss(-(spread**2) / 2, spread))))
        # CPUs per node, a power of two: as many as leave the job's memory
        # room on a node.
        ppn = min(size, 2 ** int(math.log2(cpus / max(f, 1.0))))
        nodes = -(-size // ppn)
        mem_node = min(node_mem, math.ceil(ppn * f * node_mem / cpus))
        run = round(math.exp(rng.uniform(math.log(60), math.log(12 * 3600))))
        req = 60 * math.ceil(run * rng.uniform(1, 5) / 60)
        drawn.append((nodes, ppn, mem_node, run, req))
    cpu_work = sum(n * p * run for n, p, _, run, _ in drawn)
    mem_work = sum(n * m * run for n, _, m, run, _ in drawn) * cpus / node_mem
    gap = max(cpu_work, mem_work) / jobs / (total * load)  # seconds between arrivals
    out, t = [], 0.0
    for jid, (nodes, ppn, mem_node, run, req) in enumerate(drawn, start=1):
        t += rng.expovariate(1 / gap)
        request = JobRequest(
            nodes=nodes, ppn=ppn, mem_kb=nodes * mem_node, walltime=req
        )
        out.append(
            TraceJob(
                id=jid,
                user=f"u{rng.randrange(50)}",
                group="g",
                queue="1",
                submit=round(t),
                run_time=float(run),
                procs=nodes * ppn,
                req_time=float(req),
                mem_kb=nodes * mem_node,
                request=request,
            )
        )
    return out


def offered(jobs: list[TraceJob], machine: Machine) -> tuple[float, float]:
    """The offered load of CPUs and of memory: work asked over capacity x span."""
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    cpu = sum(j.procs * j.run_time for j in jobs) / (machine.procs * span)
    mem = sum((j.mem_kb or 0) * j.run_time for j in jobs) / (
        (machine.mem_kb or 1) * span
    )
    return cpu, mem
