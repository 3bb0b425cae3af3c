"""The user commands: ``qsub``, ``qstat``, ``qdel``/``qhold``/``qrls``/``qalter``,
``pbsnodes`` and ``mb acct``.

Parsing that needs no server lives in :mod:`.directives` and rendering in
:mod:`.render`, so both are tested without a cluster. ``qsub`` is kept free of typer
and rich on its start-up path: it is the command scripts call in tight loops.
"""
