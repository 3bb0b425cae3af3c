"""``qstat``'s layouts beyond the job tables of :mod:`minibatch.cli.render`:
arrays as one line, the ``-n``/``-s``/``-1`` additions to ``-a``, and the queue
(``-Q``, ``-q``) and server (``-B``) layouts, each as Torque prints it.

The column layouts are Torque's (src/cmds/qstat.c), as sites show them:
``Queue Max Tot Ena Str Que Run Hld Wat Trn Ext T Cpt`` (``-Q``), ``Server Max
Tot Que Run Hld Wat Trn Ext Com Status`` (``-B``) and ``Queue Memory CPU Time
Walltime Node Run Que Lm State`` (``-q``); the unit tests hold them to the
character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from minibatch.cli import render
from minibatch.core.job import ACTIVE_STATES, Job, JobResult, JobState
from minibatch.core.units import format_duration
from minibatch.protocol.messages import QueueInfo, ServerStatus

# ------------------------------------------------------------------ arrays


class ArraySummary(Job, kw_only=True):
    """One line for a whole array (``qstat`` without ``-t``): ``5[]``."""

    tasks: int = 0

    @property
    def display_id(self) -> str:
        return f"{self.array_id}[]"


def _array_state(tasks: Sequence[Job]) -> tuple[JobState, JobResult | None]:
    """Torque's letter for the array: R while a task runs, Q while one waits to
    be scheduled, C/F once all have ended (C only if all completed), else H or
    W as its tasks are."""
    states = {t.state for t in tasks}
    if states & ACTIVE_STATES:
        return JobState.RUNNING, None
    if JobState.QUEUED in states:
        return JobState.QUEUED, None
    if states == {JobState.FINISHED}:
        bad = [t.result for t in tasks if t.result is not JobResult.COMPLETED]
        return JobState.FINISHED, bad[0] if bad else JobResult.COMPLETED
    if JobState.HELD in states:
        return JobState.HELD, None
    return JobState.WAITING, None


def array_line(tasks: Sequence[Job]) -> ArraySummary:
    """The summary of an array's ``tasks`` (those shown: running only, say)."""
    state, result = _array_state(tasks)
    starts = [t.start_time for t in tasks if t.start_time is not None]
    cpu = [render.cpu_used(t) for t in tasks]
    fields = msgspec.structs.asdict(tasks[0])
    fields.update(
        state=state,
        result=result,
        start_time=min(starts, default=None),
        end_time=(
            max(t.end_time or 0.0 for t in tasks)
            if state is JobState.FINISHED
            else None
        ),
        cputime_s=sum(c for c in cpu if c is not None) if starts else None,
        used_cputime_s=None,
        used_rss_kb=None,
        # Where its running tasks run (qstat -n).
        alloc=[a for t in tasks if t.state in ACTIVE_STATES for a in t.alloc],
        session_id=None,
        exit_status=None,
        signal=None,
        comment="",
        # A waiting array waits on what its first task does (a dependency
        # makes its letter H, as a task's).
        reason=tasks[0].reason if state is JobState.WAITING else "",
        tasks=len(tasks),
    )
    return ArraySummary(**fields)


def summarize(jobs: Sequence[Job], keep: Callable[[Job], bool]) -> list[Job]:
    """Each array's tasks as one line where its first task was; other jobs, and
    the tasks ``keep`` says were named one by one (``5[2]``), as they are."""
    groups: dict[int, list[Job]] = {}
    order: list[Job | int] = []
    for job in jobs:
        if job.array_id is None or keep(job):
            order.append(job)
            continue
        if job.array_id not in groups:
            groups[job.array_id] = []
            order.append(job.array_id)
        groups[job.array_id].append(job)
    return [
        item if isinstance(item, Job) else array_line(groups[item]) for item in order
    ]


# ------------------------------------------------------ -a with -n, -s, -1


