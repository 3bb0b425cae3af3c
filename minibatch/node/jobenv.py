"""A job's environment: the submitter's, plus what tells it where it runs.

The variables PBS/Torque and Slurm set for a batch job (``PBS_NODEFILE``,
``SLURM_JOB_ID``, ...) beside minibatch's own (``MB_CPU_LIST``), built from
the launch alone, so every rule is unit-tested without starting anything.
"""

from __future__ import annotations

from minibatch.node.identity import Identity
from minibatch.protocol.messages import LaunchSpec

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Inherited variables that describe *another* job (qsub from inside a job).
_FOREIGN_PREFIXES = ("MB_", "PBS_", "SLURM_")


def nodefile_lines(spec: LaunchSpec, node: str) -> list[str]:
    """One line per CPU per host, as PBS writes ``$PBS_NODEFILE``."""
    return [h for h in (spec.hosts or [node]) for _ in spec.cpus]


def job_environment(
    spec: LaunchSpec,
    *,
    node: str,
    home: str,
    ident: Identity,
    cpus: list[int],
    nodefile: str,
    cpuset_file: str = "",
    resize_signal: str = "USR1",
    tmpdir: str = "",
) -> dict[str, str]:
    """The job's environment: the submitter's, plus what tells it where it runs."""
    env = {k: v for k, v in spec.env.items() if not k.startswith(_FOREIGN_PREFIXES)}
    # PBS_O_* describe the submission and are set by qsub: keep them.
    env.update({k: v for k, v in spec.env.items() if k.startswith("PBS_O_")})
    env.setdefault("HOME", ident.home)
    env.setdefault("USER", ident.user)
    env.setdefault("LOGNAME", ident.user)
    env.setdefault("SHELL", ident.shell or "/bin/sh")
    env.setdefault("PATH", DEFAULT_PATH)
    hosts = spec.hosts or [node]
    ncpus = str(len(cpus))
    # The CPUs the job runs with here: its other nodes' too when they lent
    # their cores (srun starts that many tasks at most).
    slots = len(cpus) * (len(hosts) if spec.other_cores else 1)
    env.update(
        MB_JOBID=spec.display_id,
        MB_JOB_SLOTS=str(slots),
        MB_CPUS=ncpus,
        MB_CPU_LIST=",".join(map(str, cpus)),
        MB_NODE=node,
        MB_HOME=home,
        OMP_NUM_THREADS=ncpus,
        PBS_JOBID=spec.display_id,
        PBS_JOBNAME=spec.name,
        PBS_O_WORKDIR=spec.workdir,
        PBS_NODEFILE=nodefile,
        PBS_ENVIRONMENT="PBS_BATCH",
        PBS_NUM_NODES=str(len(hosts)),
        PBS_NUM_PPN=ncpus,
        PBS_NP=str(len(hosts) * len(cpus)),
        SLURM_JOB_ID=str(spec.job),
        SLURM_JOB_NAME=spec.name,
        SLURM_CPUS_ON_NODE=ncpus,
        SLURM_JOB_NUM_NODES=str(len(hosts)),
        SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_SUBMIT_DIR=spec.workdir,
    )
    if cpuset_file:
        # Where a malleable job reads its CPUs after a resize, and the signal
        # that announces one (minibatch.malleable reads both).
        env.update(MB_CPUSET_FILE=cpuset_file, MB_RESIZE_SIGNAL=resize_signal)
    env.update(pbs_extras(spec, len(cpus)))
    env.update(slurm_extras(spec, node, ident, len(hosts), len(cpus)))
    if spec.gpus:
        gpus = ",".join(map(str, spec.gpus))
        env.update(
            CUDA_VISIBLE_DEVICES=gpus, SLURM_JOB_GPUS=gpus, GPU_DEVICE_ORDINAL=gpus
        )
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


def pbs_extras(spec: LaunchSpec, ncpus: int) -> dict[str, str]:
    """What Torque and PBS Pro tell a job besides the basics: its queue, task
    and vnode numbers (one task, on the first vnode), array index, account."""
    env = {
        "PBS_QUEUE": spec.queue,
        "PBS_TASKNUM": "1",
        "PBS_VNODENUM": "0",
        "PBS_NODENUM": "0",
        "PBS_WALLTIME": str(spec.walltime),
        "PBS_MOMPORT": "0",
        "NCPUS": str(ncpus),
    }
    if spec.account:
        env["PBS_ACCOUNT"] = spec.account
    if spec.array_index is not None:
        env.update(
            PBS_ARRAYID=str(spec.array_index),
            PBS_ARRAY_INDEX=str(spec.array_index),
            PBS_ARRAY_ID=f"{spec.array_id}[]",
        )
    return env


def slurm_extras(
    spec: LaunchSpec, node: str, ident: Identity, nodes: int, ncpus: int
) -> dict[str, str]:
    """Slurm's job variables, as sbatch sets them for the batch step."""
    opts = spec.options
    per_task = opts.cpus_per_task or 1
    ntasks = opts.ntasks or max(1, nodes * ncpus // per_task)
    per_node = opts.tasks_per_node or max(1, ncpus // per_task)
    env = {
        "SLURM_JOBID": str(spec.job),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NNODES": str(nodes),
        "SLURM_NODELIST": ",".join(spec.hosts or [node]),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})" if nodes > 1 else str(per_node),
        "SLURM_JOB_CPUS_PER_NODE": f"{ncpus}(x{nodes})" if nodes > 1 else str(ncpus),
        "SLURM_JOB_PARTITION": spec.queue,
        "SLURM_JOB_USER": ident.user,
        "SLURM_JOB_UID": str(ident.uid),
        "SLURM_JOB_GID": str(ident.gid),
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": node,
        "SLURM_RESTART_COUNT": str(spec.reruns),
        "SLURM_SUBMIT_HOST": spec.env.get("PBS_O_HOST", node),
    }
    if opts.cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(opts.cpus_per_task)
    if opts.tasks_per_node:
        env["SLURM_NTASKS_PER_NODE"] = str(opts.tasks_per_node)
    if spec.mem_kb:  # what it holds on each node (mem_kb: all of its nodes here)
        nodes_here = len(spec.hosts) if spec.other_cores else 1
        env["SLURM_MEM_PER_NODE"] = str(spec.mem_kb // nodes_here // 1024)
    if spec.account:
        env["SLURM_JOB_ACCOUNT"] = spec.account
    if spec.gpus:
        env["SLURM_GPUS_ON_NODE"] = str(len(spec.gpus))
    if spec.array_index is not None:
        env.update(
            SLURM_ARRAY_TASK_ID=str(spec.array_index),
            SLURM_ARRAY_JOB_ID=str(spec.array_id),
        )
    return env
