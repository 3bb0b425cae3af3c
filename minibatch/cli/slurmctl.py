"""``scontrol``: the parts of Slurm's control command a user needs here.

    scontrol show job [ID]            Slurm's Key=Value block of each job
    scontrol show partition [NAME]    each queue as a Slurm partition
    scontrol show hostnames [LIST]    node[0-3,7] -> a name a line
                                      (LIST defaults to $SLURM_JOB_NODELIST)
    scontrol show hostlist LIST       the other way: a,b,c -> Slurm's form
    scontrol hold|release ID...       qhold / qrls
    scontrol requeue ID...            qrerun (operators)

``-o``/``--oneliner`` prints each block on one line. Anything else is refused
with one line naming what is supported.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, qstat, render, slurmcmds, slurmfmt, slurmshow
from minibatch.errors import ErrorCode, InvalidArgument, RemoteError

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

SUPPORTED = (
    "show job [ID], show partition [NAME], show hostnames [LIST], "
    "show hostlist LIST, hold ID..., release ID..., requeue ID..."
)
_ENTITIES = {
    "job": "job",
    "jobs": "job",
    "jobid": "job",
    "partition": "partition",
    "partitions": "partition",
    "partitionname": "partition",
    "hostnames": "hostnames",
    "hostname": "hostnames",
    "hostlist": "hostlist",
}
_ACTIONS = {"hold": "hold", "uhold": "hold", "release": "release"}


def unsupported(what: str) -> InvalidArgument:
    return InvalidArgument(f"{what} is not supported here (supported: {SUPPORTED})")


def key_value(word: str, key: str) -> str:
    """``jobid=7`` / ``JobId=7`` / ``7`` -> ``7`` (Slurm takes either)."""
    head, sep, value = word.partition("=")
    return value if sep and head.lower() == key else word


def show_job(ids: list[str], one_line: bool) -> int:
    from minibatch.protocol.messages import QueryJobs

    now = time.time()
    given, _, code = slurmcmds.resolve("scontrol", ids)
    with slurmcmds.reporting("scontrol"):
        if given:
            jobs = qstat.fetch(QueryJobs(selectors=list(given), finished=True))
        elif code:
            return code
        else:
            jobs = list(common.call(QueryJobs()).jobs)
    if given and not jobs:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return common.ERROR_EXIT
    if not jobs:
        print("No jobs in the system")
    for job in sorted(jobs, key=lambda j: j.id):
        text = slurmshow.block_text(slurmshow.job_block(job, now), one_line)
        sys.stdout.write(render.printable(text) + ("" if one_line else "\n"))
    return code


def show_partition(names: list[str], one_line: bool) -> int:
    from minibatch.protocol.messages import NodeList, QueryNodes, QueryQueues, QueueList

    try:
        with common.connect() as client:
            queues: QueueList = client.call(QueryQueues(names=names))
            nodes: NodeList = client.call(QueryNodes())
    except RemoteError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise
        print(f"Partition {' '.join(names)} not found", file=sys.stderr)
        return common.ERROR_EXIT
    for queue in queues.queues:
        block = slurmshow.partition_block(queue, nodes.nodes)
        text = slurmshow.block_text(block, one_line)
        sys.stdout.write(render.printable(text) + ("" if one_line else "\n"))
    return 0


def show_hostnames(words: list[str]) -> int:
    text = ",".join(words) or os.environ.get("SLURM_JOB_NODELIST", "")
    if not text:
        raise InvalidArgument(
            "no host list given and SLURM_JOB_NODELIST is not set "
            "(scontrol show hostnames node[0-3])"
        )
    sys.stdout.write("".join(f"{h}\n" for h in slurmfmt.expand_hostlist(text)))
    return 0


def show_hostlist(words: list[str]) -> int:
    if not words:
        raise InvalidArgument("no host names given (scontrol show hostlist a,b,c)")
    hosts = slurmfmt.expand_hostlist(",".join(words))
    print(slurmfmt.compress_hostlist(hosts))
    return 0


def control(action: str, words: list[str]) -> int:
    """hold, release or requeue each id; ``{why} for job {id}`` for a refusal."""
    from minibatch.protocol.messages import JobControl, Message, Rerun

    ids = [key_value(w, "jobid") for w in words]
    if not ids:
        raise InvalidArgument(f"{action}: no job id given")
    given, known, code = slurmcmds.resolve("scontrol", ids)
    if not given:
        return code
    selectors = list(given)
    request: Message = (
        Rerun(selectors=selectors)
        if action == "requeue"
        else JobControl(action=action, selectors=selectors, each=True)
    )
    reply = common.call(request)
    failed = slurmcmds.report(reply, given, known, "{why} for job {id}")
    return code or failed


def run(words: list[str], one_line: bool) -> int:
    if not words:
        raise InvalidArgument(f"no command given (supported: {SUPPORTED})")
    command, rest = words[0].lower(), words[1:]
    if command == "show":
        if not rest:
            raise InvalidArgument(f"show what? (supported: {SUPPORTED})")
        head, sep, value = rest[0].partition("=")  # job 7, or JobId=7
        entity = _ENTITIES.get(head.lower())
        args = ([value] if sep else []) + rest[1:]
        if entity == "job":
            return show_job(args, one_line)
        if entity == "partition":
            return show_partition(args, one_line)
        if entity == "hostnames":
            return show_hostnames(args)
        if entity == "hostlist":
            return show_hostlist(args)
        raise unsupported(f"show {rest[0]}")
    if command in _ACTIONS:
        return control(_ACTIONS[command], rest)
    if command == "requeue":
        return control("requeue", rest)
    raise unsupported(repr(words[0]))


def scontrol_command(
    words: Annotated[
        list[str] | None,
        typer.Argument(metavar="COMMAND [ARGS]...", help=SUPPORTED, show_default=False),
    ] = None,
    one_line: Annotated[
        bool, typer.Option("-o", "--oneliner", help="Each block on one line.")
    ] = False,
    details: Annotated[bool, typer.Option("-d", "--details", help="Accepted.")] = False,
    quiet: Annotated[bool, typer.Option("-Q", "--quiet", help="Accepted.")] = False,
) -> None:
    """View jobs, partitions and host lists; hold, release and requeue jobs."""
    with slurmcmds.reporting("scontrol"):
        code = run(words or [], one_line)
    if code:
        raise SystemExit(code)


def main() -> None:
    common.script(scontrol_command, "scontrol", context_settings=CONTEXT_SETTINGS)
