"""Every message any two minibatch processes exchange.

Each message is a frozen msgspec Struct with a tag (the ``type`` field on the
wire), so a frame decodes straight to the right class and is validated on the way.
Requests get exactly one reply: the reply named in the request's docstring, or
:class:`Error`. Adding an optional field with a default is compatible; renaming or
removing one bumps ``PROTOCOL_VERSION``.

Roles: *clients* (the commands) send the client requests; the *scheduler* sends
``SchedHello``, ``GetSnapshot`` and ``ApplyPlan`` and receives ``Wake`` (those are
in :mod:`minibatch.protocol.scheduling`, and in :data:`Message`); a *node*
sends ``NodeHello``, ``Heartbeat``, ``JobStarted``, ``JobResized`` and
``JobEnded`` and receives ``Launch``, ``ResizeJob``, ``Kill`` and ``Signal``.
"""

# No ``from __future__ import annotations`` here: see minibatch.protocol.base.

from typing import Any

import msgspec

from minibatch.core.job import Job, JobOptions, JobResult
from minibatch.core.reservation import Reservation
from minibatch.core.snapshot import ClusterSnapshot

# Ok, Error, Submit and Submitted live apart so that a command need not import
# this module (see minibatch.protocol.submit); they are messages as the rest.
from minibatch.protocol.base import Error as Error
from minibatch.protocol.base import Msg
from minibatch.protocol.base import Ok as Ok
from minibatch.protocol.scheduling import (
    ApplyPlan,
    GetSnapshot,
    PlanResult,
    SchedHello,
    SnapshotReply,
    Wake,
)
from minibatch.protocol.submit import Submit as Submit
from minibatch.protocol.submit import Submitted as Submitted

# --------------------------------------------------------- client requests


class Status(Msg, frozen=True, kw_only=True, tag="status"):
    """-> ServerStatus"""


class ServerStatus(Msg, frozen=True, kw_only=True, tag="server_status"):
    pid: int
    endpoint: str
    mqtt_url: str
    policy: str
    nodes: dict[str, str]
    scheduler_pid: int | None
    jobs: dict[str, int]
    #: MQTT events: sent, pending (buffered), dropped (past the buffer's
    #: bound while the broker was away), connected (1 or 0).
    events: dict[str, int] = {}


class QueryJobs(Msg, frozen=True, kw_only=True, tag="query_jobs"):
    """-> JobList. Selectors are ``7``, ``7[]`` (a whole array) or ``7[2]``."""

    selectors: list[str] = []
    user: str | None = None
    finished: bool = False
    active: bool = True
    since: float | None = None
    #: Only what a bare ``qstat`` prints (the reply is then :class:`JobRows`),
    #: when no ids are named and no finished jobs asked for: 100,000 jobs are
    #: then a few MB, not 60. With ``alt``, what ``qstat -a`` prints (also of
    #: one ``user``).
    rows: bool = False
    alt: bool = False


class JobRows(Msg, frozen=True, kw_only=True, tag="job_rows"):
    """A bare ``qstat``'s table: msgpack of a list of ``[id, name, user, time
    use, state letter, queue]`` (:data:`ROW`; ``qstat -a``'s: :data:`ALT_ROW`),
    arrays summed up, in id order. Raw, so the server encodes it once per
    change of the jobs and the client decodes it with the row type."""

    rows: msgspec.Raw


#: One row of a bare ``qstat``, and the type of :attr:`JobRows.rows`.
Row = tuple[str, str, str, str, str, str]
ROW = list[Row]
#: ... when asked with ``alt``: ten cells of ``qstat -a``, then the start and
#: end time its elapsed time is computed from.
AltRow = tuple[
    str, str, str, str, str, str, str, str, str, str, float | None, float | None
]
ALT_ROW = list[AltRow]


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """One job id a per-id request did not act on: the error it would have got."""

    selector: str
    code: int
    message: str


class JobList(Msg, frozen=True, kw_only=True, tag="job_list"):
    jobs: list[Job]
    #: Requests that act on each id on its own (PBS's qdel 13 14): the ids
    #: refused, while ``jobs`` are those acted on.
    refused: list[Refusal] = []


