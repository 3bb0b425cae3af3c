"""Discrete-event simulation of workload traces with the live scheduler policies.

``swf`` reads and writes the Standard Workload Format and applies the job filter,
``machine`` describes the simulated nodes, ``engine`` is the event loop that feeds
:class:`~minibatch.core.snapshot.ClusterSnapshot` objects to an unmodified policy,
``runner`` turns a trace and a policy into job records and files, ``experiments``
holds the named, reproducible comparisons. See ``docs/simulator.md``.
"""
