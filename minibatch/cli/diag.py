"""``checkjob`` and ``diagnose``: why a job waits, and how priorities come about.

    checkjob ID      state, credentials, request, priority breakdown, PSP bin,
                     reservation, predicted start and the scheduler's reason
    diagnose -p      every eligible job's priority components (Maui's layout)
    diagnose -f      fairshare usage against targets

The numbers are computed here from the server's snapshot with the live policy's
parameters (:mod:`minibatch.cli.ranking`), with the functions the policies plan
with: :func:`minibatch.policy.priority.breakdown`,
:func:`minibatch.policy.fairshare.fairshare_rows` and
:func:`minibatch.policy.psp.user_bin`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, render
from minibatch.cli.ranking import Ranking, maui_date, maui_duration, rank
from minibatch.core.job import Job, JobResult, JobState, eligible_time
from minibatch.core.snapshot import ClusterSnapshot
from minibatch.core.units import format_cpu_list, format_size_kb
from minibatch.errors import InvalidArgument
from minibatch.protocol.messages import DiagnoseReply
from minibatch.server.records import pending_view

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}

#: Maui's column labels for components and subcomponents.
LABELS = {"cred": "Cred", "fs": "FS", "serv": "Serv", "targ": "Targ", "res": "Res"}
LABELS["psp"] = "PSP"
SUBLABELS = {
    "user": "User",
    "group": "Grp",
    "account": "Acct",
    "qos": "QOS",
    "queuetime": "QTime",
    "xfactor": "XFctr",
    "node": "Node",
    "proc": "Proc",
    "mem": "Mem",
    "walltime": "WCL",
    "ps": "PS",
    "pe": "PE",
    "bin": "Bin",
}
_STATES = {
    JobState.QUEUED: "Idle",
    JobState.HELD: "UserHold",
    JobState.WAITING: "Depend",
    JobState.RUNNING: "Running",
    JobState.EXITING: "Exiting",
}


def shown_components(
    ranking: Ranking,
) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """(component, weight, [(subcomponent, weight)]) that can contribute."""
    from minibatch.policy.priority import COMPONENTS

    w = ranking.weights
    fs_on = w.fspolicy.value != "NONE"
    out = []
    for comp, cw_name, subs in COMPONENTS:
        cw = w.weight(cw_name)
        if cw == 0 or (comp == "fs" and not fs_on):
            continue
        active = [(s, w.weight(sw)) for s, sw in subs if w.weight(sw) != 0]
        if active:
            out.append((comp, cw, active))
    return out


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 1e6 else f"{x:.3g}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out


def render_priorities(reply: DiagnoseReply) -> str:
    """``diagnose -p``: percent of each job's priority per component, raw values
    in parentheses (weighted for FS), weights on top, averages at the bottom."""
    from minibatch.policy.priority import Scorer

    ranking = rank(reply)
    comps = shown_components(ranking)
    scorer = Scorer(reply.snapshot, ranking.weights)
    header = ["Job", "PRIORITY*"]
    weights = ["             Weights", "--------"]
    for comp, cw, subs in comps:
        header.append(f"{LABELS[comp]}({':'.join(SUBLABELS[s] for s, _ in subs)})")
        weights.append(f"{_num(cw)}({':'.join(_num(sw) for _, sw in subs)})")
    rows = [header, weights]
    sums = [0.0] * len(comps)
    for job in ranking.order:
        parts = scorer.breakdown(job)
        raw = scorer.raw(job)
        total = sum(parts[c] for c, _, _ in comps)
        mark = "*" if job.priority else ""
        row = [str(job.id), f"{parts['total']:.0f}{mark}"]
        for i, (comp, _, subs) in enumerate(comps):
            pct = 100.0 * parts[comp] / total if total else 0.0
            sums[i] += pct
            values = [
                parts[f"{comp}.{s}"] if comp == "fs" else raw[f"{comp}.{s}"]
                for s, _ in subs
            ]
            row.append(f"{pct:.1f}({':'.join(_num(v) for v in values)})")
        rows.append(row)
    n = len(ranking.order)
    footer = ["Percent Contribution", "--------"]
    footer += [f"{s / n:.1f}" if n else "0.0" for s in sums]
    rows.append(footer)
    lines = [
        f"diagnosing job priority information (partition: ALL, policy: "
        f"{ranking.policy})",
        "",
    ]
    lines += _columns(rows)
    lines += ["", "* indicates system prio set on job"]
    if ranking.note:
        lines.append(f"note: {ranking.note}")
    return "\n".join(lines) + "\n"


def render_fairshare(reply: DiagnoseReply) -> str:
    """``diagnose -f``: decayed usage, its share, the target and Δ per entity."""
    from minibatch.policy.fairshare import fairshare_rows

    ranking = rank(reply)
    fs = reply.fairshare
    lines = [
        "FairShare Information",
        "",
        f"Depth: {fs.get('depth', '?')} intervals   Interval Length: "
        f"{maui_duration(float(fs.get('interval', 0)))}   "
        f"Decay Rate: {float(fs.get('decay', 1)):.2f}",
        f"FS Policy: {fs.get('policy', '?')}   (targets from policy "
        f"{ranking.policy!r})",
        "",
    ]
    rows = fairshare_rows(reply.snapshot, ranking.targets)
    table = [["FSInfo", "Usage(proc-s)", "Usage%", "Target", "Delta"]]
    for kind in ("user", "group", "account"):
        of_kind = [r for r in rows if r.kind == kind]
        if not of_kind:
            continue
        table.append([kind.upper(), "", "", "", ""])
        for r in of_kind:
            table.append(
                [
                    f"  {r.name}",
                    f"{r.usage:.1f}",
                    f"{r.percent:.2f}",
                    r.target or "-",
                    f"{r.delta:+.2f}",
                ]
            )
    if len(table) == 1:
        lines.append("no usage recorded and no targets set")
    else:
        lines += _columns(table)
    return "\n".join(lines) + "\n"


def diagnose_command(
    priority: Annotated[bool, typer.Option("-p", help="Priority components.")] = False,
    fairshare: Annotated[
        bool, typer.Option("-f", help="Fairshare usage against targets.")
    ] = False,
) -> None:
    """Show how the live policy's priorities and fairshare come about."""
    with common.reporting("diagnose"):
        if priority == fairshare:
            raise InvalidArgument("give one of -p (priority) or -f (fairshare)")
        from minibatch.protocol.messages import Diagnose

        reply = common.call(Diagnose())
    render = render_priorities if priority else render_fairshare
    sys.stdout.write(render(reply))


