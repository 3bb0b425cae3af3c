"""Builders for policy tests: snapshots with memory, GPUs and reservations, and a
partial matcher for decisions (``Like(job=3)`` equals any ``Start`` of job 3)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import (
    ClusterSnapshot,
    NodeView,
    PendingView,
    Plan,
    ReservationView,
    RunningView,
    Start,
)

GB = 1024 * 1024


class Like:
    """Equal to any object whose named attributes have these values."""

    def __init__(self, **attrs: Any) -> None:
        self.attrs = attrs

    def __eq__(self, other: object) -> bool:
        return all(getattr(other, k, object()) == v for k, v in self.attrs.items())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"Like({inner})"


def node(
    name: str, cpus: int, mem_kb: int | None = None, gpus: int = 0
) -> tuple[str, int, int | None, int]:
    return (name, cpus, mem_kb, gpus)


def running(
    id: int,
    on: dict[str, int],
    start: float = 0.0,
    walltime: float = 100.0,
    *,
    mem_kb: int | None = None,
    gpus: int = 0,
    advres: str = "",
    user: str = "u",
) -> RunningView:
    """A running job holding ``on[node]`` CPUs (and ``mem_kb``/``gpus`` per node)."""
    return RunningView(
        id=id,
        user=user,
        nodes=tuple(on.items()),
        mem_kb_per_node=mem_kb,
        start_time=start,
        walltime=walltime,
        gpus_per_node=gpus,
        advres=advres,
    )


def job(
    id: int,
    ppn: int = 1,
    walltime: int = 100,
    *,
    nodes: int = 1,
    mem_kb: int | None = None,
    gpus: int = 0,
    user: str = "u",
    submit: float | None = None,
    advres: str = "",
) -> PendingView:
    return PendingView(
        id=id,
        user=user,
        group="g",
        request=JobRequest(
            nodes=nodes, ppn=ppn, mem_kb=mem_kb, walltime=walltime, gpus=gpus
        ),
        submit_time=float(id) if submit is None else submit,
        advres=advres,
    )


def snap(
    nodes: Iterable[tuple[str, int, int | None, int]] | Sequence[int],
    running: Iterable[RunningView] = (),
    pending: Iterable[PendingView] = (),
    *,
    now: float = 0.0,
    reservations: Iterable[ReservationView] = (),
) -> ClusterSnapshot:
    """Nodes as capacities (``node(...)`` tuples, or plain CPU counts named
    n0, n1, ...); free resources are capacity less what ``running`` holds."""
    specs = [
        (f"n{i}", n, None, 0) if isinstance(n, int) else n for i, n in enumerate(nodes)
    ]
    run = list(running)
    views = []
    for name, cpus, mem, gpus in specs:
        used = sum(c for r in run for n, c in r.nodes if n == name)
        used_mem = sum(
            r.mem_kb_per_node or 0 for r in run for n, _ in r.nodes if n == name
        )
        used_gpus = sum(r.gpus_per_node for r in run for n, _ in r.nodes if n == name)
        views.append(
            NodeView(
                name=name,
                cpus=cpus,
                free_cpus=cpus - used,
                mem_kb=mem,
                free_mem_kb=None if mem is None else mem - used_mem,
                gpus=gpus,
                free_gpus=gpus - used_gpus,
            )
        )
    return ClusterSnapshot(
        now=now,
        generation=1,
        nodes=tuple(views),
        running=tuple(run),
        pending=tuple(pending),
        reservations=tuple(reservations),
    )


def started(plan: Plan) -> list[int]:
    return [s.job for s in plan.starts]


def test_like_matches_on_named_attributes_only():
    assert Start(3, ("n0",)) == Like(job=3)
    assert Start(3, ("n0",)) != Like(job=4)
    assert [Start(1, ("a",)), Start(2, ("b",))] == [Like(job=1), Like(nodes=("b",))]


def test_snap_derives_free_resources_from_running_jobs():
    s = snap(
        [node("a", 8, 16 * GB, 2)],
        [running(1, {"a": 3}, mem_kb=4 * GB, gpus=1)],
    )
    (a,) = s.nodes
    assert (a.free_cpus, a.free_mem_kb, a.free_gpus) == (5, 12 * GB, 1)
