"""A full disk under a running cluster: a change is refused at once, naming the
cause; reads go on; nothing refused appears later; nothing acknowledged is lost.

The cluster's ``state/`` (the database) is a small tmpfs, filled to the last
byte with a file. Mounting needs root: elsewhere the test is skipped.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Cluster, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: What the client says when no answer came: a refusal must never look like it.
NO_ANSWER = "no answer from the minibatch server"


def fill(path: Path) -> None:
    """Write ``path`` until its file system has no byte left."""
    with path.open("wb", buffering=0) as out:
        for size in (1 << 20, 4096, 1):
            chunk = bytes(size)
            while True:
                try:
                    out.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        # Something still holds a file there: detach it now, freed when let go.
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def small_disk(cluster: ClusterFactory) -> Iterator[Cluster]:
    """A one-node cluster whose ``state/`` is an 8 MB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    c = cluster(nodes=1, start=False)
    state = c.paths.state
    state.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(state)]
    mounted = subprocess.run(mount, capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        c.up()
        yield c
    finally:
        # Every process that may hold a file there goes before the unmount.
        try:
            c.down()
        finally:
            c.kill_everything()
            unmount(state)


def held(c: Cluster, name: str) -> subprocess.CompletedProcess[str]:
    return c.run("qsub", "-h", "-N", name, "--", "true", check=False)


def names(c: Cluster) -> dict[str, int]:
    """Every job the server has, finished ones too: name -> id."""
    return {j["name"]: int(j["id"]) for j in c.jobs(finished=True)}


def test_full_disk_refuses_changes_at_once_and_loses_nothing(
    small_disk: Cluster,
) -> None:
    c = small_disk
    acknowledged: dict[str, int] = {}
    for name in ("before", "before2"):
        acknowledged[name] = int(c.qsub("-h", "-N", name, "--", "true"))

    filler = c.paths.state / "filler"
    fill(filler)
    # Submissions until one is refused: SQLite may still have room in a page.
    refused = None
    for i in range(20):
        proc = held(c, f"full{i}")
        if proc.returncode:
            refused = proc
            break
        acknowledged[f"full{i}"] = int(proc.stdout)
    assert refused is not None, "the disk never filled up"
    cause = f"No space left on device ({c.paths.database}); nothing was changed"
    assert refused.stderr == f"qsub: cannot save the change: {cause}\n"
    assert NO_ANSWER not in refused.stderr  # answered, not timed out
    also_refused = held(c, "refused-too")
    assert also_refused.returncode == 1 and cause in also_refused.stderr
    qdel = c.run("qdel", str(acknowledged["before"]), check=False)
    assert qdel.returncode == 1 and cause in qdel.stderr

    # Reads go on while the disk is full.
    assert c.run("qstat").returncode == 0
    assert set(names(c)) == set(acknowledged)
    assert "node0" in c.run("pbsnodes", "-a").stdout
    assert c.job(acknowledged["before"])["state"] == "held"  # the qdel did nothing

    # Space comes back: changes work again without a restart.
    filler.unlink()
    for name in ("after", "after2"):
        acknowledged[name] = int(c.qsub("-h", "-N", name, "--", "true"))
    assert names(c) == acknowledged  # no refused job turned up
    # No id was given twice or skipped: the refused ones were never told.
    assert sorted(acknowledged.values()) == list(range(1, len(acknowledged) + 1))

    log = c.log("server")
    assert log.count("commit failed") == 1, log  # once per cause and minute
    failed = re.search(r"commits work again \((\d+) failed before\)", log)
    assert failed is not None and int(failed[1]) >= 3, log

    server = c.pids()["server"]
    psutil.Process(server).send_signal(signal.SIGKILL)
    psutil.Process(server).wait(5)
    assert c.up().started == ["server"]
    assert names(c) == acknowledged  # all committed, nothing more


def test_a_job_that_ends_while_the_disk_is_full_is_reported_once_space_returns(
    small_disk: Cluster,
) -> None:
    c = small_disk
    job = c.qsub("-N", "ends-while-full", "--", "sleep", "1")
    c.wait_state(job, "running")
    c.launched_procs(job)
    filler = c.paths.state / "filler"
    fill(filler)
    c.wait_for(lambda: not c.job_procs(job), what=f"job {job} to end")
    # The node sends its report with each heartbeat, and is refused each time.
    time.sleep(5 * c.config.node.heartbeat)
    assert c.job(job)["state"] == "running"  # nothing could be saved yet
    filler.unlink()
    done = c.wait_state(job, "finished")
    # The node's own report, taken once space came back: the job ran once.
    assert (done["result"], done["exit_status"], done["reruns"]) == ("completed", 0, 0)
