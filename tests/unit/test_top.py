"""``mb top`` headless (textual's pilot), on a LiveCluster fed by hand: what the
panes show, and what each key asks the server (through an injected ``act``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from minibatch.core.job import Allocation
from minibatch.core.reservation import Reservation
from minibatch.errors import RemoteError
from minibatch.live.model import LiveCluster, LiveNode
from minibatch.protocol.messages import JobControl, JobList, Message, Refusal, SetPolicy
from minibatch.protocol.scheduling import GetSnapshot, SnapshotReply
from minibatch.top.app import SAID_FOR, TopApp
from minibatch.top.screens import TextScreen
from minibatch.top.widgets import NodeGrid, Timeline, job_style, sparkline
from tests.conftest import snapshot

pytestmark = pytest.mark.timeout(30)

NOW = 1_700_000_000.0
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
POLICIES = ["easy", "fifo", "maui"]


def job_event(
    job_id: str, event: str, state: str, at: float, **fields: Any
) -> tuple[str, dict[str, Any]]:
    payload = {"id": job_id, "event": event, "time": at, "name": f"job{job_id}",
               "user": "alice", "state": state, "ncpus": 1, "walltime": 600,
               "submit_time": NOW - 100, **fields}  # fmt: skip
    return f"jobs/{job_id}/{event}", payload


def cluster() -> LiveCluster:
    """Two 4-CPU nodes, job 7 running on node0 CPU 0, jobs 8-10 waiting."""
    model = LiveCluster()
    model.nodes = {
        name: LiveNode(name=name, state="free", cpus=[0, 1, 2, 3])
        for name in ("node0", "node1")
    }
    model.apply("sched/policy", {"name": "easy", "params": {}}, NOW)
    model.apply(
        *job_event("7", "started", "running", NOW - 60, start_time=NOW - 60,
                   alloc={"node0": [0]}),
        NOW,
    )  # fmt: skip
    for job_id in ("8", "9", "10"):
        model.apply(*job_event(job_id, "submitted", "queued", NOW - 50), NOW)
    model.apply(*job_event("11", "held", "held", NOW - 40), NOW)
    # The order, reasons and predicted starts are the policy's: a load brings
    # them; here they are set as one would.
    for rank, (job_id, reason, start) in enumerate(
        [
            ("10", "waiting for 4 CPUs (3 free); reserved", NOW + 300),
            ("8", "backfill window too short", NOW + 900),
            ("9", "waiting for 8 CPUs", None),
        ]
    ):
        job = model.jobs[job_id]
        job.rank, job.reason, job.predicted_start = rank, reason, start
    model.jobs["11"].reason = "held (user hold)"
    model.stale = False
    return model


class Recorder:
    """An ``act`` that records each request and answers like the server: with
    ``reply``, or by raising ``refuse`` (a refused request)."""

    def __init__(self, refuse: str = "") -> None:
        self.sent: list[Message] = []
        self.refuse = refuse
        self.reply: Any = JobList(jobs=[])

    def __call__(self, message: Message) -> Any:
        self.sent.append(message)
        if self.refuse:
            raise RemoteError(7, self.refuse)
        return self.reply


def make_app(act: Callable[[Message], Any] | None = None, **kw: Any) -> TopApp:
    return TopApp(cluster(), act or Recorder(), POLICIES, now=lambda: NOW, **kw)


async def until(pilot: Pilot[None], predicate: Callable[[], object]) -> None:
    """Let the app run until ``predicate()`` holds (redraws come on a timer)."""
    for _ in range(200):
        if predicate():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached within 4 s")


def cells(app: TopApp, node: str) -> list[tuple[str, Style]]:
    """``node``'s CPU cells as (text, style), from what the grid draws (the
    node's name and state are styled by name, its cells by Style)."""
    text = app.query_one(NodeGrid).render()
    line = next(li for li in text.split("\n") if li.plain.startswith(node))
    return [
        (line.plain[span.start : span.end].strip(), span.style)
        for span in line.spans
        if isinstance(span.style, Style)
    ]


def static_text(app: TopApp, selector: str) -> str:
    content = app.query_one(selector, Static).content
    return content.plain if isinstance(content, Text) else str(content)


def table_rows(app: TopApp, selector: str) -> list[list[str]]:
    table: DataTable[Any] = app.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_cells_show_jobs_and_change_hands_on_resize() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert [c for c, _ in cells(app, "node0")] == ["7", "·", "·", "·"]
        assert cells(app, "node0")[0][1] == job_style("7")
        # Job 7 grows onto CPUs 1 and 2 of node0 and CPU 0 of node1.
        app.model.apply(
            *job_event("7", "resized", "running", NOW - 10, start_time=NOW - 60,
                       alloc={"node0": [0, 1, 2], "node1": [0]}),
            NOW,
        )  # fmt: skip
        await until(pilot, lambda: cells(app, "node0")[1][0] == "7")
        assert [c for c, _ in cells(app, "node0")] == ["7", "7", "7", "·"]
        assert [s for _, s in cells(app, "node0")[:3]] == [job_style("7")] * 3
        assert cells(app, "node1")[0] == ("7", job_style("7"))
        await until(pilot, lambda: table_rows(app, "#running")[0][3] == "4")
        assert table_rows(app, "#running")[0][4] == "node0:0-2 node1:0"
        # It shrinks back: the cells it left are idle again.
        app.model.apply(
            *job_event("7", "resized", "running", NOW - 5, start_time=NOW - 60,
                       alloc={"node0": [2]}),
            NOW,
        )  # fmt: skip
        await until(pilot, lambda: cells(app, "node0")[0][0] == "·")
        assert [c for c, _ in cells(app, "node0")] == ["·", "·", "7", "·"]
        assert [c for c, _ in cells(app, "node1")] == ["·"] * 4


