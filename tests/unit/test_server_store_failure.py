"""A commit that fails (a full disk, a read-only database): the store names the
cause, and the server answers at once, goes back to what the database holds,
and sends nothing of the refused batch. The real full disk is in
tests/integration/test_cluster_disk.py."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from minibatch.config import Config, Paths
from minibatch.core.job import Job, JobOptions, JobRequest, JobResult, JobSpec
from minibatch.core.reservation import Reservation
from minibatch.core.snapshot import Plan, Start
from minibatch.errors import ErrorCode, StorageError
from minibatch.protocol import decode, encode
from minibatch.protocol.messages import (
    Error,
    JobEnded,
    JobList,
    Launch,
    Message,
    NodeHello,
    NodeList,
    Ok,
    QueryJobs,
    QueryNodes,
    Submit,
    Submitted,
)
from minibatch.protocol.scheduling import ApplyPlan, SchedHello
from minibatch.server import booking, liveness
from minibatch.server.requests import Request
from minibatch.server.service import Server
from minibatch.server.store import Store
from minibatch.server.submit import Caller

CALLER = Caller(os.getuid(), os.getgid(), os.getpid())
NODE, SCHED = b"node0", b"sched"


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


class FailingDisk:
    """A store's connection whose COMMIT fails while ``error`` is set, the way
    SQLite's does on a full disk: the transaction is rolled back, then the error
    is raised."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.error: Exception | None = None

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT" and self.error is not None:
            self.db.execute("ROLLBACK")
            raise self.error
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


FULL = sqlite_error("database or disk is full", sqlite3.SQLITE_FULL)


def spec(name: str, mail: str = "") -> JobSpec:
    return JobSpec(
        name=name,
        workdir="/tmp",
        request=JobRequest(ppn=1),
        argv=["true"],
        options=JobOptions(mail_points=mail),
    )


def ended(job: int) -> JobEnded:
    return JobEnded(
        job=job,
        result=JobResult.COMPLETED,
        exit_status=0,
        signal=None,
        end_time=1.0,
        cputime_s=0.0,
        maxrss_kb=0,
    )


class Harness:
    """A server without sockets: requests go in as batches, and what it sends,
    publishes and mails is kept."""

    def __init__(self, home: Path) -> None:
        self.paths = Paths(home)
        self.paths.state.mkdir(parents=True)
        self.server = Server(self.paths, Config())
        store = self.server.state.store
        self.disk = FailingDisk(store._db)
        store._db = self.disk  # type: ignore[assignment]
        self.server.driver = self  # type: ignore[assignment]
        self.server.publisher = self  # type: ignore[assignment]
        self.server.mailer = self  # type: ignore[assignment]
        self.sent: list[tuple[bytes, int, Message]] = []
        self.topics: list[str] = []
        self.mails = 0
        self._ids = itertools.count(1)

    # The driver, the publisher and the mailer.
    def send(self, frames: list[Any]) -> bool:
        env = decode(frames[1])
        self.sent.append((frames[0], env.re, env.body))
        return True

    def send_all(self, letters: list[Any], host: str) -> None:
        self.mails += len(letters)

    def publish(self, topic: str, payload: Any, retain: bool = False) -> None:
        self.topics.append(topic)

    def batch(self, *requests: tuple[bytes, Message]) -> list[Message]:
        """Handle ``requests`` as one batch; their replies, in order."""
        ids = [next(self._ids) for _ in requests]
        batch = [
            Request(who, encode(body, rid), CALLER)
            for rid, (who, body) in zip(ids, requests, strict=True)
        ]
        start = len(self.sent)
        self.server.on_batch(batch)
        replies = {rid: body for _, rid, body in self.sent[start:] if rid}
        return [replies[rid] for rid in ids]

    def ask(self, body: Message, who: bytes = b"client") -> Message:
        return self.batch((who, body))[0]

    def stored_jobs(self) -> dict[int, Job]:
        """What a restarted server would find."""
        other = Store(self.paths.database)
        try:
            jobs = {j.id: j for j in other.load_jobs()}
            jobs.update({j.id: j for j in other.finished_jobs()})
            return jobs
        finally:
            other.close()

    def close(self) -> None:
        self.server.state.store.close()


