"""``srun`` inside a batch job: start the job's tasks, as a Slurm job step does.

Slurm scripts say ``srun ./app`` where PBS scripts say ``mpirun ./app`` or just
``./app``: so that they run unchanged, ``srun`` starts ``--ntasks`` copies of the
command (default: the job's ``$SLURM_NTASKS``), each with ``SLURM_PROCID``,
``SLURM_LOCALID`` and ``SLURM_STEP_*`` set and bound to its own
``--cpus-per-task`` CPUs of the job's, waits for all of them and exits with the
highest status (128 + N for a task killed by signal N). ``-l`` prefixes each
output line with its task number. Asking for more CPUs than the job holds is an
error, as in Slurm ("more processors requested than permitted").

What it cannot do here: start tasks on a job's other nodes (they are slices of
this machine; every task runs on the batch node's CPUs), or be the PMI server an
MPI library expects (launch MPI programs with the MPI's own ``mpirun``). Outside
a job it refuses: it allocates nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import IO, NoReturn

from minibatch.cli import common
from minibatch.cli.longopts import FLAG, OPTIONAL, VALUE, LongOptions
from minibatch.errors import InvalidArgument

# fmt: off
_OPTIONS = LongOptions({
    "ntasks": ("n", VALUE), "cpus-per-task": ("c", VALUE), "label": ("l", FLAG),
    "kill-on-bad-exit": ("K", OPTIONAL), "chdir": ("D", VALUE),
    # Accepted, with no effect here (the step runs inside the job's allocation).
    "nodes": ("N", VALUE), "ntasks-per-node": ("", VALUE), "mpi": ("", VALUE),
    "cpu-bind": ("", VALUE), "export": ("", VALUE), "exclusive": ("", OPTIONAL),
    "overlap": ("", FLAG), "unbuffered": ("u", FLAG), "mem": ("", VALUE),
    "mem-per-cpu": ("", VALUE), "job-name": ("J", VALUE), "time": ("t", VALUE),
    "gres": ("", VALUE), "gpus": ("G", VALUE), "gpus-per-task": ("", VALUE),
    "distribution": ("m", VALUE), "hint": ("", VALUE), "quiet": ("Q", FLAG),
    "verbose": ("v", FLAG), "wait": ("W", VALUE), "propagate": ("", OPTIONAL),
    "accel-bind": ("", VALUE), "threads-per-core": ("", VALUE),
    "help": ("h", FLAG),
}, {"cpu_bind": "cpu-bind", "tasks-per-node": "ntasks-per-node"})
# fmt: on
#: Signals passed on to every task, as srun forwards them to the step.
_FORWARD = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

USAGE = """\
usage: srun [-n NTASKS] [-c CPUS_PER_TASK] [-l] [-K] [-D DIR] COMMAND [ARGS...]