# --------------------------------------------------------------- checkjob


def _state(job: Job) -> str:
    if job.state is JobState.FINISHED:
        return "Completed" if job.result is JobResult.COMPLETED else "Removed"
    return _STATES[job.state]


def _priority_lines(ranking: Ranking, snap: ClusterSnapshot, job: Job) -> list[str]:
    from minibatch.policy.priority import Scorer

    scorer = Scorer(snap, ranking.weights)
    view = pending_view(job)
    parts, raw = scorer.breakdown(view), scorer.raw(view)
    lines = [f"StartPriority:  {parts['total']:.2f}  (policy {ranking.policy})"]
    if not ranking.by_priority:
        lines.append(
            f"  (policy {ranking.policy} does not order by it: queue priority "
            f"{view.queue_priority:g}, then qsub -p {view.user_priority}, then "
            "submission, as PBS does)"
        )
    for comp, _, subs in shown_components(ranking):
        inner = "  ".join(
            f"{SUBLABELS[s]}: {_num(raw[f'{comp}.{s}'])}" for s, _ in subs
        )
        lines.append(f"  {LABELS[comp]}: {parts[comp]:.2f}  ({inner})")
    return lines


def render_checkjob(job: Job, reply: DiagnoseReply, now: float) -> str:
    from minibatch.policy.psp import TAGS, user_bin

    snap = reply.snapshot
    req = job.request
    ran = 0.0 if job.start_time is None else (job.end_time or now) - job.start_time
    queued_until = job.start_time or job.end_time or now
    lines = [
        f"checking job {job.display_id}",
        "",
        f"State: {_state(job)}" + (f"  ({job.result.value})" if job.result else ""),
        f"Creds:  user:{job.user}  group:{job.group or '-'}  "
        f"account:{job.account or '-'}  class:{job.queue or '-'}  qos:{job.qos or '-'}",
        f"WallTime: {maui_duration(ran)} of {maui_duration(req.walltime)}",
        f"SubmitTime: {maui_date(job.submit_time)}",
        f"  (Time Queued  Total: {maui_duration(queued_until - job.submit_time)}"
        f"  Eligible: {maui_duration(eligible_time(job, now))})",
        "",
        f"Total Tasks: {req.cpus}",
        "",
        f"Req[0]  TaskCount: {req.cpus}  Partition: ALL",
        f"Nodes: {req.nodes}  PPN: {req.ppn}  Memory: {format_size_kb(req.mem_kb)}"
        f"  GPUs: {req.gpus}",
        "",
        f"IWD: {job.workdir}",
    ]
    if job.alloc:
        where = " ".join(f"{a.node}:{format_cpu_list(a.cpus)}" for a in job.alloc)
        lines.append(f"Allocated: {where}  since {maui_date(job.start_time or now)}")
    if req.malleable is not None:
        held = sum(len(a.cpus) for a in job.alloc)
        now_text = f", holds {held} now" if job.alloc else ""
        lines.append(f"Malleable: {req.malleable[0]}-{req.malleable[1]} CPUs{now_text}")
        if job.time_limit:
            lines.append(f"WallTime limit: {maui_duration(job.time_limit)} (stretched)")
        if job.borrowed:
            lent = ", ".join(f"{n} from job {m}" for m, n in job.borrowed.items())
            lines.append(f"Borrowed: {lent}")
        lines += [f"Resized: {line}" for line in render.resize_history(job)]
    ranking = rank(reply)
    if job.state in (JobState.QUEUED, JobState.HELD, JobState.WAITING):
        lines += _priority_lines(ranking, snap, job)
    psp_bin, mean = user_bin(snap.accuracy, job.user, ranking.psp_default_bin)
    history = snap.accuracy.get(job.user, ())
    if mean is None:
        lines.append(
            f"PSP: bin {psp_bin} ({TAGS[psp_bin]}), {job.user} has no "
            "finished job yet (default bin)"
        )
    else:
        lines.append(
            f"PSP: bin {psp_bin} ({TAGS[psp_bin]}), mean accuracy "
            f"{mean:.2f} over {len(history)} jobs"
        )
    if job.advres:
        found = [r for r in snap.reservations if r.name == job.advres]
        if found:
            r = found[0]
            lines.append(
                f"Advance reservation '{r.name}' ({maui_date(r.start)} -> "
                f"{maui_date(r.end)}  Duration: {maui_duration(r.end - r.start)})"
            )
        else:
            lines.append(f"Advance reservation '{job.advres}' (no longer exists)")
    if job.state is JobState.QUEUED:
        # A predicted start is the policy's reservation for the job (backfill
        # keeps other jobs from delaying it); without one, nothing is held.
        if job.predicted_start is not None:
            start = max(job.predicted_start, now)
            lines.append(
                f"Reservation: starts in {maui_duration(start - now)} on "
                f"{maui_date(start)} (policy {reply.policy})"
            )
        else:
            lines.append(
                f"Reservation: none (policy {reply.policy!r} holds none for this "
                "job, so no start is predicted)"
            )
    if job.reason:
        lines.append(f"Reason: {job.reason}")
    if job.comment:
        lines.append(f"Comment: {job.comment}")
    return "\n".join(lines) + "\n"


def checkjob_command(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A job id.")],
    verbose: Annotated[
        bool,
        typer.Option("-v", help="Maui's verbose: accepted; every detail is shown."),
    ] = False,
) -> None:
    """A job's state, priority breakdown, PSP bin, reservation and reason."""
    with common.reporting("checkjob"):
        from minibatch.protocol.messages import Diagnose, QueryJobs

        selector = common.parse_selector(job_id)
        with common.connect() as client:
            jobs = client.call(QueryJobs(selectors=[selector], finished=True)).jobs
            reply = client.call(Diagnose(jobs=False))
    now = time.time()
    text = "\n".join(render_checkjob(j, reply, now) for j in jobs)
    sys.stdout.write(render.printable(text))


def checkjob_main() -> None:
    common.script(checkjob_command, "checkjob", context_settings=CONTEXT_SETTINGS)


def diagnose_main() -> None:
    common.script(diagnose_command, "diagnose", context_settings=CONTEXT_SETTINGS)
