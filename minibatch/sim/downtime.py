"""Downtimes in the simulator: windows in which CPUs are reserved for nobody.

Maui and the live server call them downtime (system) reservations: ``setres``
without ``-u``. ``mb sim --downtime START,LENGTH[,CPUS]`` puts one on the
simulated machine, from START after the trace's first submission, for LENGTH,
on CPUS processors (default: all of them) taken node by node in machine order.
START and LENGTH are seconds or ``[[DD:]HH:]MM:SS``.

Policies see downtimes in every snapshot (``snap.reservations``), exactly as the
live scheduler sees ``setres`` reservations, and plan around them; the simulator
checks every start against them as the server does (a start that would run, by
its requested time, on a CPU a downtime holds is a policy bug) and runs a pass
at each downtime's start and end.

A job that runs past its requested time is not stopped by a downtime, as it is not
stopped at all without ``--kill-at-walltime``: add that flag for strict windows.
"""

from __future__ import annotations

from typing import NamedTuple

from minibatch.core.snapshot import ReservationView
from minibatch.core.units import parse_duration
from minibatch.errors import InvalidArgument
from minibatch.sim.machine import Machine


class Downtime(NamedTuple):
    """A downtime as given: seconds after the first submission, length, CPUs."""

    start: float
    length: float
    cpus: int | None = None


def parse(text: str) -> Downtime:
    """``START,LENGTH[,CPUS]`` -> :class:`Downtime`, or InvalidArgument naming
    what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 3):
        raise InvalidArgument(
            f"malformed --downtime {text!r} (expected START,LENGTH[,CPUS], "
            "e.g. 86400,4:00:00,64)"
        )
    # A start of zero ("0", "0:00") is at the first submission.
    zero = parts[0] and set(parts[0]) <= {"0", ":"}
    start = 0 if zero else parse_duration(parts[0])
    length = parse_duration(parts[1])
    cpus = None
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise InvalidArgument(
                f"--downtime CPUS must be a positive integer, got {parts[2]!r}"
            )
        cpus = int(parts[2])
    return Downtime(float(start), float(length), cpus)


def place(
    downtimes: list[Downtime], machine: Machine, origin: float
) -> tuple[ReservationView, ...]:
    """The reservations of ``downtimes`` on ``machine``, named ``down.1`` ...,
    their times counted from ``origin`` (the trace's first submission).

    Each takes its CPUs from the first nodes; downtimes that overlap in time
    must fit the machine together (InvalidArgument names the two that do not).
    """
    out: list[ReservationView] = []
    for k, down in enumerate(downtimes, start=1):
        want = machine.procs if down.cpus is None else down.cpus
        if want > machine.procs:
            raise InvalidArgument(
                f"--downtime asks for {want} CPUs; the machine has {machine.procs}"
            )
        nodes = []
        for node in machine.nodes:
            if want == 0:
                break
            take = min(want, node.cpus)
            nodes.append((node.name, take))
            want -= take
        start = origin + down.start
        resv = ReservationView(
            name=f"down.{k}", start=start, end=start + down.length, nodes=tuple(nodes)
        )
        _check_overlaps(resv, out, machine)
        out.append(resv)
    return tuple(out)


def _check_overlaps(
    new: ReservationView, earlier: list[ReservationView], machine: Machine
) -> None:
    size = {n.name: n.cpus for n in machine.nodes}
    for old in earlier:
        if old.start >= new.end or new.start >= old.end:
            continue
        held = dict(old.nodes)
        for name, cpus in new.nodes:
            if held.get(name, 0) + cpus > size[name]:
                raise InvalidArgument(
                    f"downtimes {old.name} and {new.name} overlap and together "
                    f"hold more CPUs than node {name} has ({size[name]})"
                )
