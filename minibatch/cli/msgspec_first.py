"""Import msgspec for a command without ``typing_extensions``.

msgspec takes ``get_type_hints``, ``Required`` and ``NotRequired`` from
``typing_extensions`` when it is installed (typer needs it) and from ``typing``
otherwise: on Python 3.11+ the same for the types our protocol uses. Importing
``typing_extensions`` (and ``inspect``, which it imports) is ~9 ms of a command
that should answer in 60 (docs/benchmarks.md, "Commands"). The module is hidden
only while msgspec loads, so typer (help, usage errors) finds it later; a
process that imported either already is left as it is.
"""

from __future__ import annotations

import sys


def load() -> None:
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]
