"""The dialogs ``mb top`` opens over the dashboard: a yes/no question, a policy
to pick, a text to read (what if)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static

CSS = """
ModalScreen { align: center middle; }
.dialog { width: 64; height: auto; max-height: 80%; border: thick $accent;
          background: $surface; padding: 1 2; }
.dialog OptionList { height: auto; max-height: 16; }
.dialog.wide { width: 90%; }
"""


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question (y, or n/escape)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(f"{self.question}\n\n[b]y[/b] yes   [b]n[/b] no", classes="dialog")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PolicyScreen(ModalScreen[str | None]):
    """Pick a policy (enter), or escape; the list opens on ``current``."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, names: Sequence[str], current: str, prompt: str) -> None:
        super().__init__()
        self.names = list(names)
        self.current = current
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        shown = [f"{n} (current)" if n == self.current else n for n in self.names]
        with Vertical(classes="dialog"):
            yield Static(f"{self.prompt}\n(enter picks, escape cancels)")
            yield OptionList(*shown)

    def on_mount(self) -> None:
        if self.current in self.names:
            self.query_one(OptionList).highlighted = self.names.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.names[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen[None]):
    """A text to read, scrolled with the arrows; escape (or q) closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close"),
    ]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide") as box:
            box.border_title = self.title_text
            yield Static(self.text, markup=False)
            yield Static("\n[b]escape[/b] closes")

    def action_close(self) -> None:
        self.dismiss(None)
