"""The Standard Workload Format (SWF): reading, the job filter, and export.

SWF (Parallel Workloads Archive, Feitelson et al.) is one job per line, 18
whitespace-separated numbers, ``-1`` for unknown, and ``;`` header comments of the
form ``; Key: value`` (``MaxProcs``, ``MaxNodes``, ``UnixStartTime`` ...). Files
may be gzip-compressed (``.gz``).

The job filter (the same for ``mb sim``, ``mb compare``, experiments and tests):

* processors = requested (field 8) if positive, else allocated (field 5);
* keep a record only if run time (field 4) > 0 and 0 < processors <= machine size
  (and the job's shape fits the nodes, see :mod:`minibatch.sim.machine`);
* requested time = field 9 if positive, else the run time (``--estimates exact``
  makes it the run time for every job);
* requested memory = field 10 (KB per processor) x processors, when positive;
* ``limit`` keeps the first N kept records in file order;
* submit times are rebased so the earliest kept job is submitted at 0.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from minibatch.core.job import JobRequest
from minibatch.errors import InvalidArgument
from minibatch.sim.machine import Machine

if TYPE_CHECKING:
    from minibatch.core.job import Job


class SwfRecord(NamedTuple):
    """One SWF line, all 18 fields in the order of the format."""

    job: int
    submit: float
    wait: float
    run: float
    alloc_procs: int
    avg_cpu: float
    used_mem: float
    req_procs: int
    req_time: float
    req_mem: float
    status: int
    user: int
    group: int
    executable: int
    queue: int
    partition: int
    preceding_job: int
    think_time: float


#: SWF status codes (field 11).
STATUS_FAILED: Final = 0
STATUS_COMPLETED: Final = 1
STATUS_CANCELLED: Final = 5


class MemoryUnit(StrEnum):
    """How field 10 (requested memory) is expressed in a trace."""

    #: The SWF standard: kilobytes per processor.
    KB_PER_PROC = "kb-per-proc"
    #: Bytes for the whole job (the MetaCentrum/Alea data sets).
    BYTES_PER_JOB = "bytes-per-job"


class Estimates(StrEnum):
    """Which requested time the policy sees."""

    TRACE = "trace"
    EXACT = "exact"


@dataclass
class SwfTrace:
    """A parsed SWF file: its header and every record in file order."""

    header: dict[str, str] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)
    records: list[SwfRecord] = field(default_factory=list)

    def machine_procs(self) -> int | None:
        """The machine size from the header: ``MaxProcs``, else ``MaxNodes``."""
        for key in ("MaxProcs", "MaxNodes"):
            text = self.header.get(key, "").split()
            if text and text[0].lstrip("-").isdigit() and int(text[0]) > 0:
                return int(text[0])
        return None


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job kept by the filter, as the simulator replays it.

    ``submit`` is rebased; ``wait`` is the trace's own recorded wait (-1 unknown),
    kept so a simulated schedule can be compared with the real one.
    """

    id: int
    user: str
    group: str
    queue: str
    submit: float
    run_time: float
    procs: int
    req_time: float
    mem_kb: int | None
    request: JobRequest
    wait: float = -1.0
    status: int = -1


def parse_line(line: str) -> SwfRecord:
    """One data line -> record. Raises InvalidArgument on a malformed line."""
    parts = line.split()
    if len(parts) < 18:
        raise InvalidArgument(
            f"SWF line has {len(parts)} fields, expected 18: {line!r}"
        )
    try:
        v = [float(p) for p in parts[:18]]
    except ValueError as exc:
        raise InvalidArgument(f"SWF line has a non-numeric field: {line!r}") from exc
    if not all(map(math.isfinite, v)):  # float() takes nan and inf
        raise InvalidArgument(f"SWF line has a field that is not a number: {line!r}")
    return SwfRecord(
        int(v[0]),
        v[1],
        v[2],
        v[3],
        int(v[4]),
        v[5],
        v[6],
        int(v[7]),
        v[8],
        v[9],
        int(v[10]),
        int(v[11]),
        int(v[12]),
        int(v[13]),
        int(v[14]),
        int(v[15]),
        int(v[16]),
        v[17],
    )


