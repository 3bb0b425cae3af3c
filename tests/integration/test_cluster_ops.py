"""Operations on real daemons: systemd's readiness protocol, the PBS accounting
log, and ``mb backup`` while jobs are submitted."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import BIN, Cluster, ClusterFactory, make_home

from minibatch.config import Paths
from minibatch.daemon import notify_ready
from minibatch.net.client import Client
from minibatch.protocol.messages import JobList, QueryJobs
from minibatch.server.submit import user_name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

HOST = os.uname().nodename
#: ``MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...``
LINE = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d);([A-Z]);([^;]+);(.*)$")


# ------------------------------------------------------------ sd_notify


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket in the abstract namespace, as systemd's, and its
    ``$NOTIFY_SOCKET`` spelling."""
    name = f"minibatch-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(f"\0{name}")
    sock.settimeout(30)
    try:
        yield sock, f"@{name}"
    finally:
        sock.close()


def start(program: str, home: Path, notify: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MB_")}
    env |= {"MB_HOME": str(home), "NOTIFY_SOCKET": notify}
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(BIN / program)], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_server_and_scheduler_say_ready_once_they_serve(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
):
    sock, address = notify_socket
    home, _ = make_home(tmp_path)
    paths = Paths(home)
    server = start("mb-server", home, address, tmp_path / "server.log")
    scheduler = None
    try:
        assert sock.recv(64) == b"READY=1"
        # Ready means serving: a request is answered at once.
        endpoint = f"ipc://{paths.run / 'server.sock'}"
        with Client(endpoint, timeout=5) as client:
            assert isinstance(client.call(QueryJobs()), JobList)
        scheduler = start("mb-scheduler", home, address, tmp_path / "sched.log")
        assert sock.recv(64) == b"READY=1"
        for proc in (scheduler, server):
            proc.send_signal(signal.SIGTERM)
            assert sock.recv(64) == b"STOPPING=1"
            assert proc.wait(15) == 0
    finally:
        for proc in (scheduler, server):
            if proc is not None:
                stop(proc)


def test_notify_reaches_a_socket_named_by_its_path(monkeypatch: pytest.MonkeyPatch):
    path = Path(f"/tmp/mb-notify-{uuid.uuid4().hex[:12]}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        try:
            sock.settimeout(5)
            monkeypatch.setenv("NOTIFY_SOCKET", str(path))
            notify_ready()
            assert sock.recv(64) == b"READY=1"
        finally:
            path.unlink()


# ----------------------------------------------------- accounting log


def accounting(c: Cluster) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """Each job's records, in order: (type, keys); every line and file checked."""
    out: dict[str, list[tuple[str, dict[str, str]]]] = {}
    directory = c.paths.state / "accounting"
    for day in sorted(directory.iterdir()):
        for line in day.read_text().splitlines():
            m = LINE.match(line)
            assert m, f"{day.name}: not a PBS accounting line: {line!r}"
            stamp = time.strptime(m.group(1), "%m/%d/%Y %H:%M:%S")
            assert day.name == time.strftime("%Y%m%d", stamp)
            keys = dict(kv.split("=", 1) for kv in m.group(4).split(" ") if kv)
            out.setdefault(m.group(3), []).append((m.group(2), keys))
    return out


def test_accounting_log_has_every_kind_of_record(cluster: ClusterFactory):
    c = cluster(nodes=1, cpus_per_node=1)
    done = c.qsub("--", "/bin/true")
    c.wait_state(done, "completed")
    held = c.qsub("-h", "--", "/bin/true")
    c.run("qdel", held)
    killed = c.qsub("--", "/bin/sleep", "60")
    c.wait_state(killed, "running")
    c.launched_procs(killed)
    c.run("qdel", killed)
    c.wait_state(killed, "cancelled")
    rerun = c.qsub("--", "/bin/sleep", "60")
    c.wait_state(rerun, "running")
    c.launched_procs(rerun)
    c.run("qrerun", rerun)
    c.wait_for(
        lambda: (r := c.job(rerun))["reruns"] == 1 and r["state"] == "running",
        timeout=15,
        what="the rerun job running again",
    )
    c.run("qdel", rerun)
    c.wait_state(rerun, "cancelled")

    log = accounting(c)
    kinds = {job: [kind for kind, _ in records] for job, records in log.items()}
    assert kinds == {
        done: ["Q", "S", "E"],
        held: ["Q", "D"],
        killed: ["Q", "S", "D", "E"],
        rerun: ["Q", "S", "R", "S", "D", "E"],
    }
    me = user_name(os.getuid())
    (_, q), (_, s), (_, e) = log[done]
    assert q == {"queue": "batch"}
    assert s["user"] == me and s["owner"] == f"{me}@{HOST}"
    assert s["jobname"] == "true" and s["exec_host"].startswith("node0/")
    assert s["Resource_List.ncpus"] == "1"
    assert e["Exit_status"] == "0" and int(e["end"]) >= int(e["start"])
    for key in ("resources_used.cput", "resources_used.mem", "session"):
        assert key in e
    assert log[held][1] == ("D", {"requestor": f"{me}@{HOST}"})
    assert log[killed][3][1]["Exit_status"] == "271"  # 256 + SIGTERM


# ---------------------------------------------------------------- backup


def test_backup_while_jobs_are_submitted(cluster: ClusterFactory, tmp_path: Path):
    c = cluster(nodes=1, cpus_per_node=1)
    finished = c.qsub("--", "/bin/true")
    c.wait_state(finished, "completed")
    acked: list[str] = []
    stopping = threading.Event()

    def submit() -> None:
        while not stopping.is_set():
            acked.append(c.qsub("-h", "--", "/bin/true"))

    submitter = threading.Thread(target=submit)
    submitter.start()
    dest = tmp_path / "backup.db"
    try:
        c.wait_for(lambda: len(acked) >= 3, timeout=30, what="3 submissions")
        before = list(acked)
        out = c.run("mb", "backup", str(dest)).stdout
        during = len(acked)
        c.wait_for(lambda: len(acked) > during, timeout=30, what="more submissions")
    finally:
        stopping.set()
        submitter.join(30)
    assert re.fullmatch(
        rf"wrote {re.escape(str(dest))}: \d+ jobs queued or running, 1 finished .*\n",
        out,
    )

    copy = sqlite3.connect(dest)
    try:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        ids = {str(i) for (i,) in copy.execute("SELECT id FROM jobs")}
        ids |= {str(i) for (i,) in copy.execute("SELECT id FROM accounting")}
    finally:
        copy.close()
    assert {finished, *before} <= ids
    assert os.stat(dest).st_mode & 0o077 == 0  # every job's environment is in it

    refused = c.run("mb", "backup", str(dest), check=False)
    assert refused.returncode == 1 and "--force" in refused.stderr
    c.run("mb", "backup", "--force", str(dest))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".backup.db")]
    assert psutil.pid_exists(c.pids()["server"])  # the server never noticed