async def test_queue_in_priority_order_with_reasons_and_starts() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)):
        rows = table_rows(app, "#queue")
        assert [r[1] for r in rows] == ["10", "8", "9", "11"]
        assert [r[0] for r in rows] == ["1", "2", "3", ""]
        assert rows[0][7] == "waiting for 4 CPUs (3 free); reserved"
        assert rows[0][8] == "in 5 min"
        assert rows[1][8] == "in 15 min"
        assert rows[2][8] == "-"
        assert rows[3][6:8] == ["held", "held (user hold)"]
        running = table_rows(app, "#running")
        assert running[0][:5] == ["7", "job7", "alice", "1", "node0:0"]
        assert running[0][5].startswith("00:01:00/00:10:00 ")


async def test_pass_line_shows_policy_started_and_backfilled() -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert "no scheduling pass" in static_text(app, "#pass")
        app.model.apply(
            "sched/pass",
            {"time": NOW - 2, "policy": "easy", "duration_ms": 1.25, "pending": 3,
             "started": 2, "backfilled": 1, "reserved": 1},
            NOW,
        )  # fmt: skip
        await until(pilot, lambda: "backfilled" in static_text(app, "#pass"))
        line = static_text(app, "#pass")
        assert line.startswith("policy easy")
        for part in ("(2 s ago)", "2 started", "1 backfilled", "1 reserved",
                     "3 pending", "1.2 ms"):  # fmt: skip
            assert part in line, line
        app.model.apply("sched/policy", {"name": "maui", "params": {"x": 1}}, NOW)
        await until(pilot, lambda: "policy maui x=1" in static_text(app, "#pass"))


async def test_keys_hold_release_delete_the_selected_job() -> None:
    act = Recorder()
    app = make_app(act)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("down", "h")  # the queue's second job: 8
        await app.workers.wait_for_complete()
        assert act.sent == [JobControl(action="hold", selectors=["8"], each=True)]
        assert static_text(app, "#status") == "hold job 8: done"
        await pilot.press("down", "down", "r")
        await app.workers.wait_for_complete()
        assert act.sent[-1] == JobControl(action="release", selectors=["11"], each=True)
        # Delete asks first: n leaves the job alone, y cancels it.
        await pilot.press("tab", "d")
        await pilot.press("n")
        await app.workers.wait_for_complete()
        assert len(act.sent) == 2
        await pilot.press("d", "y")
        await app.workers.wait_for_complete()
        assert act.sent[-1] == JobControl(action="cancel", selectors=["7"], each=True)
        assert static_text(app, "#status") == "delete job 7: done"


async def test_policy_key_offers_the_installed_policies() -> None:
    act = Recorder()
    app = make_app(act)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        # The list opens on the policy in force (easy); one down is fifo.
        await pilot.press("down", "enter")
        await app.workers.wait_for_complete()
        assert act.sent == [SetPolicy(name="fifo")]
        assert "policy fifo: set" in static_text(app, "#status")
        await pilot.press("p", "escape")
        await app.workers.wait_for_complete()
        assert len(act.sent) == 1


async def test_a_refusal_is_shown_and_the_app_goes_on() -> None:
    act = Recorder(refuse="permission denied: job 8 belongs to alice")
    app = make_app(act)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("down", "h")
        await app.workers.wait_for_complete()
        assert static_text(app, "#status") == (
            "hold job 8: permission denied: job 8 belongs to alice"
        )
        await pilot.press("p", "enter")
        await app.workers.wait_for_complete()
        assert "policy easy: permission denied" in static_text(app, "#status")
        assert app.is_running
        # A per-id refusal (the server's reply to each=True) reads the same.
        act.refuse = ""
        act.reply = JobList(
            jobs=[], refused=[Refusal(selector="8", code=4, message="no job 8")]
        )
        await pilot.press("h")
        await app.workers.wait_for_complete()
        assert static_text(app, "#status") == "hold job 8: no job 8"
    assert len(act.sent) == 3


async def test_an_outcome_leaves_the_status_line_after_a_while() -> None:
    clock = [NOW]
    app = TopApp(cluster(), Recorder(), POLICIES, now=lambda: clock[0])
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("h")
        await app.workers.wait_for_complete()
        assert static_text(app, "#status") == "hold job 10: done"
        clock[0] += SAID_FOR + 1
        await until(pilot, lambda: "select a job" in static_text(app, "#status"))


