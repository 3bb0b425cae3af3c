"""``qdel``, ``qhold``, ``qrls`` and ``qalter``: act on jobs already submitted.

Like their PBS namesakes they print nothing on success, and act on each id on
its own: ``qdel 13 14`` deletes 13 even when 14 is unknown, says
``qdel: Unknown Job Id 14`` on stderr and exits 1 (2 if an id was malformed).
``qalter`` changes a pending job's name, walltime or CPU count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common, pbsopts
from minibatch.core.units import parse_duration
from minibatch.errors import ErrorCode, InvalidArgument

if TYPE_CHECKING:
    import typer

    from minibatch.protocol.messages import Message
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}

#: The ids every command here takes. Spelled out in each signature: an alias
#: built at import would import typer.
IDS_HELP = "Job ids: 7, 7[] (a whole array) or 7[2]."


def per_id(
    prog: str, job_ids: list[str], request: Callable[[list[str]], Message]
) -> None:
    """Send ``request(selectors)`` (a request the server acts on id by id) and
    report each id it refused, as PBS does: the others are done all the same,
    and the exit status is 1 if any was refused (2 if one was malformed)."""
    selectors: dict[str, str] = {}
    code = 0
    for text in job_ids:
        try:
            selectors.setdefault(common.parse_selector(text), text)
        except InvalidArgument as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            code = common.USAGE_EXIT
    if selectors:
        with common.reporting(prog):
            reply = common.call(request(list(selectors)))
        for refusal in reply.refused:
            given = selectors.get(refusal.selector, refusal.selector)
            if refusal.code == ErrorCode.NOT_FOUND:
                print(f"{prog}: Unknown Job Id {given}", file=sys.stderr)
            else:
                print(f"{prog}: {refusal.message}", file=sys.stderr)
            code = code or common.ERROR_EXIT
    if code:
        raise SystemExit(code)


TASKS_HELP = "Only these tasks of each array id (Torque's -t, e.g. 1-5,7)."


def array_tasks(prog: str, job_ids: list[str], tasks: str | None) -> list[str]:
    """``job_ids`` with each array id (``7[]`` or ``7``) replaced by the tasks
    ``-t`` names (``7[1]`` ... ``7[5]``); ids of one task stay as they are."""
    if tasks is None:
        return job_ids
    from minibatch.cli.optvalues import parse_array

    with common.reporting(prog):
        indices, limit = parse_array(tasks)
        if limit:
            raise InvalidArgument(f"-t {tasks!r}: a slot limit means nothing here")
    out: list[str] = []
    for text in job_ids:
        base = text.strip().removesuffix("[]")
        if "[" in base:
            out.append(text)
        else:
            out += [f"{base}[{i}]" for i in indices]
    return out


def _control(prog: str, action: str, job_ids: list[str], tasks: str | None) -> None:
    from minibatch.protocol.messages import JobControl

    per_id(
        prog,
        array_tasks(prog, job_ids, tasks),
        lambda selectors: JobControl(action=action, selectors=selectors, each=True),
    )


def qdel_command(
    job_ids: Annotated[
        list[str],
        typer.Argument(
            metavar="ID",
            help=IDS_HELP + " all: every job of yours.",
            show_default=False,
        ),
    ],
    tasks: Annotated[
        str | None, typer.Option("-t", help=TASKS_HELP, show_default=False)
    ] = None,
    purge: Annotated[
        bool, typer.Option("-p", help="Purge (as qdel does: see -W force).")
    ] = False,
    extend: Annotated[
        str | None,
        typer.Option(
            "-W", help="force or suppress_email=N (PBS Pro).", show_default=False
        ),
    ] = None,
) -> None:
    """Cancel jobs: pending ones are removed, running ones are killed; a job
    whose node is down ends at once (what -p and -W force ask for)."""
    if (
        extend is not None
        and extend != "force"
        and not extend.startswith("suppress_email=")
    ):
        common.fail("qdel", f"-W {extend}: only force and suppress_email=N", 2)
    if any(i in ("all", "ALL") for i in job_ids):
        job_ids = [i for i in job_ids if i not in ("all", "ALL")] + _all_jobs()
        if not job_ids:
            return  # nothing of the caller's to delete: Torque is silent too
    _control("qdel", "cancel", job_ids, tasks)


def _all_jobs() -> list[str]:
    """``qdel all``: the caller's pending and running jobs (root's: all), each
    array once."""
    import os

    from minibatch.cli.submission import login_name
    from minibatch.protocol.messages import QueryJobs

    user = None if os.geteuid() == 0 else login_name()
    with common.reporting("qdel"):
        jobs = common.call(QueryJobs(user=user)).jobs
    ids = [f"{j.array_id}[]" if j.array_id is not None else str(j.id) for j in jobs]
    return list(dict.fromkeys(ids))


def qhold_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
    tasks: Annotated[
        str | None, typer.Option("-t", help=TASKS_HELP, show_default=False)
    ] = None,
) -> None:
    """Put pending jobs on user hold."""
    _control("qhold", "hold", job_ids, tasks)


def qrls_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
    tasks: Annotated[
        str | None, typer.Option("-t", help=TASKS_HELP, show_default=False)
    ] = None,
) -> None:
    """Release held jobs."""
    _control("qrls", "release", job_ids, tasks)


def alter_fields(resources: list[str]) -> tuple[int | None, int | None]:
    """``-l`` lists -> (walltime, ncpus); any other resource is an error."""
    walltime = ncpus = None
    for text in resources:
        for key, value in pbsopts.parse_resource_list(text):
            if key == "walltime":
                walltime = parse_duration(value)
            elif key == "ncpus":
                ncpus = common.positive_int(value, "ncpus")
            else:
                raise InvalidArgument(f"cannot alter {key!r} (only walltime and ncpus)")
    return walltime, ncpus


def qalter_command(
    job_ids: Annotated[
        list[str], typer.Argument(metavar="ID", help=IDS_HELP, show_default=False)
    ],
    name: Annotated[
        str | None, typer.Option("-N", "--name", help="New job name.")
    ] = None,
    resources: Annotated[
        list[str] | None,
        typer.Option(
            "-l",
            "--resource",
            help="walltime=[[HH:]MM:]SS and/or ncpus=N (repeatable, comma lists).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Change a pending job's name, walltime or CPU count."""
    with common.reporting("qalter"):
        selectors = [common.parse_selector(j) for j in job_ids]
        walltime, ncpus = alter_fields(resources or [])
        if name is not None:
            common.check_name(name)
        if name is None and walltime is None and ncpus is None:
            raise InvalidArgument(
                "nothing to alter (give -N NAME or -l walltime=/ncpus=)"
            )
        from minibatch.protocol.messages import Alter

        for selector in selectors:
            common.call(
                Alter(selector=selector, name=name, walltime=walltime, ncpus=ncpus)
            )


