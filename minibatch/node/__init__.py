"""The node daemon, ``mb-node``: launches, supervises and measures jobs.

* :mod:`.launcher` starts a job's top process (identity, CPU mask, files, env);
* :mod:`.ownership` decides which processes belong to which job;
* :mod:`.tracker` reaps, enforces walltime and memory, kills leftovers, measures
  usage and produces ``JobStarted`` / ``JobEnded`` reports;
* :mod:`.procfs` reads ``/proc``;
* :mod:`.service` is the asyncio daemon that talks to the server.
"""
