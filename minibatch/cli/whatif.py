"""``mb whatif``: what another policy would do with the queue as it is now.

    mb whatif POLICY [--param KEY=VALUE ...] [--json]

Takes the live cluster's snapshot (``get_snapshot`` with ``peek``: any user may,
nothing changes), simulates it under the policy the cluster runs and under
POLICY (:func:`minibatch.sim.whatif.whatif`), and prints each waiting job's
predicted start under both, the difference and the mean wait of each: what
``mb policy set POLICY`` would do, before doing it. Parameters are read as
``mb policy set`` reads them (a VALUE is JSON when it parses).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import msgspec
import typer

from minibatch.cli import common
from minibatch.cli.policy import parse_params
from minibatch.cli.ranking import maui_duration

if TYPE_CHECKING:
    from minibatch.sim.whatif import WhatIf

PROG = "mb whatif"


def whatif_command(
    policy: Annotated[str, typer.Argument(help="The policy to try (mb policy show).")],
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", "-p", help="KEY=VALUE, repeatable.", show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Predicted starts and mean wait under POLICY next to the current policy."""
    from minibatch.protocol.scheduling import GetSnapshot, SnapshotReply
    from minibatch.sim.whatif import whatif

    with common.reporting(PROG):
        params = parse_params(param or [])
        _, config = common.home()
        reply: SnapshotReply = common.call(GetSnapshot(peek=True))
        result = whatif(
            reply.snapshot,
            policy,
            params,
            reply.policy,
            reply.params,
            modules=config.scheduler.policy_modules,
        )
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(result), indent=2))
    else:
        typer.echo(render(result), nl=False)


def _when(start: float, now: float) -> str:
    return "now" if start <= now else f"in {maui_duration(start - now)}"


def _change(delta: float) -> str:
    if abs(delta) < 0.5:
        return "same"
    return ("+" if delta > 0 else "") + maui_duration(delta)


def render(result: WhatIf) -> str:
    """The table: one row per waiting job, then the mean waits and the jobs
    left out."""
    from minibatch.metrics.table import grid

    now, current, other = result.now, result.current, result.policy
    if current == other and result.params != result.current_params:
        other += " " + json.dumps(result.params, sort_keys=True)
    lines = [f"{current} (current) vs {other}: {len(result.rows)} waiting jobs"]
    if result.rows:
        header = ["job", "user", "cpus", f"start ({current})", f"start ({other})"]
        rows = [
            [
                str(r.job),
                r.user,
                str(r.cpus),
                _when(r.current, now),
                _when(r.other, now),
                _change(r.delta),
            ]
            for r in result.rows
        ]
        lines.append(grid([*header, "difference"], rows).rstrip("\n"))
    if result.current_mean_wait is not None and result.mean_wait is not None:
        change = _change(result.mean_wait - result.current_mean_wait)
        width = max(len(current), len(other))
        lines += [
            f"mean wait  {current:<{width}}  {maui_duration(result.current_mean_wait)}",
            f"mean wait  {other:<{width}}  {maui_duration(result.mean_wait)}"
            f"  ({change})",
        ]
    lines += [f"left out: job {job}: {why}" for job, why in result.skipped.items()]
    return "\n".join(lines) + "\n"
