"""Screens pushed over the main view: a finding's evidence, a stack, the key list, the quit question."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Label, Static

from torchwatch.faces.tui import render, views
from torchwatch.faces.tui.widgets import StackTable
from torchwatch.model.findings import Finding
from torchwatch.model.observation import Observation, StackRow
from torchwatch.model.units import fmt_share


class EvidenceScreen(Screen[None]):
    """The readings and stack samples behind one finding, kept live while open.

    Args:
        rule: the finding's rule id.
        observation: the Observation the finding was chosen in.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Back"),
        Binding("backspace", "dismiss", "Back", show=False),
    ]
    observation: reactive[Observation | None] = reactive(None)

    def __init__(self, rule: str, observation: Observation) -> None:
        super().__init__()
        self.rule = rule
        self._initial = observation
        self._finding: Finding | None = None

    def compose(self) -> ComposeResult:
        """Finding, evidence table, fixes, thread states, the stacks behind it, one stack's frames."""
        with VerticalScroll(id="evidence"):
            yield Static(id="ev-head")
            yield Static(id="ev-table")
            yield Static(id="ev-fixes")
            yield Static(id="ev-states")
            yield Label(id="ev-stacks-title", classes="table-title")
            yield StackTable(id="ev-stacks")
            yield Static(id="ev-frames")
        yield Footer()

    def on_mount(self) -> None:
        """Draw the Observation the finding was chosen in, from the top (tab reaches the stack table)."""
        box = self.query_one("#evidence")
        box.border_title = f"evidence · {self.rule}"
        self.observation = self._initial
        box.focus()

    def watch_observation(self, obs: Observation | None) -> None:
        """Redraw from a new Observation; a finding that stopped firing stays, marked so."""
        if obs is None or not self.query("#ev-head"):
            return
        found = next((f for f in obs.findings if f.rule == self.rule), None)
        self._finding = found or self._finding
        finding = self._finding
        if finding is None:
            return
        head = render.finding_header(finding)
        if found is None:
            head.append("\n(no longer firing: showing its last evidence)", style="bold yellow")
        self.query_one("#ev-head", Static).update(head)
        rank = obs.focus
        self.query_one("#ev-table", Static).update(render.evidence_table(finding, obs))
        self.query_one("#ev-fixes", Static).update(render.fixes_text(finding))
        states = render.states_text("loop thread (/proc, 10 Hz)", rank.main_states)
        states.append("\n").append_text(render.states_text("workers' main threads", rank.worker_states))
        states.append("\n").append_text(render.readings_text(obs, finding.evidence))
        self.query_one("#ev-states", Static).update(states)
        rows = views.rows_behind(rank.stacks, list(finding.evidence))
        phases = views.phases_for(finding.evidence)
        where = "all phases" if phases is None else "phases " + ", ".join(sorted(phases))
        self.query_one("#ev-stacks-title", Label).update(
            f"stack samples behind it (py-spy, last {obs.window_s:g} s, {where}); tab, then arrows: a stack"
        )
        self.query_one(StackTable).stack_rows = tuple(rows)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Show the highlighted row's whole stack under the table."""
        row = self.query_one(StackTable).row(event.row_key.value)
        frames = self.query_one("#ev-frames", Static)
        frames.update(render.frames_text(row.frames) if row else "")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a row: the frames are already shown; keep the event from the app."""
        event.stop()

    async def action_dismiss(self, result: None = None) -> None:
        """Back to the main view."""
        self.dismiss(result)


class StackScreen(ModalScreen[None]):
    """One stack row's frames, innermost first."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("enter", "close", "Close", show=False),
    ]

    def __init__(self, row: StackRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        """Headline and frames in a box."""
        r = self.row
        with VerticalScroll(id="stack-box", classes="dialog"):
            yield Static(
                Text.assemble(
                    (f"{r.who} thread · {r.category} · ", "bold"),
                    f"{fmt_share(r.share)} of its samples ({r.samples})\n",
                )
            )
            yield Static(render.frames_text(r.frames))
        yield Footer()

    def action_close(self) -> None:
        """Back."""
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key binding, with what it does.

    Args:
        rows: ``(keys, what it does)`` pairs.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False, key_display="?"),
    ]

    def __init__(self, rows: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        """A two-column table of keys (descriptions wrap)."""
        with VerticalScroll(id="help-box", classes="dialog"):
            yield Static(render.help_table(self.rows), id="help-table")
        yield Footer()

    def on_mount(self) -> None:
        """Title the box."""
        self.query_one("#help-box").border_title = "keys · escape closes"

    def action_close(self) -> None:
        """Back."""
        self.dismiss(None)


class QuitScreen(ModalScreen[str | None]):
    """Asks, in ``run`` mode, whether quitting also stops the training.

    Dismissed with ``"stop"`` (stop the training, then quit), ``"leave"`` (quit, the training
    keeps running in the background) or ``None`` (cancel).
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "choose('stop')", "Stop training and quit"),
        Binding("n", "choose('leave')", "Quit, leave it running"),
        Binding("escape", "choose(None)", "Cancel"),
    ]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def compose(self) -> ComposeResult:
        """The question and three buttons."""
        with Vertical(id="quit-box", classes="dialog"):
            yield Static(
                Text.assemble(
                    ("Quit torchwatch. ", "bold"),
                    f"The training (PID {self.pid}) is still running.\n",
                    ("y", "bold"),
                    ": stop the training, then quit   ",
                    ("n", "bold"),
                    ": quit and leave it running   ",
                    ("esc", "bold"),
                    ": stay",
                )
            )
            with Horizontal(id="quit-buttons"):
                yield Button("Stop training (y)", id="stop", variant="error")
                yield Button("Leave it running (n)", id="leave")
                yield Button("Stay (esc)", id="cancel")

    def on_mount(self) -> None:
        """Enter stops the training (the usual expectation of ``run``)."""
        self.query_one("#stop", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """A button is the same as its key."""
        self.action_choose({"stop": "stop", "leave": "leave"}.get(event.button.id or ""))

    def action_choose(self, choice: str | None) -> None:
        """Close with the choice."""
        self.dismiss(choice)
