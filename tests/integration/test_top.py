"""``mb top`` in a real terminal (tmux) on a real cluster: a job submitted with
qsub shows up running on a node, the delete key (confirmed) cancels it, q quits,
and no process is left behind."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import BIN, ClusterFactory, gone, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WIDTH, HEIGHT = 140, 45


class Tmux:
    """A tmux server of its own (``-L``), so nothing else's is touched."""

    def __init__(self, env: dict[str, str]) -> None:
        binary = shutil.which("tmux")
        if binary is None:
            pytest.fail("tmux is not installed: `make test` installs it")
        self.argv = [binary, "-L", f"mbtop-{uuid.uuid4().hex[:12]}"]
        self.env = env

    def __call__(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [*self.argv, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def showing(self, pattern: str, what: str, timeout: float = 20.0) -> str:
        """Wait until the screen matches ``pattern``; return the screen."""
        last = [""]

        def shown() -> str | None:
            last[0] = self.screen()
            return last[0] if re.search(pattern, last[0], re.MULTILINE) else None

        try:
            return wait_for(shown, timeout, 0.2, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{last[0]}") from None


def test_mb_top_shows_a_job_and_deletes_it(cluster: ClusterFactory) -> None:
    c = cluster(nodes=2, cpus_per_node=1)
    tmux = Tmux(c.env)
    tmux(
        "new-session", "-d", "-s", "top", "-x", str(WIDTH), "-y", str(HEIGHT),
        "-e", f"MB_HOME={c.home}", f"{BIN / 'mb'} top",
    )  # fmt: skip
    server = psutil.Process(int(tmux("display-message", "-p", "#{pid}")))
    socket = Path(tmux("display-message", "-p", "#{socket_path}").strip())
    top = psutil.Process(int(tmux("display-message", "-p", "-t", "top", "#{pane_pid}")))
    try:
        tmux.showing(r"^│node0 ", "the dashboard with its nodes")
        job = c.qsub("-N", "topjob", "--", "sleep", "300")
        c.wait_state(job, "running")
        # Its CPU cell on a node, and its row among the running jobs.
        cell = rf"^│node\d +[\w-]+ +{re.escape(job)} "
        row = rf"^│ {re.escape(job)} +topjob +\S+ +1 +node\d:\d+ +00:"
        screen = tmux.showing(rf"{cell}(?s:.*){row}", f"job {job} running on a node")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "mb-top.txt").write_text(screen)

        tmux("send-keys", "-t", "top", "Tab", "d")  # the running table; delete
        tmux.showing(rf"Delete job {re.escape(job)} \(topjob", "the confirmation")
        tmux("send-keys", "-t", "top", "y")
        assert c.wait_state(job, "cancelled")["result"] == "cancelled"
        tmux.showing(rf"delete job {re.escape(job)}: done", "the outcome")
        tmux.showing(r"Running: 0", "the job gone from the running table")

        tmux("send-keys", "-t", "top", "q")
        wait_for(lambda: gone(top.pid), 10, what="mb top to quit on q")
        # Its session was the only one: the server goes with it.
        wait_for(lambda: gone(server.pid), 10, what="the tmux server to exit")
    finally:
        tmux("kill-server", check=False)
        for proc in (top, server):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs([top, server], timeout=5)
        socket.unlink(missing_ok=True)  # tmux leaves it behind when it exits