HELLO = NodeHello(name="node0", cpus=[0], mem_kb=None, pid=4242)


@pytest.fixture
def harness(tmp_path: Path) -> Any:
    """A server with node0 (one CPU) up."""
    h = Harness(tmp_path / "home")
    assert isinstance(h.ask(HELLO, NODE), Ok)
    yield h
    h.close()


def storage_error(reply: Message) -> str:
    assert isinstance(reply, Error), reply
    assert reply.code == ErrorCode.STORAGE
    return reply.message


# ------------------------------------------------------------------ store


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (FULL, "No space left on device"),
        (sqlite_error("disk I/O error", 10 | (3 << 8)), "Input/output error"),
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "No space left on device"),
        (sqlite_error("database is locked", sqlite3.SQLITE_BUSY), "database is locked"),
    ],
)
def test_a_failed_commit_names_its_cause_and_writes_nothing(
    tmp_path: Path, error: Exception, cause: str
) -> None:
    store = Store(tmp_path / "db")
    disk = FailingDisk(store._db)
    store._db = disk  # type: ignore[assignment]
    try:
        store.set_next_id(2)
        store.commit()
        store.set_next_id(3)
        disk.error = error
        with pytest.raises(StorageError) as caught:
            store.commit()
        assert str(caught.value) == (
            f"cannot save the change: {cause} ({tmp_path / 'db'}); nothing was changed"
        )
        assert caught.value.code is ErrorCode.STORAGE and caught.value.cause == cause
        assert not disk.db.in_transaction and store.next_id() == 2
        store.discard()
        disk.error = None
        store.set_next_id(4)
        store.commit()  # and the next works
        assert store.next_id() == 4
    finally:
        store.close()


def test_a_read_only_database_is_a_storage_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    try:
        store._db.execute("PRAGMA query_only = ON")  # SQLite's own SQLITE_READONLY
        store.set_next_id(5)
        with pytest.raises(StorageError, match="read-only database or file system"):
            store.commit()
        assert not store._db.in_transaction
    finally:
        store.close()


def test_queries_see_queued_writes_without_committing_them(
    harness: Harness,
) -> None:
    state = harness.server.state
    (job,) = state.submit(spec("done"), caller=CALLER)
    state.cancel(job)
    store = state.store
    assert [j.id for j in store.finished_jobs(user=job.user)] == [job.id]
    assert [e for _, e, _ in store.events_of(job.id)] == ["submitted", "finished"]
    assert store.latest_per_user(10)[-1].id == job.id
    assert harness.stored_jobs() == {}  # nothing reached the database yet
    store.commit()
    assert list(harness.stored_jobs()) == [job.id]


# ----------------------------------------------------------------- server


async def test_a_refused_batch_is_answered_at_once_and_leaves_no_trace(
    harness: Harness,
) -> None:
    kept = harness.ask(Submit(spec=spec("kept")))
    assert isinstance(kept, Submitted) and kept.ids == [1]
    topics = list(harness.topics)
    harness.disk.error = FULL
    refused, listing = harness.batch(
        (b"qsub", Submit(spec=spec("refused"))), (b"qstat", QueryJobs())
    )
    db = harness.paths.database
    assert storage_error(refused) == (
        f"cannot save the change: No space left on device ({db}); nothing was changed"
    )
    # The query wrote nothing: handled again after the rollback, it does not
    # show the job its neighbour was refused.
    assert isinstance(listing, JobList)
    assert [j.name for j in listing.jobs] == ["kept"]
    assert list(harness.server.state.jobs) == [1]
    assert harness.topics == topics  # no event of the refused batch
    # Reads go on while the disk is full.
    nodes, jobs = harness.batch((b"a", QueryNodes()), (b"b", QueryJobs()))
    assert isinstance(nodes, NodeList) and isinstance(jobs, JobList)

    harness.disk.error = None
    later = harness.ask(Submit(spec=spec("later")))
    # The refused job's id was never told to anyone: the next job takes it.
    assert isinstance(later, Submitted) and later.ids == [2]
    stored = harness.stored_jobs()
    assert {j.name for j in stored.values()} == {"kept", "later"}
    assert {j.name for j in harness.server.state.jobs.values()} == {"kept", "later"}


