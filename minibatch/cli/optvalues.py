"""Values of qsub and sbatch options: arrays, dependencies, variables, dates.

Pure functions shared by the PBS (:mod:`minibatch.cli.pbsopts`) and Slurm
(:mod:`minibatch.cli.slurmopts`) option tables; each raises
:class:`InvalidArgument` naming what is wrong with the value.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from minibatch.core.job import Dependency, DependKind
from minibatch.errors import InvalidArgument

#: Guards against ``-t 0-999999999`` turning into a billion job records.
MAX_ARRAY = 100_000

# Patterns as text, compiled by re's cache when first used: compiling
# them all as the module loads is ~0.6 ms of every qsub, which uses few.
_ARRAY_ITEM = r"^(\d+)(?:-(\d+)(?:[:](\d+))?)?$"
#: 123, 123.server, 123[] (a whole array), 123[4] or Slurm's 123_4 (one task).
_JOB_REF = r"^(\d+)(?:\[(\d*)\]|_(\d+))?(?:\.[\w.-]+)?$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_WORD = r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}$"
_PBS_DATE = r"^(\d{4,12})(?:\.(\d{2}))?$"
_CLOCK = r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*([AaPp][Mm])?$"
_ISO = r"^(\d{4})-(\d{2})-(\d{2})(?:T(\d{1,2}):(\d{2})(?::(\d{2}))?)?$"
_SLASH = r"^(\d{1,2})[/.](\d{1,2})(?:[/.](\d{2}))?$"
_MMDDYY = r"^(\d{2})(\d{2})(\d{2})?$"
#: One item of ``A=1,B='x,y'``: a name, ``=`` and a quoted value that ends
#: before a comma or the end, else anything up to a comma.
_ENV_ITEM = r"""(?s)[^,]*?=(['"]).*?\1(?=,|\Z)|[^,]*"""
_RELATIVE = r"^now(?:([+-])(\d+)(seconds?|minutes?|hours?|days?|weeks?)?)?$"
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Slurm's named times of day (sbatch --begin).
_NAMED = {"midnight": 0, "noon": 12, "fika": 15, "teatime": 16}

#: Dependency types as PBS and Slurm spell them -> (kind, whole array).
_DEPEND_KINDS = {
    "afterok": (DependKind.AFTEROK, False),
    "afternotok": (DependKind.AFTERNOTOK, False),
    "afterany": (DependKind.AFTERANY, False),
    "afterokarray": (DependKind.AFTEROK, True),
    "afternotokarray": (DependKind.AFTERNOTOK, True),
    "afteranyarray": (DependKind.AFTERANY, True),
}


def check_word(value: str, what: str) -> str:
    """A QOS, account, project or queue name: letters, digits and ``_ . - @ +``."""
    if not re.match(_WORD, value):
        raise InvalidArgument(f"invalid {what} {value!r}")
    return value


def parse_array(text: str) -> tuple[list[int], int]:
    """``1-10``, ``1,3,5-7``, ``0-15:2``, each optionally ``%N`` -> (sorted unique
    indices, the most tasks that may run at once, 0 for no limit)."""
    spec, pct, limit_text = text.strip().partition("%")
    limit = 0
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise InvalidArgument(
                f"malformed array slot limit in {text!r} (e.g. 1-10%2)"
            )
        limit = int(limit_text)
    indices: set[int] = set()
    for item in spec.split(","):
        m = re.match(_ARRAY_ITEM, item.strip())
        if m is None:
            raise InvalidArgument(f"malformed array range {text!r} (e.g. 1-10,12)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise InvalidArgument(f"malformed array range {item!r} in {text!r}")
        if len(indices) + (hi - lo) // step + 1 > MAX_ARRAY:
            raise InvalidArgument(f"array {text!r} has more than {MAX_ARRAY} tasks")
        indices.update(range(lo, hi + 1, step))
    return sorted(indices), limit


def parse_depend(text: str) -> list[Dependency]:
    """``afterok:1:2,afterany:3``, ``afterokarray:5[]`` -> dependencies (all must
    hold, as in PBS; ``5[]`` stands for every task of array 5)."""
    if "?" in text:
        raise InvalidArgument(f"'?' (any-of) dependencies are not supported: {text!r}")
    deps: list[Dependency] = []
    for clause in text.split(","):
        kind_text, _, ids = clause.strip().partition(":")
        found = _DEPEND_KINDS.get(kind_text.lower())
        if found is None:
            supported = ", ".join(_DEPEND_KINDS)
            raise InvalidArgument(
                f"unsupported dependency type {kind_text!r} (supported: {supported})"
            )
        kind, whole = found
        if not ids:
            raise InvalidArgument(f"dependency {clause!r} names no job")
        for ref in ids.split(":"):
            m = re.match(_JOB_REF, ref.strip())  # 123, 123.server, 123[] or 123[4]
            if m is None:
                raise InvalidArgument(f"malformed job id {ref!r} in a dependency")
            index = m.group(2)
            task = m.group(3) or index or None
            if task is not None and whole:
                raise InvalidArgument(f"dependency {clause!r}: an array, not a task")
            # afterok:5[] (PBS Pro) and afterokarray:5 (Torque): every task.
            dep = Dependency(
                kind,
                int(m.group(1)),
                whole or index == "",
                None if task is None else int(task),
            )
            if dep not in deps:
                deps.append(dep)
    return deps


def parse_env_list(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``A=1,B=2,C`` -> variables; a bare name takes its value from ``environ``.

    A value in quotes may hold commas, as PBS Pro documents it (``qsub -v
    "A='x,y',B=1"``): the quotes go, the commas stay."""
    out: dict[str, str] = {}
    for item in _comma_items(text):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not re.match(_ENV_NAME, name):
            raise InvalidArgument(f"malformed variable {item!r} in {text!r}")
        if len(value) >= 2 and value[0] in "'\"" and value[-1] == value[0]:
            value = value[1:-1]
        out[name] = value if sep else environ.get(name, "")
    return out


def _comma_items(text: str) -> list[str]:
    """``text`` cut at its commas, but not inside a value in quotes: a quote
    right after ``=`` that closes right before a comma or the end
    (``A='x,y'``). Any other quote is a character (``MSG=don't``)."""
    items, pos = [], 0
    while True:
        item = re.compile(_ENV_ITEM).match(text, pos)
        assert item is not None  # the second branch matches anything
        items.append(item.group())
        pos = item.end() + 1  # past the comma
        if pos > len(text):
            return items


def _at(now: float, year: int, month: int, day: int, h: int, m: int, s: int) -> float:
    try:
        when = time.mktime((year, month, day, h, m, s, 0, 0, -1))
    except (OverflowError, ValueError):
        raise InvalidArgument("date out of range") from None
    check = time.localtime(when)
    if (check.tm_mon, check.tm_mday) != (month, day) or not 0 <= h < 24 or m > 59:
        raise InvalidArgument("no such date or time")
    return when


def _next_clock(now: float, h: int, m: int, s: int) -> float:
    """Today at h:m:s, or tomorrow when that has passed (PBS and Slurm alike)."""
    t = time.localtime(now)
    when = _at(now, t.tm_year, t.tm_mon, t.tm_mday, h, m, s)
    return when if when > now else _at(now, t.tm_year, t.tm_mon, t.tm_mday + 1, h, m, s)


def parse_pbs_date(text: str, now: float) -> float:
    """qsub ``-a [[[[CC]YY]MM]DD]hhmm[.SS]`` -> epoch seconds (local time)."""
    m = re.match(_PBS_DATE, text.strip())
    if m is None or len(m.group(1)) % 2:
        raise InvalidArgument(
            f"malformed date {text!r} (expected [[[[CC]YY]MM]DD]hhmm[.SS])"
        )
    digits, sec = m.group(1), int(m.group(2) or 0)
    pairs = [int(digits[i : i + 2]) for i in range(0, len(digits), 2)]
    hh, mm = pairs[-2], pairs[-1]
    rest = pairs[:-2]
    t = time.localtime(now)
    if not rest:
        return _next_clock(now, hh, mm, sec)
    day = rest[-1]
    month = rest[-2] if len(rest) >= 2 else t.tm_mon
    if len(rest) >= 4:
        year = rest[-4] * 100 + rest[-3]
    elif len(rest) == 3:
        year = 2000 + rest[-3]
    else:
        year = t.tm_year
    return _at(now, year, month, day, hh, mm, sec)


def relative_time(text: str, now: float) -> float | None:
    """Slurm's ``now``, ``now+N[units]``, ``now-N[units]`` (seconds by
    default), or None for any other form."""
    m = re.match(_RELATIVE, text.strip().lower())
    if m is None:
        return None
    sign = -1 if m.group(1) == "-" else 1
    return now + sign * int(m.group(2) or 0) * _UNIT[(m.group(3) or "s")[0]]


def parse_slurm_begin(text: str, now: float) -> float:
    """sbatch ``--begin``: ``HH:MM[:SS] [AM|PM]``, ``YYYY-MM-DD[THH:MM[:SS]]``,
    ``MM/DD[/YY]``, ``MMDD[YY]``, ``now[+N[units]]``, midnight, noon, fika,
    teatime, today, tomorrow -> epoch seconds (local time)."""
    value = text.strip().lower()
    t = time.localtime(now)
    relative = relative_time(value, now)
    if relative is not None:
        return relative
    if value in _NAMED:
        return _next_clock(now, _NAMED[value], 0, 0)
    if value in ("today", "tomorrow"):
        extra = 1 if value == "tomorrow" else 0
        return _at(now, t.tm_year, t.tm_mon, t.tm_mday + extra, 0, 0, 0)
    if m := re.match(_CLOCK, value):
        h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if m.group(4):
            h = h % 12 + (12 if m.group(4).lower() == "pm" else 0)
        return _next_clock(now, h, mi, s)
    if m := re.match(_ISO, value.upper()):
        y, mo, d, h, mi, s = (int(g or 0) for g in m.groups())
        return _at(now, y, mo, d, h, mi, s)
    if m := re.match(_SLASH, value) or re.match(_MMDDYY, value):
        year = 2000 + int(m.group(3)) if m.group(3) else t.tm_year
        return _at(now, year, int(m.group(1)), int(m.group(2)), 0, 0, 0)
    raise InvalidArgument(
        f"malformed begin time {text!r} (e.g. 16:00, 2026-12-01T08:00, now+1hour)"
    )