async def test_no_job_selected_says_so_and_sends_nothing() -> None:
    act = Recorder()
    app = make_app(act)
    app.model.jobs.clear()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("h", "d")
        assert "no job selected" in static_text(app, "#status")
        assert act.sent == []


class StubFeed:
    """A feed whose broker is gone: only its ``problem`` matters here."""

    problem = "event broker mqtt://127.0.0.1:1 unreachable (refused); retrying in 5 s"

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_the_feed_problem_is_on_the_status_line() -> None:
    app = make_app(feed=StubFeed())
    async with app.run_test(size=(120, 40)):
        assert static_text(app, "#status") == StubFeed.problem


async def test_too_small_a_terminal_shows_a_message_and_sends_nothing() -> None:
    act = Recorder()
    app = make_app(act)
    async with app.run_test(size=(60, 20)) as pilot:
        message = app.query_one("#too-small", Static)
        assert message.display
        assert not app.query_one("#dashboard").display
        text = static_text(app, "#too-small")
        assert "60x20" in text and "at least 80x24" in text
        await pilot.press("h", "d", "p", "y", "enter")
        await app.workers.wait_for_complete()
        assert act.sent == []
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: app.query_one("#dashboard").display)
        assert not message.display
        await pilot.press("q")
    assert act.sent == []


async def test_reservations_on_the_time_line() -> None:
    app = make_app()
    app.model.apply(
        "reservations/maint/created",
        {"name": "maint", "event": "created", "time": NOW, "type": "System",
         "start": NOW + 1200, "end": NOW + 3000, "users": [], "owner": "root",
         "nodes": {"node1": [0, 1]}},
        NOW,
    )  # fmt: skip
    async with app.run_test(size=(120, 40)):
        timeline = app.query_one(Timeline)
        lines = timeline.render().plain.split("\n")
        assert all(len(line) == timeline.size.width for line in lines)
        assert lines[0].startswith("maint")
        assert "2 CPUs in 20 min" in lines[0]
        # An hour's span: the bar starts a third of the way and ends at 5/6.
        bar = lines[0].split(" ")[-1]
        assert bar.index("█") == len(bar) // 3
        assert lines[1].split() == ["now", "+15", "min", "+30", "min", "+45", "min"]


async def test_reservations_made_before_mb_top_started_are_loaded() -> None:
    """The feed loads them with the jobs: events tell only what changes."""
    app = make_app()
    held = Allocation(node="node0", cpus=[2, 3])
    old = Reservation(name="old", start=NOW - 60, end=NOW + 600, alloc=[held])
    app.model.load_reservations([old], at=NOW)
    async with app.run_test(size=(120, 40)):
        line = app.query_one(Timeline).render().plain.split("\n")[0]
        assert line.startswith("old") and "2 CPUs now" in line
        assert line.split(" ")[-1].startswith("█")  # under way: from now


def snapshot_reply() -> SnapshotReply:
    """One 4-CPU node, 2 CPUs busy for 10 min; job 2 (4 CPUs) waits first, job
    3 (2 CPUs, 100 s) behind it: EASY backfills 3 now, FIFO does not."""
    return SnapshotReply(
        snapshot=snapshot(
            nodes=[4], running=[(1, 2, NOW, 600.0)],
            pending=[(2, 4, 600.0), (3, 2, 100.0)], now=NOW,
        ),
        policy="easy",
        params={},
    )  # fmt: skip


async def test_what_if_shows_each_waiting_job_under_both_policies() -> None:
    act = Recorder()
    act.reply = snapshot_reply()
    app = make_app(act)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("w", "down", "enter")  # easy, then fifo
        await app.workers.wait_for_complete()
        await until(pilot, lambda: isinstance(app.screen, TextScreen))
        assert act.sent == [GetSnapshot(peek=True)]
        assert static_text(app, "#status") == "what if fifo: 2 waiting jobs simulated"
        text = str(app.screen.query_one(Static).content)
        assert text.startswith("easy (current) vs fifo: 2 waiting jobs")
        row = next(line.split() for line in text.splitlines() if line.startswith("3 "))
        assert row[3:5] == ["now", "in"]  # EASY starts it now, FIFO later
        await pilot.press("escape")
        assert not isinstance(app.screen, TextScreen)


def test_sparkline_spreads_samples_over_the_window() -> None:
    samples = [(NOW - 50, 0, 4), (NOW - 30, 2, 4), (NOW - 10, 4, 4)]
    assert sparkline(samples, NOW, 60, 6) == " ▁ ▅ █"
    assert sparkline([], NOW, 60, 3) == "   "


async def test_screenshot() -> None:
    """An SVG of the dashboard for the README (tests/artifacts/mb-top.svg)."""
    app = make_app()
    async with app.run_test(size=(120, 40)):
        ARTIFACTS.mkdir(exist_ok=True)
        saved = Path(app.save_screenshot("mb-top.svg", path=str(ARTIFACTS)))
    assert saved.read_text().startswith("<svg")