def qdel_main() -> None:
    common.script(qdel_command, "qdel", context_settings=CONTEXT_SETTINGS)


def qhold_main() -> None:
    common.script(qhold_command, "qhold", context_settings=CONTEXT_SETTINGS)


def qrls_main() -> None:
    common.script(qrls_command, "qrls", context_settings=CONTEXT_SETTINGS)


#: What PBS's qalter also changes (``-W depend=``, ``-o``, ``-p``, ...), which
#: minibatch's does not: refused naming what it changes, not "No such option".
_QALTER_ELSEWHERE = frozenset(
    ("-a", "-A", "-c", "-e", "-j", "-k", "-m", "-M", "-o", "-p", "-P", "-q", "-r")
    + ("-S", "-u", "-v", "-W")
)


def qalter_main() -> None:
    for arg in sys.argv[1:]:
        if arg == "--":
            break
        if arg[:2] in _QALTER_ELSEWHERE:
            common.fail(
                "qalter",
                f"{arg[:2]}: qalter changes a pending job's -N and -l walltime=/ncpus= "
                "here (a running malleable job's ncpus too); for the rest, qdel "
                "the job and submit it again",
                common.USAGE_EXIT,
            )
    common.script(qalter_command, "qalter", context_settings=CONTEXT_SETTINGS)
