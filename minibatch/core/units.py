"""Parsing and formatting of PBS-style quantities: durations, sizes, CPU lists."""

from __future__ import annotations

import re

from minibatch.errors import InvalidArgument

_SIZE = re.compile(r"^(\d+)\s*([kmgtp]?)(b|w)?$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size_kb(text: str) -> int:
    """PBS size (``512mb``, ``2gb``, ``100kb``, ``1048576``) -> kibibytes (ceil).

    A bare number is bytes, as in PBS; ``w`` (8-byte words) is accepted too.
    """
    m = _SIZE.match(text.strip())
    if not m:
        raise InvalidArgument(f"malformed size {text!r} (expected e.g. 512mb, 2gb)")
    value, power, unit = int(m.group(1)), m.group(2).lower(), (m.group(3) or "b")
    nbytes: int = value * 1024 ** _POWERS[power] * (8 if unit.lower() == "w" else 1)
    if nbytes <= 0:
        raise InvalidArgument(f"size must be positive, got {text!r}")
    return -(-nbytes // 1024)


def parse_duration(text: str) -> int:
    """``[[DD:]HH:]MM:SS`` or plain seconds -> seconds; must be positive."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
        raise InvalidArgument(f"malformed duration {text!r} (expected [[HH:]MM:]SS)")
    seconds = 0
    for part, scale in zip(reversed(parts), (1, 60, 3600, 86400), strict=False):
        seconds += int(part) * scale
    if seconds <= 0:
        raise InvalidArgument(f"duration must be positive, got {text!r}")
    if seconds > _LONGEST:  # past what a request's fields can carry, too
        raise InvalidArgument(f"duration {text!r} is longer than 100 years")
    return seconds


#: The longest duration any limit may name (seconds).
_LONGEST = 100 * 365 * 86400


def format_duration(seconds: float) -> str:
    """Seconds -> ``HH:MM:SS`` (hours may exceed 24, as qstat prints them)."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def humanize_duration(seconds: float) -> str:
    """A short duration a person reads at a glance: ``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def format_size_kb(kb: int | None) -> str:
    if kb is None:
        return "--"
    for unit in ("kb", "mb", "gb", "tb"):
        if kb < 10240 or unit == "tb":
            return f"{kb}{unit}"
        kb //= 1024
    raise AssertionError("unreachable")


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,6,8-9`` -> sorted unique CPU ids."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise InvalidArgument(f"malformed CPU list {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise InvalidArgument(f"malformed CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int]) -> str:
    """Sorted CPU ids -> compact ranges, the inverse of :func:`parse_cpu_list`."""
    out: list[str] = []
    ids = sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)
