"""The policy's whole world: an immutable snapshot of the cluster, and its answer.

A policy reads a :class:`ClusterSnapshot` and returns a :class:`Plan`. The server (live)
and the simulator build snapshots the same way, so a policy cannot tell them apart.
Policies see requested walltimes only, never real run times.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
from collections.abc import Sequence

import msgspec

from minibatch.core.job import JobRequest


class NodeView(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A node that can take work. Down and offline nodes are left out."""

    name: str
    cpus: int
    free_cpus: int
    mem_kb: int | None = None
    free_mem_kb: int | None = None
    gpus: int = 0
    free_gpus: int = 0
    #: Properties jobs may ask for (``nodes=1:bigmem``, ``-C bigmem``).
    features: tuple[str, ...] = ()


class RunningView(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A running job: where it is and when it is expected to end at the latest."""

    id: int
    user: str
    nodes: tuple[tuple[str, int], ...]
    mem_kb_per_node: int | None
    start_time: float
    walltime: float
    gpus_per_node: int = 0
    #: The advance reservation the job runs inside, if any.
    advres: str = ""
    group: str = ""
    account: str = ""
    qos: str = ""
    #: Malleable jobs: the fewest and most CPUs per node (None: rigid); for
    #: every job the CPUs per node asked for, when it was submitted and the
    #: walltime it asked for (``walltime`` is that limit as stretched by resizes).
    malleable: tuple[int, int] | None = None
    ppn: int = 0
    submit_time: float = 0.0
    req_walltime: float = 0.0

    def expected_end(self, now: float) -> float:
        """Start + requested time; a job past it is treated as ending now."""
        return max(self.start_time + self.walltime, now)


class PendingView(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """An eligible pending job (not held, no unmet dependency), in priority order."""

    id: int
    user: str
    group: str
    request: JobRequest
    submit_time: float
    priority: float = 0.0
    account: str = ""
    qos: str = ""
    #: The advance reservation the job must run inside ("" = none).
    advres: str = ""
    #: Its eligible time is ``now - eligible_since`` (held time excluded);
    #: None: count from ``submit_time`` (the simulator's jobs are never held).
    eligible_since: float | None = None
    #: The job's queue (Maui's class), that queue's priority, and the job's
    #: own (``qsub -p``): the queue orders jobs by them before submission time.
    queue: str = ""
    queue_priority: float = 0.0
    user_priority: int = 0
    #: Node features it needs, every one on each of its nodes.
    features: tuple[str, ...] = ()

    @property
    def rank(self) -> tuple[float, int, float, int]:
        """PBS order: queue priority, then job priority (both highest first),
        then submission time and id."""
        return (-self.queue_priority, -self.user_priority, self.submit_time, self.id)

    @property
    def eligible_from(self) -> float:
        return self.submit_time if self.eligible_since is None else self.eligible_since


class ReservationView(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """An advance reservation: CPUs held on nodes from ``start`` to ``end``.

    Only ``users`` may run inside it (jobs submitted with ``advres=name``); an
    empty ``users`` is a downtime reservation that no job may use. Every policy
    must keep other jobs off these CPUs during the window.
    """

    name: str
    start: float
    end: float
    nodes: tuple[tuple[str, int], ...]
    users: tuple[str, ...] = ()


class FairshareView(msgspec.Struct, frozen=True, kw_only=True):
    """Decayed past usage, computed by the resource manager from accounting.

    Values are in the unit of ``FSPOLICY`` (dedicated CPU-seconds by default),
    already weighted over the ``FSDEPTH`` windows of ``FSINTERVAL`` by ``FSDECAY``.
    """

    users: dict[str, float] = {}
    groups: dict[str, float] = {}
    accounts: dict[str, float] = {}


class QosView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    priority: float = 0.0
    max_walltime: float | None = None
    max_jobs_per_user: int | None = None


class ClusterSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy plans from.

    ``running`` and ``pending`` are read-only sequences: the server builds tuples
    (they arrive as lists after the wire), the simulator passes views of its own
    queue so that a pass never copies it. A policy only reads them, during the call.
    """

    now: float
    generation: int
    nodes: tuple[NodeView, ...]
    running: Sequence[RunningView]
    pending: Sequence[PendingView]
    reservations: tuple[ReservationView, ...] = ()
    fairshare: FairshareView = FairshareView()
    #: PSP: each user's latest finished jobs' accuracy (run time / requested
    #: time), oldest first, at most 10.
    accuracy: dict[str, tuple[float, ...]] = {}
    qos: dict[str, QosView] = {}
    #: How many jobs the plan should name as ``upcoming`` (0: none; the
    #: simulator plans every instant and has no use for them).
    upcoming: int = 0
    #: The jobs of ``running`` again, in order of ``start_time + walltime``
    #: (ties in any order), or None. A derived index the simulator keeps as
    #: jobs start and end, so that a policy finds what ends first without
    #: sorting them all; a policy must plan the same without it.
    running_by_end: Sequence[RunningView] | None = None
    #: Whether the plan must say why jobs wait (``Plan.reasons`` and
    #: ``default_reason``). False lets a policy leave them empty: the
    #: simulator keeps no reasons and asks for none.
    reasons: bool = True


class Start(msgspec.Struct, frozen=True):
    """Start ``job`` on the named nodes (the server picks CPU ids): its requested
    CPUs on each, or ``ppn`` of them (a malleable job, within its range)."""

    job: int
    nodes: tuple[str, ...]
    ppn: int = 0


class Resize(msgspec.Struct, frozen=True):
    """Give running malleable job ``job`` ``cpus`` CPUs on its node (the server
    picks which: a shrink keeps the lowest ids, a growth takes free ones).

    ``guest``: the pending job these CPUs are taken for (0: none). The guest's
    start and all its resizes stand or fall together; the CPUs go back to this
    job when the guest ends.
    """

    job: int
    cpus: int
    guest: int = 0


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    generation: int
    starts: list[Start] = []
    #: Running malleable jobs to shrink or expand, applied before ``starts``.
    resizes: list[Resize] = []
    #: Why a pending job does not start, in words a person understands.
    reasons: dict[int, str] = {}
    #: The reason of every pending job not in ``reasons`` (lets a pass stop early).
    default_reason: str = ""
    #: Predicted start times, where the policy can tell.
    predicted: dict[int, float] = {}
    #: Jobs the policy would start next, in this order, each as soon as it fits:
    #: the head of its priority order, less what this plan starts. Until the next
    #: plan the server starts them itself when a job ends (stopping at the first
    #: that does not fit), without waiting for a pass; see docs/architecture.md.
    upcoming: list[int] = []
    #: The policy's order is submission order (the snapshot's): a job queued
    #: after this plan precedes an upcoming job exactly when its (submit time,
    #: id) is smaller. False (the safe default): any such job stops the server's
    #: shortcut until the next plan. A policy that reorders the queue (or wraps
    #: one that does not, handing it a reordered snapshot) must leave it False.
    upcoming_by_submission: bool = False
    #: Starts made while a job ahead of them holds a reservation (backfills):
    #: reported in the scheduler's pass event, never used to decide anything.
    backfilled: list[int] = []
