"""What would another policy do with the queue as it is now?

:func:`whatif` replays a live cluster's snapshot in the simulator twice, under the
policy the cluster runs and under another, and gives each waiting job's start
under both and the mean wait of each. It is pure (no IO), for ``mb whatif`` and
any view that shows the same (``mb top``, ``mb web``).

How the snapshot becomes a simulation (a :class:`~minibatch.sim.backlog.Backlog`
at the snapshot's ``now``):

* **Nodes**: those in the snapshot (up and online), with their CPUs and memory.
* **Running jobs** hold their CPUs until their expected end, start + time limit
  (``RunningView.expected_end``): the simulator cannot know how long a job will
  really run, so every job runs for its whole requested time, which is also
  what the policies plan with. None is resized.
* **Waiting jobs** are the snapshot's pending jobs (held jobs, jobs waiting on a
  dependency and jobs over a QOS limit are not in it), in queue order, with their
  priorities, each running for its requested walltime. Left out, with the
  reason (:attr:`WhatIf.skipped`): jobs bound to an advance reservation, jobs
  that need GPUs or node features (the simulated nodes have neither), and jobs
  no set of the nodes up now could hold.
* **Reservations** not yet over: downtimes as they are; a user reservation
  becomes CPUs held for nobody, less those its running jobs hold until they end
  (the jobs that may use it are left out above, so nobody else may use them).
* Usage-aware policies (fairshare, PSP) see only the usage of the running and
  simulated jobs, from their starts: the cluster's older history is not in a
  snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import fmean
from typing import Any

import msgspec

from minibatch.core.snapshot import (
    ClusterSnapshot,
    PendingView,
    ReservationView,
    RunningView,
)
from minibatch.errors import MinibatchError
from minibatch.policy import registry
from minibatch.policy.base import Policy, mem_per_node
from minibatch.sim.backlog import Backlog
from minibatch.sim.engine import PlanRejected, Simulator
from minibatch.sim.machine import Machine, NodeSpec
from minibatch.sim.swf import TraceJob

__all__ = ["WhatIf", "WhatIfRow", "whatif"]


class WhatIfRow(msgspec.Struct, frozen=True, kw_only=True):
    """One waiting job: its start under the current policy and under the other
    (times since the epoch, as the snapshot's)."""

    job: int
    user: str
    cpus: int
    submit: float
    current: float
    other: float
    #: ``other - current``: negative when the other policy starts it sooner.
    delta: float


class WhatIf(msgspec.Struct, frozen=True, kw_only=True):
    """Both simulations of one snapshot, side by side."""

    now: float
    current: str
    current_params: dict[str, Any]
    policy: str
    params: dict[str, Any]
    #: The waiting jobs simulated, in queue order.
    rows: list[WhatIfRow]
    #: Mean of start - submit over ``rows``, under each policy (None: no row).
    current_mean_wait: float | None
    mean_wait: float | None
    #: Waiting jobs left out of the simulation, and why.
    skipped: dict[int, str] = {}


def whatif(
    snapshot: ClusterSnapshot,
    policy_name: str,
    params: dict[str, Any],
    current_name: str,
    current_params: dict[str, Any],
    *,
    modules: Mapping[str, str] | None = None,
) -> WhatIf:
    """Simulate ``snapshot`` under the current policy and under ``policy_name``.

    Args:
        snapshot: a live cluster's snapshot (``GetSnapshot(peek=True)``).
        policy_name, params: the policy to try, and its parameters.
        current_name, current_params: the policy the cluster runs.
        modules: the configuration's ``[scheduler.policy_modules]``.

    Raises:
        InvalidArgument: an unknown policy (or a ``module:callable``) or bad
            parameters.
        MinibatchError: a policy that leaves jobs waiting forever or makes a
            decision the server would refuse.
    """
    # By name only, as ``mb policy set`` takes them.
    other = registry.load_named(policy_name, params, modules)
    current = registry.load_named(current_name, current_params, modules)
    machine, backlog, downtimes, skipped = prepare(snapshot)
    now_starts = _starts(current_name, current, machine, backlog, downtimes)
    new_starts = _starts(policy_name, other, machine, backlog, downtimes)
    rows = [
        WhatIfRow(
            job=view.id,
            user=view.user,
            cpus=view.request.cpus,
            submit=view.submit_time,
            current=now_starts[view.id],
            other=new_starts[view.id],
            delta=new_starts[view.id] - now_starts[view.id],
        )
        for view, _ in backlog.queued
    ]
    return WhatIf(
        now=snapshot.now,
        current=current_name,
        current_params=dict(current_params),
        policy=policy_name,
        params=dict(params),
        rows=rows,
        current_mean_wait=_mean_wait(rows, lambda r: r.current),
        mean_wait=_mean_wait(rows, lambda r: r.other),
        skipped=skipped,
    )


def _mean_wait(
    rows: Sequence[WhatIfRow], start: Callable[[WhatIfRow], float]
) -> float | None:
    return fmean(start(r) - r.submit for r in rows) if rows else None


def _starts(
    name: str,
    policy: Policy,
    machine: Machine,
    backlog: Backlog,
    downtimes: list[ReservationView],
) -> dict[int, float]:
    if not backlog.queued:
        return {}
    sim = Simulator(policy, machine, [], reservations=downtimes, backlog=backlog)
    try:
        outcomes = sim.run()
    except PlanRejected as exc:
        raise MinibatchError(f"policy {name!r} cannot plan this queue: {exc}") from exc
    return {o.job.id: o.start for o in outcomes}


def prepare(
    snapshot: ClusterSnapshot,
) -> tuple[Machine, Backlog, list[ReservationView], dict[int, str]]:
    """The simulated machine, the backlog, the downtimes and the waiting jobs
    left out (with why) for ``snapshot`` (see the module docstring)."""
    now = snapshot.now
    nodes = tuple(NodeSpec(n.name, n.cpus, n.mem_kb) for n in snapshot.nodes)
    up = {n.name for n in nodes}
    running: list[RunningView] = []
    for r in snapshot.running:
        held = tuple((name, cpus) for name, cpus in r.nodes if name in up)
        if held:  # a job on a node now down holds nothing the policy can use
            running.append(
                msgspec.structs.replace(
                    r, nodes=held, malleable=None, gpus_per_node=0, advres=""
                )
            )
    queued: list[tuple[PendingView, TraceJob]] = []
    skipped: dict[int, str] = {}
    for view in snapshot.pending:
        why = _left_out(view, snapshot)
        if why:
            skipped[view.id] = why
        else:
            queued.append((view, _trace_job(view)))
    backlog = Backlog(now, tuple(running), tuple(queued), snapshot.qos)
    return Machine(nodes=nodes), backlog, _downtimes(snapshot), skipped


def _left_out(view: PendingView, snapshot: ClusterSnapshot) -> str:
    """Why ``view`` cannot be simulated, or ""."""
    req = view.request
    if view.advres:
        return f"runs inside reservation {view.advres!r}"
    if req.gpus or view.features:
        return "needs GPUs or node features, which the simulator does not model"
    mem = mem_per_node(req)
    fit = sum(
        1
        for n in snapshot.nodes
        if n.cpus >= req.ppn and (mem is None or n.mem_kb is None or n.mem_kb >= mem)
    )
    if fit < req.nodes:
        return "no set of the nodes up now can hold it"
    return ""


def _trace_job(view: PendingView) -> TraceJob:
    """The job as the simulator runs it: for its whole requested time."""
    req = view.request
    return TraceJob(
        id=view.id,
        user=view.user,
        group=view.group,
        queue=view.queue,
        submit=view.submit_time,
        run_time=float(req.walltime),
        procs=req.cpus,
        req_time=float(req.walltime),
        mem_kb=req.mem_kb,
        request=req,
    )


def _downtimes(snapshot: ClusterSnapshot) -> list[ReservationView]:
    """The reservations not yet over, as CPUs held for nobody from now on."""
    now = snapshot.now
    up = {n.name for n in snapshot.nodes}
    out = []
    for resv in snapshot.reservations:
        if resv.end <= now:
            continue
        start = max(resv.start, now)
        inside = [r for r in snapshot.running if resv.users and r.advres == resv.name]
        for node, cpus in resv.nodes:
            if node not in up:
                continue
            # Its jobs hold some of its CPUs until they end; then it has them back.
            held = [
                (r.expected_end(now), sum(c for n, c in r.nodes if n == node))
                for r in inside
            ]
            pieces = [(start, cpus - sum(c for _, c in held))]
            pieces += [(max(start, end), c) for end, c in held if c and end < resv.end]
            out += [
                ReservationView(
                    name=resv.name, start=begin, end=resv.end, nodes=((node, count),)
                )
                for begin, count in pieces
                if count > 0
            ]
    return out
