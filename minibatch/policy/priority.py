"""Maui's multifactor job priority, with every contribution explained.

Maui Admin Guide 5.1 (priority overview and factors) checked against
src/MPriority.c ``MJobGetStartPriority`` (``shared/batch-systems.md`` §2.2; seed
004, Bode et al.: "orders the queued jobs based upon priority"):

    Priority = Σ_c CW[c] · min(CCAP[c], Σ_s∈c SW[s] · min(SCAP[s], SF[s]))

========= ============ ===================================================
component weight       subfactors (weight: value)
========= ============ ===================================================
cred      CREDWEIGHT   USERWEIGHT: user prio, GROUPWEIGHT: group prio,
                       ACCOUNTWEIGHT: account prio, QOSWEIGHT: QOS priority,
                       CLASSWEIGHT: class (queue) priority
fs        FSWEIGHT     FSUSERWEIGHT/FSGROUPWEIGHT/FSACCOUNTWEIGHT: Δ = target -
                       usage % (:mod:`minibatch.policy.fairshare`); only when
                       FSPOLICY is not NONE
serv      SERVWEIGHT   QUEUETIMEWEIGHT: minutes queued; XFACTORWEIGHT:
                       (queued s + WCL) / max(XFMINWCLIMIT, WCL)
targ      TARGWEIGHT   TARGETQUEUETIMEWEIGHT: (QTTARGET - QT)^-2,
                       TARGETXFACTORWEIGHT: (XFTARGET - XF)^-2, per QOS, the
                       difference floored at 0.0001; 0 without a target
res       RESWEIGHT    NODEWEIGHT: nodes, PROCWEIGHT: CPUs, MEMWEIGHT: MB,
                       WALLTIMEWEIGHT: WCL s, PSWEIGHT: CPUs·WCL, PEWEIGHT:
                       processor-equivalents
psp       PSPWEIGHT    PSPBINWEIGHT: the user's PSP bin 1..5 (seed 000; ours)
========= ============ ===================================================

Per-QOS ``QTWEIGHT``/``XFWEIGHT`` are added to QUEUETIMEWEIGHT/XFACTORWEIGHT for
that QOS's jobs. Caps (``caps``: ``{"serv.queuetime": 100, "fs": 500}`` or Maui's
names ``QUEUETIMECAP``, ``XFACTORCAP``, ``SERVCAP``, ``FSCAP``, ``CREDCAP``,
``TARGCAP``, ``RESCAP``) bound a value from above. **Defaults are Maui's**: every
component weight 1, every subcomponent weight 0 except QUEUETIMEWEIGHT 1, so the
priority is the minutes queued and the order is FIFO. The result is clipped to
[1, 10^9] (to [-10^9, 10^9] with ``enable_neg_priority``); a job with a system
priority P (``PendingView.priority`` != 0, Maui's ``setspri``) gets 10^9 + P and
passes every computed priority. Queue time accrues from submission (Maui's
``JOBPRIOACCRUALPOLICY ALWAYS``; held jobs never reach the snapshot). Not
modelled: ATTR, USAGE (running jobs only), the BYPASS count.

:func:`breakdown` gives every contribution for ``diagnose -p`` and ``checkjob``;
:class:`Maui` (``maui``) is EASY (or FIFO, ``backfill=False``) over this order,
ties in submission order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

import msgspec

from minibatch.core.snapshot import ClusterSnapshot, PendingView
from minibatch.core.usage import FairshareConfig, FsPolicy, processor_equivalent
from minibatch.policy.base import as_number, converted
from minibatch.policy.fairshare import (
    Fairshare,
    FairshareContext,
    FairshareTargets,
    has_caps,
)
from minibatch.policy.ordered import OrderedPolicy
from minibatch.policy.psp import DEFAULT_BIN, Psp, user_bin

MAX_PRIO: Final = 1_000_000_000.0
#: (component, prefix, subcomponents), in Maui's order. A component's weight is
#: ``<component>weight`` (``servweight``), a subcomponent's
#: ``<prefix><subcomponent>weight`` (``queuetimeweight``, ``fsuserweight``).
_SPEC: Final = (
    ("cred", "", ("user", "group", "account", "qos", "class")),
    ("fs", "fs", ("user", "group", "account")),
    ("serv", "", ("queuetime", "xfactor")),
    ("targ", "target", ("queuetime", "xfactor")),
    ("res", "", ("node", "proc", "mem", "walltime", "ps", "pe")),
    ("psp", "psp", ("bin",)),
)
#: (component, its weight, ((subcomponent, its weight), ...)).
COMPONENTS: Final = tuple(
    (c, f"{c}weight", tuple((s, f"{p}{s}weight") for s in subs)) for c, p, subs in _SPEC
)
#: Maui's cap names -> our ids.
CAP_ALIASES: Final = {
    "queuetimecap": "serv.queuetime",
    "xfactorcap": "serv.xfactor",
    **{f"{c}cap": c for c, _, _ in COMPONENTS},
}
_IDS: Final = frozenset(
    {c for c, _, _ in COMPONENTS}
    | {f"{c}.{s}" for c, _, subs in COMPONENTS for s, _ in subs}
)


class PriorityWeights(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Maui's priority parameters (lower-case names), with Maui's defaults."""

    credweight: float = 1.0
    fsweight: float = 1.0
    servweight: float = 1.0
    targweight: float = 1.0
    resweight: float = 1.0
    pspweight: float = 1.0
    userweight: float = 0.0
    groupweight: float = 0.0
    accountweight: float = 0.0
    qosweight: float = 0.0
    #: CLASSWEIGHT: the job's queue (Maui's class) priority, ``[[queue]] priority``.
    classweight: float = 0.0
    fsuserweight: float = 0.0
    fsgroupweight: float = 0.0
    fsaccountweight: float = 0.0
    queuetimeweight: float = 1.0
    xfactorweight: float = 0.0
    targetqueuetimeweight: float = 0.0
    targetxfactorweight: float = 0.0
    nodeweight: float = 0.0
    procweight: float = 0.0
    memweight: float = 0.0
    walltimeweight: float = 0.0
    psweight: float = 0.0
    peweight: float = 0.0
    pspbinweight: float = 0.0
    caps: dict[str, float] = {}
    xfminwclimit: float = 120.0
    enable_neg_priority: bool = False
    fspolicy: FsPolicy = FsPolicy.NONE
    fstargets: FairshareTargets = FairshareTargets()
    #: ``USERCFG[u] PRIORITY=`` and the like.
    user_priority: dict[str, float] = {}
    group_priority: dict[str, float] = {}
    account_priority: dict[str, float] = {}
    #: ``QOSCFG[q] QTTARGET=`` (seconds), ``XFTARGET=``, ``QTWEIGHT=``, ``XFWEIGHT=``.
    qos_qttarget: dict[str, float] = {}
    qos_xftarget: dict[str, float] = {}
    qos_qtweight: dict[str, float] = {}
    qos_xfweight: dict[str, float] = {}
    psp_default_bin: int = DEFAULT_BIN

    def __post_init__(self) -> None:
        for key in self.caps:
            if key.lower() not in CAP_ALIASES and key not in _IDS:
                raise ValueError(f"unknown priority cap {key!r}")
        self.fstargets.parsed()

    def cap_table(self) -> dict[str, float]:
        return {CAP_ALIASES.get(k.lower(), k): v for k, v in self.caps.items()}

    def weight(self, name: str) -> float:
        value: float = getattr(self, name)
        return value