Inside a batch job: run NTASKS copies of COMMAND (default $SLURM_NTASKS), each on
its own CPUS_PER_TASK of the job's CPUs, and wait for them all.
"""


def job_slots(environ: Mapping[str, str]) -> list[int]:
    """The real core behind each CPU the job runs with here: its cores (those
    its other nodes lent included), in turn, as many times as its node says
    it has CPUs here (``$MB_JOB_SLOTS``): the virtual CPUs of an
    oversubscribed layout share cores. A malleable job's CPUs are its cores
    now (a resize changes them, not the variable)."""
    cores = sorted(os.sched_getaffinity(0))
    held = environ.get("MB_JOB_SLOTS", "")
    if not held.isdigit() or "MB_CPUSET_FILE" in environ:
        return cores
    return [cores[i % len(cores)] for i in range(max(int(held), len(cores)))]


def task_cpus(cpus: list[int], ntasks: int, per_task: int) -> list[list[int]]:
    """Each task's CPUs: consecutive blocks of the job's (all its nodes' cores:
    they are this machine's), in order."""
    if ntasks * per_task > len(cpus):
        raise InvalidArgument(
            f"more processors requested than permitted: {ntasks} tasks of "
            f"{per_task} CPUs, and the job holds {len(cpus)}"
        )
    return [cpus[i * per_task : (i + 1) * per_task] for i in range(ntasks)]


def task_env(
    environ: Mapping[str, str], task: int, ntasks: int, per_task: int, cpus: list[int]
) -> dict[str, str]:
    env = dict(environ)
    env.update(
        SLURM_PROCID=str(task),
        SLURM_LOCALID=str(task),
        SLURM_NODEID="0",
        SLURM_STEP_ID="0",
        SLURM_STEPID="0",
        SLURM_NTASKS=str(ntasks),
        SLURM_NPROCS=str(ntasks),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_TASKS_PER_NODE=str(ntasks),
        SLURM_CPUS_PER_TASK=str(per_task),
        MB_CPU_LIST=",".join(map(str, cpus)),
        MB_CPUS=str(len(cpus)),
    )
    return env


def _count(value: str, option: str) -> int:
    return common.positive_int(value, option)


def _pump(stream: IO[bytes], task: int, out: IO[bytes], lock: threading.Lock) -> None:
    """``-l``: copy a task's lines with its number in front."""
    prefix = f"{task}: ".encode()
    for line in stream:
        with lock:
            out.write(prefix + line)
            out.flush()


def run(argv: list[str], environ: Mapping[str, str]) -> int:
    """Start the tasks and wait for them; the exit status srun returns."""
    pairs, command = _OPTIONS.getopt(argv)
    opts = dict(pairs)
    if "help" in opts:
        print(USAGE, end="")
        return 0
    if not command:
        raise InvalidArgument("no command given (srun [options] COMMAND [ARGS...])")
    if "SLURM_JOB_ID" not in environ and "MB_JOBID" not in environ:
        raise InvalidArgument(
            "not inside a job: srun starts the tasks of a running job here; "
            "submit the command with sbatch --wrap or qsub -- COMMAND"
        )
    ntasks = _count(opts.get("ntasks") or environ.get("SLURM_NTASKS", "1"), "--ntasks")
    default_per_task = environ.get("SLURM_CPUS_PER_TASK", "1")
    per_task = _count(opts.get("cpus-per-task") or default_per_task, "--cpus-per-task")
    blocks = task_cpus(job_slots(environ), ntasks, per_task)
    workdir = opts.get("chdir") or None
    label = "label" in opts
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    lock = threading.Lock()
    for task, cpus in enumerate(blocks):
        try:
            proc = subprocess.Popen(
                command,
                cwd=workdir,
                env=task_env(environ, task, ntasks, per_task, cpus),
                stdout=subprocess.PIPE if label else None,
                stderr=subprocess.PIPE if label else None,
                # srun is no hot path: binding each task before exec is simplest.
                preexec_fn=lambda c=cpus: os.sched_setaffinity(0, c),
            )
        except OSError as exc:
            for p in procs:
                p.kill()
            raise InvalidArgument(f"cannot run {command[0]}: {exc.strerror}") from None
        procs.append(proc)
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            if stream is not None:
                t = threading.Thread(
                    target=_pump, args=(stream, task, out.buffer, lock), daemon=True
                )
                t.start()
                pumps.append(t)

    def forward(sig: int, _frame: object) -> None:
        for p in procs:
            if p.returncode is None:
                p.send_signal(sig)

    for sig in _FORWARD:
        signal.signal(sig, forward)
    kill_on_bad = "kill-on-bad-exit" in opts and opts["kill-on-bad-exit"] != "0"
    statuses = _wait_all(procs, kill_on_bad)
    for t in pumps:
        t.join()
    return max((_shell_status(s) for s in statuses), default=0)


def _wait_all(procs: list[subprocess.Popen[bytes]], kill_on_bad: bool) -> list[int]:
    """Every task's wait status; ``-K``: the first failure ends the others."""
    pending = list(procs)
    statuses: list[int] = []
    while pending:
        pid, status = os.wait()
        done = next((p for p in pending if p.pid == pid), None)
        if done is None:
            continue
        pending.remove(done)
        done.returncode = os.waitstatus_to_exitcode(status)
        statuses.append(done.returncode)
        if kill_on_bad and done.returncode != 0:
            for p in pending:
                p.send_signal(signal.SIGKILL)
    return statuses


def _shell_status(code: int) -> int:
    return 128 - code if code < 0 else code


def main() -> NoReturn:
    """The ``srun`` console script."""

    def body() -> None:
        with common.reporting("srun"):
            status = run(sys.argv[1:], os.environ)
        raise SystemExit(status)

    common.run_and_exit(body)