def _open_lines(path: Path) -> Iterator[str]:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            try:
                yield from f
            except (EOFError, OSError, zlib.error) as exc:  # cut short, corrupt
                why = f"{path}: not a whole gzip file ({exc})"
                raise InvalidArgument(why) from None
    else:
        with path.open(encoding="utf-8", errors="replace") as f:
            yield from f


def parse_swf(lines: Iterable[str]) -> SwfTrace:
    """Parse SWF text (header comments and records)."""
    trace = SwfTrace()
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            comment = text[1:].strip()
            trace.comments.append(comment)
            key, sep, value = comment.partition(":")
            if (
                sep
                and key
                and " " not in key.strip()
                and key.strip() not in trace.header
            ):
                trace.header[key.strip()] = value.strip()
            continue
        trace.records.append(parse_line(text))
    return trace


#: The traces that come with minibatch (``jobs/workloads`` in the repository).
BUNDLED = Path(__file__).resolve().parents[2] / "jobs" / "workloads"


def find_trace(name: str) -> Path:
    """A trace file: the path as given, else by name in ``$MB_TRACES``,
    ``./traces``, then the traces that come with minibatch."""
    direct = Path(name)
    if direct.is_file():
        return direct
    dirs = [d for d in os.environ.get("MB_TRACES", "").split(os.pathsep) if d]
    dirs += ["traces", str(BUNDLED)]
    for d in dirs:
        candidate = Path(d) / name
        if candidate.is_file():
            return candidate
    raise InvalidArgument(
        f"trace {name!r} not found in {', '.join(dirs)} (set MB_TRACES to its folder)"
    )


def read_swf(path: str | Path) -> SwfTrace:
    """Read a plain or gzip-compressed SWF file (compression found by content).

    ``path`` may also be a bare trace name, looked up by :func:`find_trace`.
    """
    return parse_swf(_open_lines(find_trace(str(path))))


def record_mem_kb(rec: SwfRecord, procs: int, unit: MemoryUnit) -> int | None:
    """The whole job's requested memory in KB, or None when the trace has none."""
    if rec.req_mem <= 0:
        return None
    if unit is MemoryUnit.BYTES_PER_JOB:
        return max(1, math.ceil(rec.req_mem / 1024))
    return max(1, math.ceil(rec.req_mem * procs))


def select_jobs(
    trace: SwfTrace | Sequence[SwfRecord],
    machine: Machine,
    *,
    limit: int | None = None,
    estimates: Estimates = Estimates.TRACE,
    mem_unit: MemoryUnit = MemoryUnit.KB_PER_PROC,
    left_out: dict[str, int] | None = None,
) -> list[TraceJob]:
    """Apply the job filter (module docstring) and return jobs ordered by (submit, id).

    Args:
        trace: a parsed trace, or its records.
        machine: the simulated machine; its size bounds the processors, and its
            memory (when modelled) makes the requested memory a requirement.
        limit: keep only the first ``limit`` jobs that pass, in file order.
        estimates: ``trace`` uses the requested time, ``exact`` the run time.
        mem_unit: how field 10 is expressed in this trace.
        left_out: if given, counts the records left out, by reason.
    """
    out = left_out if left_out is not None else {}
    records = trace.records if isinstance(trace, SwfTrace) else trace
    size = machine.procs
    with_mem = machine.mem_kb is not None
    kept: list[tuple[SwfRecord, int, float, int | None, JobRequest]] = []
    for rec in records:
        if limit is not None and len(kept) >= limit:
            break
        procs = rec.req_procs if rec.req_procs > 0 else rec.alloc_procs
        why = (
            "no run time"
            if rec.run <= 0
            else "no processors"
            if procs <= 0
            else "wider than the machine"
            if procs > size
            else ""
        )
        if why:
            out[why] = out.get(why, 0) + 1
            continue
        if estimates is Estimates.EXACT or rec.req_time <= 0:
            req_time = rec.run
        else:
            req_time = rec.req_time
        mem = record_mem_kb(rec, procs, mem_unit) if with_mem else None
        request = machine.request(procs, mem, math.ceil(req_time))
        if request is None:
            out["fits no node"] = out.get("fits no node", 0) + 1
            continue
        kept.append((rec, procs, req_time, mem, request))
    if not kept:
        return []
    origin = min(k[0].submit for k in kept)
    jobs = [
        TraceJob(
            id=rec.job,
            user=str(rec.user),
            group=str(rec.group),
            queue=str(rec.queue),
            submit=rec.submit - origin,
            run_time=rec.run,
            procs=procs,
            req_time=req_time,
            mem_kb=mem,
            request=request,
            wait=rec.wait,
            status=rec.status,
        )
        for rec, procs, req_time, mem, request in kept
    ]
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


