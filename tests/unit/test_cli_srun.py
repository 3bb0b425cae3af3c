"""srun inside a job: real tasks, each bound to its CPUs, statuses combined."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minibatch.cli.srun import job_slots, run, task_cpus
from minibatch.errors import InvalidArgument

SRUN = [sys.executable, "-c", "from minibatch.cli.srun import main; main()"]


def test_task_cpus_are_blocks_of_the_jobs():
    assert task_cpus([4, 5, 6, 7], 2, 2) == [[4, 5], [6, 7]]
    with pytest.raises(InvalidArgument, match="more processors requested"):
        task_cpus([0, 1], 3, 1)


def test_outside_a_job_srun_refuses():
    with pytest.raises(InvalidArgument, match="not inside a job"):
        run(["true"], {"PATH": os.environ["PATH"]})


@pytest.mark.timeout(30)
def test_tasks_run_bound_and_labelled(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_NTASKS": str(len(cpus))}
    script = (
        "import os; print(os.environ['SLURM_PROCID'], "
        "sorted(os.sched_getaffinity(0)) == [int(c) for c in "
        "os.environ['MB_CPU_LIST'].split(',')], os.environ['MB_CPU_LIST'])"
    )
    proc = subprocess.run(
        [*SRUN, "-l", sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"{i}: {i} True {cpu}" for i, cpu in enumerate(cpus)]


@pytest.mark.timeout(30)
def test_status_is_the_highest_of_the_tasks():
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}
    failing = subprocess.run([*SRUN, "sh", "-c", "exit 3"], env=env, check=False)
    assert failing.returncode == 3
    killed = subprocess.run([*SRUN, "sh", "-c", "kill -TERM $$"], env=env, check=False)
    assert killed.returncode == 143


def test_virtual_cpus_share_the_cores_behind_them():
    """An oversubscribed layout's job holds more CPUs ($PBS_NP) than it has
    cores: srun -n $SLURM_NTASKS runs, tasks sharing cores in turn (found by a
    new-user trial: it refused)."""
    cores = sorted(os.sched_getaffinity(0))
    slots = job_slots({"MB_JOB_SLOTS": str(3 * len(cores))})
    assert slots == cores * 3
    assert job_slots({}) == cores == job_slots({"MB_JOB_SLOTS": "x"})
    assert len(task_cpus(slots, 3 * len(cores), 1)) == 3 * len(cores)
    # A job on several nodes whose others lent nothing: $PBS_NP counts them,
    # its slots do not (srun refuses more tasks than its cores, as it did).
    assert job_slots({"PBS_NP": "64", "MB_JOB_SLOTS": str(len(cores))}) == cores
    # A malleable job: its cores now, whatever it was given at its start.
    malleable = {"MB_JOB_SLOTS": str(3 * len(cores)), "MB_CPUSET_FILE": "/x"}
    assert job_slots(malleable) == cores
