"""Run code in a new interpreter of this venv: what a module imports on its
own, or does to the process, only shows in a process that starts clean."""

from __future__ import annotations

import subprocess
import sys


def output_of(code: str, timeout: float = 30) -> str:
    """What ``python -c code`` prints, stripped; raise if it fails."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return done.stdout.strip()
