"""``setres``, ``showres`` and ``releaseres``: Maui's advance reservations.

    setres -u USER[,USER] -s START -d DURATION (-n NODES | -c CPUS) [-N NAME]
    setres -s START -d DURATION -n NODES          a downtime reservation (no -u)
    showres [-n] [NAME...]
    releaseres NAME...

START is ``now`` (the default), ``+[[DD:]HH:]MM:SS`` from now, ``HH:MM[:SS]``
today (Maui's ``HH:MM:SS_MO/DD[/YY]`` for another day) or an ISO date-time
(``2025-03-01T14:00``). DURATION is ``[[DD:]HH:]MM:SS``. NODES is a count, a
comma list of node names, or ``ALL``. Only the users named may run jobs in it
(``qsub -l advres=NAME``); without ``-u`` no job may use its CPUs during the
window (maintenance). Creating and releasing reservations is for operators.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from minibatch.cli import common
from minibatch.cli.ranking import maui_date, maui_duration
from minibatch.core.reservation import Reservation
from minibatch.core.units import format_cpu_list, parse_duration
from minibatch.errors import InvalidArgument

if TYPE_CHECKING:
    import typer
else:
    from minibatch.cli.fastargs import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["--help"]}

_CLOCK = re.compile(
    r"^(\d{1,2}):(\d{2})(?::(\d{2}))?(?:_(\d{1,2})/(\d{1,2})(?:/(\d{2,4}))?)?$"
)
#: Beyond this a relative time shows as INFINITY (Maui: 1000 hours).
INFINITY = 1000 * 3600


def parse_start(text: str, now: float) -> float:
    """A reservation start as setres takes it -> epoch seconds."""
    text = text.strip()
    if text.lower() == "now":
        return now
    if text.startswith("+"):
        rest = text[1:]
        if rest.strip(":0") == "":
            return now
        return now + parse_duration(rest)
    m = _CLOCK.match(text)
    if m is not None:
        hour, minute, second, month, day, year = m.groups()
        today = datetime.fromtimestamp(now)
        if year is not None and len(year) == 2:
            year = "20" + year
        try:
            when = today.replace(
                hour=int(hour),
                minute=int(minute),
                second=int(second or 0),
                microsecond=0,
                month=int(month or today.month),
                day=int(day or today.day),
                year=int(year or today.year),
            )
        except ValueError as exc:
            raise InvalidArgument(f"bad start time {text!r}: {exc}") from None
        return when.timestamp()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise InvalidArgument(
            f"malformed start {text!r} (now, +HH:MM:SS, HH:MM[:SS] or "
            "YYYY-MM-DDTHH:MM[:SS])"
        ) from None


def parse_nodes(text: str) -> tuple[list[str], int]:
    """``-n``: (node names, 0), ([], count), or (["ALL"], 0) for every node."""
    value = text.strip()
    if value.isdigit():
        return [], common.positive_int(value, "node count")
    names = [n.strip() for n in value.replace(":", ",").split(",") if n.strip()]
    if not names:
        raise InvalidArgument(f"malformed node list {text!r}")
    return names, 0


def _users(text: str | None) -> list[str]:
    if not text:
        return []
    users = [u.strip() for u in re.split(r"[,:]", text) if u.strip()]
    if not users:
        raise InvalidArgument(f"malformed user list {text!r}")
    return users


def _where(resv: Reservation) -> str:
    return ",".join(f"{a.node}:{format_cpu_list(a.cpus)}" for a in resv.alloc)


def _nodes_word(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def setres_command(
    users: Annotated[
        str | None,
        typer.Option(
            "-u", help="Users who may run in it (USER[,USER]); none: downtime."
        ),
    ] = None,
    start: Annotated[
        str, typer.Option("-s", help="now, +HH:MM:SS, HH:MM[:SS] or ISO date-time.")
    ] = "now",
    duration: Annotated[
        str | None, typer.Option("-d", help="[[DD:]HH:]MM:SS", show_default=False)
    ] = None,
    nodes: Annotated[
        str | None, typer.Option("-n", help="A node count, node names, or ALL.")
    ] = None,
    cpus: Annotated[
        int | None, typer.Option("-c", help="A number of CPUs.", show_default=False)
    ] = None,
    name: Annotated[
        str | None, typer.Option("-N", help="Reservation name (default USER.N).")
    ] = None,
) -> None:
    """Reserve nodes or CPUs for users (or for maintenance) over a time window."""
    with common.reporting("setres"):
        if duration is None:
            raise InvalidArgument("a duration is needed (-d [[HH:]MM:]SS)")
        if (nodes is None) == (cpus is None):
            raise InvalidArgument("give either -n NODES or -c CPUS")
        now = time.time()
        names, count = parse_nodes(nodes) if nodes is not None else ([], 0)
        if cpus is not None and cpus < 1:
            raise InvalidArgument(f"-c must be a positive integer, got {cpus}")
        from minibatch.protocol.messages import QueryNodes, SetReservation

        with common.connect() as client:
            if [n.upper() for n in names] == ["ALL"]:
                names = sorted(n.name for n in client.call(QueryNodes()).nodes)
            reply = client.call(
                SetReservation(
                    name=name or "",
                    users=_users(users),
                    start=parse_start(start, now),
                    duration=float(parse_duration(duration)),
                    nodes=names,
                    node_count=count,
                    cpus=cpus or 0,
                )
            )
    (resv,) = reply.reservations
    print(
        f"reservation '{resv.name}' created on {_nodes_word(len(resv.alloc))} "
        f"({resv.cpus} tasks): {_where(resv)}, {maui_date(resv.start)} to "
        f"{maui_date(resv.end)}"
    )


def _relative(seconds: float) -> str:
    if seconds >= INFINITY:
        return "INFINITY"
    return maui_duration(seconds)


def render_showres(reservations: Sequence[Reservation], now: float) -> str:
    """Maui's ``showres`` table (``src/UserI.c`` ``UIResList``)."""
    row = "{:<18} {:>6} {:1} {:>11} {:>11} {:>11} {:>9}  {}"
    lines = [
        row.format(
            "ReservationID", "Type", "S", "Start", "End", "Duration", "N/P", "StartTime"
        ),
        "",
    ]
    for resv in reservations:
        state = "R" if resv.active(now) else "I"
        lines.append(
            row.format(
                resv.name,
                resv.kind,
                state,
                _relative(resv.start - now),
                _relative(resv.end - now),
                _relative(resv.duration),
                f"{len(resv.alloc)}/{resv.cpus}",
                maui_date(resv.start),
            )
        )
        users = ",".join(resv.users) if resv.users else "(downtime: no jobs)"
        lines.append(f"    users: {users}  CPUs: {_where(resv)}")
    count = len(reservations)
    lines += ["", f"{count} reservation{'s' if count != 1 else ''} located"]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_showres_nodes(reservations: Sequence[Reservation], now: float) -> str:
    """``showres -n``: one line per node and reservation."""
    row = "{:<18} {:>6} {:<18} {:>5} {:>11} {:>11}  {}"
    lines = [
        row.format(
            "NodeName",
            "Type",
            "ReservationID",
            "Task",
            "Start",
            "Duration",
            "StartTime",
        ),
        "",
    ]
    entries = sorted(
        ((a.node, r, len(a.cpus)) for r in reservations for a in r.alloc),
        key=lambda e: (e[0], e[1].start, e[1].name),
    )
    for node, resv, tasks in entries:
        lines.append(
            row.format(
                node,
                resv.kind,
                resv.name,
                tasks,
                _relative(resv.start - now),
                _relative(resv.duration),
                maui_date(resv.start),
            )
        )
    count = len(reservations)
    lines += ["", f"{count} reservation{'s' if count != 1 else ''} located"]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def showres_command(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Reservation names (default: all).", show_default=False),
    ] = None,
    by_node: Annotated[bool, typer.Option("-n", help="One line per node.")] = False,
) -> None:
    """Show advance reservations: window, nodes/CPUs, who may use them."""
    with common.reporting("showres"):
        from minibatch.protocol.messages import QueryReservations

        reply = common.call(QueryReservations(names=list(names or [])))
    now = reply.now or time.time()
    render = render_showres_nodes if by_node else render_showres
    sys.stdout.write(render(reply.reservations, now))


def releaseres_command(
    names: Annotated[
        list[str], typer.Argument(metavar="NAME", help="Reservations to release.")
    ],
) -> None:
    """Release reservations; pending jobs submitted into them are cancelled."""
    with common.reporting("releaseres"):
        from minibatch.protocol.messages import ReleaseReservation

        reply = common.call(ReleaseReservation(names=list(names)))
    for resv in reply.reservations:
        print(f"released {resv.kind} reservation '{resv.name}'")
    if reply.cancelled:
        ids = ", ".join(map(str, reply.cancelled))
        print(f"cancelled pending jobs that needed it: {ids}")


def setres_main() -> None:
    common.script(setres_command, "setres", context_settings=CONTEXT_SETTINGS)


def showres_main() -> None:
    common.script(showres_command, "showres", context_settings=CONTEXT_SETTINGS)


def releaseres_main() -> None:
    common.script(releaseres_command, "releaseres", context_settings=CONTEXT_SETTINGS)
