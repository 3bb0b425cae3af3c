"""``mb policy``: show or switch the scheduling policy while the cluster runs.

    mb policy show [--json]
    mb policy set NAME [--param KEY=VALUE ...]

``set`` is for operators, and takes a name only: an installed policy's or one
``[scheduler.policy_modules]`` in minibatch.toml gives to a ``module:callable``
(never a ``module:callable`` itself: the daemons would import it as their own
user). The server loads the policy and plans the queue with it once before it
accepts it (an unknown name, bad parameters or a policy that raises are refused
with one line, and the previous policy stays), stores it (it survives a
restart), publishes it on ``minibatch/v1/sched/policy`` and the scheduler plans
with it from its next pass; should it raise there, the scheduler goes back to
the previous one and ``show`` says why. A VALUE is read as JSON when it
parses (``3``, ``0.5``, ``false``, ``{"users": {"alice": "50"}}``), else taken as
a string.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from minibatch.cli import common
from minibatch.cli.ranking import maui_date
from minibatch.errors import InvalidArgument

policy_app = typer.Typer(
    help="Show or switch the scheduling policy (live).", no_args_is_help=True
)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> parameters; a VALUE is JSON if it parses."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InvalidArgument(f"malformed parameter {item!r} (expected KEY=VALUE)")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def render_policy(info: Any) -> str:
    params = json.dumps(info.params, sort_keys=True) if info.params else "(none)"
    origin = (
        f"set by {info.set_by} on {maui_date(info.since)}"
        if info.set_by
        else "the configuration's [scheduler] policy"
    )
    lines = [
        f"policy:     {info.name}",
        f"parameters: {params}",
        f"origin:     {origin}",
        f"scheduler:  {info.scheduler_policy or '(not registered)'}",
        f"available:  {', '.join(info.available)}",
    ]
    if info.scheduler_refused:
        lines.append(f"refused:    {info.scheduler_refused}")
    elif info.scheduler_policy and info.scheduler_policy != info.name:
        lines.append("(the scheduler switches at its next pass)")
    return "\n".join(lines) + "\n"


@policy_app.command("show")
def show(
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """The policy the scheduler plans with, its parameters and who set it."""
    with common.reporting("mb policy"):
        from minibatch.protocol.messages import GetPolicy

        info = common.call(GetPolicy())
    if as_json:
        import msgspec

        data = msgspec.to_builtins(info)
        data.pop("type", None)
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    typer.echo(render_policy(info), nl=False)


@policy_app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="A policy name (see mb policy show).")],
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", "-p", help="KEY=VALUE, repeatable.", show_default=False
        ),
    ] = None,
) -> None:
    """Switch the scheduling policy; it applies from the next pass (operators)."""
    with common.reporting("mb policy"):
        params = parse_params(param or [])
        from minibatch.protocol.messages import SetPolicy

        info = common.call(SetPolicy(name=name, params=params))
    shown = json.dumps(info.params, sort_keys=True) if info.params else ""
    typer.echo(f"policy set to {info.name} {shown}".rstrip())
