"""One record per finished job, whatever produced it, and the ``jobs.csv`` format.

A :class:`JobRecord` holds what every metric needs: who, when submitted, started
and ended, how many processors, what was requested. Simulations, a live cluster's
accounting and ``jobs.csv`` files all become lists of these.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    from minibatch.core.job import Job
    from minibatch.sim.engine import Outcome

#: The columns of ``jobs.csv``, in order (the first eleven are the stable core).
CSV_COLUMNS: tuple[str, ...] = (
    "job",
    "user",
    "submit",
    "start",
    "end",
    "procs",
    "req_time",
    "run_time",
    "wait",
    "predicted_start",
    "eet",
    "group",
    "queue",
    "mem_kb",
    "nodes",
    "trace_start",
    "static_run",
    "cpu_s",
    "resizes",
    "guest",
)


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A job that ran: times in seconds (simulated, or epoch seconds when live)."""

    job: int
    user: str
    submit: float
    start: float
    end: float
    procs: int
    req_time: float
    group: str = ""
    #: The job's class: the trace's queue number, or the live queue's name.
    queue: str = ""
    mem_kb: int | None = None
    nodes: tuple[str, ...] = ()
    #: The start the policy predicted at submission, where it made one; the
    #: submit time of a job started then (live: by the first plan that saw it).
    predicted_start: float | None = None
    #: The start recorded in the trace (submit + wait), where it has one.
    trace_start: float | None = None
    #: Malleable jobs: the run time on the CPUs it asked for (what slowdown
    #: divides by, as seed 002 does), the CPU-seconds it held, how often its
    #: CPUs changed and whether it started on CPUs other jobs lent it.
    static_run: float | None = None
    cpu_s: float | None = None
    resizes: int = 0
    guest: bool = False

    @property
    def wait(self) -> float:
        return self.start - self.submit

    @property
    def run_time(self) -> float:
        return self.end - self.start

    @property
    def static_run_time(self) -> float:
        """The run time it would have had on its requested CPUs."""
        return self.run_time if self.static_run is None else self.static_run

    @property
    def cpu_seconds(self) -> float:
        """Processor-seconds it held (its allocation integrated over its run)."""
        return self.procs * self.run_time if self.cpu_s is None else self.cpu_s

    @property
    def response(self) -> float:
        return self.end - self.submit


def from_outcomes(outcomes: Iterable[Outcome]) -> list[JobRecord]:
    """Records of a simulation, in submission order."""
    records = []
    for o in outcomes:
        job = o.job
        records.append(
            JobRecord(
                job=job.id,
                user=job.user,
                group=job.group,
                queue=job.queue,
                submit=job.submit,
                start=o.start,
                end=o.end,
                procs=job.request.cpus,
                req_time=job.req_time,
                mem_kb=job.mem_kb,
                nodes=o.nodes,
                predicted_start=o.predicted,
                trace_start=job.submit + job.wait if job.wait >= 0 else None,
                static_run=job.run_time if o.cpu_s is not None else None,
                cpu_s=o.cpu_s,
                resizes=o.resizes,
                guest=o.guest,
            )
        )
    return records


def from_jobs(jobs: Iterable[Job], queue: str = "batch") -> list[JobRecord]:
    """Records of a live cluster's jobs; jobs that never ran are left out.

    ``procs`` is the CPUs the job held (its request when the allocation is gone).
    """
    records = []
    for job in jobs:
        if job.start_time is None or job.end_time is None:
            continue
        held = sum(len(a.cpus) for a in job.alloc)
        records.append(
            JobRecord(
                job=job.id,
                user=job.user,
                group=job.group,
                queue=queue,
                submit=job.submit_time,
                start=job.start_time,
                end=job.end_time,
                procs=held or job.request.cpus,
                req_time=float(job.request.walltime),
                mem_kb=job.request.mem_kb,
                nodes=tuple(a.node for a in job.alloc),
                predicted_start=job.first_predicted_start,
            )
        )
    records.sort(key=lambda r: (r.submit, r.job))
    return records


def format_number(value: float | None) -> str:
    """A time for a CSV cell: whole numbers without a point, others to 6 places."""
    if value is None:
        return ""
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return repr(round(value, 6))


def write_csv(
    path: str | Path,
    records: Sequence[JobRecord],
    eet: dict[int, float] | None = None,
) -> None:
    """Write ``jobs.csv``: one row per record, columns :data:`CSV_COLUMNS`."""
    eet = eet or {}
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(CSV_COLUMNS)
        for r in records:
            out.writerow(
                (
                    r.job,
                    r.user,
                    format_number(r.submit),
                    format_number(r.start),
                    format_number(r.end),
                    r.procs,
                    format_number(r.req_time),
                    format_number(r.run_time),
                    format_number(r.wait),
                    format_number(r.predicted_start),
                    format_number(eet.get(r.job)),
                    r.group,
                    r.queue,
                    "" if r.mem_kb is None else r.mem_kb,
                    "+".join(r.nodes),
                    format_number(r.trace_start),
                    format_number(r.static_run),
                    format_number(r.cpu_s),
                    r.resizes,
                    int(r.guest),
                )
            )


def _optional(text: str | None) -> float | None:
    return None if text is None or text == "" else float(text)


def read_csv(path: str | Path) -> list[JobRecord]:
    """Read a ``jobs.csv`` written by :func:`write_csv` (extra columns ignored)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(f"no such file: {p}")
    records = []
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"job", "user", "submit", "start", "end", "procs"} - set(
            reader.fieldnames or ()
        )
        if missing:
            raise InvalidArgument(f"{p} lacks column(s) {', '.join(sorted(missing))}")
        for row in reader:
            mem = row.get("mem_kb") or ""
            nodes = row.get("nodes") or ""
            records.append(
                JobRecord(
                    job=int(row["job"]),
                    user=row["user"],
                    submit=float(row["submit"]),
                    start=float(row["start"]),
                    end=float(row["end"]),
                    procs=int(row["procs"]),
                    req_time=float(row.get("req_time") or 0.0),
                    group=row.get("group") or "",
                    queue=row.get("queue") or "",
                    mem_kb=int(mem) if mem else None,
                    nodes=tuple(nodes.split("+")) if nodes else (),
                    predicted_start=_optional(row.get("predicted_start")),
                    trace_start=_optional(row.get("trace_start")),
                    static_run=_optional(row.get("static_run")),
                    cpu_s=_optional(row.get("cpu_s")),
                    resizes=int(row.get("resizes") or 0),
                    guest=row.get("guest") == "1",
                )
            )
    return records
