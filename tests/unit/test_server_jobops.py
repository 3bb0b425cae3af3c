"""PBS's everyday job commands on the server, driven directly (no sockets):
per-id qdel/qhold/qrls, qsig, qrerun, qmove, tracejob, queues, live usage."""

from __future__ import annotations

import signal

import msgspec
import pytest

from minibatch.config import Config, QueueConfig
from minibatch.core.job import (
    TRANSITIONS,
    JobOptions,
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
)
from minibatch.errors import ErrorCode, InvalidArgument, NotFound, PermissionDenied
from minibatch.protocol.messages import (
    Heartbeat,
    JobControl,
    JobEnded,
    JobList,
    JobTrace,
    JobUsage,
    Kill,
    Launch,
    MoveJob,
    QueryQueues,
    QueueList,
    Rerun,
    Signal,
    SignalJob,
    TraceJob,
)
from minibatch.server import liveness, requeue
from minibatch.server.access import Context
from minibatch.server.handlers import HANDLERS
from minibatch.server.queues import QueueTable
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

ME = Caller(uid=1000, gid=1000, pid=1)
OTHER = Caller(uid=1001, gid=1001, pid=2)
ROOT = Caller(uid=0, gid=0, pid=3)
CTX = Context(owner_uid=0)


def spec(cpus: int = 1, **kw) -> JobSpec:
    return JobSpec(
        name="j", workdir="/tmp", request=JobRequest(ppn=cpus), argv=["true"], **kw
    )


def ask(state: ServerState, msg, caller: Caller | None = ME):
    return HANDLERS[type(msg)](state, CTX, caller, b"", msg)


def refusals(reply: JobList) -> dict[str, tuple[int, str]]:
    return {r.selector: (r.code, r.message) for r in reply.refused}


def run(state: ServerState, job, node: str = "n0") -> None:
    assert state.start(job.id, (node,)) is None


# ------------------------------------------------------ qdel, qhold, qrls


def test_qdel_does_the_known_ids_and_names_the_others(server_state: ServerState):
    (a,) = server_state.submit(spec(), ME)
    (done,) = server_state.submit(spec(), ME)
    server_state.cancel(done)
    reply = ask(
        server_state,
        JobControl(
            action="cancel", selectors=[str(a.id), "99", str(done.id)], each=True
        ),
    )
    assert [j.id for j in reply.jobs] == [a.id]
    assert a.result is JobResult.CANCELLED
    got = refusals(reply)
    assert got["99"] == (ErrorCode.NOT_FOUND, "unknown job id 99")
    code, message = got[str(done.id)]
    assert code == ErrorCode.INVALID_ARGUMENT
    assert message == f"job {done.id} has finished (cancelled)"


def test_without_each_one_refusal_refuses_all(server_state: ServerState):
    (a,) = server_state.submit(spec(), ME)
    with pytest.raises(NotFound):
        ask(server_state, JobControl(action="cancel", selectors=[str(a.id), "99"]))
    assert a.state is JobState.QUEUED


def test_finished_arrays_and_tasks_are_not_unknown(server_state: ServerState):
    tasks = server_state.submit(spec(array=[1, 2]), ME)
    first = tasks[0].id
    for t in tasks:
        server_state.cancel(t)
    reply = ask(
        server_state,
        JobControl(action="cancel", selectors=[f"{first}[]", f"{first}[2]"], each=True),
    )
    got = refusals(reply)
    assert got[f"{first}[]"][1] == f"job {first}[] has finished"
    assert got[f"{first}[2]"][1] == f"job {first}[2] has finished (cancelled)"


def test_qhold_of_an_array_holds_its_pending_tasks(server_state: ServerState):
    tasks = server_state.submit(spec(array=[1, 2, 3]), ME)
    run(server_state, tasks[0])
    first = tasks[0].array_id
    reply = ask(
        server_state, JobControl(action="hold", selectors=[f"{first}[]"], each=True)
    )
    assert reply.refused == []
    assert [t.state for t in tasks] == [JobState.RUNNING, JobState.HELD, JobState.HELD]
    # Holding held jobs again is no error (as in PBS); the running task is.
    reply = ask(
        server_state,
        JobControl(action="hold", selectors=[f"{first}[1]", f"{first}[]"], each=True),
    )
    assert set(refusals(reply)) == {f"{first}[1]"}
    reply = ask(
        server_state, JobControl(action="release", selectors=[f"{first}[]"], each=True)
    )
    assert [t.state for t in tasks[1:]] == [JobState.QUEUED, JobState.QUEUED]
    # Nothing of it to release: the array is refused, for its first task's reason.
    reply = ask(
        server_state, JobControl(action="release", selectors=[f"{first}[]"], each=True)
    )
    assert refusals(reply)[f"{first}[]"][1] == f"job {first}[1] is not held"


