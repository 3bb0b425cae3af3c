"""The ``mb top`` application: panes over a :class:`LiveCluster`, keys that act
with the caller's own rights.

The feed runs as a worker in textual's loop and only marks the view dirty; a
timer redraws at most four times a second, and only when the model moved, so a
burst of events costs one redraw. Time passes on its own too: once a second the
utilization is sampled and the elapsed times move.

A request a key sends (hold, release, delete, a policy, what if) runs in a
thread, so a server that is slow to answer (or a simulation) never freezes the
screen; its answer, a refusal included, goes on the status line. A terminal smaller than
:data:`MIN_WIDTH` x :data:`MIN_HEIGHT` shows a message in place of the
dashboard, and every key but ``q`` rests until it grows: the feed goes on, and
nothing is sent, so the cluster never notices.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Static

from minibatch.errors import MinibatchError
from minibatch.live.model import LiveCluster, LiveJob
from minibatch.protocol.messages import JobControl, JobList, Message, SetPolicy
from minibatch.protocol.scheduling import GetSnapshot
from minibatch.top import screens
from minibatch.top.screens import ConfirmScreen, PolicyScreen, TextScreen
from minibatch.top.widgets import (
    NodeGrid,
    Timeline,
    Utilization,
    pass_text,
    queue_row,
    running_row,
)

if TYPE_CHECKING:
    from minibatch.config import Config, Paths
    from minibatch.live.feed import Feed
    from minibatch.sim.whatif import WhatIf

MIN_WIDTH, MIN_HEIGHT = 80, 24
#: Waiting jobs listed at most: a deep queue's tail says nothing at a glance,
#: and rebuilding thousands of rows at every redraw would.
MAX_QUEUE_ROWS = 200
QUEUE_COLUMNS = ("#", "job", "name", "user", "cpus", "walltime", "state",
                 "reason", "start")  # fmt: skip
RUNNING_COLUMNS = ("job", "name", "user", "cpus", "where", "elapsed/walltime")
#: Seconds a key's outcome stays on the status line: long enough to read, not
#: so long that it reads as the state of things later.
SAID_FOR = 20.0
Act = Callable[[Message], Any]

CSS = """
#pass { height: 1; padding: 0 1; }
#status { height: 1; padding: 0 1; }
#top-row { height: auto; max-height: 45%; }
.pane { border: round $primary; border-title-color: $text; height: auto; }
#nodes-pane { width: 1fr; max-height: 100%; overflow-y: auto; }
#util-pane { width: 48; }
#queue, #running { height: 1fr; min-height: 4; }
#resv-pane { max-height: 8; overflow-y: auto; }
#too-small { display: none; width: 100%; height: 100%; content-align: center middle;
             text-align: center; text-style: bold; }
