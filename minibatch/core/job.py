"""The job model: request, state machine and record.

State and result are separate fields (as in Flux): ``state`` says where a job is in
its life, ``result`` says how a finished job ended. PBS letters are a rendering
concern (:func:`state_letter`). Every state change goes through :func:`transition`,
which checks it against :data:`TRANSITIONS`, so an impossible change is an error and
never a silent corruption.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
from enum import StrEnum
from typing import Final

import msgspec

from minibatch.errors import InvalidTransition


class JobState(StrEnum):
    QUEUED = "queued"
    HELD = "held"
    WAITING = "waiting"
    RUNNING = "running"
    EXITING = "exiting"
    FINISHED = "finished"


class JobResult(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out_of_memory"
    NODE_FAIL = "node_fail"


#: The longest job name (PBS Pro's): NAME.oID must stay a legal file name.
MAX_NAME: Final = 236

PENDING_STATES: Final = frozenset({JobState.QUEUED, JobState.HELD, JobState.WAITING})
ACTIVE_STATES: Final = frozenset({JobState.RUNNING, JobState.EXITING})

#: Allowed (from, to) pairs, each with the event that causes it.
TRANSITIONS: Final[dict[tuple[JobState, JobState], str]] = {
    (JobState.QUEUED, JobState.HELD): "hold",
    (JobState.WAITING, JobState.HELD): "hold",
    (JobState.HELD, JobState.QUEUED): "release",
    (JobState.HELD, JobState.WAITING): "release",
    (JobState.WAITING, JobState.QUEUED): "dependency satisfied",
    (JobState.QUEUED, JobState.RUNNING): "start",
    (JobState.RUNNING, JobState.EXITING): "kill",
    (JobState.RUNNING, JobState.FINISHED): "end",
    (JobState.EXITING, JobState.FINISHED): "end",
    # qrerun: the killed run's end puts the job back in the queue, same id.
    (JobState.EXITING, JobState.QUEUED): "requeue",
    (JobState.RUNNING, JobState.QUEUED): "requeue",
    (JobState.QUEUED, JobState.FINISHED): "cancel",
    (JobState.HELD, JobState.FINISHED): "cancel",
    (JobState.WAITING, JobState.FINISHED): "cancel",
}

_LETTERS: Final = {
    JobState.QUEUED: "Q",
    JobState.HELD: "H",
    JobState.WAITING: "W",
    JobState.RUNNING: "R",
    JobState.EXITING: "E",
}


#: How the server begins the reason of a job waiting on a dependency. Torque
#: and PBS Pro show such a job held (``H``, hold type ``s``); ``W`` is for a
#: job waiting for its start time (``qsub -a``).
DEPENDENCY_REASON = "dependency on"


def state_letter(state: JobState, result: JobResult | None) -> str:
    """PBS letter: Q H W R E, then C for a completed job and F for any other end."""
    if state is JobState.FINISHED:
        return "C" if result is JobResult.COMPLETED else "F"
    return _LETTERS[state]


class DependKind(StrEnum):
    AFTEROK = "afterok"
    AFTERNOTOK = "afternotok"
    AFTERANY = "afterany"


class Dependency(msgspec.Struct, frozen=True):
    kind: DependKind
    job: int
    #: ``afterokarray:5[]`` as submitted: every task of array ``job``; and
    #: ``afterok:5[3]`` (``5_3`` in Slurm): its task of index 3. The server
    #: replaces both by dependencies on job ids, so stored jobs have neither.
    whole_array: bool = False
    task: int | None = None


def dependency_outcome(dep: Dependency, result: JobResult | None) -> bool | None:
    """Whether ``dep`` is satisfied by a job that ended with ``result``.

    Returns None while the job has not ended, True when satisfied, and False when
    it can never be satisfied (the dependent job is then cancelled, as PBS does).
    """
    if result is None:
        return None
    if dep.kind is DependKind.AFTERANY:
        return True
    ok = result is JobResult.COMPLETED
    return ok if dep.kind is DependKind.AFTEROK else not ok


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a job asks for. ``mem_kb`` is for the whole job (PBS ``mem=``)."""

    nodes: int = 1
    ppn: int = 1
    mem_kb: int | None = None
    walltime: int = 3600
    #: GPUs on each node.
    gpus: int = 0
    #: A malleable job's fewest and most CPUs on each node (``qsub -l
    #: malleable=MIN-MAX``), ``ppn`` lying between them; None: a rigid job.
    malleable: tuple[int, int] | None = None

    @property
    def cpus(self) -> int:
        return self.nodes * self.ppn


