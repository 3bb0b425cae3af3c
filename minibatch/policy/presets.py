"""The scheduling presets this package ships, by name.

A preset is a policy class registered in the ``minibatch.policies`` entry-point
group (``pyproject.toml``) under its name; ``mb sim --policy``, ``mb policy
set`` and ``[scheduler] policy`` all take these names, and ``--param k=v`` /
``[scheduler.params]`` become its constructor keywords (strings or numbers).
:data:`PRESETS` is the catalogue: where each one lives, what it is, which
parameters it takes. A test checks that the entry points say the same.

Priority-ordered presets (``fairshare``, ``psp``, ``maui``) are registered by
their own modules; they compose :class:`~minibatch.policy.backfill.Backfill`
(or FIFO) with a priority order.
"""

from __future__ import annotations

from typing import NamedTuple


class Preset(NamedTuple):
    target: str  # "module:Class", as in the entry point
    summary: str
    params: str  # the parameters it takes, for `mb policy` listings and docs


PRESETS: dict[str, Preset] = {
    "fifo": Preset(
        "minibatch.policy.fifo:Fifo",
        "strict first-come first-served: stop at the first job that does not fit",
        "",
    ),
    "pbs-fifo": Preset(
        "minibatch.policy.pbsfifo:PbsFifo",
        "PBS FIFO: start anything that fits; a job eligible longer than "
        "starve_after halts all starts until it runs (seed 004)",
        "starve_after=86400 (seconds or HH:MM:SS), help_starving_jobs=true",
    ),
    "easy": Preset(
        "minibatch.policy.backfill:Easy",
        "EASY backfilling: the first blocked job is reserved (Maui "
        "RESERVATIONDEPTH 1; Mu'alem & Feitelson 2001)",
        "select=firstfit|bestfit|bb|ibb, metric=procs|procseconds|seconds",
    ),
    "conservative": Preset(
        "minibatch.policy.backfill:Conservative",
        "conservative backfilling: every pending job is reserved",
        "",
    ),
    "backfill": Preset(
        "minibatch.policy.backfill:Backfill",
        "backfilling with any reservation depth (Maui RESERVATIONDEPTH)",
        "depth=1 (int or all), select=firstfit|bestfit|bb|ibb, "
        "metric=procs|procseconds|seconds",
    ),
    "bb": Preset(
        "minibatch.policy.balanced:BB",
        "EASY + Backfill Balanced: one backfill per pass, the candidate with "
        "the lowest Eq. 1 over CPUs and memory (seed 003)",
        "depth=1, rescan=false (true: traverse again after each start)",
    ),
    "ibb": Preset(
        "minibatch.policy.balanced:IBB",
        "EASY + Improved Backfill Balanced: every candidate passing Eq. 2, in "
        "one traversal (seed 003)",
        "depth=1",
    ),
    "sd": Preset(
        "minibatch.policy.sd:SlowdownDriven",
        "SD-Policy: EASY, and a malleable job that cannot start takes CPUs "
        "from at most `mates` running malleable jobs when that beats its "
        "static end; idle CPUs grow malleable jobs (seed 002)",
        "mates=2, max_slowdown=dynamic|N|inf, sharing_factor=0.5, expand=true, "
        "candidates=8",
    ),
}


#: The priority-ordered presets, registered by their own modules
#: (:mod:`minibatch.policy.ordered`): name -> ``module:Class``.
ORDERED: dict[str, str] = {
    "maui": "minibatch.policy.priority:Maui",
    "fairshare": "minibatch.policy.fairshare:Fairshare",
    "psp": "minibatch.policy.psp:Psp",
}

#: Every policy minibatch ships, name -> ``module:Class``: its entry points in
#: the ``minibatch.policies`` group (a test holds pyproject.toml to it).
TARGETS: dict[str, str] = {
    **{name: preset.target for name, preset in PRESETS.items()},
    **ORDERED,
}


def describe() -> str:
    """One line per preset: name, what it is, its parameters."""
    lines = []
    for name, preset in PRESETS.items():
        extra = f" [{preset.params}]" if preset.params else ""
        lines.append(f"{name:<13} {preset.summary}{extra}")
    return "\n".join(lines) + "\n"