TopApp.too-small #too-small { display: block; }
TopApp.too-small #dashboard, TopApp.too-small Footer { display: none; }
"""


class TopApp(App[None]):
    """The dashboard.

    Args:
        model: What to show; ``feed`` keeps it current (none in tests, which
            feed the model themselves).
        act: Sends one request to the server and returns its reply (raises
            :class:`MinibatchError` for a refusal); called in a thread.
        policies: The names the policy and what-if keys offer.
        modules: The configuration's ``[scheduler.policy_modules]`` (what if
            simulates in this process, and may need them).
        feed: Run as a worker while the app runs; its ``problem`` is shown.
        now: The clock (tests pass a fixed one).
    """

    TITLE = "mb top"
    CSS = CSS + screens.CSS
    # Its commands (themes, screenshots) are not the dashboard's: one less
    # thing a key can open by surprise.
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "policy", "Policy"),
        Binding("h", "hold", "Hold"),
        Binding("r", "release", "Release"),
        Binding("d", "delete", "Delete"),
        Binding("w", "what_if", "What if"),
    ]

    def __init__(
        self,
        model: LiveCluster,
        act: Act,
        policies: Sequence[str],
        modules: Mapping[str, str] | None = None,
        feed: Feed | None = None,
        now: Callable[[], float] = time.time,
        until: Callable[[], bool] = lambda: False,
    ) -> None:
        """``until``: when it says so (checked each second), the app ends by
        itself, as after ``q`` (``mb demo --top`` when its workload is done)."""
        super().__init__()
        self.model = model
        self.until = until
        self.act = act
        self.policies = list(policies)
        self.modules = dict(modules or {})
        self.feed = feed
        self.now = now
        #: The last request's outcome, whether it was refused, and when.
        self.said: tuple[str, bool, float] = ("", False, 0.0)
        self._dirty = True
        self._drawn = -1
        self._rows: dict[str, list[tuple[str, Sequence[str | Text]]]] = {}

    # ------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        with Vertical(id="dashboard"):
            yield Static(id="pass")
            with Horizontal(id="top-row"):
                with Vertical(id="nodes-pane", classes="pane"):
                    yield NodeGrid(self.model)
                with Vertical(id="util-pane", classes="pane"):
                    yield Utilization(self.model, self.now)
            yield self._table("queue", QUEUE_COLUMNS)
            yield self._table("running", RUNNING_COLUMNS)
            with Vertical(id="resv-pane", classes="pane"):
                yield Timeline(self.model, self.now)
            yield Static(id="status")
        yield Static(id="too-small")
        yield Footer()

    @staticmethod
    def _table(name: str, columns: Sequence[str]) -> DataTable[str | Text]:
        table: DataTable[str | Text] = DataTable(
            id=name, classes="pane", cursor_type="row", zebra_stripes=True
        )
        table.add_columns(*columns)
        return table

    def on_mount(self) -> None:
        self.query_one("#nodes-pane").border_title = "Nodes (CPU cells by job)"
        self.query_one("#util-pane").border_title = "Utilization"
        self.query_one("#resv-pane").border_title = "Reservations"
        self.query_one("#queue", DataTable).focus()
        self._fit(self.size.width, self.size.height)
        if self.feed is not None:
            self.run_worker(self.feed.run(), name="feed", group="feed")
        self.set_interval(0.25, self._maybe_redraw)
        self.set_interval(1.0, self._tick)
        self._tick()

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        if small:
            # A dialog left open would stay usable over the message: close it
            # unanswered (nothing is sent).
            while len(self.screen_stack) > 1:
                self.pop_screen()
            self.query_one("#too-small", Static).update(
                f"This terminal is {width}x{height}: mb top needs at least "
                f"{MIN_WIDTH}x{MIN_HEIGHT}.\nEnlarge it, or press q to quit."
            )
        self.set_class(small, "too-small")
        self.refresh_bindings()

    @property
    def too_small(self) -> bool:
        return self.has_class("too-small")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action == "quit" or not self.too_small

    # ------------------------------------------------------------ drawing

    def changed(self) -> None:
        """The feed's ``on_change``: something moved; redraw at the next tick."""
        self._dirty = True

    def _maybe_redraw(self) -> None:
        if self._dirty or self.model.version != self._drawn:
            self.redraw()

    def _tick(self) -> None:
        if self.until():
            self.exit()
            return
        self.model.sample(self.now())
        self.redraw()

    def redraw(self) -> None:
        """Draw every pane from the model as it is now."""
        self._dirty, self._drawn = False, self.model.version
        now = self.now()
        self.query_one("#pass", Static).update(pass_text(self.model, now))
        for widget in (NodeGrid, Utilization, Timeline):
            self.query_one(widget).refresh(layout=True)
        waiting = self.model.queue()
        more = len(waiting) - MAX_QUEUE_ROWS
        queue = self.query_one("#queue", DataTable)
        queue.border_title = f"Queue: {len(waiting)} waiting, in priority order" + (
            f" (the first {MAX_QUEUE_ROWS} shown)" if more > 0 else ""
        )
        self._fill(queue, [(j.id, queue_row(j, now)) for j in waiting[:MAX_QUEUE_ROWS]])
        running = self.model.running()
        table = self.query_one("#running", DataTable)
        table.border_title = f"Running: {len(running)}"
        self._fill(table, [(j.id, running_row(j, now)) for j in running])
        self.query_one("#status", Static).update(self._status_text())

    def _fill(
        self, table: DataTable[str | Text], rows: list[tuple[str, Sequence[str | Text]]]
    ) -> None:
        """Show ``rows`` (key, cells), the cursor staying on its job."""
        name = table.id or ""
        if self._rows.get(name) == rows:
            return
        self._rows[name] = rows
        selected = self._key_at_cursor(table)
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        keys = [key for key, _ in rows]
        if selected in keys:
            table.move_cursor(row=keys.index(selected), animate=False)

    @staticmethod
    def _key_at_cursor(table: DataTable[str | Text]) -> str | None:
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def _status_text(self) -> Text:
        problem = self.feed.problem if self.feed is not None else ""
        if problem:
            return Text(problem, style="bold red")
        text, refused, when = self.said
        if text and self.now() - when < SAID_FOR:
            return Text(text, style="bold red" if refused else "bold")
        nodes = len(self.model.nodes)
        return Text(
            f"{nodes} node{'s' if nodes != 1 else ''}; select a job with "
            "the arrows (tab: queue/running), then h, r or d",
            style="grey50",
        )

    def say(self, text: str, refused: bool = False) -> None:
        """Put an outcome on the status line."""
        self.said = (text, refused, self.now())
        self.query_one("#status", Static).update(self._status_text())

    # ------------------------------------------------------------ actions

    def selected(self) -> LiveJob | None:
        """The job under the cursor of the focused table."""
        table = self.focused
        if not isinstance(table, DataTable):
            return None
        key = self._key_at_cursor(table)
        return self.model.jobs.get(key) if key is not None else None

    def _selected_or_say(self) -> LiveJob | None:
        job = self.selected()
        if job is None:
            self.say("no job selected (tab moves between the queue and running jobs)")
        return job

    def action_hold(self) -> None:
        self._control("hold")

    def action_release(self) -> None:
        self._control("release")

    def action_delete(self) -> None:
        job = self._selected_or_say()
        if job is None:
            return
        question = f"Delete job {job.id} ({job.name}, {job.user}, {job.state})?"

        def answered(yes: bool | None) -> None:
            if yes:
                self._send(
                    JobControl(action="cancel", selectors=[job.id], each=True),
                    f"delete job {job.id}",
                )

        self.push_screen(ConfirmScreen(question), answered)

    def _control(self, action: str) -> None:
        job = self._selected_or_say()
        if job is not None:
            self._send(
                JobControl(action=action, selectors=[job.id], each=True),
                f"{action} job {job.id}",
            )

    def action_policy(self) -> None:
        def picked(name: str | None) -> None:
            if name:
                self._send(SetPolicy(name=name), f"policy {name}")

        self.push_screen(
            PolicyScreen(self.policies, self.model.policy, "Switch the policy to"),
            picked,
        )

    def action_what_if(self) -> None:
        def picked(name: str | None) -> None:
            if name:
                self.run_worker(self._what_if(name), group="requests")

        prompt = "What if: simulate the queue as it is now under"
        self.push_screen(PolicyScreen(self.policies, "", prompt), picked)

    async def _what_if(self, name: str) -> None:
        from minibatch.cli.whatif import render

        what = f"what if {name}"
        self.say(f"{what}: simulating the queue...")
        try:
            result = await asyncio.to_thread(self._simulate, name)
        except MinibatchError as exc:
            self.say(f"{what}: {exc or type(exc).__name__}", refused=True)
            return
        except Exception as exc:  # noqa: BLE001
            # A policy's own bug, met in this process: said, not fatal to the
            # dashboard (the scheduler would have refused that policy too).
            self.say(f"{what}: the simulation failed: {exc!r}", refused=True)
            return
        self.say(f"{what}: {len(result.rows)} waiting jobs simulated")
        if not self.too_small:
            self.push_screen(TextScreen(f"What if {name}?", render(result)))

    def _simulate(self, name: str) -> WhatIf:
        """The snapshot any user may take (nothing changes), simulated under
        the policy in force and under ``name``, as ``mb whatif`` does."""
        from minibatch.sim.whatif import whatif

        reply = self.act(GetSnapshot(peek=True))
        return whatif(
            reply.snapshot, name, {}, reply.policy, reply.params, modules=self.modules
        )

    def _send(self, message: Message, what: str) -> None:
        self.say(f"{what}: asking the server...")
        self.run_worker(self._request(message, what), group="requests")

    async def _request(self, message: Message, what: str) -> None:
        try:
            reply = await asyncio.to_thread(self.act, message)
        except MinibatchError as exc:
            self.say(f"{what}: {exc or type(exc).__name__}", refused=True)
            return
        if isinstance(reply, JobList) and reply.refused:
            self.say(f"{what}: {reply.refused[0].message}", refused=True)
        elif isinstance(message, SetPolicy):
            self.say(f"{what}: set; the scheduler plans with it from its next pass")
        else:
            self.say(f"{what}: done")


def run_top(
    paths: Paths, config: Config, until: Callable[[], bool] = lambda: False
) -> None:
    """Follow the cluster of ``paths`` in this terminal until ``q`` (or until
    ``until()`` says so).

    Raises:
        NoEvents: The cluster publishes no events to follow.
    """
    from minibatch.live.feed import Feed
    from minibatch.net.client import Client
    from minibatch.policy.registry import available

    model = LiveCluster()
    feed = Feed(paths, config, model)

    def act(message: Message) -> Any:
        # The server knows the caller by the socket's peer credentials: this
        # process's user, so a key can do no more than qdel could.
        with Client(feed.endpoint) as client:
            return client.call(message)

    modules = config.scheduler.policy_modules
    app = TopApp(
        model,
        act,
        available(modules),
        modules=modules,
        feed=feed,
        until=until,
    )
    feed.on_change = app.changed
    app.run()
