"""Find policies by name through the ``minibatch.policies`` entry-point group.

Names are case-insensitive. ``module:Class`` is accepted too, so an experiment can
load a policy that is not installed as a package.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from minibatch.errors import InvalidArgument
from minibatch.policy.base import Policy

GROUP = "minibatch.policies"


def available() -> list[str]:
    return sorted(ep.name.lower() for ep in entry_points(group=GROUP))


def load(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Instantiate the policy called ``name`` with keyword ``params``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        registry = {ep.name.lower(): ep for ep in entry_points(group=GROUP)}
        ep = registry.get(name.lower())
        if ep is None:
            raise InvalidArgument(
                f"unknown policy {name!r} (available: {', '.join(available())})"
            )
        cls = ep.load()
    try:
        policy: Policy = cls(**(params or {}))
    except TypeError as exc:
        raise InvalidArgument(f"bad parameters for policy {name!r}: {exc}") from exc
    return policy