def test_someone_elses_job_is_refused_and_mine_done(server_state: ServerState):
    (mine,) = server_state.submit(spec(), ME)
    (theirs,) = server_state.submit(spec(), OTHER)
    reply = ask(
        server_state,
        JobControl(action="hold", selectors=[str(theirs.id), str(mine.id)], each=True),
    )
    assert mine.state is JobState.HELD and theirs.state is JobState.QUEUED
    assert refusals(reply)[str(theirs.id)][0] == ErrorCode.PERMISSION


# ------------------------------------------------------------------ qsig


def test_qsig_sends_the_signal_to_the_jobs_node(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    (waiting,) = server_state.submit(spec(), ME)
    run(server_state, job, "n1")
    server_state.outbox.clear()
    reply = ask(
        server_state,
        SignalJob(selectors=[str(job.id), str(waiting.id)], signal="usr1"),
    )
    assert server_state.outbox == [
        (b"route-n1", Signal(job=job.id, signal=int(signal.SIGUSR1)))
    ]
    assert "only running jobs" in refusals(reply)[str(waiting.id)][1]
    events = server_state.store.events_of(job.id)
    assert events[-1][1:] == ("signalled", "SIGUSR1 by cloudsdk")
    with pytest.raises(InvalidArgument, match="unknown signal"):
        ask(server_state, SignalJob(selectors=[str(job.id)], signal="suspend"))
    reply = ask(server_state, SignalJob(selectors=[str(job.id)]), OTHER)
    assert refusals(reply)[str(job.id)][0] == ErrorCode.PERMISSION


# ---------------------------------------------------------------- qrerun


def ended(job, result=JobResult.CANCELLED, reruns: int = 0) -> JobEnded:
    return JobEnded(
        job=job.id,
        result=result,
        exit_status=271,
        signal=15,
        end_time=1005.0,
        cputime_s=1.5,
        maxrss_kb=100,
        reruns=reruns,
    )


def test_a_qdel_keeps_its_reason_beside_what_the_node_adds(server_state: ServerState):
    """qstat -f of a job qdel ended says so, not only the node's "2 leftover
    process(es) killed" (found by a new-user trial)."""
    (job,) = server_state.submit(spec(), ME)
    run(server_state, job)
    server_state.cancel(job, comment="cancelled by qdel (alice)")
    report = msgspec.structs.replace(
        ended(job), comment="2 leftover process(es) killed"
    )
    requeue.end_as_reported(server_state, job, report)
    assert job.comment == "cancelled by qdel (alice); 2 leftover process(es) killed"


def test_qrerun_kills_and_queues_the_job_again(server_state: ServerState, clock):
    assert TRANSITIONS[(JobState.EXITING, JobState.QUEUED)] == "requeue"
    (job,) = server_state.submit(spec(cpus=2), ME)
    run(server_state, job)
    job.used_cputime_s, job.used_rss_kb = 1.0, 50
    with pytest.raises(PermissionDenied, match="only operators"):
        ask(server_state, Rerun(selectors=[str(job.id)]), ME)
    server_state.outbox.clear()
    reply = ask(server_state, Rerun(selectors=[str(job.id)]), ROOT)
    assert reply.refused == [] and job.state is JobState.EXITING
    assert job.rerun_pending and job.comment == "rerun by root"
    assert server_state.outbox == [
        (b"route-n0", Kill(job=job.id, result=JobResult.CANCELLED))
    ]
    ask(server_state, ended(job), ROOT)
    assert job.state is JobState.QUEUED and job.reruns == 1
    assert not job.rerun_pending and job.result is None and job.alloc == []
    assert job.start_time is None and job.used_cputime_s is None
    assert server_state.nodes.nodes["n0"].used == {}
    assert job.id in set(server_state.queue)
    events = [e for _, e, _ in server_state.store.events_of(job.id)]
    assert events[-2:] == ["exiting", "requeued"]
    # It runs again under the same id, and the node knows it is a new run.
    server_state.outbox.clear()
    run(server_state, job, "n1")
    (launch,) = [m for _, m in server_state.outbox if isinstance(m, Launch)]
    assert launch.spec.job == job.id and launch.spec.reruns == 1
    # A late copy of the first run's end report does not end the second run.
    ask(server_state, ended(job, reruns=0), ROOT)
    assert job.state is JobState.RUNNING
    ask(server_state, ended(job, JobResult.COMPLETED, reruns=1), ROOT)
    assert job.result is JobResult.COMPLETED and job.reruns == 1


def test_qrerun_refuses_what_cannot_be_rerun(server_state: ServerState):
    (pinned,) = server_state.submit(spec(options=JobOptions(rerunnable=False)), ME)
    (queued,) = server_state.submit(spec(), ME)
    run(server_state, pinned)
    reply = ask(server_state, Rerun(selectors=[str(pinned.id), str(queued.id)]), ROOT)
    got = refusals(reply)
    assert got[str(pinned.id)][1] == (
        f"job {pinned.id} is not rerunnable (submitted with -r n)"
    )
    assert "only running jobs can be rerun" in got[str(queued.id)][1]
    assert pinned.state is JobState.RUNNING


def test_qdel_after_qrerun_ends_the_job(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    run(server_state, job)
    ask(server_state, Rerun(selectors=[str(job.id)]), ROOT)
    ask(server_state, JobControl(action="cancel", selectors=[str(job.id)], each=True))
    ask(server_state, ended(job), ROOT)
    assert job.result is JobResult.CANCELLED and job.reruns == 0


def test_a_deleted_job_whose_node_stops_or_loses_it_is_not_queued_again(
    server_state: ServerState,
):
    """qdel sent the Kill to a daemon that died as it started the job: the
    next daemon reports it (requeue set), or the server finds it lost."""
    jobs = [server_state.submit(spec(), ME)[0] for _ in range(2)]
    for job in jobs:
        run(server_state, job)
        ask(server_state, JobControl(action="cancel", selectors=[str(job.id)]))
        assert job.state is JobState.EXITING
    stopped, lost = jobs
    report = msgspec.structs.replace(
        ended(stopped, JobResult.NODE_FAIL), requeue=True, comment="node stopped"
    )
    ask(server_state, report, ROOT)
    for _ in range(3):
        liveness.heartbeat(server_state, Heartbeat(name="n0", running=[]), b"r0")
    for job in jobs:
        assert (job.state, job.result, job.reruns) == (
            JobState.FINISHED,
            JobResult.CANCELLED,
            0,
        ), job
        assert job.comment.startswith("cancelled by qdel; "), job.comment


def test_a_lost_node_still_requeues_a_job_being_rerun(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    run(server_state, job)
    ask(server_state, Rerun(selectors=[str(job.id)]), ROOT)
    for _ in range(3):
        liveness.heartbeat(server_state, Heartbeat(name="n0", running=[]), b"r0")
    assert job.state is JobState.QUEUED and job.reruns == 1


# ----------------------------------------------------------------- qmove


def queued_state(tmp_path, clock, queues: list[QueueConfig]) -> ServerState:
    from minibatch.server.nodes import Node
    from minibatch.server.store import Store

    store = Store(tmp_path / "q.db")
    store.put_node(Node(name="n0", cpus=[0, 1], pid=100))
    store.commit()
    config = Config(queue=queues, default_queue=queues[0].name)
    state = ServerState(store, clock=clock, config=config)
    for node in state.nodes.nodes.values():
        node.up, node.route = True, b"route"
    return state


def test_qmove_and_queue_counts(tmp_path, clock):
    state = queued_state(
        tmp_path,
        clock,
        [
            QueueConfig(name="batch"),
            QueueConfig(name="short", priority=10, max_walltime="00:10:00"),
            QueueConfig(name="vip", users=["root"]),
            QueueConfig(name="closed", enabled=False),
        ],
    )
    (a,) = state.submit(spec(), ME)
    short = JobRequest(walltime=300)
    (b,) = state.submit(
        JobSpec(name="j", workdir="/tmp", request=short, argv=["x"]), ME
    )
    (c,) = state.submit(spec(hold=True), ME)
    assert a.queue == "batch"
    reply = ask(state, MoveJob(queue="short", selectors=[str(a.id), str(b.id)]))
    # a asks for an hour: over short's limit; b fits.
    assert [j.id for j in reply.jobs] == [b.id] and b.queue == "short"
    assert "exceeds queue 'short'" in refusals(reply)[str(a.id)][1]
    assert state.queue.ordered()[0].id == b.id  # short's priority ranks it first
    reply = ask(state, MoveJob(queue="vip", selectors=[str(c.id)]))
    assert refusals(reply)[str(c.id)][0] == ErrorCode.PERMISSION
    with pytest.raises(NotFound, match="unknown queue 'nope'"):
        ask(state, MoveJob(queue="nope", selectors=[str(a.id)]))
    with pytest.raises(InvalidArgument, match="closed"):
        ask(state, MoveJob(queue="closed", selectors=[str(a.id)]))
    assert state.start(a.id, ("n0",)) is None
    reply = ask(state, MoveJob(queue="batch", selectors=[str(a.id)]))
    assert "only pending jobs can be moved" in refusals(reply)[str(a.id)][1]

    queues: QueueList = ask(state, QueryQueues())
    by_name = {q.name: q for q in queues.queues}
    assert by_name["batch"].jobs == {"running": 1, "held": 1}
    assert by_name["short"].jobs == {"queued": 1}
    assert by_name["short"].max_walltime == 600 and by_name["batch"].default
    assert not by_name["closed"].enabled and by_name["vip"].users == ["root"]
    with pytest.raises(NotFound):
        ask(state, QueryQueues(names=["nope"]))
    state.store.close()


def test_queue_table_without_queues_is_batch(server_state: ServerState):
    assert QueueTable(Config()).default == "batch"
    reply: QueueList = ask(server_state, QueryQueues())
    assert [q.name for q in reply.queues] == ["batch"]


# -------------------------------------------------------------- tracejob


def test_tracejob_reads_the_event_log_of_finished_jobs_too(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    server_state.hold(job)
    server_state.cancel(job)
    trace: JobTrace = ask(server_state, TraceJob(selector=str(job.id)))
    assert [j.id for j in trace.jobs] == [job.id]
    assert [e.event for e in trace.events] == ["submitted", "held", "finished"]
    assert trace.events[-1].detail == "cancelled: cancelled by qdel"
    with pytest.raises(NotFound):
        ask(server_state, TraceJob(selector="99"))


def test_tracejob_shows_the_submission_s_arguments_to_its_owner_only(
    server_state: ServerState,
):
    (job,) = server_state.submit(spec(submit_args="-v TOKEN=s3cret"), ME)
    mine: JobTrace = ask(server_state, TraceJob(selector=str(job.id)))
    assert mine.events[0].detail == "-v TOKEN=s3cret"
    theirs: JobTrace = ask(server_state, TraceJob(selector=str(job.id)), OTHER)
    assert [(e.event, e.detail) for e in theirs.events] == [("submitted", "")]
    assert theirs.jobs[0].submit_args == ""
    # Nor is it published: anyone may subscribe to the events.
    published = [p for t, p in server_state.events if t.endswith("/submitted")]
    assert [p["detail"] for p in published] == [""]


# ------------------------------------------------------------ live usage


def test_heartbeats_carry_live_usage_kept_in_memory(server_state: ServerState):
    (job,) = server_state.submit(spec(), ME)
    run(server_state, job, "n1")
    server_state.store.commit()
    beat = Heartbeat(name="n1", running=[job.id], usage=[JobUsage(job.id, 12.5, 2048)])
    liveness.heartbeat(server_state, beat, b"r1")
    assert (job.used_cputime_s, job.used_rss_kb) == (12.5, 2048)
    assert not server_state.store.dirty  # not written at every heartbeat
    # Another node's word about the job is not taken.
    other = Heartbeat(name="n0", running=[], usage=[JobUsage(job.id, 99.0, 1)])
    liveness.heartbeat(server_state, other, b"r0")
    assert job.used_cputime_s == 12.5
