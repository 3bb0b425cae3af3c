"""mb sweep on a real Dask cluster: a LocalCluster of two worker processes,
started here, reached over TCP by the ``mb`` command; its results are those of
the sequential run, and the cluster's processes are gone once it is closed."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import gone
from distributed import Client, LocalCluster

from minibatch.sim import sweep
from minibatch.sim.parallel import Pool
from minibatch.sim.runner import SimConfig
from minibatch.sim.swf import find_trace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BIN = Path(sys.executable).parent
SDSC = str(find_trace("SDSC-SP2-1998-4.2-cln.swf.gz").resolve())
GRID = ["--policies", "fifo,easy", "--loads", "0.8,1.2", "--limit", "300"]


def mb_sweep(out: Path, *where: str) -> str:
    done = subprocess.run(
        [str(BIN / "mb"), "sweep", SDSC, *GRID, "--out", str(out), *where],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def schedule(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without its timings; NaN (undefined) as None, to compare."""
    return {
        k: None if isinstance(v, float) and math.isnan(v) else v
        for k, v in summary.items()
        if k not in ("wall_s", "jobs_per_s", "read_s")
    }


def test_a_sweep_on_a_local_dask_cluster_matches_the_sequential_one(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        with Client(cluster) as client:
            workers = set(client.run(os.getpid).values())
        assert len(workers) == 2 and os.getpid() not in workers
        address = cluster.scheduler_address
        assert address.startswith("tcp://")

        printed = mb_sweep(tmp_path / "dask", "--cluster", address)
        mb_sweep(tmp_path / "here", "--workers", "1", "--no-plots")
        table = (tmp_path / "dask" / "sweep.csv").read_bytes()
        assert table == (tmp_path / "here" / "sweep.csv").read_bytes()
        assert len(printed.splitlines()) == 2 + 4 + 2  # head, 4 runs, "wrote"
        assert (tmp_path / "dask" / "mean_wait_s.png").is_file()

        # Whole runs come back too, records and all, in the grid's order.
        points = sweep.grid_points([SDSC], ["fifo", "easy"], [0.8, 1.2], {})
        tasks = sweep.tasks(points, SimConfig(trace=SDSC, limit=300))
        heard: list[int] = []
        with Pool(cluster=address, progress=lambda done, n: heard.append(n)) as pool:
            remote = pool.all(tasks)
        local = Pool(workers=1).all(tasks)
        for a, b in zip(remote, local, strict=True):
            assert a.records == b.records and a.eet == b.eet
            assert schedule(a.summary) == schedule(b.summary)
        assert heard == [4, 4, 4, 4]
    finally:
        cluster.close()
    assert all(gone(pid) for pid in workers)