def annotated_alt(
    jobs: Sequence[Job],
    now: float,
    server: str = "",
    *,
    nodes: bool = False,
    comments: bool = False,
    one_line: bool = False,
) -> str:
    """``qstat -a`` with each job's nodes (``-n``) and comment (``-s``) under
    its row, indented three spaces, or appended to it (``-1``)."""
    table = render.qstat_alt(jobs, now, server)
    if not table or not (nodes or comments):
        return table
    lines = table.splitlines()
    head, rows = lines[: len(lines) - len(jobs)], lines[len(lines) - len(jobs) :]
    out = list(head)
    for job, row in zip(jobs, rows, strict=True):
        extra = []
        if nodes:
            extra.append(render.exec_host(job) or "--")
        note = render.job_comment(job)
        if comments and note:
            extra.append(note)
        if one_line:
            out.append("   ".join([row, *extra]))
        else:
            out += [row, *(f"   {text}" for text in extra)]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------ -Q, -q, -B


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _count(q: QueueInfo, *states: str) -> int:
    return sum(q.jobs.get(s, 0) for s in states)


def _queue_row(*cells: Any) -> str:
    name, mx, tot, ena, st, que, run, hld, wat, trn, ext, kind, cpt = cells
    return (
        f"{render.fit(name, 16):<16} {mx:>5} {tot:>6} {ena:>5} {st:>5} {que:>5} "
        f"{run:>5} {hld:>5} {wat:>5} {trn:>5} {ext:>5} {kind} {cpt:>5}"
    )


#: The headings, as Torque prints them (the rows line up under them).
_QUEUE_HEAD = (
    "Queue              Max    Tot   Ena   Str   Que   Run   Hld   Wat   Trn"
    "   Ext T   Cpt\n"
    "----------------   ---   ----    --    --   ---   ---   ---   ---   ---"
    "   --- -   ---\n"
)
_SERVER_HEAD = (
    "Server             Max   Tot   Que   Run   Hld   Wat   Trn   Ext   Com Status\n"
    "----------------   ---   ---   ---   ---   ---   ---   ---   ---   ---"
    " ----------\n"
)
_LIMITS_HEAD = (
    "Queue            Memory CPU Time Walltime Node  Run Que Lm  State\n"
    "---------------- ------ -------- -------- ----  --- --- --  -----\n"
)


def queue_table(queues: Sequence[QueueInfo]) -> str:
    """``qstat -Q``: one line per queue with its jobs by state (Trn and Cpt
    are always 0: jobs are never in transit, and finished ones leave)."""
    lines: list[str] = []
    for q in queues:
        lines.append(
            _queue_row(
                q.name,
                0,
                sum(q.jobs.values()),
                _yes(q.enabled),
                _yes(q.started),
                _count(q, "queued"),
                _count(q, "running"),
                _count(q, "held"),
                _count(q, "waiting"),
                0,
                _count(q, "exiting"),
                "E",
                0,
            )
        )
    return _QUEUE_HEAD + "".join(line + "\n" for line in lines)


def _limits_row(*cells: Any) -> str:
    name, mem, cpu, wall, node, run, que, lm, state = cells
    return (
        f"{render.fit(name, 16):<16} {mem:^6} {cpu:^8} {wall:^8} {node:>4}  "
        f"{run:>3} {que:>3} {lm:>2}  {state:^5}"
    ).rstrip()


def queue_limits(queues: Sequence[QueueInfo], server: str) -> str:
    """``qstat -q``: each queue's limits and its running and queued jobs, with
    their totals. Only the walltime limit exists here; the rest show ``--``."""
    lines = ["", f"server: {server}", "", *_LIMITS_HEAD.splitlines()]
    running = queued = 0
    for q in queues:
        run, que = _count(q, "running", "exiting"), _count(q, "queued")
        running, queued = running + run, queued + que
        wall = "--" if q.max_walltime is None else format_duration(q.max_walltime)
        state = f"{'E' if q.enabled else 'D'} {'R' if q.started else 'S'}"
        # Torque cuts a long walltime (168:00:0), so do we.
        cells = ("--", "--", wall[:8], "--", run, que, "--", state)
        lines.append(_limits_row(q.name, *cells))
    lines.append(" " * 47 + "----- -----")
    lines.append(" " * 47 + f"{running:>5} {queued:>5}")
    return "\n".join(lines) + "\n"


