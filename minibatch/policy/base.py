"""The policy contract, and what every policy shares: parameters and reasons.

A policy is a pure function of a snapshot: no IO, no wall clock (``snap.now`` is the
only time), no state carried between calls, deterministic for a snapshot and its
parameters. Its decisions are proposals: the server (live) or the simulator
validates each one against current state and may drop one that no longer fits.
Policies plan on :class:`~minibatch.policy.profile.Profile` (free resources per
node over time).

Parameters come as constructor keywords from ``--param k=v`` and
``[scheduler.params]``: strings or numbers. The ``as_*`` helpers accept both,
validate, and raise :class:`~minibatch.errors.InvalidArgument` naming the
parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import ClassVar, Protocol, TypeVar

import msgspec

from minibatch.core.job import JobRequest
from minibatch.core.snapshot import ClusterSnapshot, PendingView, Plan
from minibatch.core.units import humanize_duration, parse_duration
from minibatch.errors import InvalidArgument

T = TypeVar("T")


class Policy(Protocol):
    name: ClassVar[str]

    def plan(self, snap: ClusterSnapshot) -> Plan: ...


#: A priority order: the pending jobs of a snapshot, highest priority first.
Order = Callable[[ClusterSnapshot], Sequence[PendingView]]


def mem_per_node(req: JobRequest) -> int | None:
    return None if req.mem_kb is None else -(-req.mem_kb // req.nodes)


# ---------------------------------------------------------------- parameters

_OFF = ("none", "all", "inf", "infinite", "unlimited")


def as_int(
    name: str, value: object, *, minimum: int = 0, unlimited: bool = False
) -> int | None:
    """An integer parameter (``3`` or ``"3"``); with ``unlimited``, also None,
    ``"none"``/``"all"``/``"inf"``, which return None."""
    if unlimited and (value is None or str(value).strip().lower() in _OFF):
        return None
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value.strip())
    if number is None:
        extra = " or 'all'" if unlimited else ""
        raise InvalidArgument(
            f"parameter {name}: expected an integer{extra}, got {value!r}"
        )
    if number < minimum:
        raise InvalidArgument(f"parameter {name}: must be >= {minimum}, got {number}")
    return number


def as_seconds(name: str, value: object) -> float:
    """A duration: seconds (``86400``, ``"86400"``) or ``"[[DD:]HH:]MM:SS"``."""
    if isinstance(value, bool):
        raise InvalidArgument(f"parameter {name}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = float(parse_duration(text))
            except InvalidArgument:
                raise InvalidArgument(
                    f"parameter {name}: expected seconds or HH:MM:SS, got {value!r}"
                ) from None
    else:
        raise InvalidArgument(f"parameter {name}: expected a duration, got {value!r}")
    if not seconds >= 0:
        raise InvalidArgument(f"parameter {name}: must be >= 0, got {value!r}")
    return seconds


def as_bool(name: str, value: object) -> bool:
    """``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InvalidArgument(f"parameter {name}: expected true or false, got {value!r}")


def as_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """One of ``choices`` (case-insensitive)."""
    text = str(value).strip().lower()
    if text not in choices:
        raise InvalidArgument(
            f"parameter {name}: expected one of {', '.join(choices)}, got {value!r}"
        )
    return text


def as_order(name: str, value: object) -> Order | None:
    if value is None or callable(value):
        return value
    raise InvalidArgument(f"parameter {name}: expected a function of a snapshot")


# ---------------------------------------------------------------- reasons


def waiting_reason(req: JobRequest, widest: int) -> str:
    """Why a job does not fit now, in the user's terms."""
    return _waiting_text(req.nodes, req.ppn, widest)


@lru_cache(maxsize=4096)
def _waiting_text(nodes: int, ppn: int, widest: int) -> str:
    # Memoised: a pure function of three small numbers, asked for on every pass.
    cpus = "1 CPU" if ppn == 1 else f"{ppn} CPUs"
    if nodes == 1:
        return f"waiting for {cpus} ({widest} free)"
    return f"waiting for {nodes} nodes with {cpus} each"


def reserved_reason(base: str, start: float, now: float) -> str:
    return f"{base}; reserved to start in {humanize_duration(start - now)}"


NEVER = "no usable node has room for it now"


def as_number(name: str, value: object, kind: type[float] | type[int] = float) -> float:
    """A numeric parameter (``kind``: int or float), or a clear error."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidArgument(f"parameter {name}: expected a number, got {value!r}")
    try:
        return kind(value)
    except ValueError:
        raise InvalidArgument(
            f"parameter {name}: expected a number, got {value!r}"
        ) from None


def converted(name: str, value: object, kind: type[T]) -> T:
    """``value`` as ``kind`` (``msgspec.convert``), or a clear error naming
    the parameter: a user's ``--param`` must not end in a traceback."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"parameter {name}: {exc}") from None