class JobControl(Msg, frozen=True, kw_only=True, tag="job_control"):
    """-> JobList of the jobs changed. ``action``: cancel, hold or release."""

    action: str
    selectors: list[str]
    #: False: every id is checked first and one refusal refuses them all.
    #: True: each id on its own, as PBS does; refusals come back in the reply.
    each: bool = False


class Alter(Msg, frozen=True, kw_only=True, tag="alter"):
    """-> JobList. ``qalter`` of a pending job; of a running malleable job,
    ``ncpus`` resizes it (its owner within its range, or an operator)."""

    selector: str
    name: str | None = None
    walltime: int | None = None
    ncpus: int | None = None


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: str
    cpus: list[int]
    free_cpus: list[int]
    mem_kb: int | None
    jobs: dict[int, list[int]]
    shared_cpus: list[int] = []
    comment: str = ""
    last_heartbeat: float | None = None
    pid: int | None = None
    features: list[str] = []
    gpus: int = 0
    enforcement: str = ""
    #: CPU id -> real core, for virtual CPUs (see ``NodeHello.real_cpus``).
    real_cpus: dict[int, int] = {}


class QueryNodes(Msg, frozen=True, kw_only=True, tag="query_nodes"):
    """-> NodeList"""

    names: list[str] = []


class NodeList(Msg, frozen=True, kw_only=True, tag="node_list"):
    nodes: list[NodeInfo]


class SetNodeOffline(Msg, frozen=True, kw_only=True, tag="set_node_offline"):
    """-> NodeList. ``pbsnodes -o`` / ``-c``; operators only."""

    names: list[str]
    offline: bool
    comment: str = ""


# The requests below act on each id on its own: JobList.refused says which
# were refused and why, the others are done.


class SignalJob(Msg, frozen=True, kw_only=True, tag="signal_job"):
    """-> JobList. ``qsig``: send ``signal`` (a name or number) to every process
    of each running job; its owner or an operator."""

    selectors: list[str]
    signal: str = "SIGTERM"


class Rerun(Msg, frozen=True, kw_only=True, tag="rerun"):
    """-> JobList. ``qrerun``; operators only: kill each running job and queue
    it again under the same id (refused for a job submitted with ``-r n``)."""

    selectors: list[str]


class MoveJob(Msg, frozen=True, kw_only=True, tag="move_job"):
    """-> JobList. ``qmove``: pending jobs go to ``queue`` (its limits and
    users apply); their owner or an operator."""

    queue: str
    selectors: list[str]


class QueryQueues(Msg, frozen=True, kw_only=True, tag="query_queues"):
    """-> QueueList. ``qstat -Q``/``-q``; no names means all."""

    names: list[str] = []


class QueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    priority: float
    enabled: bool
    started: bool
    #: Where jobs go that name no queue.
    default: bool = False
    #: Seconds; None: no default or no limit.
    default_walltime: int | None = None
    max_walltime: int | None = None
    max_cpus: int | None = None
    users: list[str] = []
    #: Jobs in it now, by state (``queued held waiting running exiting``).
    jobs: dict[str, int] = {}


class QueueList(Msg, frozen=True, kw_only=True, tag="queue_list"):
    queues: list[QueueInfo]


class TraceJob(Msg, frozen=True, kw_only=True, tag="trace_job"):
    """-> JobTrace. ``tracejob``: each job's event log, finished jobs too."""

    selector: str


class TraceEvent(msgspec.Struct, frozen=True, kw_only=True):
    job: int
    time: float
    event: str
    detail: str = ""


class JobTrace(Msg, frozen=True, kw_only=True, tag="job_trace"):
    jobs: list[Job]
    #: Oldest first, job by job.
    events: list[TraceEvent]


# ------------------------------------------------- reservations and policy


class SetReservation(Msg, frozen=True, kw_only=True, tag="set_reservation"):
    """-> ReservationList (the new one). ``setres``; operators only.

    Exactly one of ``nodes`` (whole nodes by name), ``node_count`` (that many
    whole nodes) and ``cpus`` (that many CPUs) says what to hold. No ``users``
    makes a downtime reservation. ``name`` "" lets the server name it.
    """

    start: float
    duration: float
    users: list[str] = []
    nodes: list[str] = []
    node_count: int = 0
    cpus: int = 0
    name: str = ""
    comment: str = ""


