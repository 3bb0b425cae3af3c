"""Quiet passes: the scheduling passes the engine can prove would change nothing.

A policy is a pure function of its snapshot (:mod:`minibatch.policy.base`), so a
pass matters only through what the engine keeps of its plan: its starts, its
resizes, and its predicted starts for the jobs that arrived at its instant. The
engine skips a pass that can have none of them, a *quiet* one:

* **no start**: a start must find the job's CPUs free now (the server's rule,
  which the engine applies to every start), so none is possible when every
  queued job asks for more CPUs per node than the freest node has free. The
  engine keeps the queue's least in a heap. Memory, features and downtimes
  can only forbid more;
* **no resize**: no malleable job takes part in the simulation (a plan may
  shrink one to start another, or start one on fewer CPUs than it asked for);
* **no prediction to keep**: no job arrived at the instant, or the policy is
  one whose pass, when it starts nothing, predicts starts for the first
  :func:`prediction_reach` jobs of the queue only, and at least that many were
  queued before the instant's arrivals.

Nor with fairshare usage, whose ledger is read at every pass. On SDSC-SP2 under
EASY, 38 % of the passes are quiet: the machine is full and a job arrives behind
the head, or an end frees fewer CPUs than any queued job asks for.
``tests/unit/test_sim_quiet.py`` checks that skipping them changes no start, end
or prediction.
"""

from __future__ import annotations

from minibatch.policy.backfill import Backfill, Easy
from minibatch.policy.base import Policy
from minibatch.policy.fifo import Fifo

__all__ = ["prediction_reach"]


def prediction_reach(policy: Policy) -> int | None:
    """How many of the queue's first jobs a pass of ``policy`` that starts
    nothing may predict a start for; None when that is not known.

    FIFO never predicts. Backfilling in submission order with first fit walks
    the queue in order and reserves (predicts) the first ``depth`` jobs that do
    not start, every one of which fits some day (the job filter drops those
    that never could). Any other policy, or a subclass, may predict for anyone.
    """
    if type(policy) is Fifo:
        return 0 if policy.order is None else None
    if isinstance(policy, Backfill) and type(policy) in (Backfill, Easy):
        simple = policy.order is None and policy.selection is None
        return policy.depth if simple else None
    return None
