"""SQLite persistence for the server (WAL mode).

Tables: ``jobs`` (every job not yet finished), ``accounting`` (one row per finished
job, with the columns accounting queries filter on), ``job_events`` (each job's
event log), ``nodes``, ``reservations`` (advance reservations not yet over),
``settings`` (e.g. the scheduling policy set with ``mb policy set``) and ``meta``
(counters: the next job id, the next reservation number). Each record is stored as a
msgpack blob of the model struct beside the columns we query by, so the model can
grow without schema migrations.

Writes are queued and committed together by :meth:`Store.commit`: the server
handles a batch of requests, commits once, and only then replies. With WAL and
``synchronous=NORMAL`` a commit survives a crash (SIGKILL) of the server process;
``synchronous=FULL`` also survives a power cut, at the cost of an fsync per commit.

A commit that fails (disk full, read-only file system, I/O error) raises
:class:`~minibatch.errors.StorageError` naming the cause, with the transaction
rolled back; :meth:`Store.discard` then drops the queued writes, and the service
rebuilds its state from what the database has (``rollback.py``). Queries never
commit: they read the database plus the writes still queued, so a batch is
written all at once or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from minibatch.core.job import Job
from minibatch.core.reservation import Reservation
from minibatch.errors import StorageError
from minibatch.server.nodes import Node

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS accounting (
    id INTEGER PRIMARY KEY, user TEXT NOT NULL, end_time REAL NOT NULL,
    array_id INTEGER, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS accounting_user ON accounting (user, end_time);
CREATE INDEX IF NOT EXISTS accounting_end ON accounting (end_time);
CREATE INDEX IF NOT EXISTS accounting_array ON accounting (array_id);
CREATE TABLE IF NOT EXISTS job_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL, time REAL NOT NULL,
    event TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS reservations (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, data BLOB NOT NULL);
"""

_enc = msgspec.msgpack.Encoder()
_job = msgspec.msgpack.Decoder(Job)
_node = msgspec.msgpack.Decoder(Node)
_resv = msgspec.msgpack.Decoder(Reservation)


def _ended(job: Job) -> tuple[float, int]:
    """Accounting's order of finished jobs (its ``end_time`` column, then id)."""
    return (job.end_time or 0.0, job.id)


#: SQLite's primary result codes for a database that cannot be written, in words.
_CAUSES = {
    sqlite3.SQLITE_FULL: os.strerror(errno.ENOSPC),
    sqlite3.SQLITE_READONLY: "read-only database or file system",
    sqlite3.SQLITE_IOERR: os.strerror(errno.EIO),
}


