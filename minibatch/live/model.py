"""A live cluster as the event stream tells it: what ``mb top`` and ``mb web`` draw.

Pure: the caller feeds it the server's replies (:meth:`LiveCluster.load`) and
the MQTT events (:meth:`LiveCluster.apply`), and passes the time in, so every
case can be tested without a cluster. :mod:`minibatch.live.feed` does the IO.

Jobs and nodes change by event, within milliseconds. What only the scheduler
knows (the priority order, each waiting job's reason and predicted start) comes
with :meth:`LiveCluster.load`, which the feed calls again after scheduling passes,
at most about once a second: a view never polls job by job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from minibatch.core.job import Job, JobState
from minibatch.core.reservation import Reservation
from minibatch.protocol.messages import NodeInfo

#: Job states a job leaves only by ending (its CPUs are held meanwhile).
_ACTIVE = frozenset({JobState.RUNNING.value, JobState.EXITING.value})
_DONE = JobState.FINISHED.value
#: Node states whose CPUs take no jobs (not counted in utilization).
_UNUSABLE = frozenset({"down", "offline"})
#: Reservation events after which the reservation is gone.
_RESV_GONE = frozenset({"ended", "released", "deleted", "cancelled"})


class LiveJob(msgspec.Struct, kw_only=True):
    """A job as a live view shows it (its display id, e.g. ``7`` or ``7[2]``)."""

    id: str
    name: str
    user: str
    state: str
    ncpus: int = 1
    walltime: float = 0.0
    queue: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    #: CPU ids by node while it runs (and what it ran on, once ended).
    alloc: dict[str, list[int]] = {}
    result: str | None = None
    exit_status: int | None = None
    reason: str = ""
    predicted_start: float | None = None
    #: Position in the policy's priority order (0 first); waiting jobs only.
    rank: int | None = None


class LiveNode(msgspec.Struct, kw_only=True):
    name: str
    state: str
    cpus: list[int] = []
    comment: str = ""


class SchedPass(msgspec.Struct, kw_only=True):
    """One scheduling pass (``sched/pass``)."""

    time: float
    policy: str = ""
    duration_ms: float = 0.0
    pending: int = 0
    started: int = 0
    backfilled: int = 0
    reserved: int = 0


class LogLine(msgspec.Struct, frozen=True):
    time: float
    kind: str
    text: str


def _cpu_list(cpus: Iterable[int]) -> str:
    from minibatch.core.units import format_cpu_list

    return format_cpu_list(sorted(cpus))


def describe(topic: str, payload: Mapping[str, Any]) -> tuple[str, str]:
    """An event as ``(kind, line)``: kind is ``job``, ``node``, ``sched`` or
    ``resv``; the line reads like a log (``mb watch`` prints it).

    Args:
        topic: The topic below the prefix, e.g. ``jobs/7/started``.
        payload: The event's JSON.
    """
    parts = topic.split("/")
    if parts[0] == "jobs" and len(parts) == 3:
        return "job", _describe_job(parts[2], payload)
    if parts[0] == "nodes" and len(parts) == 3:
        state = payload.get("state", "?")
        return "node", f"node {payload.get('name', parts[1])} is {state}"
    if topic == "sched/pass":
        return "sched", _describe_pass(payload)
    if topic == "sched/policy":
        by = f" by {payload['set_by']}" if payload.get("set_by") else ""
        params = payload.get("params") or {}
        shown = " " + " ".join(f"{k}={v}" for k, v in params.items()) if params else ""
        return "sched", f"policy {payload.get('name', '?')}{shown}{by}"
    if parts[0] == "reservations" and len(parts) == 3:
        nodes = payload.get("nodes") or {}
        where = ", ".join(f"{n}:{_cpu_list(c)}" for n, c in nodes.items())
        return "resv", f"reservation {parts[1]} {parts[2]} ({where or 'no CPUs'})"
    return "other", f"{topic} {dict(payload)}"


def _describe_job(event: str, p: Mapping[str, Any]) -> str:
    who = f"job {p.get('id', '?')} ({p.get('name', '')}, {p.get('user', '')})"
    said = p.get("detail")
    detail = f": {said}" if said and said != p.get("result") else ""
    alloc = p.get("alloc") or {}
    where = " ".join(f"{n}:{_cpu_list(c)}" for n, c in alloc.items())
    if event == "submitted":
        ncpus = p.get("ncpus", 1)
        return f"{who} submitted, {ncpus} CPU{'s' if ncpus != 1 else ''}{detail}"
    if event in ("started", "resized"):
        return f"{who} {event} on {where}"  # the detail says the same
    if event == "finished":
        status = p.get("exit_status")
        code = f", exit {status}" if status is not None else ""
        return f"{who} finished, {p.get('result')}{code}{detail}"
    return f"{who} {event}{detail}"


def _describe_pass(p: Mapping[str, Any]) -> str:
    text = f"pass {p.get('policy', '?')}: {p.get('started', 0)} started"
    if p.get("backfilled"):
        text += f" ({p['backfilled']} backfilled)"
    text += f", {p.get('reserved', 0)} reserved, {p.get('pending', 0)} pending"
    return text + f", {float(p.get('duration_ms', 0.0)):.1f} ms"


def _from_job(job: Job) -> LiveJob:
    return LiveJob(
        id=job.display_id,
        name=job.name,
        user=job.user,
        state=job.state.value,
        ncpus=job.request.cpus,
        walltime=float(job.request.walltime),
        queue=job.queue,
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=job.end_time,
        alloc={a.node: list(a.cpus) for a in job.alloc},
        result=job.result.value if job.result else None,
        exit_status=job.exit_status,
        reason=job.reason,
        predicted_start=job.predicted_start,
    )


class LiveCluster:
    """The cluster a live view shows, kept current by events.

    Args:
        history: Seconds of the past kept: ended jobs (the Gantt chart's left
            side) and utilization samples.
        log_size: Event lines kept for the log pane.
    """

    def __init__(self, history: float = 600.0, log_size: int = 500) -> None:
        self.history = history
        self.jobs: dict[str, LiveJob] = {}
        self.nodes: dict[str, LiveNode] = {}
        self.reservations: dict[str, dict[str, Any]] = {}
        self.policy = ""
        self.params: dict[str, Any] = {}
        self.passes: deque[SchedPass] = deque(maxlen=100)
        self.log: deque[LogLine] = deque(maxlen=log_size)
        #: ``(time, busy CPUs, CPUs of nodes that take jobs)``.
        self.samples: deque[tuple[float, int, int]] = deque()
        #: Something happened that only the server can fill in (a node that
        #: registered, a pass that moved predictions): the feed loads again.
        self.stale = False
        #: Bumped by every change, so a view redraws only when it moved.
        self.version = 0
        #: When each job's shown state was true: events older than that are
        #: already in it (they arrived while a load was on its way).
        self._seen: dict[str, float] = {}
        self._loaded_at = 0.0
        #: The same for reservations, by name (see :meth:`load_reservations`).
        self._resv_seen: dict[str, float] = {}

    # ---------------------------------------------------------------- input

    def load(
        self,
        jobs: Iterable[Job],
        nodes: Iterable[NodeInfo],
        at: float,
        order: Iterable[int] = (),
        policy: str = "",
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Take the server's word: every job not finished, every node, and the
        policy's priority order of the waiting jobs (ids), as asked at ``at``."""
        ranks = {job_id: i for i, job_id in enumerate(order)}
        fresh = {}
        for job in jobs:
            live = _from_job(job)
            live.rank = ranks.get(job.id)
            fresh[live.id] = live
            self._seen[live.id] = at
        self._loaded_at = at
        # Ended jobs stay for the chart: the server lists only active ones.
        for key, old in self.jobs.items():
            if old.state == _DONE and key not in fresh:
                fresh[key] = old
        self.jobs = fresh
        self.nodes = {
            n.name: LiveNode(
                name=n.name, state=n.state, cpus=list(n.cpus), comment=n.comment
            )
            for n in nodes
        }
        if policy:
            self.policy, self.params = policy, dict(params or {})
        self.stale = False
        self.version += 1

    def load_reservations(self, reservations: Iterable[Reservation], at: float) -> None:
        """Take the server's word on the reservations, as asked at ``at`` (a
        view started after ``setres`` shows them too: events say only what
        changes). One an event told of since ``at`` stays as that event left it."""
        fresh = {
            r.name: {
                "name": r.name, "type": r.kind, "start": r.start, "end": r.end,
                "users": list(r.users), "owner": r.owner,
                "nodes": {a.node: list(a.cpus) for a in r.alloc},
            }
            for r in reservations
        }  # fmt: skip
        for name, when in self._resv_seen.items():
            if when > at:
                if name in self.reservations:
                    fresh[name] = self.reservations[name]
                else:
                    fresh.pop(name, None)
        self._resv_seen = {n: w for n, w in self._resv_seen.items() if w > at}
        self.reservations = fresh
        self.version += 1

    def apply(self, topic: str, payload: Mapping[str, Any], now: float) -> str:
        """Apply one event (topic below the prefix); returns its kind (see
        :func:`describe`) and logs it."""
        kind, line = describe(topic, payload)
        parts = topic.split("/")
        if kind == "job":
            self._job_event(payload)
        elif kind == "node":
            self._node_event(parts[1], payload)
        elif topic == "sched/pass":
            self.passes.append(msgspec.convert(payload, SchedPass, strict=False))
            self.stale = True
        elif topic == "sched/policy":
            self.policy = str(payload.get("name", ""))
            self.params = dict(payload.get("params") or {})
        elif kind == "resv":
            self._resv_seen[parts[1]] = float(payload.get("time", now))
            if parts[2] in _RESV_GONE:
                self.reservations.pop(parts[1], None)
            else:
                self.reservations[parts[1]] = dict(payload)
        self.log.append(LogLine(float(payload.get("time", now)), kind, line))
        self.version += 1
        return kind

    def _job_event(self, p: Mapping[str, Any]) -> None:
        key = str(p.get("id", ""))
        when = float(p.get("time", 0.0))
        job = self.jobs.get(key)
        if when < self._seen.get(key, 0.0):
            return  # the last load already showed this or later
        if job is None and when < self._loaded_at and p.get("state") != _DONE:
            return  # not in the load, so it has ended since: its end will come
        self._seen[key] = when
        if job is None:
            job = self.jobs[key] = LiveJob(
                id=key, name=str(p.get("name", "")), user=str(p.get("user", "")),
                state=str(p.get("state", "")),
            )  # fmt: skip
        job.state = str(p.get("state", job.state))
        job.result, job.exit_status = p.get("result"), p.get("exit_status")
        for field in ("ncpus", "queue", "submit_time", "start_time", "end_time"):
            if field in p:
                setattr(job, field, p[field])
        if "walltime" in p:
            job.walltime = float(p["walltime"])
        if "alloc" in p:
            job.alloc = {n: list(c) for n, c in p["alloc"].items()}
        if job.state in _ACTIVE or job.state == _DONE:
            job.rank, job.reason, job.predicted_start = None, "", None
        elif p.get("event") == "submitted":
            self.stale = True  # its place in the order is the policy's to say

    def _node_event(self, name: str, p: Mapping[str, Any]) -> None:
        node = self.nodes.get(name)
        if node is None:  # registered since the last load: its CPUs are unknown
            self.nodes[name] = LiveNode(name=name, state=str(p.get("state", "")))
            self.stale = True
        else:
            node.state = str(p.get("state", node.state))

    # --------------------------------------------------------------- output

    def sample(self, now: float) -> None:
        """Record utilization now and forget what is older than the history
        (nothing before the first load: no nodes is not an idle cluster)."""
        if not self.nodes:
            return
        usable = [n for n in self.nodes.values() if n.state not in _UNUSABLE]
        total = sum(len(n.cpus) for n in usable)
        self.samples.append((now, min(self.busy_cpus(), total), total))
        while self.samples and self.samples[0][0] < now - self.history:
            self.samples.popleft()
        horizon = now - self.history
        for key in [
            k
            for k, j in self.jobs.items()
            if j.state == _DONE and (j.end_time or 0.0) < horizon
        ]:
            del self.jobs[key]
            self._seen.pop(key, None)

    def busy_cpus(self) -> int:
        return sum(len(c) for j in self.running() for c in j.alloc.values())

    def cells(self, node: str) -> list[tuple[int, str | None]]:
        """Each CPU of ``node`` with the id of the job on it (None: idle)."""
        owner: dict[int, str] = {}
        for job in self.running():
            for cpu in job.alloc.get(node, ()):
                owner[cpu] = job.id
        live = self.nodes.get(node)
        cpus = live.cpus if live and live.cpus else sorted(owner)
        return [(cpu, owner.get(cpu)) for cpu in cpus]

    def running(self) -> list[LiveJob]:
        """Jobs holding CPUs, by start time."""
        active = [j for j in self.jobs.values() if j.state in _ACTIVE]
        return sorted(active, key=lambda j: (j.start_time or 0.0, j.id))

    def queue(self) -> list[LiveJob]:
        """Jobs not started, in the policy's priority order (then held and
        blocked jobs, then those submitted since the last load, by submission)."""
        waiting = [
            j for j in self.jobs.values() if j.state not in _ACTIVE and j.state != _DONE
        ]
        last = len(waiting) + 1
        return sorted(
            waiting,
            key=lambda j: (
                j.rank if j.rank is not None else last,
                j.submit_time,
                j.id,
            ),
        )

    def ended(self) -> list[LiveJob]:
        """Ended jobs still within the history, by end time."""
        done = [j for j in self.jobs.values() if j.state == _DONE]
        return sorted(done, key=lambda j: (j.end_time or 0.0, j.id))

    def last_pass(self) -> SchedPass | None:
        return self.passes[-1] if self.passes else None
