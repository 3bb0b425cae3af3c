"""Shared fixtures: snapshot builders for policies, a server state on a temp DB."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, NodeView, PendingView, RunningView
from minibatch.server.nodes import Node
from minibatch.server.state import ServerState
from minibatch.server.store import Store
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob

# pytest-xdist titles its workers with setproctitle, which by default moves the
# environment aside to make room and leaves the process's /proc/PID/environ all
# but empty; tests read their own there (procfs). Read before any worker starts.
os.environ.setdefault("SPT_NOENV", "1")


def snapshot(
    nodes: list[int],
    running: list[tuple[int, int, float, float]] = (),  # type: ignore[assignment]
    pending: list[tuple[int, int, float]] = (),  # type: ignore[assignment]
    now: float = 0.0,
) -> ClusterSnapshot:
    """Nodes by CPU count; running (id, cpus, start, walltime) packed first-fit
    onto the nodes; pending (id, cpus, walltime) in queue order."""
    free = {f"n{i}": c for i, c in enumerate(nodes)}
    running_views = []
    for jid, cpus, start, wall in running:
        name = next(n for n, f in free.items() if f >= cpus)
        free[name] -= cpus
        running_views.append(
            RunningView(
                id=jid,
                user="u",
                nodes=((name, cpus),),
                mem_kb_per_node=None,
                start_time=start,
                walltime=wall,
            )
        )
    return ClusterSnapshot(
        now=now,
        generation=1,
        nodes=tuple(
            NodeView(name=f"n{i}", cpus=c, free_cpus=free[f"n{i}"])
            for i, c in enumerate(nodes)
        ),
        running=tuple(running_views),
        pending=tuple(
            PendingView(
                id=jid,
                user="u",
                group="g",
                request=JobRequest(ppn=cpus, walltime=int(wall)),
                submit_time=float(jid),
            )
            for jid, cpus, wall in pending
        ),
    )


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server_state(tmp_path: Path, clock: Clock) -> Iterator[ServerState]:
    """A server state with two 2-CPU nodes up, on a temporary database."""
    store = Store(tmp_path / "db.sqlite")
    for i in range(2):
        store.put_node(Node(name=f"n{i}", cpus=[2 * i, 2 * i + 1], pid=100 + i))
    store.commit()
    state = ServerState(store, clock=clock)
    for node in state.nodes.nodes.values():
        node.up, node.route = True, f"route-{node.name}".encode()
    yield state
    validate(state)
    store.close()


def validate(state: ServerState) -> None:
    """Invariants that must hold after any sequence of operations."""
    from minibatch.core.job import ACTIVE_STATES, JobState

    held: dict[tuple[str, int], int] = {}
    for job in state.jobs.values():
        if job.state in ACTIVE_STATES:
            assert job.alloc, f"active job {job.id} has no allocation"
        for alloc in job.alloc:
            for cpu in alloc.cpus:
                assert (alloc.node, cpu) not in held, "CPU allocated twice"
                held[(alloc.node, cpu)] = job.id
    queued = {j.id for j in state.jobs.values() if j.state is JobState.QUEUED}
    assert set(state.queue) == queued, "queue out of step with job states"
    active = {j.id for j in state.jobs.values() if j.state in ACTIVE_STATES}
    assert state.active == active, "active set out of step with job states"
    users: dict[str, set[int]] = {}
    for job in state.jobs.values():
        users.setdefault(job.user, set()).add(job.id)
    assert state.by_user == users, "user index out of step with the jobs"
    snap = state.snapshot()
    keys = [(p.submit_time, p.id) for p in snap.pending]
    assert keys == sorted(keys), "snapshot queue not in priority order"
    for node in state.nodes.nodes.values():
        for cpu, jid in node.used.items():
            assert held.get((node.name, cpu)) == jid, (
                f"stale allocation {node.name}/{cpu}"
            )


def trace_job(
    id: int,
    submit: float,
    run: float,
    procs: int,
    req: float | None = None,
    user: str = "u",
    machine: Machine | None = None,
    mem_kb: int | None = None,
) -> TraceJob:
    """A simulator job; ``req`` (requested time) defaults to ``run``, the machine
    to one large flat pool."""
    m = machine or Machine.pool(1 << 20)
    req_time = run if req is None else req
    request = m.request(procs, mem_kb, int(req_time))
    assert request is not None
    return TraceJob(
        id=id,
        user=user,
        group="g",
        queue="1",
        submit=submit,
        run_time=run,
        procs=procs,
        req_time=req_time,
        mem_kb=mem_kb,
        request=request,
    )
