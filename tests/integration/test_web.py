"""``mb web`` against a real cluster, seen in headless chromium (Debian's, driven by
playwright): the page shows the nodes, and a job submitted meanwhile waits in the
queue at its predicted start, then runs on its CPU, then ends. A screenshot is kept
in tests/artifacts/mb-web.png.

And what goes wrong: a port in use, a cluster without a broker, a broker that
refuses the connection; each said plainly, nothing left running.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BIN, REPO, ClusterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = REPO / "tests" / "artifacts" / "mb-web.png"
#: Milliseconds the page may take to show what the cluster already says.
SHOWN_WITHIN = 20_000


class Web:
    """A running ``mb web --port 0`` and the URL it printed."""

    def __init__(self, home: Path, *args: str) -> None:
        env = {"PATH": str(BIN) + ":/usr/bin:/bin", "MB_HOME": str(home)}
        self.proc = subprocess.Popen(
            [str(BIN / "mb"), "web", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        prefix, suffix = "mb web: serving ", " (Ctrl-C to stop)\n"
        if not (line.startswith(prefix) and line.endswith(suffix)):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"mb web printed {line!r}; stderr: {err}")
        self.url = line[len(prefix) : -len(suffix)]
        assert self.url.startswith("http://127.0.0.1:") and self.url.endswith("/")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "state", timeout=10) as reply:
            result: dict[str, Any] = json.load(reply)
            return result

    def stop(self) -> str:
        """SIGTERM by pid; it must exit 0 without a traceback. Returns stderr."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, err
        assert "Traceback" not in err
        return err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield chromium
        finally:
            chromium.close()


def waits_on(gate: Path) -> list[str]:
    """A job's command that runs until ``gate`` exists, however slow the machine."""
    return ["--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"]


def test_the_page_follows_a_job_from_queue_to_cpu_to_past(
    cluster: ClusterFactory, browser: Any
) -> None:
    from playwright.sync_api import expect

    c = cluster(nodes=2, cpus_per_node=1)
    web = Web(c.home, "--port", "0")
    try:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        complaints: list[str] = []
        page.on("pageerror", lambda exc: complaints.append(str(exc)))
        page.on(
            "console",
            lambda m: complaints.append(m.text) if m.type == "error" else None,
        )
        page.goto(web.url)
        for name in c.nodes():
            expect(page.locator(f"#nodes .node[data-node='{name}']")).to_be_visible(
                timeout=SHOWN_WITHIN
            )

        # Both CPUs taken, so the job waits, with a predicted start.
        gate_blocker, gate_job = c.work / "go-blocker", c.work / "go-job"
        blocker = c.qsub(
            "-l", "nodes=2:ppn=1", "-l", "walltime=120", *waits_on(gate_blocker)
        )
        c.wait_state(blocker, "running")
        job = c.qsub("-N", "<b>web<b>", "-l", "walltime=60", *waits_on(gate_job))
        queued = page.locator(f"#queue tr[data-job='{job}']")
        expect(queued).to_be_visible(timeout=SHOWN_WITHIN)
        # The name is shown as written, not taken for markup.
        expect(queued).to_contain_text("<b>web<b>")
        planned = page.locator(f"#gantt g[data-job='{job}'][data-kind='planned']")
        expect(planned).to_have_count(1, timeout=SHOWN_WITHIN)
        assert c.job(job)["state"] == "queued"
        for cpu in page.locator(f"#nodes .cell[data-job='{blocker}']").all():
            expect(cpu).to_have_text(blocker)
        # What if: the waiting job, simulated under another policy.
        page.select_option("#whatif-policy", "fifo")
        page.click("#whatif-run")
        expect(page.locator(f"#whatif-table tr[data-job='{job}']")).to_be_visible(
            timeout=SHOWN_WITHIN
        )
        expect(page.locator("#whatif-means")).to_contain_text("under fifo")

        gate_blocker.touch()
        cell = page.locator(f"#nodes .cell[data-job='{job}']")
        expect(cell).to_have_count(1, timeout=SHOWN_WITHIN)
        expect(page.locator(f"#running tr[data-job='{job}']")).to_be_visible()
        expect(queued).to_have_count(0)
        record = c.job(job)
        assert record["state"] == "running"
        (where,) = record["alloc"]
        (cpu,) = where["cpus"]
        node_cells = f"#nodes .node[data-node='{where['node']}']"
        expect(page.locator(f"{node_cells} .cell[data-cpu='{cpu}']")).to_have_text(job)
        ended = page.locator(f"#gantt g[data-job='{blocker}'][data-kind='ended']")
        expect(ended).to_have_count(2, timeout=SHOWN_WITHIN)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        gate_job.touch()
        c.wait_state(job, "finished")
        expect(page.locator("#nodes .cell[data-job]")).to_have_count(
            0, timeout=SHOWN_WITHIN
        )
        expect(page.locator("#problem")).to_be_hidden()
        assert complaints == []
        assert web.stop() == ""
    finally:
        web.kill()


def test_a_port_in_use_is_refused_and_nothing_starts(
    cluster: ClusterFactory,
) -> None:
    c = cluster(nodes=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = c.run("mb", "web", "--port", str(port), check=False, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr == f"mb web: port {port} is in use\n"
    assert proc.stdout == ""


def test_a_cluster_without_a_broker_is_named(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(BIN / "mb"), "web", "--port", "0"],
        env={"PATH": "/usr/bin:/bin", "MB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("mb web: the cluster in ")
    assert "publishes no events" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_refusing_broker_is_a_banner_and_the_page_stays_up(
    tmp_path: Path, browser: Any
) -> None:
    from playwright.sync_api import expect

    with socket.socket() as closed:  # bound, never listening: connections refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        (tmp_path / "minibatch.toml").write_text(
            f'[mqtt]\nurl = "mqtt://127.0.0.1:{port}"\n'
        )
        web = Web(tmp_path, "--port", "0")
        try:
            page = browser.new_page()
            page.goto(web.url)
            banner = page.locator("#problem")
            expect(banner).to_contain_text(
                f"event broker mqtt://127.0.0.1:{port} unreachable",
                timeout=SHOWN_WITHIN,
            )
            assert "unreachable" in web.state()["problem"]
            err = web.stop()
            assert f"mqtt://127.0.0.1:{port} unreachable" in err
        finally:
            web.kill()
