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
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from minibatch.core.job import Job
from minibatch.core.reservation import Reservation
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


class Store:
    def __init__(self, path: Path, synchronous: str = "normal") -> None:
        if synchronous.lower() not in ("normal", "full"):
            raise ValueError(
                f"sqlite_synchronous must be normal or full, not {synchronous!r}"
            )
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
        self._jobs[job.id] = job

    def finish_job(self, job: Job) -> None:
        self._jobs.pop(job.id, None)
        self._finished[job.id] = job

    def put_node(self, node: Node) -> None:
        self._nodes[node.name] = node

    def event(self, job: int, time: float, event: str, detail: str = "") -> None:
        self._events.append((job, time, event, detail))

    def set_next_id(self, value: int) -> None:
        self._next_id = value

    def set_counter(self, key: str, value: int) -> None:
        self._counters[key] = value

    def put_reservation(self, resv: Reservation) -> None:
        self._resv[resv.name] = resv

    def delete_reservation(self, name: str) -> None:
        self._resv[name] = None

    def put_setting(self, key: str, value: Any) -> None:
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
        """Write everything queued in one transaction."""
        if not self.dirty:
            return
        db = self._db
        db.execute("BEGIN")
        try:
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
        except BaseException:
            db.execute("ROLLBACK")
            raise
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
    # Each query commits queued writes first, so it sees what this batch changed.

    def finished_jobs(
        self,
        ids: list[int] | None = None,
        user: str | None = None,
        since: float | None = None,
    ) -> list[Job]:
        self.commit()
        sql = "SELECT data FROM accounting"
        where: list[str] = []
        args: list[Any] = []
        if ids is not None:
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
        return [_job.decode(r[0]) for r in self._db.execute(sql, args)]

    def latest_per_user(self, limit: int) -> list[Job]:
        """Each user's ``limit`` most recently finished jobs, oldest first."""
        self.commit()
        rows = self._db.execute(
            "SELECT data FROM (SELECT data, end_time, id, ROW_NUMBER() OVER"
            " (PARTITION BY user ORDER BY end_time DESC, id DESC) AS n"
            " FROM accounting) WHERE n <= ? ORDER BY end_time, id",
            (limit,),
        )
        return [_job.decode(r[0]) for r in rows]

    def finished_in_array(self, array_id: int) -> list[Job]:
        self.commit()
        rows = self._db.execute(
            "SELECT data FROM accounting WHERE array_id = ? ORDER BY id", (array_id,)
        )
        return [_job.decode(r[0]) for r in rows]

    def is_finished(self, job_id: int) -> Job | None:
        if job_id in self._finished:
            return self._finished[job_id]
        row = self._db.execute(
            "SELECT data FROM accounting WHERE id = ?", (job_id,)
        ).fetchone()
        return _job.decode(row[0]) if row else None

    def events_of(self, job_id: int) -> list[tuple[float, str, str]]:
        self.commit()
        return list(
            self._db.execute(
                "SELECT time, event, detail FROM job_events WHERE job = ? ORDER BY seq",
                (job_id,),
            )
        )

    def close(self) -> None:
        self._db.close()
