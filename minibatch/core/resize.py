"""The rules of malleability, shared by the resource manager and the simulator.

A malleable job asks for ``ppn`` CPUs per node and names the fewest and most it
can run on (``malleable=(low, high)``, ``low <= ppn <= high``). While it runs,
its CPUs may change within that range: a **shrink** makes room for another job,
an **expansion** gives back what it lent or uses idle CPUs. The live server and
the simulator both check a resize with :func:`refusal` and stretch the job's time
with :func:`stretch`, so a policy cannot tell them apart here either.

**Run-time models** (seed 002, Section 3.4). A job asked for ``ppn`` CPUs per node
for ``walltime`` seconds; its work is taken as proportional to CPUs x time, so on
fewer CPUs it progresses more slowly. Over each stretch of time with a fixed
allocation it progresses at a *rate* (static seconds per second):

* ``ideal`` (Eq. 5): the job balances its load over whatever it has, so the rate
  is its CPUs over the CPUs it asked for, all nodes together;
* ``worst`` (Eq. 6): a statically balanced job runs at the pace of its poorest
  node: the rate is the smallest per-node share.

The two differ only when a multi-node job's nodes hold different counts. Every
resize here changes all of a job's nodes alike, so they coincide in minibatch
today (docs/policies.md says so); both are kept so the simulator can name the
model it applies. Time limits and predictions use :func:`limit_rate`: the worst
case, as SD-Policy does, and no faster than requested, so a resize never
shortens the time a user was promised (the simulator's *run times* use the
chosen model uncapped: a job given more CPUs than it asked for runs faster).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from minibatch.errors import InvalidArgument


class RuntimeModel(StrEnum):
    IDEAL = "ideal"
    WORST = "worst"


def check_range(malleable: tuple[int, int] | None, ppn: int, nodes: int = 1) -> None:
    """Refuse a malleable range that makes no sense for a request of ``nodes``
    nodes with ``ppn`` CPUs each (raises :class:`InvalidArgument`)."""
    if malleable is None:
        return
    low, high = malleable
    if low < 1:
        raise InvalidArgument(f"malleable={low}-{high}: the fewest CPUs must be >= 1")
    if low > high:
        raise InvalidArgument(
            f"malleable={low}-{high}: the fewest CPUs exceed the most (MIN-MAX)"
        )
    if not low <= ppn <= high:
        raise InvalidArgument(
            f"malleable={low}-{high} does not include the {ppn} CPUs requested"
        )
    if nodes != 1:
        raise InvalidArgument("a malleable job runs on one node (nodes=1)")


def refusal(
    job: int,
    malleable: tuple[int, int] | None,
    held: int,
    target: int,
    free: int,
) -> str | None:
    """Why job ``job`` (holding ``held`` CPUs on its node, where ``free`` more are
    free for it) may not be resized to ``target`` CPUs; None if it may."""
    if malleable is None:
        return f"job {job} is not malleable"
    low, high = malleable
    if target < low:
        return f"job {job} cannot run on fewer than {low} CPUs (asked {target})"
    if target > high:
        return f"job {job} cannot use more than {high} CPUs (asked {target})"
    if target - held > free:
        return (
            f"job {job} cannot grow to {target} CPUs: only {free} more are free "
            "on its node"
        )
    return None


def rate(cpus: Sequence[int], ppn: int, model: RuntimeModel) -> float:
    """Static seconds per second for a job holding ``cpus`` (per node) that asked
    for ``ppn`` per node: Eq. 5 (``ideal``) or Eq. 6 (``worst``)."""
    if not cpus or ppn <= 0:
        return 1.0
    if model is RuntimeModel.IDEAL:
        return sum(cpus) / (ppn * len(cpus))
    return min(cpus) / ppn


def limit_rate(cpus: Sequence[int], ppn: int) -> float:
    """The rate a time limit or a prediction assumes: the worst case, and never
    faster than asked for (a job given more CPUs than it requested is not
    promised to use them; a limit never shrinks for them)."""
    return min(1.0, rate(cpus, ppn, RuntimeModel.WORST))


def stretch(remaining: float, before: float, after: float) -> float:
    """Seconds left after a change of rate from ``before`` to ``after``, for a job
    with ``remaining`` seconds left at rate ``before`` (the work left is kept)."""
    if after <= 0:
        raise ValueError("a running job holds at least one CPU")
    return remaining * before / after


def new_limit(
    elapsed: float,
    limit: float,
    asked: float,
    before: float,
    after: float,
) -> float:
    """A running job's new time limit (seconds from its start) after its rate
    changes from ``before`` to ``after``, ``elapsed`` seconds into its run: the
    time it had left stretched by the model, never under ``asked``."""
    left = max(0.0, limit - elapsed)
    return max(asked, elapsed + stretch(left, before, after))


def start_limit(walltime: float, asked: int, ppn: int) -> float:
    """The time limit of a job that asked for ``asked`` CPUs per node for
    ``walltime`` seconds and starts on ``ppn``: stretched when fewer."""
    return new_limit(0.0, walltime, walltime, 1.0, limit_rate([ppn], asked))


def give_back_target(held: int, lent: int, high: int, free: int) -> int:
    """A mate's CPUs when its guest ends: what it lent back, within its maximum
    and the CPUs free on its node (seed 002, Listing 3: ``expand_job(owner)``)."""
    return max(held, min(high, held + lent, held + free))