def queue_full(queues: Sequence[QueueInfo]) -> str:
    """``qstat -Q -f``: a ``Queue:`` block of ``attr = value`` lines per queue."""
    blocks = []
    for q in queues:
        counts = " ".join(
            f"{label}:{_count(q, *states)}" for label, states in _STATE_COUNT
        )
        attrs: list[tuple[str, str | None]] = [
            ("queue_type", "Execution"),
            ("Priority", f"{q.priority:g}"),
            ("total_jobs", str(sum(q.jobs.values()))),
            ("state_count", counts),
            ("resources_max.walltime", _duration(q.max_walltime)),
            ("resources_max.ncpus", None if q.max_cpus is None else str(q.max_cpus)),
            ("resources_default.walltime", _duration(q.default_walltime)),
            ("acl_user_enable", "True" if q.users else None),
            ("acl_users", ",".join(q.users) or None),
            ("default_queue", "True" if q.default else None),
            ("enabled", str(q.enabled)),
            ("started", str(q.started)),
        ]
        lines = [f"Queue: {q.name}"]
        lines += [f"    {k} = {v}" for k, v in attrs if v is not None]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


_STATE_COUNT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Transit", ()),
    ("Queued", ("queued",)),
    ("Held", ("held",)),
    ("Waiting", ("waiting",)),
    ("Running", ("running",)),
    ("Exiting", ("exiting",)),
    ("Complete", ()),
)


def _duration(seconds: int | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


def _server_state(status: ServerStatus) -> str:
    # Torque: Active while it schedules; Idle when scheduling is off (here:
    # no scheduler has registered).
    return "Active" if status.scheduler_pid is not None else "Idle"


def server_table(status: ServerStatus, server: str) -> str:
    """``qstat -B``: the server's jobs by state (Trn and Com are always 0)."""
    n = status.jobs
    counts = [sum(n.values())] + [n.get(s, 0) for s in ("queued", "running")]
    counts += [n.get("held", 0), n.get("waiting", 0), 0, n.get("exiting", 0), 0]
    numbers = " ".join(f"{c:>5}" for c in [0, *counts])
    line = f"{render.fit(server, 16):<16} {numbers} {_server_state(status)}"
    return _SERVER_HEAD + line + "\n"


def server_full(status: ServerStatus, server: str, queues: Sequence[QueueInfo]) -> str:
    """``qstat -B -f``: the server's attributes."""
    n = status.jobs
    counts = " ".join(
        f"{label}:{sum(n.get(s, 0) for s in states)}" for label, states in _STATE_COUNT
    )
    default = next((q.name for q in queues if q.default), None)
    attrs: list[tuple[str, str | None]] = [
        ("server_state", _server_state(status)),
        ("scheduling", str(status.scheduler_pid is not None)),
        ("total_jobs", str(sum(n.values()))),
        ("state_count", counts),
        ("default_queue", default),
        ("scheduler_policy", status.policy or None),
        ("server_pid", str(status.pid)),
        (
            "scheduler_pid",
            None if status.scheduler_pid is None else str(status.scheduler_pid),
        ),
        (
            "nodes",
            ",".join(f"{k}={v}" for k, v in sorted(status.nodes.items())) or None,
        ),
        ("endpoint", status.endpoint or None),
        ("mqtt_url", status.mqtt_url or None),
    ]
    lines = [f"Server: {server}"]
    lines += [f"    {k} = {v}" for k, v in attrs if v is not None]
    return "\n".join(lines) + "\n"


def used_record(job: Job, now: float) -> dict[str, Any]:
    """``resources_used`` for ``qstat -f --json``: live while the job runs (so
    only the full record has it: the others must not change between queries)."""
    return {
        "cput_s": render.cpu_used(job),
        "mem_kb": render.mem_used_kb(job),
        "walltime_s": render.elapsed(job, now),
    }
