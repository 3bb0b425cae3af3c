#!/usr/bin/env python3
# PBS -N rigid_burn
# PBS -l ncpus=2,walltime=00:01:00
"""A rigid CPU burner: one busy process per CPU of the job ($MB_CPUS), no resizes.

It does not catch the resize signal, so a resize never signals it; it only finds
its processes confined to other CPUs. Prints ``start cpus=0-1 workers=2
seconds=10.0`` and, at the end, ``done workers=2 elapsed=10.01 cpu_seconds=19.96``.
"""

import argparse
import ctypes
import os
import signal
import sys
import time


def burn(seconds: float) -> None:
    """Spin in a child process until ``seconds`` pass, then leave."""
    # Die with the parent (prctl PR_SET_PDEATHSIG), so that ending it ends all.
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=float(os.environ.get("BURN_SECONDS", "10")),
        help="how long to burn (default $BURN_SECONDS or 10)",
    )
    args = parser.parse_args()
    affinity = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("MB_CPUS", len(affinity)))
    cpus = ",".join(map(str, affinity))
    print(f"start cpus={cpus} workers={workers} seconds={args.seconds}", flush=True)
    begin = time.monotonic()
    for _ in range(workers):
        if os.fork() == 0:
            burn(args.seconds)
    for _ in range(workers):
        os.wait()
    t = os.times()
    used = t.user + t.system + t.children_user + t.children_system
    elapsed = time.monotonic() - begin
    print(
        f"done workers={workers} elapsed={elapsed:.2f} cpu_seconds={used:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
