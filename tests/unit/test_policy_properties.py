"""Properties of every policy of this package, on random snapshots and workloads.

On snapshots (with memory, GPUs, advance reservations and jobs inside them):
starts never exceed any free resource of any node, never put a job on CPUs a
reservation holds for others during its requested time, never run a job outside
its reservation or in one it may not use, and plans are deterministic.

Through the simulator (CPUs and memory): no node is over-allocated at any
instant, runs are deterministic, FIFO starts in queue order, EASY never starts
the job it reserved later than its reservation (jobs end by their requested
times), and conservative backfilling with exact estimates starts every job no
later than the start it predicted when the job was submitted.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from minibatch.core.snapshot import ClusterSnapshot, ReservationView
from minibatch.policy import registry
from minibatch.sim.engine import Outcome, Simulator
from minibatch.sim.machine import Machine
from minibatch.sim.swf import TraceJob
from tests.unit.test_policy_snapshots import job, node, running, snap

POLICIES = ["fifo", "pbs-fifo", "easy", "conservative", "bb", "ibb", "backfill"]
PARAMS = {
    "pbs-fifo": {"starve_after": 50},
    "backfill": {"depth": 2, "select": "bestfit"},
}


def load(name: str):
    return registry.load(name, PARAMS.get(name, {}))


# ------------------------------------------------------------------ snapshots


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    """A consistent cluster: at most one reservation per node (some downtimes),
    other jobs running beside it, its own jobs inside it while it is active."""
    now = float(draw(st.integers(0, 100)))
    with_mem, with_gpus = draw(st.booleans()), draw(st.booleans())
    count = draw(st.integers(1, 4))
    caps, resvs, runs = [], [], []
    users = ["alice", "bob"]
    jid = 100
    for i in range(count):
        name = f"n{i}"
        cpus = draw(st.integers(1, 8))
        mem = draw(st.integers(4, 32)) if with_mem else None
        gpus = draw(st.integers(0, 2)) if with_gpus else 0
        caps.append(node(name, cpus, mem, gpus))
        held = 0
        if draw(st.booleans()):
            held = draw(st.integers(1, cpus))
            start = now + draw(st.integers(-50, 60))
            resv = ReservationView(
                name=f"r{i}",
                start=start,
                end=start + draw(st.integers(1, 120)),
                nodes=((name, held),),
                users=() if draw(st.integers(0, 3)) == 0 else ("alice",),
            )
            resvs.append(resv)
            if resv.users and resv.start <= now < resv.end and draw(st.booleans()):
                jid += 1
                runs.append(
                    running(
                        jid,
                        {name: draw(st.integers(1, held))},
                        now - 1,
                        draw(st.integers(1, 40)),
                        advres=resv.name,
                        user="alice",
                    )
                )
        left, mem_left, gpus_left = cpus - held, mem, gpus
        while left and draw(st.booleans()):
            take = draw(st.integers(1, left))
            m = draw(st.integers(0, mem_left)) if mem_left is not None else None
            g = draw(st.integers(0, gpus_left))
            jid += 1
            start = now - draw(st.integers(0, 50))
            runs.append(
                running(
                    jid,
                    {name: take},
                    start,
                    draw(st.integers(1, 120)),
                    mem_kb=m,
                    gpus=g,
                )
            )
            left -= take
            mem_left = None if mem_left is None else mem_left - (m or 0)
            gpus_left -= g
    pending = []
    for k in range(draw(st.integers(1, 12))):
        nodes = draw(st.integers(1, count))
        advres, user, wall = "", draw(st.sampled_from(users)), draw(st.integers(1, 150))
        if resvs and draw(st.integers(0, 2)) == 0:
            # Mostly alice, in a reservation of hers, short enough to fit.
            advres = draw(st.sampled_from([r.name for r in resvs] + ["ghost"]))
            user = "alice" if draw(st.integers(0, 4)) else "bob"
            nodes, wall = 1, draw(st.integers(1, 30))
        pending.append(
            job(
                k + 1,
                draw(st.integers(1, 8)),
                wall,
                nodes=nodes,
                mem_kb=draw(st.integers(1, 16)) * nodes
                if with_mem and draw(st.booleans())
                else None,
                gpus=draw(st.integers(0, 2)) if with_gpus else 0,
                user=user,
                submit=float(k),
                advres=advres,
            )
        )
    return snap(caps, runs, pending, now=now, reservations=resvs)


def check_plan(s: ClusterSnapshot, name: str) -> None:
    plan = load(name).plan(s)
    assert plan == load(name).plan(s)  # deterministic
    jobs = {j.id: j for j in s.pending}
    nodes = {n.name: n for n in s.nodes}
    resv = {r.name: r for r in s.reservations}
    ids = [st.job for st in plan.starts]
    assert len(ids) == len(set(ids)) and set(ids) <= set(jobs)
    cpus: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gpus: dict[str, int] = defaultdict(int)
    # CPUs that jobs outside each node's reservation hold at each critical time.
    for start in plan.starts:
        j = jobs[start.job]
        req = j.request
        assert len(start.nodes) == req.nodes == len(set(start.nodes)) and set(
            start.nodes
        ) <= set(nodes)
        per_mem = 0 if req.mem_kb is None else -(-req.mem_kb // req.nodes)
        for n in start.nodes:
            cpus[n] += req.ppn
            mem[n] += per_mem
            gpus[n] += req.gpus
        end = s.now + req.walltime
        if j.advres:
            r = resv[j.advres]
            assert j.user in r.users and r.start <= s.now and end <= r.end
            assert set(start.nodes) <= {n for n, _ in r.nodes}
    for name, v in nodes.items():
        assert cpus[name] <= v.free_cpus
        if v.free_mem_kb is not None:
            assert mem[name] <= v.free_mem_kb
        assert gpus[name] <= v.free_gpus
    # Reservations: at each instant of each one's window, jobs outside it (running,
    # by their expected ends, and started now) leave it its CPUs; its own jobs
    # fit in it.
    for r in s.reservations:
        for rname, held in r.nodes:
            cap = nodes[rname].cpus
            for t in {max(s.now, r.start)}:
                if not r.start <= t < r.end:
                    continue
                outside = inside = 0
                for run in s.running:
                    busy = sum(c for n, c in run.nodes if n == rname)
                    alive = t == s.now or run.expected_end(s.now) > t
                    if busy and alive:
                        if run.advres == r.name:
                            inside += busy
                        else:
                            outside += busy
                for start in plan.starts:
                    j = jobs[start.job]
                    if rname in start.nodes and s.now + j.request.walltime > t:
                        if j.advres == r.name:
                            inside += j.request.ppn
                        else:
                            outside += j.request.ppn
                assert outside <= cap - held, f"{name}: job on {r.name}'s CPUs at {t}"
                assert inside <= held


@settings(max_examples=120, deadline=None)
@given(snapshots(), st.sampled_from(POLICIES))
def test_plans_never_overallocate_or_trespass(s, name):
    check_plan(s, name)


# ----------------------------------------------------------------- simulations


@st.composite
def workloads(draw: st.DrawFn, exact: bool = False) -> tuple[Machine, list[TraceJob]]:
    mem = draw(st.sampled_from([None, 16]))
    machine = Machine.uniform(draw(st.integers(1, 3)), draw(st.integers(1, 6)), mem)
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        procs = draw(st.integers(1, machine.procs))
        run = draw(st.integers(1, 60))
        req = run if exact else max(1, run * draw(st.integers(1, 20)) // 5)
        request = machine.request(procs, draw(st.integers(1, 16)) if mem else None, req)
        if request is None:
            continue
        jobs.append(
            TraceJob(
                id=i + 1,
                user="u",
                group="g",
                queue="1",
                submit=float(draw(st.integers(0, 90))),
                run_time=float(run),
                procs=procs,
                req_time=float(req),
                mem_kb=request.mem_kb,
                request=request,
            )
        )
    return machine, jobs


def assert_no_overallocation(machine: Machine, out: list[Outcome]) -> None:
    steps: dict[str, dict[float, list[int]]] = defaultdict(
        lambda: defaultdict(lambda: [0, 0])
    )
    for o in out:
        req = o.job.request
        per = 0 if req.mem_kb is None else -(-req.mem_kb // req.nodes)
        for n in o.nodes:
            steps[n][o.start][0] += req.ppn
            steps[n][o.start][1] += per
            steps[n][o.end][0] -= req.ppn
            steps[n][o.end][1] -= per
    for spec in machine.nodes:
        cpus = mem = 0
        for t in sorted(steps[spec.name]):  # ends and starts at t net out first
            cpus += steps[spec.name][t][0]
            mem += steps[spec.name][t][1]
            assert cpus <= spec.cpus, f"{spec.name} CPUs over-allocated at {t}"
            assert spec.mem_kb is None or mem <= spec.mem_kb


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(POLICIES), st.booleans())
def test_schedules_never_overallocate_and_are_deterministic(work, name, kill):
    machine, jobs = work
    out = Simulator(load(name), machine, jobs, kill_at_walltime=kill).run()
    assert_no_overallocation(machine, out)
    assert (
        out
        == Simulator(
            load(name), machine, list(reversed(jobs)), kill_at_walltime=kill
        ).run()
    )


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_fifo_starts_in_queue_order(work):
    machine, jobs = work
    out = sorted(
        Simulator(load("fifo"), machine, jobs).run(),
        key=lambda o: (o.job.submit, o.job.id),
    )
    assert [o.start for o in out] == sorted(o.start for o in out)


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_easy_never_delays_its_reservation(work):
    # Jobs end by their requested times (killed there): a job reserved when it
    # was submitted starts no later than that reservation, whatever backfills.
    machine, jobs = work
    for o in Simulator(load("easy"), machine, jobs, kill_at_walltime=True).run():
        if o.predicted is not None:
            assert o.start <= o.predicted


@settings(max_examples=60, deadline=None)
@given(workloads(exact=True))
def test_conservative_with_exact_estimates_keeps_every_prediction(work):
    machine, jobs = work
    for o in Simulator(load("conservative"), machine, jobs).run():
        if o.predicted is None:
            assert o.start == o.job.submit  # started in the pass it arrived in
        else:
            assert o.start <= o.predicted
