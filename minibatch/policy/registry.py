"""Find policies by name: the built-in ones (:data:`BUILTIN`), the
``minibatch.policies`` entry points, and the names the configuration maps to
``module:callable`` (``[scheduler.policy_modules]``).

Names are case-insensitive. The daemons choose a policy by name only
(:func:`load_named`): a name stands for code someone installed, or that the
owner of ``minibatch.toml`` named, so an operator switching policies (``mb
policy set``) picks among those and can never make the server or the scheduler,
which may run as root, import a module of the operator's choosing.
:func:`load` also takes ``module:callable`` itself, for code a user runs in
their own process (the simulator, experiments before ``pip install``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from minibatch.errors import InvalidArgument
from minibatch.policy.base import Policy
from minibatch.policy.presets import TARGETS

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "minibatch.policies"

#: The policies minibatch ships: its own entry points in :data:`GROUP`
#: (pyproject.toml declares the same; a unit test holds the two together).
#: They are found here first, so that ``showq`` and ``checkjob``, which load
#: the live policy, do not import importlib.metadata (email, zipfile, csv) and
#: scan every installed package's entry points: ~15 ms of a 60 ms command. No
#: other package can take one of these names.
BUILTIN = TARGETS


def _installed() -> dict[str, EntryPoint]:
    """The entry points of :data:`GROUP` by lower-case name."""
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep for ep in entry_points(group=GROUP)}


def available(modules: Mapping[str, str] | None = None) -> list[str]:
    """Installed policies' names and those of ``modules`` (the configuration's)."""
    names = BUILTIN.keys() | _installed().keys()
    return sorted(names | {name.lower() for name in modules or {}})


def by_name_only(name: str) -> str:
    """Why ``name`` cannot be chosen over the socket, or "" if it can."""
    if ":" not in name:
        return ""
    return (
        f"policies are chosen by name, not as module:callable ({name!r}); the "
        "owner of minibatch.toml may give it one under [scheduler.policy_modules] "
        f'(e.g. mine = "{name}"), then: mb policy set mine'
    )


def load_named(
    name: str,
    params: dict[str, Any] | None = None,
    modules: Mapping[str, str] | None = None,
) -> Policy:
    """:func:`load`, refusing ``module:callable``: what the daemons load."""
    refusal = by_name_only(name)
    if refusal:
        raise InvalidArgument(refusal)
    return load(name, params, modules)


def load(
    name: str,
    params: dict[str, Any] | None = None,
    modules: Mapping[str, str] | None = None,
) -> Policy:
    """Instantiate the policy called ``name`` with keyword ``params``.

    ``name`` is a built-in policy's, an installed one's, one of ``modules``
    (name -> ``module:callable``; a built-in or installed policy of the same
    name wins), or a ``module:callable`` itself.
    """
    key = name.lower()
    if ":" in name:
        cls = _imported(name)
    elif key in BUILTIN:
        cls = _imported(BUILTIN[key])
    else:
        ep = _installed().get(key)
        configured = {k.lower(): v for k, v in (modules or {}).items()}
        if ep is not None:
            cls = ep.load()
        elif key in configured:
            cls = _imported(configured[key])
        else:
            raise InvalidArgument(
                f"unknown policy {name!r} (available: {', '.join(available(modules))})"
            )
    unknown = _unknown_params(cls, params or {})
    if unknown:
        raise InvalidArgument(f"bad parameters for policy {name!r}: {unknown}")
    try:
        policy: Policy = cls(**(params or {}))
    except TypeError as exc:
        raise InvalidArgument(f"bad parameters for policy {name!r}: {exc}") from exc
    return policy


def _unknown_params(cls: Any, params: Mapping[str, Any]) -> str:
    """Why ``params`` do not fit ``cls``'s signature (naming the ones that
    would), or "" (a ``**weights`` catch-all takes anything)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return ""
    fields = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in fields):
        return ""
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    known = [p.name for p in fields if p.kind in named]
    extra = sorted(set(params) - set(known))
    if not extra:
        return ""
    takes = ", ".join(known) or "none"
    return f"unknown parameter {extra[0]!r} (it takes: {takes})"


def _imported(target: str) -> Any:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"cannot load policy {target!r}: {exc}") from None
