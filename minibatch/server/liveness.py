"""Node registration, heartbeats and failure detection.

A node daemon says hello with its CPUs, memory and the jobs it still runs, then
sends heartbeats. The server reconciles what it believes with what the node says:

* a node whose daemon restarted (new pid) re-adopted the jobs it lists (their
  cgroups outlived the old daemon); the others were killed before the hello, so
  they go back to the queue when rerunnable, else end ``node_fail``;
* the same daemon re-registering (the server restarted) keeps its jobs: any that
  ended meanwhile arrive as re-sent ``JobEnded`` reports;
* a job a node stops listing for :data:`~minibatch.server.state.LOST_AFTER_MISSES`
  heartbeats in a row, with no end report, was lost: requeued or ``node_fail``;
* a job a node runs that the server does not know is killed;
* a node silent for ``node_timeout`` seconds is down. Its jobs stay as they are:
  only its daemon can say their processes are gone, and when it returns it
  re-adopts or kills them and says which (``qdel`` ends such a job at once).
"""

from __future__ import annotations

from minibatch.core.job import ACTIVE_STATES, JobResult, JobState
from minibatch.errors import NotFound
from minibatch.protocol.messages import Heartbeat, Kill, NodeHello
from minibatch.server import malleable, requeue
from minibatch.server.nodes import Node
from minibatch.server.state import LOST_AFTER_MISSES, ServerState


def _jobs_on(state: ServerState, node: Node) -> set[int]:
    return set(node.used.values())


def hello(
    state: ServerState, msg: NodeHello, route: bytes, remote: bool = False
) -> None:
    """A node daemon says hello (``remote``: over tcp, from another host)."""
    now = state.clock()
    node = state.nodes.nodes.get(msg.name)
    restarted = node is not None and node.pid is not None and node.pid != msg.pid
    if node is None:
        node = Node(name=msg.name, cpus=sorted(msg.cpus))
        state.nodes.configure(node)
        state.nodes.nodes[msg.name] = node
    node.cpus, node.mem_kb, node.shared_cpus = (
        sorted(msg.cpus),
        msg.mem_kb,
        msg.shared_cpus,
    )
    node.pid, node.up, node.last_heartbeat = msg.pid, True, now
    node.route = route
    node.misses = {}
    node.stopping, node.trouble = False, ""
    node.enforcement, node.real_cpus = msg.enforcement, msg.real_cpus
    node.remote, node.lends = remote, msg.lends
    state.store.put_node(node)
    reported = set(msg.running)
    for jid in sorted(_jobs_on(state, node)):
        job = state.jobs.get(jid)
        if job is None or job.alloc[0].node != node.name:
            continue  # it runs on its first node; this one only lends CPUs
        if restarted and jid not in reported:
            why = f"node {node.name} restarted; the job's processes were gone"
            requeue.lost(state, job, why)
    for jid in sorted(reported - _jobs_on(state, node)):
        state.outbox.append((node.route, Kill(job=jid, result=JobResult.CANCELLED)))
    _kill_again(state, node, reported)
    malleable.resend(state, node)
    state.publish_node(node)
    state.changed()


def heartbeat(state: ServerState, msg: Heartbeat, route: bytes) -> None:
    node = state.nodes.nodes.get(msg.name)
    if node is None or not node.up:
        # Unknown, or declared down meanwhile: the node must say hello again.
        raise NotFound(f"node {msg.name} is not registered")
    node.last_heartbeat = state.clock()
    node.route = route  # the daemon reconnected: a new connection, a new id
    if msg.stopping and not node.stopping:
        node.stopping = True  # start nothing more here (mb down)
        state.publish_node(node)
        state.changed()
    if msg.trouble != node.trouble:
        node.trouble = msg.trouble  # a full spool: offline until it clears
        state.store.put_node(node)
        state.publish_node(node)
        state.changed()
    for use in msg.usage:
        # Live resources_used for qstat; stored with the job's next change or
        # end, not at every heartbeat.
        job = state.jobs.get(use.job)
        on_node = job is not None and job.alloc and job.alloc[0].node == node.name
        if job is not None and on_node and job.state in ACTIVE_STATES:
            job.used_cputime_s, job.used_rss_kb = use.cputime_s, use.rss_kb
    reported = set(msg.running)
    for jid in sorted(_jobs_on(state, node)):
        job = state.jobs.get(jid)
        if job is None or jid in reported or job.alloc[0].node != node.name:
            node.misses.pop(jid, None)
            continue
        node.misses[jid] = node.misses.get(jid, 0) + 1
        if node.misses[jid] >= LOST_AFTER_MISSES:
            requeue.lost(state, job, f"node {node.name} lost the job")
    for jid in sorted(reported - _jobs_on(state, node)):
        state.outbox.append((node.route, Kill(job=jid, result=JobResult.CANCELLED)))
    _kill_again(state, node, reported)


def _kill_again(state: ServerState, node: Node, reported: set[int]) -> None:
    """A job being killed (qdel, qrerun) that its node still runs: the Kill may
    have gone to a daemon that died (the new one re-adopted the job), so it is
    sent again; the node ignores a repeat."""
    for jid in sorted(reported & _jobs_on(state, node)):
        job = state.jobs.get(jid)
        if job is not None and job.state is JobState.EXITING:
            state.outbox.append((node.route, Kill(job=jid, result=JobResult.CANCELLED)))


def publish_changes(state: ServerState) -> None:
    """Publish the nodes whose state changed without a word from them: a job's
    start or end makes a node ``job-exclusive`` or ``free`` again."""
    published = state.nodes.published
    for node in state.nodes.nodes.values():
        if published.get(node.name) != node.state:
            state.publish_node(node)


def set_offline(state: ServerState, node: Node, offline: bool, comment: str) -> None:
    node.offline, node.comment = offline, (comment if offline else "")
    state.store.put_node(node)
    state.publish_node(node)
    state.changed()


def check_nodes(state: ServerState, timeout: float) -> None:
    """Declare silent nodes down (their jobs wait for the daemon's word)."""
    now = state.clock()
    for node in state.nodes.nodes.values():
        silent = node.last_heartbeat is None or now - node.last_heartbeat > timeout
        if silent and node.up:
            node.up = False
            state.store.put_node(node)
            state.publish_node(node)
            state.changed()
