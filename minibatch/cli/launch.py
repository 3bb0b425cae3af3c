"""The console scripts of the commands (``qsub``, ``qstat``, ``showq``...).

``pyproject.toml`` names each ``minibatch.cli.launch:NAME``; this module turns
the garbage collector off, then imports and returns the command's ``main``
(:data:`SCRIPTS`). Off before the imports, not only while the command runs
(:func:`minibatch.cli.common.run_and_exit`): importing msgspec, pyzmq and the
protocol creates tens of thousands of objects, and the collections they set off
free nothing, ~4 ms of a command that should answer in 60. Every command ends
through ``run_and_exit``, with the collector off and ``os._exit``. Only console
scripts import this module: the daemons and ``mb`` (whose ``mb web`` and ``mb
sim`` run for long) keep their collector.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

gc.disable()

#: Console script -> ``module:function``.
SCRIPTS = {
    "qsub": "minibatch.cli.qsub:main",
    "sbatch": "minibatch.cli.sbatch:main",
    "srun": "minibatch.cli.srun:main",
    "qstat": "minibatch.cli.qstat:main",
    "qdel": "minibatch.cli.jobctl:qdel_main",
    "qhold": "minibatch.cli.jobctl:qhold_main",
    "qrls": "minibatch.cli.jobctl:qrls_main",
    "qalter": "minibatch.cli.jobctl:qalter_main",
    "qselect": "minibatch.cli.pbsctl:qselect_main",
    "qsig": "minibatch.cli.pbsctl:qsig_main",
    "qrerun": "minibatch.cli.pbsctl:qrerun_main",
    "qmove": "minibatch.cli.pbsctl:qmove_main",
    "tracejob": "minibatch.cli.pbsctl:tracejob_main",
    "pbsnodes": "minibatch.cli.pbsnodes:main",
    "squeue": "minibatch.cli.slurmcmds:squeue_main",
    "sinfo": "minibatch.cli.sinfo:main",
    "scancel": "minibatch.cli.slurmcmds:scancel_main",
    "sacct": "minibatch.cli.slurmacct:main",
    "scontrol": "minibatch.cli.slurmctl:main",
    "showq": "minibatch.cli.showq:showq_main",
    "showstart": "minibatch.cli.showq:showstart_main",
    "showbf": "minibatch.cli.showq:showbf_main",
    "setres": "minibatch.cli.resv:setres_main",
    "showres": "minibatch.cli.resv:showres_main",
    "releaseres": "minibatch.cli.resv:releaseres_main",
    "checkjob": "minibatch.cli.diag:checkjob_main",
    "diagnose": "minibatch.cli.diag:diagnose_main",
}


def __getattr__(name: str) -> Callable[[], None]:
    """``from minibatch.cli.launch import qstat``: the script's ``main``."""
    try:
        module, _, function = SCRIPTS[name].partition(":")
    except KeyError:
        raise AttributeError(f"no console script {name!r}") from None
    # __import__, not importlib.import_module: importing importlib is ~0.2 ms.
    loaded = __import__(module, fromlist=[function])
    main: Callable[[], None] = getattr(loaded, function)
    return main
