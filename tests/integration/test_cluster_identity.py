"""Identity comes from the operating system, not from the message.

The test process (root) forks a child that becomes ``nobody`` and talks to the
server over its socket: the server must see ``nobody`` (peer credentials), run the
job as ``nobody``, and refuse what ``nobody`` may not do. The commands themselves
cannot run as ``nobody`` here (the interpreter lives under /root), so the child
speaks the protocol directly, as any client may.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.core.job import JobRequest, JobResult, JobSpec
from minibatch.errors import RemoteError
from minibatch.net.client import Client
from minibatch.protocol.messages import (
    Alter,
    JobControl,
    JobEnded,
    Message,
    SetNodeOffline,
    Submit,
)
from tests.integration.conftest import Cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root"),
]

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def shared_cluster() -> Iterator[Cluster]:
    """A cluster whose home other users can traverse (the node spools there)."""
    home = Path(tempfile.mkdtemp(prefix="mb-id-", dir="/tmp"))
    home.chmod(0o755)
    c = Cluster(home, plan_nodes(1, 2, usable_cpus()[:2], False, None), True)
    c.work.chmod(0o777)
    try:
        c.up()
        yield c
    finally:
        c.teardown()
        shutil.rmtree(home, ignore_errors=True)


def as_nobody(endpoint: str, message: Message) -> tuple[str, Any]:
    """Send ``message`` from a child process running as nobody; its outcome."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, then speak the protocol
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            with Client(endpoint, timeout=10) as client:
                out: tuple[str, Any] = ("ok", msgspec.to_builtins(client.call(message)))
        except RemoteError as exc:
            out = ("error", [int(exc.code), str(exc)])
        except BaseException as exc:  # report anything, never run pytest's teardown
            out = ("crash", repr(exc))
        os.write(write, msgspec.json.encode(out))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    kind, value = msgspec.json.decode(data)
    return kind, value


def sleeper(workdir: Path) -> JobSpec:
    return JobSpec(
        name="nap",
        workdir=str(workdir),
        request=JobRequest(ppn=1, walltime=60),
        argv=["sleep", "30"],
    )


def test_server_sees_the_socket_peer_and_runs_the_job_as_that_user(
    shared_cluster: Cluster,
) -> None:
    c = shared_cluster
    kind, reply = as_nobody(c.endpoint, Submit(spec=sleeper(c.work)))
    assert kind == "ok", reply
    job_id = reply["display"]
    record = c.wait_state(job_id, "running")
    assert record["user"] == "nobody"

    def procs() -> list[psutil.Process]:
        return c.job_procs(job_id)

    (proc,) = c.wait_for(procs, what="the job's process")
    assert proc.uids().real == NOBODY.pw_uid
    assert proc.gids().real == NOBODY.pw_gid
    out = Path(record["output_path"])
    assert out.exists() and out.stat().st_uid == NOBODY.pw_uid


def test_other_users_may_not_touch_a_job_or_act_as_a_daemon(
    shared_cluster: Cluster,
) -> None:
    c = shared_cluster
    mine = c.qsub("--", "sleep", "30")  # submitted by root
    c.wait_state(mine, "running")
    refusals: list[Callable[[], tuple[str, Any]]] = [
        lambda: as_nobody(c.endpoint, JobControl(action="cancel", selectors=[mine])),
        lambda: as_nobody(c.endpoint, SetNodeOffline(names=["node0"], offline=True)),
        lambda: as_nobody(
            c.endpoint,
            JobEnded(
                job=int(mine),
                result=JobResult.COMPLETED,
                exit_status=0,
                signal=None,
                end_time=0.0,
                cputime_s=0.0,
                maxrss_kb=0,
            ),
        ),
    ]
    for attempt in refusals:
        kind, value = attempt()
        assert kind == "error", value
        assert value[0] == 7, value  # ErrorCode.PERMISSION
    record = c.job(mine)
    assert record["state"] == "running"
    assert c.nodes()["node0"].state != "offline"
    # The owner (root, an operator) may cancel anyone's job.
    kind, reply = as_nobody(c.endpoint, Submit(spec=sleeper(c.work)))
    assert kind == "ok", reply
    c.run("qdel", reply["display"])
    assert c.wait_state(reply["display"], "cancelled")["user"] == "nobody"


def test_a_user_resizes_their_own_malleable_job_and_no_one_elses(
    shared_cluster: Cluster,
) -> None:
    c = shared_cluster
    theirs = c.qsub("-l", "ncpus=2,malleable=1-2", "--", "sleep", "30")  # root's
    c.wait_state(theirs, "running")
    kind, value = as_nobody(c.endpoint, Alter(selector=theirs, ncpus=1))
    assert (kind, value[0]) == ("error", 7), value  # ErrorCode.PERMISSION
    c.run("qdel", theirs)
    c.wait_state(theirs, "cancelled")

    spec = JobSpec(
        name="flex",
        workdir=str(c.work),
        request=JobRequest(ppn=2, walltime=60, malleable=(1, 2)),
        argv=["sleep", "30"],
    )
    kind, reply = as_nobody(c.endpoint, Submit(spec=spec))
    assert kind == "ok", reply
    mine = reply["display"]
    c.wait_state(mine, "running")
    (proc,) = c.wait_for(lambda: c.job_procs(mine), what="the job's process")
    kind, value = as_nobody(c.endpoint, Alter(selector=mine, ncpus=0))
    assert (kind, value[0]) == ("error", 8), value  # below its range
    kind, value = as_nobody(c.endpoint, Alter(selector=mine, ncpus=1))
    assert kind == "ok", value
    record = c.wait_resizes(mine, 1)
    assert record["resizes"][0]["cause"] == "qalter by nobody"
    assert proc.cpu_affinity() == record["cpus"] and len(record["cpus"]) == 1
    # Growing takes CPUs ahead of the queue: operators only.
    kind, value = as_nobody(c.endpoint, Alter(selector=mine, ncpus=2))
    assert (kind, value[0]) == ("error", 7), value