# ------------------------------------------------------------------ export

_RESULT_STATUS: Final = {"completed": STATUS_COMPLETED, "cancelled": STATUS_CANCELLED}


def _fmt(value: float, decimals: int) -> str:
    if value < 0:
        return "-1"
    if decimals <= 0:
        return str(int(round(value)))
    return f"{value:.{decimals}f}"


def export_swf(
    jobs: Iterable[Job],
    *,
    nodes: Sequence[tuple[str, int]] | None = None,
    decimals: int = 0,
    title: str = "minibatch live run",
) -> str:
    """A live run's jobs as an SWF document (``mb acct --swf``).

    Times are rebased to the earliest submission (its epoch is in the
    ``UnixStartTime`` header); ``decimals`` > 0 keeps sub-second times, which the
    SWF readers of minibatch accept (the format itself has whole seconds). Jobs
    that never started have wait, run and allocated processors -1. Requested memory
    is written as KB per processor, as the format prescribes.

    Args:
        jobs: live jobs (``minibatch.core.job.Job``), finished or not.
        nodes: (name, CPUs) of the cluster's nodes, for the machine header.
        decimals: digits after the point for times.
        title: the ``Computer`` header line.
    """
    ordered = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    origin = ordered[0].submit_time if ordered else 0.0
    procs_total = (
        sum(c for _, c in nodes)
        if nodes
        else max((j.request.cpus for j in ordered), default=0)
    )
    lines = [
        "; Version: 2.2",
        f"; Computer: {title}",
        "; Installation: minibatch (mb acct --swf)",
        f"; UnixStartTime: {int(origin)}",
        f"; MaxJobs: {len(ordered)}",
        f"; MaxRecords: {len(ordered)}",
        f"; MaxNodes: {len(nodes) if nodes else 1}",
        f"; MaxProcs: {procs_total}",
    ]
    if nodes:
        lines.append("; MinibatchNodes: " + " ".join(f"{n}:{c}" for n, c in nodes))
    lines.append("; Note: status 1 completed, 0 failed/killed, 5 cancelled")
    for job in ordered:
        lines.append(_swf_line(job, origin, decimals))
    return "\n".join(lines) + "\n"


def _swf_line(job: Job, origin: float, decimals: int) -> str:
    req = job.request
    started = job.start_time is not None
    run = -1.0
    if started and job.end_time is not None and job.start_time is not None:
        run = max(0.0, job.end_time - job.start_time)
    wait = job.start_time - job.submit_time if job.start_time is not None else -1.0
    alloc = sum(len(a.cpus) for a in job.alloc) or req.cpus
    result = job.result.value if job.result is not None else ""
    status = _RESULT_STATUS.get(result, STATUS_FAILED if result else -1)
    cpu = -1.0 if job.cputime_s is None or not started else job.cputime_s / alloc
    mem_used = -1 if job.maxrss_kb is None else job.maxrss_kb // max(1, alloc)
    req_mem = -1 if req.mem_kb is None else -(-req.mem_kb // req.cpus)
    preceding = job.depends[0].job if job.depends else -1
    fields = [
        str(job.id),
        _fmt(job.submit_time - origin, decimals),
        _fmt(wait, decimals),
        _fmt(run, decimals),
        str(alloc if started else -1),
        _fmt(cpu, decimals),
        str(mem_used),
        str(req.cpus),
        str(req.walltime),
        str(req_mem),
        str(status),
        str(job.uid),
        str(job.gid),
        "-1",
        "1",
        "-1",
        str(preceding),
        "-1",
    ]
    return " ".join(fields)


def machine_nodes_from_header(trace: SwfTrace) -> list[tuple[str, int]] | None:
    """The node list ``export_swf`` writes (``MinibatchNodes``), if present."""
    text = trace.header.get("MinibatchNodes")
    if not text:
        return None
    nodes = []
    for item in text.split():
        name, _, cpus = item.rpartition(":")
        if not name or not cpus.isdigit():
            raise InvalidArgument(f"malformed MinibatchNodes header item {item!r}")
        nodes.append((name, int(cpus)))
    return nodes
