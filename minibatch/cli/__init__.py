"""The user commands: ``qsub``, ``qstat``, ``qdel``/``qhold``/``qrls``/``qalter``,
``pbsnodes`` and ``mb acct``.

Parsing that needs no server lives in :mod:`.directives` and rendering in
:mod:`.render`, so both are tested without a cluster. The commands are kept free of
typer and rich on their start-up path (:mod:`.fastargs`): scripts call them in
tight loops.

Every command imports this package first, so msgspec is imported here, for
all of them, without ``typing_extensions`` (:mod:`.msgspec_first`).
"""

from minibatch.cli import msgspec_first

msgspec_first.load()