class JobOptions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How to run a job beyond what it asks for (qsub/sbatch options).

    Kept apart from :class:`JobRequest`, which the policies and the simulator
    see: none of these change where or when a job fits, only how the node runs
    it and what the server tells about it. Defaults are left out of the
    encoding: every job record carries its options, and most are unset.
    """

    #: ``-S``: run the script with this interpreter ("" = its ``#!`` line).
    shell: str = ""
    #: ``-F`` (Torque): arguments given to the script.
    script_args: list[str] = []
    #: ``-r y|n``, ``--requeue``/``--no-requeue``: may be rerun from the start.
    rerunnable: bool = True
    #: ``-k``: o/e keep that file in the home directory (Torque), d writes it
    #: directly (what minibatch always does).
    keep: str = ""
    #: The job's umask, for its processes and its output files: ``-W umask=``,
    #: else the submitter's (qsub and sbatch send it); None: the node daemon's.
    umask: int | None = None
    #: ``--open-mode=append``: append to existing output files.
    append: bool = False
    #: ``-a``/``--begin``: not eligible before this time (epoch seconds).
    begin: float | None = None
    #: ``-p`` (-1024..1023) / ``--nice`` (negated): orders jobs within a queue.
    priority: int = 0
    #: ``cput``: CPU-seconds of all its processes together (enforced like walltime).
    cput: int | None = None
    #: ``pmem``/``pvmem``: resident and virtual memory of any one process (KB);
    #: ``vmem``: virtual memory of each process (KB, enforced as RLIMIT_AS).
    pmem_kb: int | None = None
    vmem_kb: int | None = None
    #: ``--signal=[B:]SIG@SECS``: sent this long before the time limit.
    warn_signal: int = 0
    warn_seconds: int = 0
    #: ``B:`` in ``--signal``: only to the batch shell, not every process.
    warn_shell_only: bool = False
    #: ``-m``: a (abort) b (begin) e (end), "" = PBS's default (abort).
    mail_points: str = ""
    mail_users: list[str] = []
    #: Node properties (``nodes=2:xe``) and ``-C`` constraints, all required.
    features: list[str] = []
    #: Slurm tasks: how many, CPUs each, per node (0: not given).
    ntasks: int = 0
    cpus_per_task: int = 0
    tasks_per_node: int = 0
    #: Its CPUs may be spread over several nodes when no node has them all
    #: (Slurm's ``-n`` without ``-N``, Torque's ``procs=``).
    spread: bool = False
    #: Its memory was asked per node (sbatch ``--mem``): spread over more
    #: nodes, the job gets as much again on each.
    mem_per_node: bool = False
    #: ``%N`` in an array range: at most N of its tasks run at once.
    array_limit: int = 0
    #: ``-P`` (PBS Pro): the project; the accounting group when no ``-A``.
    project: str = ""
    #: ``-W group_list=``: the group the job runs as (one of the user's).
    group: str = ""
    #: Options with no effect here, by their PBS attribute or sbatch name, with
    #: the value given: shown by ``qstat -f`` so nothing asked for is hidden.
    recorded: dict[str, str] = {}
    #: Submitted with ``#SBATCH``/sbatch: Slurm's defaults and variables.
    slurm: bool = False


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A submission as the client sends it (identity is added by the server)."""

    name: str
    workdir: str
    request: JobRequest
    script: str | None = None
    argv: list[str] | None = None
    env: dict[str, str] = {}
    stdout_path: str | None = None
    stderr_path: str | None = None
    join: bool = False
    depends: list[Dependency] = []
    hold: bool = False
    array: list[int] | None = None
    submit_args: str = ""
    account: str = ""
    #: Quality of service by name (``qsub -l qos=NAME``); "" is the default QOS.
    qos: str = ""
    #: An advance reservation to run inside (``qsub -l advres=NAME``).
    advres: str = ""
    #: The queue (or Slurm partition) asked for; "" = the default queue.
    queue: str = ""
    options: JobOptions = JobOptions()
    #: False: no walltime was asked for, so the queue's default applies.
    walltime_given: bool = True
    #: The directive that named the queue (``job.sh line 3 (#PBS -q x)``), so
    #: that a refusal names it; "" for the command line.
    queue_source: str = ""


class Allocation(msgspec.Struct, frozen=True):
    node: str
    cpus: list[int]
    #: GPU ids on the node (``CUDA_VISIBLE_DEVICES``).
    gpus: list[int] = []


class ResizeEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a running job's CPUs, as the node applied it."""

    #: When the node applied it (the server's clock for one never applied).
    time: float
    node: str
    before: list[int]
    after: list[int]
    #: Why: ``qalter by alice``, ``sd: room for job 12``, ``job 12 ended``, ...
    cause: str = ""
    #: The job's resize number: 1 for its first, 2 for the next...
    seq: int = 0
    #: The job's time limit before it (restored if the node refuses it).
    limit: float = 0.0