class QueryReservations(Msg, frozen=True, kw_only=True, tag="query_reservations"):
    """-> ReservationList. ``showres``; no names means all."""

    names: list[str] = []


class ReleaseReservation(Msg, frozen=True, kw_only=True, tag="release_reservation"):
    """-> ReservationList (the released ones). ``releaseres``; operators only."""

    names: list[str]


class ReservationList(Msg, frozen=True, kw_only=True, tag="reservation_list"):
    reservations: list[Reservation]
    #: The server's clock when it answered.
    now: float = 0.0
    #: ``releaseres``: pending jobs cancelled because their reservation went away.
    cancelled: list[int] = []


class SetPolicy(Msg, frozen=True, kw_only=True, tag="set_policy"):
    """-> PolicyInfo. ``mb policy set``; operators only. Applies from the next pass."""

    name: str
    params: dict[str, Any] = {}


class GetPolicy(Msg, frozen=True, kw_only=True, tag="get_policy"):
    """-> PolicyInfo"""


class PolicyInfo(Msg, frozen=True, kw_only=True, tag="policy_info"):
    name: str
    params: dict[str, Any]
    #: When and by whom it was set ("" and 0: the configuration's default).
    set_by: str = ""
    since: float = 0.0
    #: What the registered scheduler last said it runs.
    scheduler_policy: str = ""
    #: Why the scheduler does not run ``name`` ("" when it does or may yet).
    scheduler_refused: str = ""
    available: list[str] = []


class Diagnose(Msg, frozen=True, kw_only=True, tag="diagnose"):
    """-> DiagnoseReply: what ``showq``, ``checkjob`` and ``diagnose`` compute from."""

    #: The jobs too (``checkjob`` asks for its job on its own, and ranks from
    #: the snapshot alone).
    jobs: bool = True


class DiagnoseReply(Msg, frozen=True, kw_only=True, tag="diagnose_reply"):
    snapshot: ClusterSnapshot
    policy: str
    params: dict[str, Any]
    #: Every job not finished, with its reason and predicted start (none
    #: when :attr:`Diagnose.jobs` is false).
    jobs: list[Job]
    #: The ``[fairshare]`` settings: interval, depth, decay, policy.
    fairshare: dict[str, Any] = {}


# ------------------------------------------------------------------ nodes


class NodeHello(Msg, frozen=True, kw_only=True, tag="node_hello"):
    """-> Ok. A node daemon (re)registers; ``running`` lists jobs it still runs."""

    name: str
    cpus: list[int]
    mem_kb: int | None
    pid: int
    shared_cpus: list[int] = []
    running: list[int] = []
    #: How the node enforces CPUs and memory ("cgroup v1", or why it cannot).
    enforcement: str = ""
    #: CPU id -> the real core that runs it, when the node's CPUs are virtual
    #: (``mb up --oversubscribe``); empty when each id is its own core.
    real_cpus: dict[int, int] = {}
    #: It runs a job of several nodes with the cores ``LaunchSpec.other_cores``
    #: names (an older node does not: it is sent none).
    lends: bool = False


class JobUsage(msgspec.Struct, frozen=True, array_like=True):
    """What a running job's processes use now, as the node sampled it."""

    job: int
    cputime_s: float
    rss_kb: int


class Heartbeat(Msg, frozen=True, kw_only=True, tag="heartbeat"):
    """-> Ok"""

    name: str
    running: list[int]
    #: The running jobs' usage (live ``resources_used`` in ``qstat``).
    usage: list[JobUsage] = []
    #: The daemon is stopping: start nothing more here.
    stopping: bool = False
    #: Why the node can start no job now (its spool is full), or "".
    trouble: str = ""


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    job: int
    display_id: str
    name: str
    user: str
    uid: int
    gid: int
    workdir: str
    script: str | None
    argv: list[str] | None
    env: dict[str, str]
    stdout_path: str
    stderr_path: str
    join: bool
    cpus: list[int]
    hosts: list[str]
    walltime: int
    #: The memory the job holds here: that of every node in ``other_cores``
    #: too (a job spanning hosts: this node's alone).
    mem_kb: int | None
    array_id: int | None = None
    array_index: int | None = None
    #: Its CPUs may change while it runs: it gets ``$MB_CPUSET_FILE``.
    malleable: bool = False
    #: How to run it (shell, umask, limits beyond memory, ...), where it was
    #: queued and charged, its GPU ids, and how often it ran before.
    options: JobOptions = JobOptions()
    queue: str = ""
    account: str = ""
    gpus: list[int] = []
    reruns: int = 0
    #: The real cores of the job's CPUs on its other nodes, when they all run
    #: on this machine: a job on several nodes runs with all of them here.
    other_cores: list[int] = []


