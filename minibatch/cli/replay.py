"""``mb replay``: run a trace's jobs on the live cluster, then score the live run
against the simulator on the same slice.

    mb replay TRACE [--speedup 600] [--limit N] [--policy P [--param K=V ...]]
              [--burn] [--out DIR]

The jobs the simulator keeps for the cluster's nodes are submitted at their
scaled submit times as real jobs (``jobs/examples/trace_job.sh``) that hold
their requested CPUs for their scaled run times (:mod:`minibatch.sim.replay`).
While they run, a line on stderr counts them (submitted, queued, running,
finished). Once all have ended, the run is exported as ``mb acct --swf`` does
(``DIR/live.swf``) and replayed in the simulator as ``mb compare --live-vs-sim``
does, under P (default: the cluster's own policy and parameters), whose table
is printed. DIR (default ``./mb-replay``) also gets ``replay.csv`` (trace job ->
live job), the comparison's files and the jobs' output (``DIR/output``).

Everything is checked before the first job is sent (the trace, the speedup, the
policy, a running cluster): bad input changes nothing. Stopped half-way (Ctrl-C,
a refused submission), it says which jobs it had submitted; they stay.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from minibatch.cli import common
from minibatch.cli.sim import LimitOpt, ParamOpt, parse_params, show_live_vs_sim
from minibatch.errors import InvalidArgument, MinibatchError

if TYPE_CHECKING:
    from minibatch.core.job import Job
    from minibatch.net.client import Client
    from minibatch.sim.replay import Submission

#: Seconds between two looks at the jobs' states.
POLL_S = 0.5
PROG = "mb replay"


def replay_command(
    trace: Annotated[str, typer.Argument(help="SWF trace (plain or .gz).")],
    speedup: Annotated[
        float,
        typer.Option(
            "--speedup", help="Divide submit, run and requested times by this."
        ),
    ] = 600.0,
    limit: LimitOpt = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            "-p",
            help="Policy of the simulated replay (default: the cluster's own).",
        ),
    ] = None,
    param: ParamOpt = None,
    burn: Annotated[
        bool,
        typer.Option("--burn", help="Jobs keep their CPUs busy instead of sleeping."),
    ] = False,
    out: Annotated[
        str, typer.Option("--out", "-o", help="Where to write the files.")
    ] = "mb-replay",
) -> None:
    """Submit TRACE's jobs at their scaled times, then compare with the simulator."""
    from minibatch.policy import registry
    from minibatch.protocol.messages import GetPolicy, NodeList, QueryNodes
    from minibatch.sim import replay
    from minibatch.sim.machine import Machine, NodeSpec
    from minibatch.sim.runner import SimConfig
    from minibatch.sim.swf import export_swf, find_trace, read_swf, select_jobs

    with common.reporting(PROG):
        replay.check_speedup(speedup)
        if limit is not None and limit < 1:
            raise InvalidArgument("--limit must be at least 1")
        path = find_trace(trace)
        try:
            records = read_swf(path)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{path} is not an SWF trace: {exc}") from None
        command = replay.program(burn)
        with common.connect() as client:
            nodes: NodeList = client.call(QueryNodes())
            live = client.call(GetPolicy())
        name = policy or live.name
        params = parse_params(param) if policy or param else dict(live.params)
        registry.load(name, params)  # as the comparison will, before any job is sent
        # The nodes that can run the slice now (not down, offline or unknown).
        layout = [
            (n.name, len(n.cpus))
            for n in nodes.nodes
            if n.state not in ("down", "offline", "unknown")
        ]
        machine = Machine(nodes=tuple(NodeSpec(n, c) for n, c in layout))
        jobs = select_jobs(records, machine, limit=limit)
        if not jobs:
            raise InvalidArgument(
                f"no job of {trace} fits the cluster ({machine.describe()})"
            )
        plan = replay.schedule(jobs, speedup)
        target = Path(out)
        output = target / "output"
        output.mkdir(parents=True, exist_ok=True)
        submit = submitter(command, output)
        say(
            f"replaying {len(plan)} jobs of {trace} on {machine.describe()}, "
            f"{speedup:g}x faster (about {plan[-1].at:.0f} s of submissions)"
        )
        ids = run(plan, submit)
        (target / "replay.csv").write_text(replay.mapping_csv(plan, ids))
        swf = target / "live.swf"
        swf.write_text(export_swf(jobs_of(ids), nodes=layout, decimals=3))
        say(f"wrote {target}/replay.csv and {swf}; replaying it under {name}")
        show_live_vs_sim(SimConfig(trace=str(swf), policy=name, params=params), out)


def say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


Submitter = Callable[["Client", "Submission"], int]


def submitter(command: Sequence[str], output: Path) -> Submitter:
    """What submits one planned job (its qsub command line, run by qsub's own
    parser): ``command`` with its seconds, its output joined into ``output``."""
    from minibatch.cli.qsub import make_spec
    from minibatch.cli.submission import current_dir
    from minibatch.protocol.messages import Submit
    from minibatch.sim import replay

    workdir, into = current_dir(), str(output.resolve())

    def submit(client: Client, sub: Submission) -> int:
        argv = replay.qsub_args(sub, command, into)
        made = make_spec(argv, environ=os.environ, workdir=workdir, mail=False)
        assert made is not None  # no --help among our own arguments
        return int(client.call(Submit(spec=made[0])).ids[0])

    return submit


def run(
    plan: Sequence[Submission],
    submit: Submitter,
    report: Callable[[str], None] = say,
) -> list[int]:
    """Submit ``plan`` on time and wait until every job has ended; the job ids.
    ``report`` gets a progress line whenever the counts change."""
    from minibatch.sim.replay import progress_line

    ids: list[int] = []
    shown = ""
    began = time.monotonic()
    try:
        with common.connect() as client:
            while True:
                elapsed = time.monotonic() - began
                while len(ids) < len(plan) and plan[len(ids)].at <= elapsed:
                    ids.append(submit(client, plan[len(ids)]))
                running, finished = _states(client, ids)
                line = progress_line(len(plan), len(ids), running, finished)
                if line != shown:
                    report(line)
                    shown = line
                if finished == len(plan):
                    return ids
                wake = began + plan[len(ids)].at if len(ids) < len(plan) else None
                pause = POLL_S if wake is None else min(POLL_S, wake - time.monotonic())
                time.sleep(max(0.0, pause))
    except (KeyboardInterrupt, MinibatchError):
        if ids:
            report(
                f"stopped: jobs {ids[0]} to {ids[-1]} were submitted and stay "
                "(qdel them to end them)"
            )
        raise


def _states(client: Client, ids: Sequence[int]) -> tuple[int, int]:
    """How many of ``ids`` run, and how many have ended."""
    from minibatch.core.job import ACTIVE_STATES
    from minibatch.protocol.messages import QueryJobs

    mine = set(ids)
    active = [j for j in client.call(QueryJobs(active=True)).jobs if j.id in mine]
    running = sum(1 for j in active if j.state in ACTIVE_STATES)
    return running, len(ids) - len(active)


def jobs_of(ids: Sequence[int]) -> list[Job]:
    from minibatch.protocol.messages import QueryJobs

    selectors = [str(i) for i in ids]
    return list(common.call(QueryJobs(selectors=selectors, finished=True)).jobs)