class Job(msgspec.Struct, kw_only=True):
    """The server's record of one job (one array task is one job)."""

    id: int
    name: str
    user: str
    uid: int
    gid: int
    group: str
    workdir: str
    request: JobRequest
    submit_time: float
    state: JobState
    script: str | None = None
    argv: list[str] | None = None
    env: dict[str, str] = {}
    stdout_path: str = ""
    stderr_path: str = ""
    join: bool = False
    depends: list[Dependency] = []
    array_id: int | None = None
    array_index: int | None = None
    submit_args: str = ""
    result: JobResult | None = None
    exit_status: int | None = None
    signal: int | None = None
    alloc: list[Allocation] = []
    start_time: float | None = None
    end_time: float | None = None
    cputime_s: float | None = None
    maxrss_kb: int | None = None
    reason: str = ""
    predicted_start: float | None = None
    #: The start predicted by the first plan that saw it queued, set when it
    #: starts and kept (``jobs.csv``'s ``predicted_start``); the time it was
    #: queued if that very plan started it (``PendingQueue.planned_start``).
    first_predicted_start: float | None = None
    comment: str = ""
    account: str = ""
    qos: str = ""
    advres: str = ""
    #: Eligible time (PBS ``eligible_time``): seconds spent queued (not held,
    #: dependencies met) before the current queued period, and when that period
    #: began (None while the job is not queued).
    eligible_s: float = 0.0
    queued_since: float | None = None
    #: The top process's pid, which leads the job's session (PBS ``session_id``).
    session_id: int | None = None
    #: Every resize applied to the running job, oldest first (accounting
    #: integrates the allocation over them).
    resizes: list[ResizeEvent] = []
    #: Resizes sent to the node and not yet acknowledged, in the order sent
    #: (``time`` is when the server sent each), and the last number given.
    resizing: list[ResizeEvent] = []
    resize_seq: int = 0
    #: Seconds from the start the job may run: its requested walltime, stretched
    #: while it runs on fewer CPUs than it asked for (0: the requested walltime).
    time_limit: float = 0.0
    #: A job started on CPUs taken from running malleable jobs (SD-Policy's
    #: guest): mate job id -> CPUs it gave; they get them back when this ends.
    borrowed: dict[int, int] = {}
    queue: str = ""
    options: JobOptions = JobOptions()
    #: How often it was requeued (``qrerun``, a node lost) before this run.
    reruns: int = 0
    #: ``qrerun`` killed it: its end report requeues it (survives a restart).
    rerun_pending: bool = False
    #: While it runs: CPU seconds and resident KB of all its processes, as the
    #: node last sampled them (heartbeats; kept in memory, not stored at each).
    used_cputime_s: float | None = None
    used_rss_kb: int | None = None

    @property
    def display_id(self) -> str:
        if self.array_id is None:
            return str(self.id)
        return f"{self.array_id}[{self.array_index}]"


def limit_of(job: Job) -> float:
    """Seconds from its start the job may run (its walltime, as stretched)."""
    return job.time_limit or float(job.request.walltime)


def allocated_cpu_seconds(job: Job, now: float) -> float:
    """CPU-seconds the job held: its allocation integrated over its run, resizes
    included (what accounting charges; CPUTime in ``mb acct``). A resized job
    runs on one node, the only one it holds."""
    if job.start_time is None:
        return 0.0
    end = job.end_time if job.end_time is not None else now
    if not job.resizes:
        return sum(len(a.cpus) for a in job.alloc) * max(0.0, end - job.start_time)
    total, since, held = 0.0, job.start_time, len(job.resizes[0].before)
    for event in job.resizes:
        at = min(max(event.time, since), end)
        total += held * (at - since)
        since, held = at, len(event.after)
    return total + held * max(0.0, end - since)


def eligible_since(job: Job) -> float | None:
    """The instant from which the job's eligible time counts, so that its eligible
    time is ``now - eligible_since`` (None while it is not queued)."""
    if job.queued_since is None:
        return None
    return job.queued_since - job.eligible_s


def eligible_time(job: Job, now: float) -> float:
    """Seconds the job has been eligible to run, held and waiting time excluded."""
    since = eligible_since(job)
    return job.eligible_s if since is None else max(0.0, now - since)


def transition(job: Job, to: JobState) -> str:
    """Move ``job`` to ``to`` and return the name of the event, or raise."""
    event = TRANSITIONS.get((job.state, to))
    if event is None:
        raise InvalidTransition(
            f"job {job.display_id} is {job.state}; it cannot become {to}"
        )
    job.state = to
    return event