Factor = Callable[[PendingView], float]


def _near(target: float, current: float) -> float:
    """Maui's target factor: (target - current)^-2, the difference floored."""
    return float(max(0.0001, target - current) ** -2)


class Scorer:
    """Priorities of the jobs of one snapshot under ``weights``."""

    def __init__(self, snap: ClusterSnapshot, weights: PriorityWeights) -> None:
        self.snap, self.w, self.now = snap, weights, snap.now
        self.caps = weights.cap_table()
        self.fs_on = weights.fspolicy is not FsPolicy.NONE
        self._fs: FairshareContext | None = None
        self._bins: dict[str, int] = {}
        self._total_cpus = sum(n.cpus for n in snap.nodes)
        mems = [n.mem_kb for n in snap.nodes]
        self._total_mem = None if None in mems else sum(m or 0 for m in mems)
        self.factors: dict[str, Factor] = {
            "cred.user": lambda j: weights.user_priority.get(j.user, 0.0),
            "cred.group": lambda j: weights.group_priority.get(j.group, 0.0),
            "cred.account": lambda j: weights.account_priority.get(j.account, 0.0),
            "cred.qos": self._qos_priority,
            "cred.class": lambda j: j.queue_priority,
            "fs.user": lambda j: self.fs.delta("user", j.user),
            "fs.group": lambda j: self.fs.delta("group", j.group),
            "fs.account": lambda j: self.fs.delta("account", j.account),
            "serv.queuetime": self._queuetime,
            "serv.xfactor": self._xfactor,
            "targ.queuetime": self._target_queuetime,
            "targ.xfactor": self._target_xfactor,
            "res.node": lambda j: float(j.request.nodes),
            "res.proc": lambda j: float(j.request.cpus),
            "res.mem": lambda j: (j.request.mem_kb or 0) / 1024,
            "res.walltime": lambda j: float(j.request.walltime),
            "res.ps": lambda j: float(j.request.cpus * j.request.walltime),
            "res.pe": lambda j: processor_equivalent(
                j.request.cpus, j.request.mem_kb, self._total_cpus, self._total_mem
            ),
            "psp.bin": self._psp_bin,
        }
        extra = {
            "serv.queuetime": weights.qos_qtweight,
            "serv.xfactor": weights.qos_xfweight,
        }
        self._extra = {k: v for k, v in extra.items() if any(v.values())}
        # Only what can contribute is evaluated on the hot path.
        self._active: list[
            tuple[str, float, float | None, list[tuple[str, float, float | None]]]
        ] = []
        for comp, cw_name, subs in COMPONENTS:
            cw = weights.weight(cw_name)
            if cw == 0 or (comp == "fs" and not self.fs_on):
                continue
            active = [
                (f"{comp}.{s}", weights.weight(sw), self.caps.get(f"{comp}.{s}"))
                for s, sw in subs
                if weights.weight(sw) != 0 or f"{comp}.{s}" in self._extra
            ]
            if active:
                self._active.append((comp, cw, self.caps.get(comp), active))

    @property
    def fs(self) -> FairshareContext:
        if self._fs is None:
            self._fs = FairshareContext(self.snap, self.w.fstargets)
        return self._fs

    def _queued(self, job: PendingView) -> float:
        # Maui's EffQTime under its default JOBPRIOACCRUALPOLICY (QUEUEPOLICY):
        # priority accrues only while the job is eligible, not while held.
        return max(0.0, self.now - job.eligible_from)

    def _queuetime(self, job: PendingView) -> float:
        return self._queued(job) / 60.0

    def _xfactor(self, job: PendingView) -> float:
        wcl = float(job.request.walltime)
        return (self._queued(job) + wcl) / max(self.w.xfminwclimit, wcl)

    def _target_queuetime(self, job: PendingView) -> float:
        target = self.w.qos_qttarget.get(job.qos)
        return 0.0 if target is None else _near(target / 60.0, self._queuetime(job))

    def _target_xfactor(self, job: PendingView) -> float:
        target = self.w.qos_xftarget.get(job.qos)
        return 0.0 if target is None else _near(target, self._xfactor(job))

    def _qos_priority(self, job: PendingView) -> float:
        qos = self.snap.qos.get(job.qos)
        return 0.0 if qos is None else qos.priority

    def _psp_bin(self, job: PendingView) -> float:
        b = self._bins.get(job.user)
        if b is None:
            b = self._bins[job.user] = user_bin(
                self.snap.accuracy, job.user, self.w.psp_default_bin
            )[0]
        return float(b)

    def _sub_weight(self, sid: str, sw: float, job: PendingView) -> float:
        extra = self._extra.get(sid)
        return sw if extra is None else sw + extra.get(job.qos, 0.0)

    def _clip(self, total: float, job: PendingView) -> float:
        if job.priority:
            return MAX_PRIO + job.priority
        low = -MAX_PRIO if self.w.enable_neg_priority else 1.0
        return min(MAX_PRIO, max(low, total))

    def score(self, job: PendingView) -> float:
        """The job's start priority."""
        total = 0.0
        factors = self.factors
        for _, cw, ccap, subs in self._active:
            value = 0.0
            for sid, sw, scap in subs:
                sf = factors[sid](job)
                if scap is not None and sf > scap:
                    sf = scap
                value += self._sub_weight(sid, sw, job) * sf
            if ccap is not None and value > ccap:
                value = ccap
            total += cw * value
        return self._clip(total, job)

    def raw(self, job: PendingView) -> dict[str, float]:
        """Every subfactor's value before weights and caps."""
        out: dict[str, float] = {}
        for comp, _, subs in COMPONENTS:
            for s, _ in subs:
                sid = f"{comp}.{s}"
                out[sid] = (
                    0.0 if comp == "fs" and not self.fs_on else self.factors[sid](job)
                )
        return out

    def breakdown(self, job: PendingView) -> dict[str, float]:
        """Contributions: ``comp.sub`` = CW·SW·min(SCAP, SF), ``comp`` =
        CW·min(CCAP, Σ SW·min(SCAP, SF)), ``system``, ``total`` (the priority)."""
        raw, w = self.raw(job), self.w
        out: dict[str, float] = {}
        total = 0.0
        for comp, cw_name, subs in COMPONENTS:
            cw = w.weight(cw_name)
            value = 0.0
            for s, sw_name in subs:
                sid = f"{comp}.{s}"
                sf, scap = raw[sid], self.caps.get(sid)
                if scap is not None:
                    sf = min(scap, sf)
                part = self._sub_weight(sid, w.weight(sw_name), job) * sf
                out[sid] = cw * part
                value += part
            ccap = self.caps.get(comp)
            if ccap is not None:
                value = min(ccap, value)
            out[comp] = cw * value
            total += cw * value
        out["system"] = MAX_PRIO + job.priority if job.priority else 0.0
        out["total"] = self._clip(total, job)
        return out


