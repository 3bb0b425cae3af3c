"""``scontrol show job`` and ``scontrol show partition``: Slurm's ``Key=Value``
blocks, built from plain records (the command is in
:mod:`minibatch.cli.slurmcmds`).

Only the keys minibatch knows a true value for are printed; a block is its
first line, then lines indented by three spaces, or one line with
``-o``/``--oneliner``. A pending job's StartTime is the scheduler's predicted
start, as Slurm shows its expected one.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from minibatch.cli import render, slurmfmt
from minibatch.core.job import Job, limit_of
from minibatch.errors import MinibatchError
from minibatch.protocol.messages import NodeInfo, QueueInfo

Block = list[list[tuple[str, str]]]


def block_text(block: Block, one_line: bool = False) -> str:
    """Lines of ``Key=Value`` pairs: the first flush, the rest indented."""
    lines = [" ".join(f"{k}={v}" for k, v in line) for line in block if line]
    if one_line:
        return " ".join(lines) + "\n"
    return "\n".join([lines[0], *("   " + line for line in lines[1:])]) + "\n"


def command_of(job: Job) -> str:
    """The job's command: its argv, or its script's path as submitted (found
    in the submission's arguments), or ``(null)`` (``--wrap``, stdin)."""
    if job.argv:
        return shlex.join(job.argv)
    from minibatch.cli import pbsopts, slurmopts

    try:
        tokens = shlex.split(job.submit_args)
        if job.options.slurm:
            try:
                operands = slurmopts.getopt(tokens)[1]
            except MinibatchError:  # qsub of a script with #SBATCH lines
                operands = pbsopts.getopt(tokens)[1]
        else:
            operands = pbsopts.getopt(tokens)[1]
    except (MinibatchError, ValueError):
        return "(null)"
    if not operands:  # --wrap, or a script read from stdin
        return "(null)"
    where = job.env.get("PWD") or job.workdir
    return os.path.normpath(os.path.join(where, operands[0]))


def tres(job: Job) -> str:
    """``cpu=2,mem=400M,node=1,billing=2[,gres/gpu=1]``."""
    cpus = sum(len(a.cpus) for a in job.alloc) or job.request.cpus
    nodes = len(job.alloc) or job.request.nodes
    parts = [f"cpu={cpus}"]
    if job.request.mem_kb:
        parts.append(f"mem={render._slurm_mem(job.request.mem_kb)}")
    parts += [f"node={nodes}", f"billing={cpus}"]
    if job.request.gpus:
        parts.append(f"gres/gpu={job.request.gpus * nodes}")
    return ",".join(parts)


def job_block(job: Job, now: float) -> Block:
    """``scontrol show job``'s keys for one job."""
    req, opts = job.request, job.options
    first = [("JobId", str(job.id))]
    if job.array_id is not None:
        first += [("ArrayJobId", str(job.array_id))]
        first += [("ArrayTaskId", str(job.array_index))]
    first.append(("JobName", job.name))
    start = job.start_time if job.start_time is not None else job.predicted_start
    stdout = job.stdout_path or "(null)"
    return [
        first,
        [("UserId", f"{job.user}({job.uid})"), ("GroupId", f"{job.group}({job.gid})")],
        [
            ("Nice", str(-opts.priority)),
            ("Account", job.account or "(null)"),
            ("QOS", job.qos or "(null)"),
        ],
        [
            ("JobState", slurmfmt.state_name(job)),
            ("Reason", slurmfmt.reason_code(job)),
            ("Dependency", slurmfmt.dependency(job)),
        ],
        [
            ("Requeue", "1" if opts.rerunnable else "0"),
            ("Restarts", str(job.reruns)),
            ("BatchFlag", "0" if job.argv else "1"),
            ("ExitCode", render.slurm_exit_code(job)),
        ],
        [
            ("RunTime", render.slurm_duration(slurmfmt.used(job, now))),
            ("TimeLimit", render.slurm_duration(limit_of(job))),
        ],
        [("SubmitTime", slurmfmt.iso(job.submit_time))],
        [
            ("StartTime", slurmfmt.iso(start, "Unknown")),
            ("EndTime", slurmfmt.iso(slurmfmt.expected_end(job), "Unknown")),
        ],
        [("Partition", job.queue or render.QUEUE)],
        [("NodeList", slurmfmt.node_list(job) or "(null)")],
        [("BatchHost", job.alloc[0].node)] if job.alloc else [],
        [
            ("NumNodes", str(len(job.alloc) or req.nodes)),
            ("NumCPUs", str(sum(len(a.cpus) for a in job.alloc) or req.cpus)),
            ("NumTasks", str(opts.ntasks or req.nodes)),
            ("CPUs/Task", str(opts.cpus_per_task or 1)),
        ],
        [("TRES", tres(job))],
        [("Features", "&".join(opts.features) or "(null)")],
        [("Command", command_of(job))],
        [("WorkDir", job.workdir)],
        [("StdErr", stdout if job.join else job.stderr_path or "(null)")],
        [("StdIn", "/dev/null")],
        [("StdOut", stdout)],
    ]


def _limit(seconds: int | None, none: str) -> str:
    return none if seconds is None else render.slurm_duration(seconds)


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def partition_state(queue: QueueInfo) -> str:
    """UP (open, starting jobs), DOWN (open, not starting: qstop), DRAIN
    (closed, still starting: qdisable), INACTIVE (neither)."""
    if queue.enabled:
        return "UP" if queue.started else "DOWN"
    return "DRAIN" if queue.started else "INACTIVE"


def partition_block(queue: QueueInfo, nodes: Sequence[NodeInfo]) -> Block:
    """``scontrol show partition``'s keys for one queue (every queue has every
    node here)."""
    block: Block = [
        [("PartitionName", queue.name)],
        [("AllowGroups", "ALL"), ("AllowAccounts", "ALL"), ("AllowQos", "ALL")],
        [("Default", "YES" if queue.default else "NO"), ("QoS", "N/A")],
        [("DefaultTime", _limit(queue.default_walltime, "NONE")), ("Hidden", "NO")],
        [
            ("MaxNodes", "UNLIMITED"),
            ("MaxTime", _limit(queue.max_walltime, "UNLIMITED")),
            ("MinNodes", "0"),
        ],
        [("Nodes", slurmfmt.compress_hostlist(n.name for n in nodes) or "(null)")],
        [
            ("PriorityJobFactor", _number(queue.priority)),
            ("PriorityTier", _number(queue.priority)),
            ("OverSubscribe", "NO"),
        ],
        [
            ("State", partition_state(queue)),
            ("TotalCPUs", str(sum(len(n.cpus) for n in nodes))),
            ("TotalNodes", str(len(nodes))),
        ],
    ]
    # minibatch's own limits, which Slurm partitions do not have.
    extra = [("AllowUsers", ",".join(queue.users))] if queue.users else []
    if queue.max_cpus is not None:
        extra.append(("MaxCPUsPerJob", str(queue.max_cpus)))
    return [*block, extra]
