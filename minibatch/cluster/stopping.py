"""The ways ``mb down`` may treat running jobs, and the sweep after it.

* default: each node kills its jobs; rerunnable ones go back to the queue;
* ``--drain``: the scheduler stops first, so nothing new starts, and the rest
  stops once no job runs;
* ``--keep-running``: the nodes leave their jobs in their cgroups (SIGUSR2), for
  the node daemons of the next ``mb up`` to re-adopt.

Whatever the mode, a job whose node daemon was already dead is found by the
record it left in the spool (:mod:`minibatch.node.records`) and killed, unless
jobs are being kept: nothing a job started outlives ``mb down``. Its node's
next daemon tells the server, which requeues it or, ``-r n``, cancels it, as
for the jobs of a node that stops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import psutil

from minibatch.config import Config, Paths
from minibatch.core.job import ACTIVE_STATES
from minibatch.errors import InvalidArgument, MinibatchError
from minibatch.net.client import Client
from minibatch.node import cgroup, keeper, procfs, reaper, records
from minibatch.node.cgroup import JobCgroup
from minibatch.node.launcher import remove_spool_files
from minibatch.protocol.messages import JobList, NodeList, QueryJobs, QueryNodes


def check_keep(paths: Paths, config: Config) -> None:
    """Refuse ``--keep-running`` unless every node keeps its jobs in cgroups."""
    try:
        with Client(config.server_endpoint(paths), 5.0) as client:
            nodes: NodeList = client.call(QueryNodes())
    except MinibatchError as exc:
        raise InvalidArgument(
            f"--keep-running needs the server to say how nodes run jobs: {exc}"
        ) from None
    without = [n.name for n in nodes.nodes if not n.enforcement.startswith("cgroup")]
    if without:
        raise InvalidArgument(
            "--keep-running needs cgroups, and node(s) "
            + ", ".join(without)
            + " run jobs without them (see mb status); nothing was stopped"
        )


def wait_drained(paths: Paths, config: Config, progress: Callable[[int], None]) -> None:
    """Wait until the server runs no job (the scheduler is stopped already)."""
    last = -1
    with Client(config.server_endpoint(paths), 10.0) as client:
        while True:
            jobs: JobList = client.call(QueryJobs())
            active = sum(j.state in ACTIVE_STATES for j in jobs.jobs)
            if active == 0:
                return
            if active != last:
                progress(active)
                last = active
            time.sleep(0.5)


def kept_jobs(paths: Paths) -> bool:
    """Whether jobs of this cluster may still run without a node daemon."""
    return any(paths.spool.glob("*.run")) if paths.spool.is_dir() else False


def sweep(paths: Paths) -> int:
    """Kill what jobs of dead node daemons left running; how many jobs."""
    where = paths.spool
    if not where.is_dir():
        return 0
    swept = 0
    for rec in records.load_all(where):
        cg = JobCgroup.at(rec.cgroup)
        # Read first: an end the job reached by itself is not the sweep's.
        ended = reaper.read(where, rec.spec.job, rec.pid)
        if procfs.kill_job_remains(rec.pid, rec.spec.uid, cg):
            swept += 1
            ended = None
        if cg is not None:
            cg.remove()
        remove_spool_files(where, rec.spec.job)
        records.mark_swept(where, rec, ended)
    cgroup.remove_empty(str(paths.home))
    return swept


def wait_keepers(paths: Paths, timeout: float = 5.0) -> int:
    """Wait for the keepers of this cluster's node daemons to exit, as they do
    once the daemon and every job it left are gone
    (:mod:`minibatch.node.keeper`); how many are still waiting."""
    procs = []
    for pid in keeper.keepers(paths.spool):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    # An end a keeper wrote as the sweep removed its job's record.
    if paths.spool.is_dir():
        reaper.remove_stale(paths.spool)
    return len(alive)
