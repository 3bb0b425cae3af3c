"""Metrics for live and simulated runs alike.

Everything here is a pure function over :class:`~minibatch.metrics.records.JobRecord`
values, which come from a simulation (``records.from_outcomes``), from a live
cluster's accounting (``records.from_jobs``) or from a ``jobs.csv`` file.
``summary`` has the classic user-agnostic metrics with medians and percentiles
beside the means, ``eet`` the user-aware ones of Tóth & Klusáček (seed 001),
``plots`` draws them (matplotlib, imported only when asked).
"""
