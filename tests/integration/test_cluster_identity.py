"""Identity comes from the operating system, not from the message.

The test process (root) forks a child that becomes ``nobody`` (or a user made
for these tests, in a supplementary group of its own) and talks to the server
over its socket: the server must see that user (peer credentials), run the job
as that user, and refuse what that user may not do, nor show them another's
environment, arguments or script. The commands themselves cannot run as another
user here (the interpreter lives under /root, mode 0700), so the child speaks
the protocol directly, as any client may, and the parent renders what it got.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from minibatch.cli.render import qstat_full
from minibatch.cluster.layout import plan_nodes, usable_cpus
from minibatch.core.job import Job, JobRequest, JobResult, JobSpec
from minibatch.errors import RemoteError
from minibatch.net.client import Client
from minibatch.protocol.messages import (
    Alter,
    Diagnose,
    JobControl,
    JobEnded,
    Message,
    MoveJob,
    QueryJobs,
    Rerun,
    SetNodeOffline,
    SignalJob,
    Submit,
    TraceJob,
)
from tests.integration.conftest import Cluster, toml_text

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
    c.paths.config.write_text(toml_text("easy", {}))  # the tests' defaults
    try:
        c.up()
        yield c
    finally:
        c.teardown()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def alice() -> Iterator[pwd.struct_passwd]:
    """A user made for these tests, in a supplementary group; removed after."""
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        pytest.skip("no useradd/groupadd to make a user with")
    tag = uuid.uuid4().hex[:6]
    group, name = f"mbg{tag}", f"mbu{tag}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--groups", group, name],
            check=True,
            capture_output=True,
        )
        try:
            yield pwd.getpwnam(name)
        finally:
            subprocess.run(["userdel", name], check=False, capture_output=True)
    finally:
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def calling(endpoint: str, message: Message) -> Callable[[], Any]:
    def call() -> Any:
        with Client(endpoint, timeout=10) as client:
            return msgspec.to_builtins(client.call(message))

    return call


def as_nobody(endpoint: str, message: Message) -> tuple[str, Any]:
    """Send ``message`` from a child process running as nobody; its outcome."""
    return as_user(NOBODY, calling(endpoint, message))


def as_user(user: pwd.struct_passwd, act: Callable[[], Any]) -> tuple[str, Any]:
    """Run ``act`` in a child process running as ``user``; its outcome."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, then act
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            out: tuple[str, Any] = ("ok", act())
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


def test_another_user_can_neither_act_on_a_job_nor_read_it(
    shared_cluster: Cluster, alice: pwd.struct_passwd
) -> None:
    c = shared_cluster
    script = c.work / "secret.sh"
    script.write_text('#!/bin/sh\necho "token $SECRET $1"\nsleep 30\n')
    job = c.qsub("-v", "SECRET=hunter2", "-F", "arg-xyz", str(script), umask=0o077)
    out = Path(c.wait_state(job, "running")["output_path"])
    # "running" comes with the launch, a moment before the node opens the file.
    c.wait_for(
        lambda: out.exists() and "token hunter2 arg-xyz" in out.read_text(),
        what="the job's output",
    )
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # the submitter's umask

    def her(message: Message) -> tuple[str, Any]:
        return as_user(alice, calling(c.endpoint, message))

    each_id = [
        JobControl(action=a, selectors=[job], each=True)
        for a in ("cancel", "hold", "release")
    ]
    each_id += [
        SignalJob(selectors=[job], signal="KILL"),
        MoveJob(queue="batch", selectors=[job]),
    ]
    for message in each_id:  # qdel, qhold, qrls, qsig, qmove
        kind, reply = her(message)
        assert kind == "ok" and reply["jobs"] == [], (message, reply)
        assert [r["code"] for r in reply["refused"]] == [7], (message, reply)
    for message in (Alter(selector=job, walltime=10), Rerun(selectors=[job])):
        kind, value = her(message)
        assert (kind, value[0]) == ("error", 7), (message, value)  # PERMISSION
    assert c.job(job)["state"] == "running"

    kind, value = as_user(alice, out.read_text)
    assert kind == "crash" and "PermissionError" in value, value

    # What she is shown: the job, less its environment, arguments and script.
    kind, reply = her(QueryJobs(selectors=[job]))
    assert kind == "ok", reply
    (seen,) = msgspec.convert(reply["jobs"], list[Job])
    assert set(seen.env) <= {"PBS_O_HOST"} and seen.script is None
    assert seen.submit_args == "" and seen.options.script_args == []
    full = qstat_full([seen], time.time())
    assert "Job_Owner = root" in full and "job_state = R" in full
    for secret in ("hunter2", "arg-xyz", "sleep 30"):
        assert secret not in full
        for message in (TraceJob(selector=job), Diagnose()):
            kind, reply = her(message)
            assert kind == "ok" and secret not in json.dumps(reply["jobs"])
    # Its owner sees them all.
    mine = c.run("qstat", "-f", job).stdout
    assert "SECRET=hunter2" in mine and "job_args = arg-xyz" in mine
    c.run("qdel", job)


def test_a_users_job_runs_with_her_uid_gids_and_groups(
    shared_cluster: Cluster, alice: pwd.struct_passwd
) -> None:
    c = shared_cluster
    kind, reply = as_user(alice, calling(c.endpoint, Submit(spec=sleeper(c.work))))
    assert kind == "ok", reply
    job = reply["display"]
    c.wait_state(job, "running")
    (proc,) = c.wait_for(lambda: c.job_procs(job), what="the job's process")
    status = Path(f"/proc/{proc.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == [str(alice.pw_uid)] * 4
    assert fields["Gid"].split() == [str(alice.pw_gid)] * 4
    groups = sorted(int(g) for g in fields["Groups"].split())
    assert groups == sorted(os.getgrouplist(alice.pw_name, alice.pw_gid))
    extra = grp.getgrnam(f"mbg{alice.pw_name[3:]}").gr_gid
    assert extra in groups and extra != alice.pw_gid
    c.run("qdel", job)
    c.wait_state(job, "cancelled")
