"""Scheduling policies: pure functions of a cluster snapshot."""

from minibatch.native import attach

# The planning core compiled by mypyc, while it matches this source
# (minibatch/native.py).
attach(__path__)
