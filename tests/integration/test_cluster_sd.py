"""SD-Policy live (seed 002): a guest starts on CPUs a running kernel lends.

Two malleable kernels fill the cluster; a third malleable job arrives; SD-Policy
shrinks one of them and starts the guest on the CPU it gave. The test checks
what the kernel says (the mate's processes on fewer CPUs, then on all again),
what the kernel program reports (its workers drop, then recover), the CPU
time it gets while shrunk (at most one CPU's, whatever else runs)
and what accounting keeps (both resizes, with their causes).

The machine has two cores, so the two nodes of two CPUs share them (``mb up
--oversubscribe``): a mate runs on both cores, and shrunk to one CPU on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time

import psutil
import pytest
from conftest import REPO, Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KERNEL = str(REPO / "jobs" / "malleable" / "kernel.py")


def kernel(c: Cluster, work: int, walltime: int) -> str:
    return c.qsub(
        "-N", "kernel", "-l", f"ncpus=2,malleable=1-2,walltime={walltime}", "--",
        sys.executable, KERNEL, "--work", str(work), "--chunk-ms", "20",
        "--interval", "0.5",
    )  # fmt: skip


def report(c: Cluster, jid: str) -> list[dict[str, str]]:
    """The kernel's interval lines so far, as dicts."""
    path = c.work / f"kernel.o{jid}"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [dict(re.findall(r"(\w+)=(\S+)", x)) for x in lines if x.startswith("t=")]


def rates(lines: list[dict[str, str]], workers: str) -> list[float]:
    return [
        float(x["rate"].removesuffix("/s")) for x in lines if x["workers"] == workers
    ]


def cpu_seconds_over(c: Cluster, jid: str, wall: float) -> tuple[float, float]:
    """CPU seconds the job's processes used over about ``wall`` seconds, and the
    wall time measured, as the kernel counts them."""

    def total(procs: list[psutil.Process]) -> float:
        used = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                used += t.user + t.system
        return used

    procs = c.job_procs(jid)
    start, t0 = total(procs), time.monotonic()
    time.sleep(wall)
    return total(procs) - start, time.monotonic() - t0


def physical(c: Cluster, jid: str) -> set[int]:
    """The CPUs the kernel lets the job's processes run on."""
    cpus: set[int] = set()
    for proc in c.job_procs(jid):
        cpus |= set(proc.cpu_affinity())
    return cpus


async def test_sd_shrinks_a_mate_for_a_guest_and_expands_it_back(
    cluster: ClusterFactory,
) -> None:
    c = await asyncio.to_thread(cluster, nodes=2, cpus_per_node=2, policy="sd")
    both = set(range(2))
    mates = [kernel(c, 100_000, 600) for _ in range(2)]
    for jid in mates:
        await asyncio.to_thread(c.wait_state, jid, "running")
    for jid in mates:
        await asyncio.to_thread(
            c.wait_for, lambda j=jid: len(report(c, j)) >= 4, 20.0, 0.2, "rates"
        )
        assert physical(c, jid) == both

    guest = kernel(c, 150, 60)
    record = await asyncio.to_thread(c.wait_state, guest, "running")
    assert len(record["cpus"]) == 1  # it started on as few as its minimum
    shrunk = [m for m in mates if len(c.job(m)["cpus"]) == 1]
    assert len(shrunk) == 1, [c.job(m) for m in mates]
    (mate,) = shrunk
    [other] = [m for m in mates if m != mate]
    await asyncio.to_thread(
        c.wait_for, lambda: len(physical(c, mate)) == 1, what="the mate shrunk"
    )
    assert physical(c, other) == both
    await asyncio.to_thread(c.launched_procs, guest)
    assert physical(c, guest) | physical(c, mate) == both
    # Shrunk, it gets at most one CPU's time, however idle the other core is.
    used, wall = await asyncio.to_thread(cpu_seconds_over, c, mate, 2.0)
    assert used <= 1.1 * wall, (used, wall)
    await asyncio.to_thread(
        c.wait_for, lambda: len(rates(report(c, mate), "1")) >= 3, 30.0, 0.2
    )

    done = await asyncio.to_thread(c.wait_state, guest, "finished", 90.0)
    assert done["result"] == "completed"
    record = await asyncio.to_thread(c.wait_resizes, mate, 2)
    assert [len(r["after"]) for r in record["resizes"]] == [1, 2]
    assert record["resizes"][0]["cause"] == f"sd: room for job {guest}"
    assert record["resizes"][1]["cause"] == f"job {guest} ended"
    assert physical(c, mate) == both
    mark = len(report(c, mate))
    await asyncio.to_thread(
        c.wait_for,
        lambda: len(rates(report(c, mate)[mark:], "2")) >= 3,
        30.0,
        0.2,
        "rates after the expansion",
    )

    # The kernel's own words: two workers, then one, then two again. (Its
    # rates follow, but how much depends on what else the machine runs: the
    # CPU time it got while shrunk is what is checked, above.)
    lines = report(c, mate)
    assert rates(lines[:mark], "2") and rates(lines, "1")
    assert rates(lines[mark:], "2")
    acct = c.run("mb", "acct", "-j", mate, "-o", "JobID,Resizes,Malleable").stdout
    assert acct.split()[-2:] == ["2", "1-2"]
    for jid in mates:
        c.run("qdel", jid)
