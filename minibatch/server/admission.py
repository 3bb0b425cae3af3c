"""What a submission becomes before it is queued: its queue and walltime, the
node features and GPUs it asks for, its group, the array tasks it depends on.

Each step either refuses the job (nothing has changed yet) or adjusts it, adding
a one-line note for the submitter when it set aside something they asked for.
"""

from __future__ import annotations

import grp
from typing import TYPE_CHECKING

import msgspec

from minibatch.core.job import Dependency, JobOptions, JobRequest, JobSpec
from minibatch.errors import (
    InfeasibleRequest,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from minibatch.server.submit import Caller

if TYPE_CHECKING:
    from minibatch.server.state import ServerState


def admit(
    state: ServerState, spec: JobSpec, caller: Caller, notes: list[str]
) -> tuple[JobSpec, Caller]:
    """``spec`` as it will be queued, and who it runs as; or raise."""
    queue = state.queues.resolve(spec, caller.user, notes)
    walltime = state.queues.walltime(queue, spec)
    request = msgspec.structs.replace(spec.request, walltime=walltime)
    options = spec.options
    if options.spread:
        request = _spread(state, request, options, notes)
    features = _features(state, options.features, notes)
    if features != options.features:
        options = msgspec.structs.replace(options, features=features)
    why = state.nodes.feasible(request, features)
    if why is not None:
        raise InfeasibleRequest(f"job can never run: {why}")
    if options.group:
        caller = _in_group(caller, options.group)
    depends = spec.depends
    if options.slurm:
        # In Slurm an array's id names the whole array.
        depends = [
            Dependency(d.kind, d.job, True)
            if d.job in state.arrays and d.task is None
            else d
            for d in depends
        ]
    depends = _expand_arrays(state, depends)
    spec = msgspec.structs.replace(
        spec,
        queue=queue.name,
        request=request,
        options=options,
        depends=depends,
    )
    return spec, caller


def _spread(
    state: ServerState, request: JobRequest, options: JobOptions, notes: list[str]
) -> JobRequest:
    """Tasks that no one node holds, over as few nodes as hold them (whole
    tasks per node), as Slurm places ``-n`` and Torque ``procs=``; memory
    asked per node (``--mem``) is asked on each of them."""
    per_task = options.cpus_per_task or 1
    biggest = max((len(n.cpus) for n in state.nodes.nodes.values()), default=0)
    room = biggest // per_task * per_task
    if request.nodes != 1 or request.ppn <= biggest or room == 0:
        return request
    tasks = request.ppn // per_task
    nodes = -(-request.ppn // room)
    ppn = -(-tasks // nodes) * per_task
    notes.append(f"{request.ppn} CPUs: spread over {nodes} nodes of {ppn} CPUs")
    mem = request.mem_kb
    if mem is not None and options.mem_per_node:
        mem *= nodes
    return msgspec.structs.replace(request, nodes=nodes, ppn=ppn, mem_kb=mem)


def _features(state: ServerState, asked: list[str], notes: list[str]) -> list[str]:
    """The features some node has; the others are refused under ``strict``, or
    set aside with a note."""
    known = state.nodes.all_features()
    unknown = [f for f in asked if f not in known]
    if not unknown:
        return asked
    have = ", ".join(sorted(known)) or "none"
    if state.queues.strict:
        raise InvalidArgument(
            f"no node has feature {', '.join(unknown)} (features here: {have})"
        )
    notes.append(
        f"node feature {', '.join(unknown)}: no node has it (features here: "
        f"{have}); the job runs without it"
    )
    return [f for f in asked if f in known]


def _in_group(caller: Caller, group: str) -> Caller:
    """``-W group_list=GROUP``: run as that group, if the user is in it."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        raise InvalidArgument(f"group_list: no group {group!r}") from None
    if (
        caller.uid != 0
        and entry.gr_gid != caller.gid
        and (caller.user not in entry.gr_mem)
    ):
        raise PermissionDenied(f"group_list: {caller.user} is not in group {group!r}")
    return Caller(caller.uid, entry.gr_gid, caller.pid)


def _expand_arrays(state: ServerState, deps: list[Dependency]) -> list[Dependency]:
    """``afterokarray:5[]`` -> one dependency on each task of array 5, and
    ``afterok:5[3]`` -> one on the job id of its task 3."""
    if not any(d.whole_array or d.task is not None for d in deps):
        return deps
    out: list[Dependency] = []
    for dep in deps:
        if not dep.whole_array and dep.task is None:
            out.append(dep)
            continue
        tasks = [state.jobs[i] for i in state.arrays.get(dep.job, [])]
        tasks += state.store.finished_in_array(dep.job)
        if dep.task is not None:
            tasks = [t for t in tasks if t.array_index == dep.task]
            if not tasks:
                raise NotFound(
                    f"dependency on unknown array task {dep.job}[{dep.task}]"
                )
        elif not tasks:
            raise NotFound(f"dependency on unknown array {dep.job}[]")
        out += [Dependency(dep.kind, t) for t in sorted({t.id for t in tasks})]
    return out
