"""The PBS accounting log: ``$MB_HOME/state/accounting/YYYYMMDD``, the file
Torque keeps in ``server_priv/accounting``, so its parsers work here.

One line per record, ``MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...`` in local
time, in the file of the record's local day (Torque's ``acct_job`` and
``account_record`` give the keys and the layout):

* ``Q`` queued, at submission: ``queue=``.
* ``S`` started: ``user= group= [account=] jobname= queue= ctime= qtime= etime=
  start= owner= exec_host= Resource_List.*=`` (times in epoch seconds).
* ``E`` ended, for a job that started: the S keys, then ``[session=] end=
  Exit_status= resources_used.cput= resources_used.mem=
  resources_used.walltime=``.
* ``D`` deleted while the server handled a request (``qdel``, ``scancel``,
  ``releaseres``): ``requestor=user@host``, the user who sent it. A running job
  gets its E record once it has ended.
* ``A`` cancelled by the server with nobody asking (a reservation's window
  ended, a dependency that can never be satisfied) and ``R`` queued again under
  the same id (``qrerun``, its node stopped): no keys, as in Torque.

The state machine notes records as things happen (:class:`Pending`), so each
describes the job as it was then. The server appends them to the file
(:class:`AccountingFile`) only once the batch is committed: the log never tells
of a change the database does not hold.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Iterable
from itertools import groupby
from pathlib import Path
from typing import NamedTuple

from minibatch.core.job import Job
from minibatch.core.units import format_duration, format_size_kb
from minibatch.server.submit import Caller

log = logging.getLogger(__name__)

#: Fields are separated by blanks and records by newlines, so a value (a job
#: name may hold anything but '/') keeps neither.
_BLANK = re.compile(r"\s")


class Record(NamedTuple):
    #: The file it goes to: its local day, ``YYYYMMDD``.
    day: str
    #: The line, without its newline.
    line: str


def _value(value: object) -> str:
    text = str(value)
    # The test first: most values have no blank, and the regex costs more.
    if text.isprintable() and " " not in text:
        return text
    return _BLANK.sub("_", text)


@functools.cache
def _host() -> str:
    # Everything runs on this machine: owners and requestors are users here.
    return os.uname().nodename


def record(
    kind: str, job: Job, when: float, keys: Iterable[tuple[str, object]]
) -> Record:
    """One record of type ``kind`` about ``job`` at ``when``."""
    stamp = time.localtime(when)
    text = " ".join(f"{key}={_value(value)}" for key, value in keys)
    return Record(
        time.strftime("%Y%m%d", stamp),
        f"{time.strftime('%m/%d/%Y %H:%M:%S', stamp)};{kind};{job.display_id};{text}",
    )


def _exec_host(job: Job) -> str:
    """Torque's ``node/cpu+node/cpu``, with the real CPU ids."""
    return "+".join(f"{a.node}/{cpu}" for a in job.alloc for cpu in a.cpus)


def _run_keys(job: Job) -> list[tuple[str, object]]:
    """What S and E records say about a job that started."""
    start = job.start_time or 0.0
    req = job.request
    keys: list[tuple[str, object]] = [("user", job.user), ("group", job.group)]
    if job.account:
        keys.append(("account", job.account))
    keys += [
        ("jobname", job.name),
        ("queue", job.queue),
        ("ctime", int(job.submit_time)),
        ("qtime", int(job.submit_time)),
        # When it would have become eligible had it waited in one stretch:
        # held and dependency waits do not count, as in PBS's eligible_time.
        ("etime", int(start - job.eligible_s)),
        ("start", int(start)),
        ("owner", f"{job.user}@{_host()}"),
        ("exec_host", _exec_host(job)),
    ]
    if req.gpus:
        keys.append(("Resource_List.gpus", req.gpus))
    if req.mem_kb:
        keys.append(("Resource_List.mem", format_size_kb(req.mem_kb)))
    keys += [
        ("Resource_List.ncpus", req.cpus),
        ("Resource_List.nodect", req.nodes),
        ("Resource_List.nodes", f"{req.nodes}:ppn={req.ppn}"),
        ("Resource_List.walltime", format_duration(req.walltime)),
    ]
    return keys


def _end_keys(job: Job, when: float) -> list[tuple[str, object]]:
    end = job.end_time or when
    keys = _run_keys(job)
    if job.session_id is not None:
        keys.append(("session", job.session_id))
    keys += [
        ("end", int(end)),
        # Empty when no status came back (its node failed), as tracejob shows it.
        ("Exit_status", "" if job.exit_status is None else job.exit_status),
        ("resources_used.cput", format_duration(job.cputime_s or 0.0)),
        ("resources_used.mem", format_size_kb(job.maxrss_kb or 0)),
        ("resources_used.walltime", format_duration(end - (job.start_time or end))),
    ]
    return keys


class Pending:
    """Records noted by the state machine and not yet written (no IO here)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        #: Jobs :meth:`deleted` noted since the last :meth:`take`.
        self._deleted: set[int] = set()

    def event(self, job: Job, event: str, when: float) -> None:
        """The record a job event calls for, if any (``ServerState.record``)."""
        if event == "submitted":
            self.records.append(record("Q", job, when, [("queue", job.queue)]))
        elif event == "started":
            self.records.append(record("S", job, when, _run_keys(job)))
        elif event == "finished" and job.start_time is not None:
            self.records.append(record("E", job, when, _end_keys(job, when)))
        elif event == "finished" and job.id not in self._deleted:
            # Ended before it ran and nobody cancelled it: its dependency failed.
            self.records.append(record("A", job, when, []))
        elif event == "requeued":
            self.records.append(record("R", job, when, []))

    def deleted(self, job: Job, when: float, requestor: Caller | None) -> None:
        """``job`` is being cancelled, on ``requestor``'s request or the
        server's own (None)."""
        self._deleted.add(job.id)
        if requestor is None:
            self.records.append(record("A", job, when, []))
        else:
            who = f"{requestor.user}@{_host()}"
            self.records.append(record("D", job, when, [("requestor", who)]))

    def take(self) -> list[Record]:
        taken, self.records = self.records, []
        self._deleted.clear()
        return taken


class AccountingFile:
    """Appends records to the day files of ``directory``: one write per file
    per batch, and no fsync (the database is the durable copy). The day's file
    stays open (an open per batch was a tenth of the server's time per job);
    an unbuffered append, so each write lands whole."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._day = ""
        self._fd: int | None = None

    def write(self, records: list[Record]) -> None:
        for day, group in groupby(records, key=lambda r: r.day):
            text = "".join(f"{r.line}\n" for r in group)
            try:
                self._append(self.directory / day, text)
            except OSError as exc:
                # The log is a report of what the database holds: losing lines
                # must not stop the server.
                log.error("accounting log %s: %s; records lost", day, exc)

    def _append(self, path: Path, text: str) -> None:
        if self._fd is None or path.name != self._day:
            self.close()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            try:
                self._fd = os.open(path, flags, 0o640)
            except FileNotFoundError:
                # Users' job names and exec hosts: readable by the cluster's
                # owner only, as Torque's server_priv.
                self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
                self._fd = os.open(path, flags, 0o640)
            self._day = path.name
        data = text.encode()
        written = os.write(self._fd, data)
        if written < len(data):  # a full disk mid-write: the rest, or the error
            os.write(self._fd, data[written:])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
