"""Fairshare: usage against targets, as a priority component and as a policy.

Maui's fairshare (6.3fairshare, src/MFS.c, src/MPriority.c;
``shared/batch-systems.md`` §2.2-2.3; seed 004, Bode et al., "usage targets,
floors and ceilings"). The resource manager computes each user's, group's and
account's decayed usage (``FSINTERVAL``, ``FSDEPTH``, ``FSDECAY``, ``FSPOLICY``;
:mod:`minibatch.core.usage`) and hands it over in ``snap.fairshare``. Here:

* **usage %** of an entity = 100 x its usage / the total delivered (the sum over
  users), so it is relative to what was delivered, not to capacity;
* **targets** (``USERCFG[u] FSTARGET=v[mod]`` ...), :func:`parse_target`:

  ====== ============== =================================================
  ``50``  target         Δ = target - usage%        (both directions)
  ``50+`` floor          Δ = max(Δ, 0)              (only boosts)
  ``50-`` ceiling        Δ = min(Δ, 0)              (only penalises)
  ``9e6^`` absolute cap  Δ = 0; blocks a job if usage + its request > cap
  ``30%`` relative cap   Δ = 0; blocks a job while usage% >= cap
  ====== ============== =================================================

  An entity with no target has Δ = 0. ``equal`` (our name for Maui's
  ``USERCFG[DEFAULT]``) is the target 100 / N, N the entities with usage or a
  pending job, so every user is aimed at an equal share (seed 001's EET share).
* **component** = ``FSUSERWEIGHT``·Δuser + ``FSGROUPWEIGHT``·Δgroup +
  ``FSACCOUNTWEIGHT``·Δaccount (:class:`FairshareContext`); the Maui priority
  (:mod:`minibatch.policy.priority`) weighs and caps it like any component.

Worked example of the Maui guide (tested): weights FSWEIGHT 100, user 10,
account 30; user 50 vs 45 %, account 25 vs 35 % -> 100·(10·5 + 30·(-10)) = -25,000.

:class:`Fairshare` is the ``fairshare`` preset: EASY (or FIFO, ``backfill=False``,
seed 001's "fairshare fifo") over the jobs ordered by this component alone, highest
first, ties in submission order; by default every user's target is ``equal``, so
the user who used least comes first. Guarantee: the order is a permutation of the
queue and a pure function of the snapshot. Not modelled: QOS and class fairshare
(the snapshot carries no QOS usage), percentage-based ``FSPOLICY ...%``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, ClassVar

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.core.usage import FairshareConfig, FsPolicy
from minibatch.policy.base import as_number, converted
from minibatch.policy.ordered import OrderedPolicy

KINDS: tuple[str, ...] = ("user", "group", "account")


class TargetKind(StrEnum):
    TARGET = ""
    FLOOR = "+"
    CEILING = "-"
    CAP = "^"
    PERCENT_CAP = "%"


class FsTarget(msgspec.Struct, frozen=True):
    """A parsed ``FSTARGET``; ``value`` None means ``equal`` (100 / N)."""

    value: float | None
    kind: TargetKind = TargetKind.TARGET

    def __str__(self) -> str:
        number = "equal" if self.value is None else f"{self.value:g}"
        return number + self.kind.value


def parse_target(text: str | float) -> FsTarget:
    """``"50"``, ``"10+"``, ``"20-"``, ``"1e6^"``, ``"30%"``, ``"equal"``."""
    raw = str(text).strip()
    kind = TargetKind.TARGET
    if raw and raw[-1] in "+-^%":
        kind, raw = TargetKind(raw[-1]), raw[:-1].strip()
    if raw.lower() == "equal":
        if kind in (TargetKind.CAP, TargetKind.PERCENT_CAP):
            raise ValueError("a cap needs a number, not 'equal'")
        return FsTarget(None, kind)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"bad fairshare target {text!r}") from None
    if value < 0:
        raise ValueError(f"a fairshare target cannot be negative: {text!r}")
    return FsTarget(value, kind)


class FairshareTargets(msgspec.Struct, frozen=True, kw_only=True):
    """``FSTARGET`` per user, group and account, and a default for each kind."""

    users: dict[str, str] = {}
    groups: dict[str, str] = {}
    accounts: dict[str, str] = {}
    default_user: str | None = None
    default_group: str | None = None
    default_account: str | None = None

    def parsed(self) -> dict[str, tuple[dict[str, FsTarget], FsTarget | None]]:
        """Per kind: (named targets, default target)."""
        out: dict[str, tuple[dict[str, FsTarget], FsTarget | None]] = {}
        for kind, named, default in (
            ("user", self.users, self.default_user),
            ("group", self.groups, self.default_group),
            ("account", self.accounts, self.default_account),
        ):
            out[kind] = (
                {n: parse_target(t) for n, t in named.items()},
                None if default is None else parse_target(default),
            )
        return out


def has_caps(targets: FairshareTargets) -> bool:
    """Whether any target is a cap (which may block jobs)."""
    return any(
        t.kind in (TargetKind.CAP, TargetKind.PERCENT_CAP)
        for named, default in targets.parsed().values()
        for t in (*named.values(), *((default,) if default else ()))
    )


def usage_percent(snap_usage: Mapping[str, float], total: float) -> dict[str, float]:
    """Each entity's usage in percent of ``total`` (all 0 when nothing ran)."""
    if total <= 0:
        return dict.fromkeys(snap_usage, 0.0)
    return {n: 100.0 * u / total for n, u in snap_usage.items()}


