"""Malleability: qsub's range, the shared rules, and the resource manager's resizes."""

from __future__ import annotations

import pytest

from minibatch.cli.directives import Context as ParseContext
from minibatch.cli.directives import parse_directives
from minibatch.cli.qsub import make_spec
from minibatch.cli.slurmopts import parse_malleable
from minibatch.core.job import (
    JobRequest,
    JobResult,
    JobSpec,
    JobState,
    ResizeEvent,
    allocated_cpu_seconds,
)
from minibatch.core.resize import RuntimeModel, new_limit, rate, refusal
from minibatch.core.snapshot import Plan, Resize, Start
from minibatch.errors import InvalidArgument, PermissionDenied
from minibatch.protocol.messages import (
    Alter,
    JobResized,
    Launch,
    NodeHello,
    ResizeJob,
    SetReservation,
)
from minibatch.server import booking, handlers, liveness, malleable
from minibatch.server.access import Context
from minibatch.server.state import ServerState
from minibatch.server.submit import Caller

ME = Caller(uid=1000, gid=1000, pid=1)
ROOT = Caller(uid=0, gid=0, pid=1)
ENV = {"HOME": "/home/alice", "PATH": "/usr/bin"}


def spec_for(argv: list[str]) -> JobSpec | None:
    made = make_spec(argv, environ=ENV, workdir="/w", host="ws", user="alice")
    return None if made is None else made[0]


# ------------------------------------------------------------------ qsub


