"""Scheduling policies: pure functions of a cluster snapshot."""