def delta(target: FsTarget | None, percent: float, equal: float) -> float:
    """Δ of one entity: its target minus its usage %, per the target's kind."""
    if target is None or target.kind in (TargetKind.CAP, TargetKind.PERCENT_CAP):
        return 0.0
    value = equal if target.value is None else target.value
    d = value - percent
    if target.kind is TargetKind.FLOOR:
        return max(d, 0.0)
    if target.kind is TargetKind.CEILING:
        return min(d, 0.0)
    return d


def _name(job: PendingView, kind: str) -> str:
    return job.user if kind == "user" else job.group if kind == "group" else job.account


class FairshareRow(msgspec.Struct, frozen=True):
    """One line of ``diagnose -f``."""

    kind: str
    name: str
    usage: float
    percent: float
    target: str
    delta: float


class FairshareContext:
    """Usage %, targets and Δ for one snapshot; Δ cached per entity."""

    def __init__(self, snap: ClusterSnapshot, targets: FairshareTargets) -> None:
        fs = snap.fairshare
        self.usage = {"user": fs.users, "group": fs.groups, "account": fs.accounts}
        self.total = sum(fs.users.values())
        self.percent = {k: usage_percent(u, self.total) for k, u in self.usage.items()}
        self.targets = targets.parsed()
        self._snap = snap
        self._equal: dict[str, float] = {}
        self._delta: dict[tuple[str, str], float] = {}

    def equal_share(self, kind: str) -> float:
        """100 / (entities with usage or a pending job), for ``equal`` targets."""
        share = self._equal.get(kind)
        if share is None:
            names = set(self.usage[kind])
            names.update(_name(j, kind) for j in self._snap.pending)
            names.discard("")
            share = self._equal[kind] = 100.0 / max(1, len(names))
        return share

    def target(self, kind: str, name: str) -> FsTarget | None:
        named, default = self.targets[kind]
        return named.get(name, default if name else None)

    def delta(self, kind: str, name: str) -> float:
        key = (kind, name)
        d = self._delta.get(key)
        if d is None:
            target = self.target(kind, name)
            equal = self.equal_share(kind) if target and target.value is None else 0.0
            pct = self.percent[kind].get(name, 0.0)
            d = self._delta[key] = delta(target, pct, equal)
        return d

    def deltas(self, job: PendingView) -> tuple[float, float, float]:
        """(Δuser, Δgroup, Δaccount) of a job's credentials."""
        return (
            self.delta("user", job.user),
            self.delta("group", job.group),
            self.delta("account", job.account),
        )

    def cap_reason(self, job: PendingView) -> str | None:
        """Why a fairshare cap blocks ``job`` now, or None."""
        for kind in KINDS:
            name = _name(job, kind)
            target = self.target(kind, name) if name else None
            if target is None or target.value is None:
                continue
            if target.kind is TargetKind.CAP:
                used = self.usage[kind].get(name, 0.0)
                need = job.request.cpus * job.request.walltime
                if used + need > target.value:
                    return (
                        f"blocked: fairshare cap of {kind} {name}: "
                        f"{used:,.0f} used + {need:,} requested > {target.value:,.0f}"
                    )
            elif target.kind is TargetKind.PERCENT_CAP:
                pct = self.percent[kind].get(name, 0.0)
                if pct >= target.value:
                    return (
                        f"blocked: fairshare cap of {kind} {name}: "
                        f"{pct:.1f} % used >= {target.value:g} %"
                    )
        return None

    def rows(self) -> list[FairshareRow]:
        """``diagnose -f``: every entity with usage or a target, by kind and name."""
        out: list[FairshareRow] = []
        for kind in KINDS:
            names = set(self.usage[kind]) | set(self.targets[kind][0])
            if self.targets[kind][1] is not None:
                names.update(_name(j, kind) for j in self._snap.pending)
            names.discard("")
            for name in sorted(names):
                target = self.target(kind, name)
                text = "" if target is None else str(target)
                if target is not None and target.value is None:
                    text = f"{self.equal_share(kind):.2f}{target.kind.value} (equal)"
                out.append(
                    FairshareRow(
                        kind=kind,
                        name=name,
                        usage=self.usage[kind].get(name, 0.0),
                        percent=self.percent[kind].get(name, 0.0),
                        target=text,
                        delta=self.delta(kind, name),
                    )
                )
        return out