def breakdown(
    job: PendingView, snap: ClusterSnapshot, weights: PriorityWeights
) -> dict[str, float]:
    """``diagnose -p`` / ``checkjob``: every contribution to ``job``'s priority."""
    return Scorer(snap, weights).breakdown(job)


def factors(
    job: PendingView, snap: ClusterSnapshot, weights: PriorityWeights
) -> dict[str, float]:
    """The raw subfactor values (showq/diagnose print them in parentheses)."""
    return Scorer(snap, weights).raw(job)


def priority_order(
    snap: ClusterSnapshot, weights: PriorityWeights
) -> list[PendingView]:
    """Pending jobs by priority, highest first; ties in snapshot order."""
    if not snap.pending:
        return []
    return sorted(snap.pending, key=Scorer(snap, weights).score, reverse=True)


class Maui(OrderedPolicy):
    """``maui``: EASY (or FIFO) over Maui's priority order.

    Args:
        backfill: EASY (True) or strict priority order without backfill (False).
        fsinterval, fsdepth, fsdecay: the accounting the simulator runs when
            ``fspolicy`` is set (live, the server's ``[fairshare]`` settings).
        **weights: :class:`PriorityWeights` fields (``queuetimeweight=1`` ...).
    """

    name: ClassVar[str] = "maui"

    def __init__(
        self,
        backfill: bool = True,
        fsinterval: float = 43200.0,
        fsdepth: int = 8,
        fsdecay: float = 1.0,
        **weights: Any,
    ) -> None:
        super().__init__(backfill)
        if isinstance(weights.get("fspolicy"), str):
            weights["fspolicy"] = weights["fspolicy"].upper()
        self.weights = converted("weights", weights, PriorityWeights)
        fsinterval = as_number("fsinterval", fsinterval)
        fsdepth = int(as_number("fsdepth", fsdepth, int))
        fsdecay = as_number("fsdecay", fsdecay)
        w = self.weights
        self.fairshare_config = FairshareConfig(
            policy=w.fspolicy, interval=fsinterval, depth=fsdepth, decay=fsdecay
        )
        self._caps = w.fspolicy is not FsPolicy.NONE and has_caps(w.fstargets)
        needs = set()
        fs_weights = (w.fsuserweight, w.fsgroupweight, w.fsaccountweight)
        if w.fspolicy is not FsPolicy.NONE and (
            w.fsweight and any(fs_weights) or self._caps
        ):
            needs.add("fairshare")
        if w.pspweight and w.pspbinweight:
            needs.add("accuracy")
        self.needs = frozenset(needs)

    def order(self, snap: ClusterSnapshot) -> list[PendingView]:
        return priority_order(snap, self.weights)

    def blocked(
        self, snap: ClusterSnapshot, ordered: Sequence[PendingView]
    ) -> dict[int, str]:
        out = super().blocked(snap, ordered)
        if self._caps:
            ctx = FairshareContext(snap, self.weights.fstargets)
            for job in ordered:
                reason = ctx.cap_reason(job)
                if reason is not None:
                    out.setdefault(job.id, reason)
        return out


def weights_of(policy: object) -> PriorityWeights:
    """Weights whose priority order is ``policy``'s (``diagnose -p``, ``checkjob``).

    ``maui``: its own; ``fairshare``: its fairshare component alone; ``psp``: the
    PSP bin alone; any other policy: Maui's defaults (FIFO by queue time).
    """
    if isinstance(policy, Maui):
        return policy.weights
    if isinstance(policy, Fairshare):
        wu, wg, wa = policy.weights
        return PriorityWeights(
            fsuserweight=wu,
            fsgroupweight=wg,
            fsaccountweight=wa,
            queuetimeweight=0.0,
            enable_neg_priority=True,
            fspolicy=policy.fairshare_config.policy,
            fstargets=policy.targets,
        )
    if isinstance(policy, Psp):
        return PriorityWeights(
            queuetimeweight=0.0, pspbinweight=1.0, psp_default_bin=policy.default_bin
        )
    return PriorityWeights()
