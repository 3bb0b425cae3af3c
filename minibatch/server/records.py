"""What the server sends about a job: the node's launch order and the MQTT event."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from minibatch.core.job import Job, eligible_since, limit_of
from minibatch.core.snapshot import PendingView
from minibatch.policy.base import mem_per_node
from minibatch.protocol.messages import LaunchSpec
from minibatch.protocol.scheduling import ApplyPlan

if TYPE_CHECKING:
    from minibatch.server.booking import PolicyChoice
    from minibatch.server.nodes import Node


def launch_spec(job: Job, nodes: Mapping[str, Node]) -> LaunchSpec:
    """The launch order of ``job`` for its first node (``nodes``: the
    cluster's). A job whose nodes all run on this machine runs there with the
    real cores and the memory of all of them; one that spans hosts, with its
    first node's."""
    here = [nodes.get(a.node) for a in job.alloc]
    first = here[0] if here else None
    together = (first is not None and first.lends) and all(
        n is not None and not n.remote for n in here
    )
    others: set[int] = set()
    for a, node in zip(job.alloc[1:], here[1:], strict=True):
        if together and node is not None:
            others.update(node.real_cpus.get(c, c) for c in a.cpus)
    return LaunchSpec(
        job=job.id,
        display_id=job.display_id,
        name=job.name,
        user=job.user,
        uid=job.uid,
        gid=job.gid,
        workdir=job.workdir,
        script=job.script,
        argv=job.argv,
        env=job.env,
        stdout_path=job.stdout_path,
        stderr_path=job.stderr_path,
        join=job.join,
        cpus=job.alloc[0].cpus,
        hosts=[a.node for a in job.alloc],
        walltime=math.ceil(limit_of(job)),
        mem_kb=_mem_here(job, len(job.alloc) if together else 1),
        array_id=job.array_id,
        array_index=job.array_index,
        malleable=job.request.malleable is not None,
        options=job.options,
        queue=job.queue,
        account=job.account,
        gpus=job.alloc[0].gpus,
        reruns=job.reruns,
        other_cores=sorted(others),
    )


def _mem_here(job: Job, nodes: int) -> int | None:
    """The memory of ``nodes`` of the job's nodes (all its processes run on
    its first node, with those nodes' CPUs)."""
    per_node = mem_per_node(job.request)
    return None if per_node is None else per_node * max(1, nodes)


def pass_event(
    msg: ApplyPlan,
    started: list[int],
    rejected: dict[int, str],
    now: float,
    policy: PolicyChoice,
) -> dict[str, Any]:
    """The JSON payload published for a scheduling pass (``sched/pass``)."""
    plan = msg.plan
    backfilled = set(plan.backfilled)
    return {
        "time": now,
        "policy": policy.name,
        "params": policy.params,
        "generation": plan.generation,
        "duration_ms": round(msg.elapsed * 1e3, 3),
        "pending": msg.pending,
        "started": len(started),
        "backfilled": sum(1 for j in started if j in backfilled),
        "reserved": len(plan.predicted),
        "resized": len(plan.resizes),
        "rejected": len(rejected),
    }


def job_event(job: Job, event: str, when: float, detail: str) -> dict[str, Any]:
    """The JSON payload published for a job event."""
    return {
        "id": job.display_id,
        "event": event,
        "time": when,
        "detail": detail,
        "name": job.name,
        "user": job.user,
        "state": job.state.value,
        "result": job.result.value if job.result else None,
        "exit_status": job.exit_status,
        "node": job.alloc[0].node if job.alloc else None,
        "cpus": job.alloc[0].cpus if job.alloc else [],
        # What a live view draws without asking the server: every node's CPUs
        # (multi-node jobs), the request, and the job's times.
        "alloc": {a.node: a.cpus for a in job.alloc},
        "ncpus": job.request.cpus,
        "walltime": job.request.walltime,
        "queue": job.queue,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
    }


def pending_view(job: Job, queue_priority: float = 0.0) -> PendingView:
    """A job as a policy sees it while it waits."""
    return PendingView(
        id=job.id,
        user=job.user,
        group=job.group,
        request=job.request,
        submit_time=job.submit_time,
        account=job.account,
        qos=job.qos,
        advres=job.advres,
        eligible_since=eligible_since(job),
        queue=job.queue,
        queue_priority=queue_priority,
        user_priority=job.options.priority,
        features=tuple(job.options.features),
    )