def test_malleable_range_from_the_command_line_and_directives():
    spec = spec_for(["-l", "ncpus=4", "-l", "malleable=2-8", "--", "run"])
    assert spec is not None and spec.request.malleable == (2, 8)
    assert spec.request.ppn == 4
    pbs = parse_directives(
        "#PBS -l ncpus=2,malleable=1-4\n", "j.sh", ParseContext(ENV, 0.0)
    )
    assert pbs.malleable == (1, 4)
    slurm = parse_directives(
        "#SBATCH --malleable=2-8 -c 4\n", "j.sh", Context(ENV, 0.0)
    )
    assert slurm.malleable == (2, 8)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-l", "ncpus=4,malleable=8-2"], "fewest CPUs exceed the most"),
        (["-l", "ncpus=4,malleable=0-4"], "fewest CPUs must be >= 1"),
        (["-l", "ncpus=4,malleable=1-3"], "does not include the 4 CPUs requested"),
        (["-l", "ncpus=1,malleable=2-3"], "does not include the 1 CPUs requested"),
        (["-l", "nodes=2:ppn=2,malleable=1-2"], "runs on one node"),
        (["-l", "malleable=two"], "malformed malleable range"),
        (["-l", "malleable=4"], "expected MIN-MAX"),
    ],
)
def test_bad_malleable_ranges_are_refused(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        spec_for([*argv, "--", "run"])


def test_parse_malleable():
    assert parse_malleable(" 2-8 ") == (2, 8)
    with pytest.raises(InvalidArgument):
        parse_malleable("2-")


# ----------------------------------------------------------------- rules


def test_refusal_names_the_broken_rule():
    assert refusal(5, None, 2, 1, 0) == "job 5 is not malleable"
    assert "fewer than 2" in refusal(5, (2, 8), 4, 1, 0)
    assert "more than 8" in refusal(5, (2, 8), 4, 9, 9)
    assert "only 1 more are free" in refusal(5, (2, 8), 4, 6, 1)
    assert refusal(5, (2, 8), 4, 6, 2) is None
    assert refusal(5, (2, 8), 4, 2, 0) is None


def test_runtime_models_and_limits():
    assert rate([2], 4, RuntimeModel.IDEAL) == rate([2], 4, RuntimeModel.WORST) == 0.5
    # Eq. 5 and 6 part when a job's nodes hold different counts.
    assert rate([4, 2], 4, RuntimeModel.IDEAL) == 0.75
    assert rate([4, 2], 4, RuntimeModel.WORST) == 0.5
    # 100 s asked; halved 40 s in: 60 s of work left take 120 s.
    assert new_limit(40, 100, 100, 1.0, 0.5) == 160
    # Back to full speed at 100 s: 60 s left at half speed is 30 s of work.
    assert new_limit(100, 160, 100, 0.5, 1.0) == 130
    # Never under what was asked for, even on more CPUs than asked.
    assert new_limit(10, 100, 100, 1.0, 2.0) == 100


def test_allocated_cpu_seconds_integrate_over_resizes(server_state: ServerState):
    job = running(server_state, 2, (1, 2))
    job.start_time, job.end_time = 0.0, 30.0
    assert allocated_cpu_seconds(job, 99) == 60
    job.resizes = [
        ResizeEvent(time=10, node="n0", before=[0, 1], after=[0]),
        ResizeEvent(time=20, node="n0", before=[0], after=[0, 1]),
    ]
    assert allocated_cpu_seconds(job, 99) == 2 * 10 + 1 * 10 + 2 * 10


# ------------------------------------------------------ resource manager


def queued(state: ServerState, cpus: int, rng, walltime: int = 100):
    request = JobRequest(ppn=cpus, walltime=walltime, malleable=rng)
    (job,) = state.submit(
        JobSpec(name="m", workdir="/tmp", request=request, argv=["x"]), ME
    )
    return job


def running(state: ServerState, cpus: int, rng, node: str = "n0", walltime=100):
    job = queued(state, cpus, rng, walltime)
    assert state.start(job.id, (node,)) is None
    return job


def qalter(
    state: ServerState,
    job,
    ncpus: int,
    caller: Caller = ROOT,
    selector_suffix: str = "",
    **kw,
) -> None:
    msg = Alter(selector=f"{job.id}{selector_suffix}", ncpus=ncpus, **kw)
    handlers.alter(state, Context(owner_uid=0), caller, b"", msg)


def sent(state: ServerState, kind: type) -> list:
    return [m for _, m in state.outbox if isinstance(m, kind)]


def ack(state: ServerState, job, when: float = 1005.0) -> None:
    """The node's answer to the job's latest resize."""
    seq = job.resizing[-1].seq if job.resizing else len(job.resizes)
    malleable.acknowledged(
        state, JobResized(job=job.id, cpus=job.alloc[0].cpus, time=when, seq=seq)
    )


def test_qalter_shrinks_and_grows_a_running_job(server_state, clock):
    job = running(server_state, 2, (1, 2))
    server_state.outbox.clear()
    clock.t += 10
    qalter(server_state, job, 1, ME)  # its owner may shrink it
    assert job.alloc[0].cpus == [0]
    assert server_state.nodes.nodes["n0"].free_cpus() == [1]
    (msg,) = sent(server_state, ResizeJob)
    assert msg.cpus == [0] and msg.time_limit == 190  # 90 s left, at half speed
    assert job.resizing and not job.resizes  # pending until the node answers
    ack(server_state, job)
    assert [(r.before, r.after, r.cause) for r in job.resizes] == [
        ([0, 1], [0], f"qalter by {ME.user}")
    ]
    assert job.resizes[0].time == 1005.0 and not job.resizing
    topics = [t for t, _ in server_state.events]
    assert f"jobs/{job.id}/resized" in topics
    ack(server_state, job)  # a repeat is a no-op
    assert len(job.resizes) == 1
    with pytest.raises(PermissionDenied, match="only operators may grow"):
        qalter(server_state, job, 2, ME)
    qalter(server_state, job, 2)  # an operator may
    assert job.alloc[0].cpus == [0, 1]


@pytest.mark.parametrize(
    ("target", "message"),
    [(0, "fewer than 1"), (3, "more than 2"), (2, "only 0 more are free")],
)
def test_refused_resizes_change_nothing(server_state, target, message):
    job = running(server_state, 1, (1, 2))
    running(server_state, 1, (1, 1))  # takes the node's other CPU
    server_state.outbox.clear()
    with pytest.raises(InvalidArgument, match=message):
        qalter(server_state, job, target)
    assert job.alloc[0].cpus == [0] and not job.resizing and not server_state.outbox


def test_rigid_pending_and_other_fields_cannot_be_resized(server_state):
    rigid = running(server_state, 1, None)
    with pytest.raises(InvalidArgument, match="only pending jobs"):
        qalter(server_state, rigid, 2)
    job = running(server_state, 1, (1, 2), node="n1")
    with pytest.raises(InvalidArgument, match="only its ncpus"):
        qalter(server_state, job, 1, name="new")
    server_state.cancel(job)  # exiting now
    assert "is exiting, not running" in malleable.check(server_state, job, 2)


def test_the_latest_answer_stands_for_the_resizes_before_it(server_state):
    job = running(server_state, 2, (1, 2))
    for target in (1, 2, 1):
        qalter(server_state, job, target)
    assert [r.seq for r in job.resizing] == [1, 2, 3]
    malleable.acknowledged(
        server_state, JobResized(job=job.id, cpus=[0], time=7.0, seq=1)
    )
    assert [r.seq for r in job.resizes] == [1] and len(job.resizing) == 2
    ack(server_state, job, when=9.0)  # the node reported only its last
    assert [(r.seq, r.time) for r in job.resizes] == [(1, 7.0), (2, 9.0), (3, 9.0)]
    assert not job.resizing and job.alloc[0].cpus == [0]


def test_a_refused_mask_leaves_the_job_on_what_the_node_reports(server_state):
    job = running(server_state, 1, (1, 2))
    qalter(server_state, job, 2)
    malleable.acknowledged(
        server_state,
        JobResized(job=job.id, cpus=[0], time=1.0, error="EINVAL", seq=1),
    )
    assert job.alloc[0].cpus == [0] and not job.resizing
    assert "resize refused by node n0: EINVAL" in job.comment
    assert server_state.nodes.nodes["n0"].free_cpus() == [1]


def guest_on_one_lent_cpu(state: ServerState, mate, guest):
    """A plan that starts ``guest`` on n0 with one CPU ``mate`` lends."""
    state.outbox.clear()
    plan = Plan(
        generation=0,
        resizes=[Resize(mate.id, 1, guest=guest.id)],
        starts=[Start(guest.id, ("n0",), ppn=1)],
    )
    return malleable.apply_plan(state, plan)


def test_a_guest_starts_on_cpus_its_mate_gives_and_returns_them(server_state, clock):
    mate = running(server_state, 2, (1, 2))
    running(server_state, 2, None, node="n1")
    guest = queued(server_state, 2, (1, 2), walltime=50)
    started, rejected = guest_on_one_lent_cpu(server_state, mate, guest)
    assert started == [guest.id] and not rejected
    # The node hears of the shrink before the guest's launch.
    kinds = [type(m) for _, m in server_state.outbox]
    assert kinds == [ResizeJob, Launch]
    assert mate.alloc[0].cpus == [0] and guest.alloc[0].cpus == [1]
    assert guest.borrowed == {mate.id: 1} and guest.time_limit == 100
    ack(server_state, mate)
    server_state.outbox.clear()
    server_state.job_ended(guest, JobResult.COMPLETED)
    (back,) = sent(server_state, ResizeJob)
    assert back.job == mate.id and mate.alloc[0].cpus == [0, 1]
    assert mate.resizing[0].cause == f"job {guest.id} ended"


def test_a_guest_that_cannot_start_leaves_its_mates_alone(server_state):
    mate = running(server_state, 2, (1, 2))
    guest = queued(server_state, 2, (2, 2))
    started, rejected = guest_on_one_lent_cpu(server_state, mate, guest)
    assert not started and "fewer than 2" in rejected[guest.id]
    assert mate.alloc[0].cpus == [0, 1] and not server_state.outbox
    assert server_state.nodes.nodes["n0"].used == {0: mate.id, 1: mate.id}
    assert guest.state is JobState.QUEUED


def test_pending_resizes_are_sent_again_when_the_node_says_hello(server_state):
    job = running(server_state, 2, (1, 2))
    qalter(server_state, job, 1)
    server_state.outbox.clear()
    node = server_state.nodes.nodes["n0"]
    liveness.hello(
        server_state,
        NodeHello(
            name="n0", cpus=node.cpus, mem_kb=None, pid=node.pid, running=[job.id]
        ),
        b"again",
    )
    (msg,) = sent(server_state, ResizeJob)
    assert msg.cpus == [0] and job.state is JobState.RUNNING


def test_an_answer_for_a_job_being_killed_frees_nothing(server_state):
    job = running(server_state, 2, (1, 2))
    qalter(server_state, job, 1)
    other = queued(server_state, 1, None)
    assert server_state.start(other.id, ("n0",)) is None  # on the freed CPU 1
    # The node still runs the job on both CPUs (it is being killed there).
    malleable.acknowledged(
        server_state,
        JobResized(job=job.id, cpus=[0, 1], time=2.0, error="the job is ending", seq=1),
    )
    # It keeps what is still its own and is confined to it: no CPU is held twice.
    assert job.alloc[0].cpus == [0] and other.alloc[0].cpus == [1]
    (again,) = [m for _, m in server_state.outbox if isinstance(m, ResizeJob)][-1:]
    assert again.cpus == [0] and again.seq == 2
    # Gone from the node: nothing changes until its end arrives.
    malleable.acknowledged(
        server_state, JobResized(job=job.id, cpus=[], time=3.0, error="gone", seq=2)
    )
    assert job.alloc[0].cpus == [0] and server_state.nodes.nodes["n0"].used == {
        0: job.id,
        1: other.id,
    }


def test_a_refused_resize_leaves_the_later_ones_in_flight(server_state):
    job = running(server_state, 2, (1, 2))
    qalter(server_state, job, 1)
    qalter(server_state, job, 2)
    malleable.acknowledged(
        server_state, JobResized(job=job.id, cpus=[0, 1], time=2.0, error="x", seq=1)
    )
    assert [r.seq for r in job.resizing] == [2] and job.alloc[0].cpus == [0, 1]
    ack(server_state, job)
    assert [r.seq for r in job.resizes] == [2] and job.resize_seq == 2


def test_a_shrink_never_stretches_a_job_into_a_reservation(server_state, clock):
    job = running(server_state, 2, (1, 2), walltime=100)
    # Both CPUs of n0 are reserved from t+150: on one CPU the job would need
    # until t+200.
    booking.create(
        server_state,
        SetReservation(start=clock.t + 150, duration=600.0, nodes=["n0"]),
        "root",
    )
    with pytest.raises(InvalidArgument, match="would run into reservation"):
        qalter(server_state, job, 1)
    assert job.alloc[0].cpus == [0, 1] and not job.resizing


def test_a_qalter_of_several_running_jobs_changes_nothing(server_state):
    first = running(server_state, 1, (1, 2))
    second = running(server_state, 1, (1, 2), node="n1")
    assert first.array_id is None
    # Two running jobs by one selector: an array whose tasks run.
    first.array_id = second.array_id = first.id
    server_state.arrays[first.id] = [first.id, second.id]
    with pytest.raises(InvalidArgument, match="one at a time"):
        qalter(server_state, first, 2, selector_suffix="[]")
    assert not first.resizing and not second.resizing


def test_a_job_that_ends_with_a_resize_unanswered_keeps_what_it_held(server_state):
    job = running(server_state, 2, (1, 2))
    qalter(server_state, job, 1)
    assert job.alloc[0].cpus == [0] and job.time_limit > 100
    server_state.job_ended(job, JobResult.NODE_FAIL, comment="node lost")
    # The node never confirmed the shrink: accounting keeps both CPUs.
    assert job.alloc[0].cpus == [0, 1] and not job.resizing
    assert job.time_limit == 0.0 and not job.resizes
    assert server_state.nodes.nodes["n0"].used == {}


def test_acting_on_a_finished_job_says_it_has_finished(server_state):
    job = running(server_state, 1, (1, 2))
    server_state.job_ended(job, JobResult.COMPLETED)
    with pytest.raises(InvalidArgument, match=f"job {job.id} has finished"):
        qalter(server_state, job, 2)
    assert server_state.select(str(job.id))[0].result is JobResult.COMPLETED