class Launch(Msg, frozen=True, kw_only=True, tag="launch"):
    """Server -> node. No reply: the node answers with JobStarted or JobEnded."""

    spec: LaunchSpec


class ResizeJob(Msg, frozen=True, kw_only=True, tag="resize_job"):
    """Server -> node: confine the job to ``cpus`` (node CPU ids) and let it run
    for ``time_limit`` seconds from its start. No reply: the node answers with
    ``JobResized``."""

    job: int
    cpus: list[int]
    time_limit: float
    #: The job's resize number (1, 2, ...), echoed by ``JobResized``.
    seq: int = 0


class JobResized(Msg, frozen=True, kw_only=True, tag="job_resized"):
    """-> Ok. The node applied a ``ResizeJob`` (``error`` ""), or could not:
    ``cpus`` are the node CPU ids the job is confined to now. Re-sent until
    acknowledged; a repeat is a no-op."""

    job: int
    cpus: list[int]
    time: float
    error: str = ""
    #: The ``seq`` of the ``ResizeJob`` answered: it and every earlier one of
    #: the job are applied (the node reports only its latest).
    seq: int = 0


class Kill(Msg, frozen=True, kw_only=True, tag="kill"):
    """Server -> node: end the job's whole process tree. No reply."""

    job: int
    result: JobResult


class Signal(Msg, frozen=True, kw_only=True, tag="signal"):
    """Server -> node: send ``signal`` to every process of the job. No reply."""

    job: int
    signal: int


class JobStarted(Msg, frozen=True, kw_only=True, tag="job_started"):
    """No reply: a notification of the process's pid and real start time."""

    job: int
    pid: int
    time: float


class JobEnded(Msg, frozen=True, kw_only=True, tag="job_ended"):
    """-> Ok. Re-sent until acknowledged, so the server treats repeats as no-ops."""

    job: int
    result: JobResult
    exit_status: int | None
    signal: int | None
    end_time: float
    cputime_s: float
    maxrss_kb: int
    comment: str = ""
    #: The run it reports (``LaunchSpec.reruns``): a late report of a run
    #: ``qrerun`` ended must not end the next one.
    reruns: int = 0
    #: Ended by its node stopping, not by itself: the server queues it again
    #: (when it never started, or is rerunnable).
    requeue: bool = False


Message = (
    Ok
    | Error
    | Status
    | ServerStatus
    | Submit
    | Submitted
    | QueryJobs
    | JobList
    | JobRows
    | JobControl
    | Alter
    | QueryNodes
    | NodeList
    | SetNodeOffline
    | SignalJob
    | Rerun
    | MoveJob
    | QueryQueues
    | QueueList
    | TraceJob
    | JobTrace
    | SetReservation
    | QueryReservations
    | ReleaseReservation
    | ReservationList
    | SetPolicy
    | GetPolicy
    | PolicyInfo
    | Diagnose
    | DiagnoseReply
    | SchedHello
    | Wake
    | GetSnapshot
    | SnapshotReply
    | ApplyPlan
    | PlanResult
    | NodeHello
    | Heartbeat
    | Launch
    | Kill
    | Signal
    | ResizeJob
    | JobResized
    | JobStarted
    | JobEnded
)


class Envelope(msgspec.Struct, frozen=True, array_like=True):
    """A message as sent: ``{v, id, re, body}`` (:mod:`minibatch.protocol.codec`)."""

    v: int
    id: int
    re: int
    body: Message