async def test_a_node_report_that_cannot_be_saved_is_refused_and_taken_later(
    harness: Harness,
) -> None:
    assert isinstance(harness.ask(SchedHello(pid=7, policy="fifo"), SCHED), Ok)
    harness.ask(Submit(spec=spec("first", mail="e")))
    harness.ask(Submit(spec=spec("second")))
    plan = Plan(generation=0, starts=[Start(1, ("node0",))])
    harness.ask(ApplyPlan(plan=plan), SCHED)
    launched = [m.spec.job for _, _, m in harness.sent if isinstance(m, Launch)]
    assert launched == [1]
    generation = harness.server.state.generation

    harness.disk.error = FULL
    sent, topics = len(harness.sent), list(harness.topics)
    reply = harness.ask(ended(1), NODE)
    storage_error(reply)
    # Only the error left: no launch of the next job, no event, no mail.
    assert [m for _, _, m in harness.sent[sent:]] == [reply]
    assert harness.topics == topics and harness.mails == 0
    state = harness.server.state
    assert [state.jobs[i].state.value for i in (1, 2)] == ["running", "queued"]
    assert state.nodes.nodes["node0"].info().jobs == {1: [0]}
    # What the database does not hold stays: the connections.
    node = state.nodes.nodes["node0"]
    assert node.up and node.route == NODE
    assert (state.scheduler, state.scheduler_pid) == (SCHED, 7)
    assert state.generation > generation

    harness.disk.error = None
    assert isinstance(harness.ask(ended(1), NODE), Ok)  # the node's resend
    done = harness.stored_jobs()[1]
    assert done.result is JobResult.COMPLETED and harness.mails == 1


async def test_failed_commits_are_logged_once_per_cause(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="minibatch.server")
    harness.disk.error = FULL
    for i in range(20):
        storage_error(harness.ask(Submit(spec=spec(f"j{i}"))))
    failed = [r for r in caplog.records if "commit failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert "No space left on device" in failed[0].getMessage()

    harness.disk.error = None
    assert isinstance(harness.ask(Submit(spec=spec("ok"))), Submitted)
    lines = [r.getMessage() for r in caplog.records]
    assert "failed commits (No space left on device): suppressed 19 more" in (
        " ".join(lines)
    )
    assert "commits work again (20 failed before)" in lines


async def test_what_a_refused_batch_announced_is_announced_again(
    harness: Harness,
) -> None:
    server = harness.server
    now = time.time()
    resv = Reservation(name="r.1", start=now - 1, end=now + 3600, alloc=[])
    server.state.reservations.add(resv)  # its start not yet announced
    server.state.store.put_reservation(resv)
    assert server.flush() is None
    server.state.nodes.nodes["node0"].last_heartbeat = now - 3600  # silent

    harness.disk.error = FULL
    topics = list(harness.topics)
    booking.tick(server.state)  # announces the start: no write of its own
    liveness.check_nodes(server.state, timeout=10.0)  # node0 down: a write
    assert isinstance(server.flush(), Error)
    assert harness.topics == topics

    harness.disk.error = None
    booking.tick(server.state)
    assert server.flush() is None
    assert harness.topics[len(topics) :] == [
        "nodes/node0/state",
        "reservations/r.1/started",
    ]
    assert server.state.nodes.nodes["node0"].state.value == "down"