def fairshare_rows(
    snap: ClusterSnapshot, targets: FairshareTargets
) -> list[FairshareRow]:
    """The rows of ``diagnose -f`` for a snapshot (usage, %, target, Δ)."""
    return FairshareContext(snap, targets).rows()


class Fairshare(OrderedPolicy):
    """``fairshare``: EASY (or FIFO) ordered by the fairshare component.

    Args:
        backfill: EASY (True) or strict FIFO (False) over the fairshare order.
        fsuserweight, fsgroupweight, fsaccountweight: Maui's subcomponent weights.
        fstargets: ``FairshareTargets`` fields (``users``, ``default_user``
            ...); by default every user's target is ``equal``.
        fspolicy, fsinterval, fsdepth, fsdecay: the accounting the simulator
            runs for this policy (live, the server's ``[fairshare]`` settings).
    """

    name: ClassVar[str] = "fairshare"
    needs = frozenset({"fairshare"})

    def __init__(
        self,
        backfill: bool = True,
        fsuserweight: float = 1.0,
        fsgroupweight: float = 0.0,
        fsaccountweight: float = 0.0,
        fstargets: Mapping[str, Any] | None = None,
        fspolicy: str = "DEDICATEDPS",
        fsinterval: float = 43200.0,
        fsdepth: int = 8,
        fsdecay: float = 1.0,
    ) -> None:
        super().__init__(backfill)
        self.weights = (
            as_number("fsuserweight", fsuserweight),
            as_number("fsgroupweight", fsgroupweight),
            as_number("fsaccountweight", fsaccountweight),
        )
        fsinterval = as_number("fsinterval", fsinterval)
        fsdepth = int(as_number("fsdepth", fsdepth, int))
        fsdecay = as_number("fsdecay", fsdecay)
        self.targets = converted(
            "fstargets",
            dict(fstargets) if fstargets is not None else {"default_user": "equal"},
            FairshareTargets,
        )
        self._caps = has_caps(self.targets)  # parses: a bad target fails here
        self.fairshare_config = FairshareConfig(
            policy=FsPolicy(fspolicy.upper()),
            interval=fsinterval,
            depth=fsdepth,
            decay=fsdecay,
        )

    def order(self, snap: ClusterSnapshot) -> list[PendingView]:
        ctx = FairshareContext(snap, self.targets)
        wu, wg, wa = self.weights
        # One value per (user, group, account): jobs of a user share it.
        cache: dict[tuple[str, str, str], float] = {}

        def key(job: PendingView) -> float:
            cred = (job.user, job.group, job.account)
            value = cache.get(cred)
            if value is None:
                du, dg, da = ctx.deltas(job)
                value = cache[cred] = wu * du + wg * dg + wa * da
            return value

        return sorted(snap.pending, key=key, reverse=True)

    def blocked(
        self, snap: ClusterSnapshot, ordered: Sequence[PendingView]
    ) -> dict[int, str]:
        out = super().blocked(snap, ordered)
        if self._caps:
            ctx = FairshareContext(snap, self.targets)
            for job in ordered:
                reason = ctx.cap_reason(job)
                if reason is not None:
                    out.setdefault(job.id, reason)
        return out
