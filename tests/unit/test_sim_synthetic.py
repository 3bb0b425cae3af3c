"""The synthetic CPU + memory mix of the bb-vs-ibb experiment (seed 003)."""

from __future__ import annotations

import pytest

from minibatch.sim.machine import Machine
from minibatch.sim.synthetic import GB, cpu_memory_mix, offered

MACHINE = Machine.uniform(16, 16, GB)


def test_a_seed_gives_the_same_jobs_and_another_seed_others():
    assert cpu_memory_mix(7, 200, MACHINE) == cpu_memory_mix(7, 200, MACHINE)
    assert cpu_memory_mix(7, 200, MACHINE) != cpu_memory_mix(8, 200, MACHINE)


def test_every_job_fits_the_machine_and_asks_at_most_half_its_memory():
    for j in cpu_memory_mix(1, 2000, MACHINE):
        req = j.request
        assert req.ppn <= 16 and req.nodes <= 16 and req.cpus == j.procs
        assert req.mem_kb is not None and req.mem_kb // req.nodes <= GB
        assert req.mem_kb <= 16 * GB / 2 + req.nodes


def test_memory_binds_as_often_as_cpus():
    jobs = cpu_memory_mix(1, 4000, MACHINE, load=0.6)
    cpu, mem = offered(jobs, MACHINE)
    assert cpu == pytest.approx(0.6, rel=0.1)
    assert mem == pytest.approx(cpu, rel=0.1)
    # CPU share vs memory share of the machine, job by job.
    heavy = sum((j.mem_kb or 0) / (16 * GB) > j.procs / 256 for j in jobs)
    assert 0.3 < heavy / len(jobs) < 0.5


def test_the_machine_must_have_identical_nodes_with_memory():
    with pytest.raises(ValueError, match="identical nodes with memory"):
        cpu_memory_mix(1, 10, Machine.uniform(4, 16))
    mixed = Machine(nodes=(*MACHINE.nodes, *Machine.uniform(1, 8, GB).nodes))
    with pytest.raises(ValueError, match="identical nodes with memory"):
        cpu_memory_mix(1, 10, mixed)