def failure_cause(exc: sqlite3.Error | OSError) -> str:
    """Why a write failed, in words (``No space left on device``)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    # Extended codes (SQLITE_IOERR_WRITE, ...) carry the primary in the low byte.
    return _CAUSES.get(code & 0xFF, str(exc)) if code is not None else str(exc)


class Store:
    def __init__(self, path: Path, synchronous: str = "normal") -> None:
        if synchronous.lower() not in ("normal", "full"):
            raise ValueError(
                f"sqlite_synchronous must be normal or full, not {synchronous!r}"
            )
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.executescript(_SCHEMA)
        self._jobs: dict[int, Job] = {}
        self._finished: dict[int, Job] = {}
        self._nodes: dict[str, Node] = {}
        self._events: list[tuple[int, float, str, str]] = []
        self._next_id: int | None = None
        #: Reservation name -> the reservation to write, or None to delete it.
        self._resv: dict[str, Reservation | None] = {}
        self._settings: dict[str, Any] = {}
        self._counters: dict[str, int] = {}
        #: Writes queued so far: the service compares it around each request to
        #: learn which requests wrote something.
        self.writes = 0

    # ------------------------------------------------------------- loading

    def load_jobs(self) -> list[Job]:
        return [
            _job.decode(row[0]) for row in self._db.execute("SELECT data FROM jobs")
        ]

    def load_nodes(self) -> list[Node]:
        return [_node.decode(r[0]) for r in self._db.execute("SELECT data FROM nodes")]

    def next_id(self) -> int:
        return self.counter("next_id")

    def counter(self, key: str) -> int:
        """A counter kept in ``meta`` (1 when never set)."""
        if key in self._counters:
            return self._counters[key]
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return int(row[0]) if row else 1

    def load_reservations(self) -> list[Reservation]:
        rows = self._db.execute("SELECT data FROM reservations ORDER BY name")
        return [_resv.decode(r[0]) for r in rows]

    def setting(self, key: str) -> Any:
        """A stored setting (any msgpack value), or None."""
        if key in self._settings:
            return self._settings[key]
        row = self._db.execute(
            "SELECT data FROM settings WHERE key = ?", (key,)
        ).fetchone()
        return msgspec.msgpack.decode(row[0]) if row else None

    # ------------------------------------------------------ queued writes

    def put_job(self, job: Job) -> None:
        self.writes += 1
        self._jobs[job.id] = job

    def finish_job(self, job: Job) -> None:
        self.writes += 1
        self._jobs.pop(job.id, None)
        self._finished[job.id] = job

    def put_node(self, node: Node) -> None:
        self.writes += 1
        self._nodes[node.name] = node

    def event(self, job: int, time: float, event: str, detail: str = "") -> None:
        self.writes += 1
        self._events.append((job, time, event, detail))

    def set_next_id(self, value: int) -> None:
        self.writes += 1
        self._next_id = value

    def set_counter(self, key: str, value: int) -> None:
        self.writes += 1
        self._counters[key] = value

    def put_reservation(self, resv: Reservation) -> None:
        self.writes += 1
        self._resv[resv.name] = resv

    def delete_reservation(self, name: str) -> None:
        self.writes += 1
        self._resv[name] = None

    def put_setting(self, key: str, value: Any) -> None:
        self.writes += 1
        self._settings[key] = value

    @property
    def dirty(self) -> bool:
        return bool(
            self._jobs
            or self._finished
            or self._nodes
            or self._events
            or self._resv
            or self._settings
            or self._counters
        ) or (self._next_id is not None)

    def commit(self) -> None:
        """Write everything queued in one transaction, or raise StorageError
        having written none of it (the writes stay queued: see :meth:`discard`)."""
        if not self.dirty:
            return
        db = self._db
        try:
            db.execute("BEGIN")
            if self._next_id is not None:
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('next_id', ?)",
                    (self._next_id,),
                )
            if self._jobs:
                db.executemany(
                    "INSERT OR REPLACE INTO jobs (id, data) VALUES (?, ?)",
                    [(j.id, _enc.encode(j)) for j in self._jobs.values()],
                )
            if self._finished:
                db.executemany(
                    "DELETE FROM jobs WHERE id = ?", [(i,) for i in self._finished]
                )
                db.executemany(
                    "INSERT OR REPLACE INTO accounting"
                    " (id, user, end_time, array_id, data) VALUES (?, ?, ?, ?, ?)",
                    [
                        (j.id, j.user, j.end_time or 0.0, j.array_id, _enc.encode(j))
                        for j in self._finished.values()
                    ],
                )
            if self._events:
                db.executemany(
                    "INSERT INTO job_events (job, time, event, detail)"
                    " VALUES (?, ?, ?, ?)",
                    self._events,
                )
            if self._nodes:
                db.executemany(
                    "INSERT OR REPLACE INTO nodes (name, data) VALUES (?, ?)",
                    [(n.name, _enc.encode(n)) for n in self._nodes.values()],
                )
            self._commit_extras(db)
            db.execute("COMMIT")
        except BaseException as exc:
            # SQLite rolls back by itself after some errors (SQLITE_FULL): a
            # second ROLLBACK would fail and hide the cause.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error | OSError):
                cause = failure_cause(exc)
                raise StorageError(
                    f"cannot save the change: {cause} ({self.path}); "
                    "nothing was changed",
                    cause,
                ) from exc
            raise
        self.discard()

    def discard(self) -> None:
        """Forget the queued writes (after a failed commit: they are not kept)."""
        self._jobs.clear()
        self._finished.clear()
        self._nodes.clear()
        self._events.clear()
        self._next_id = None
        self._resv.clear()
        self._settings.clear()
        self._counters.clear()

    def _commit_extras(self, db: sqlite3.Connection) -> None:
        """Reservations, settings and counters (inside :meth:`commit`'s transaction)."""
        for name, resv in self._resv.items():
            if resv is None:
                db.execute("DELETE FROM reservations WHERE name = ?", (name,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO reservations (name, data) VALUES (?, ?)",
                    (name, _enc.encode(resv)),
                )
        db.executemany(
            "INSERT OR REPLACE INTO settings (key, data) VALUES (?, ?)",
            [(k, _enc.encode(v)) for k, v in self._settings.items()],
        )
        db.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            list(self._counters.items()),
        )

    # ----------------------------------------------------------- queries
    # Each query sees what this batch changed without committing it: it adds the
    # finished jobs and events still queued to what the database returns.

    def finished_jobs(
        self,
        ids: list[int] | None = None,
        user: str | None = None,
        since: float | None = None,
    ) -> list[Job]:
        sql = "SELECT data FROM accounting"
        where: list[str] = []
        args: list[Any] = []
        if ids is not None:
            ids = [i for i in ids if _storable(i)]
            where.append(f"id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        if user is not None:
            where.append("user = ?")
            args.append(user)
        if since is not None:
            where.append("end_time >= ?")
            args.append(since)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id"
        stored = [_job.decode(r[0]) for r in self._db.execute(sql, args)]
        return self._with_queued(
            stored,
            lambda j: (
                (ids is None or j.id in ids)
                and (user is None or j.user == user)
                and (since is None or (j.end_time or 0.0) >= since)
            ),
        )

    def _with_queued(self, stored: list[Job], keep: Callable[[Job], bool]) -> list[Job]:
        """``stored`` (by id) with the queued finished jobs ``keep`` accepts."""
        queued = [j for j in self._finished.values() if keep(j)]
        if not queued:
            return stored
        by_id = {j.id: j for j in stored}
        by_id.update((j.id, j) for j in queued)
        return sorted(by_id.values(), key=lambda j: j.id)

    def latest_per_user(self, limit: int) -> list[Job]:
        """Each user's ``limit`` most recently finished jobs, oldest first."""
        rows = self._db.execute(
            "SELECT data FROM (SELECT data, end_time, id, ROW_NUMBER() OVER"
            " (PARTITION BY user ORDER BY end_time DESC, id DESC) AS n"
            " FROM accounting) WHERE n <= ? ORDER BY end_time, id",
            (limit,),
        )
        jobs = [_job.decode(r[0]) for r in rows]
        if not self._finished:
            return jobs
        by_id = {j.id: j for j in jobs}
        by_id.update(self._finished)
        newest: dict[str, list[Job]] = {}
        for job in sorted(by_id.values(), key=_ended, reverse=True):
            kept = newest.setdefault(job.user, [])
            if len(kept) < limit:
                kept.append(job)
        return sorted((j for kept in newest.values() for j in kept), key=_ended)

    def finished_in_array(self, array_id: int) -> list[Job]:
        if not _storable(array_id):
            return []
        rows = self._db.execute(
            "SELECT data FROM accounting WHERE array_id = ? ORDER BY id", (array_id,)
        )
        stored = [_job.decode(r[0]) for r in rows]
        return self._with_queued(stored, lambda j: j.array_id == array_id)

    def is_finished(self, job_id: int) -> Job | None:
        if job_id in self._finished:
            return self._finished[job_id]
        if not _storable(job_id):
            return None
        row = self._db.execute(
            "SELECT data FROM accounting WHERE id = ?", (job_id,)
        ).fetchone()
        return _job.decode(row[0]) if row else None

    def events_of(self, job_id: int) -> list[tuple[float, str, str]]:
        stored = list(
            self._db.execute(
                "SELECT time, event, detail FROM job_events WHERE job = ? ORDER BY seq",
                (job_id,),
            )
        )
        return stored + [(t, e, d) for j, t, e, d in self._events if j == job_id]

    def close(self) -> None:
        self._db.close()


def _storable(job_id: int) -> bool:
    """Whether SQLite can hold ``job_id``: a larger one, which a user may type
    (``qdel 99999999999999999999``), names no job rather than failing the query."""
    return 0 <= job_id < 1 << 63
