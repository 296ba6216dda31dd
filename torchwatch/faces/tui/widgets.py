"""Thin widgets: each holds its slice of a snapshot in a reactive and draws it with :mod:`render`.

A reactive only redraws when its value changes, so an unchanged panel costs nothing per refresh.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Label, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from torchwatch.analysis.diagnosis import Analysis, Finding
from torchwatch.faces.tui import render, views
from torchwatch.faces.tui.snapshot import BurstView, Snapshot, StepsView

CellRow = tuple[str, Sequence[str | Text]]
_DIGITS = re.compile(r"\d")


def show_text(widget: Static, text: Text) -> None:
    """Update ``widget`` only when ``text`` changed, and without a layout pass when only digits
    changed (same words, same wrapping): a refresh a second stays cheap."""
    old = widget.content
    if isinstance(old, Text):
        if old == text:
            return
        if _DIGITS.sub("0", old.plain) == _DIGITS.sub("0", text.plain):
            widget.update(text, layout=False)
            return
    widget.update(text)


def fill_table(table: DataTable[str | Text], rows: Iterable[CellRow]) -> None:
    """Show ``rows`` in ``table``: cells updated in place when the rows are the same keys in the
    same order, else the rows replaced, the cursor kept on its row key when it is still there."""
    rows = list(rows)
    current = [row.key.value for row in table.ordered_rows]
    if current and current == [key for key, _ in rows]:
        columns = list(table.columns)
        for key, cells in rows:
            for column, value in zip(columns, cells, strict=True):
                old = table.get_cell(key, column)
                if old != value:
                    wider = len(str(value)) > len(str(old))  # grow the column, never cut a value
                    table.update_cell(key, column, value, update_width=wider)
        return
    keep = None
    if 0 <= table.cursor_row < table.row_count:
        keep = table.ordered_rows[table.cursor_row].key.value
    table.clear()
    keys = []
    for key, cells in rows:
        table.add_row(*cells, key=key)
        keys.append(key)
    if keep in keys:
        table.move_cursor(row=keys.index(keep), animate=False)


class Trend(Horizontal):
    """A label with the series' range and a sparkline of it (values oldest first, max per cell).

    The sparkline scales from the lowest to the highest value shown, so the label gives both.
    """

    data: reactive[tuple[float, ...]] = reactive(())

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="trend")
        self._label = label

    def compose(self) -> ComposeResult:
        """Label on the left, sparkline filling the rest."""
        yield Label(classes="trend-label")
        yield Sparkline([], classes="trend-line")

    def on_mount(self) -> None:
        """Draw the series set before the sparkline existed."""
        self.watch_data(self.data)

    def watch_data(self, data: tuple[float, ...]) -> None:
        """Hand the series to the sparkline, its range to the label (fewer than 2 points draw nothing)."""
        if not self.children:
            return
        enough = len(data) >= 2
        line = self.query_one(Sparkline)
        if line.display != enough:
            line.display = enough
        line.data = list(data) if enough else []
        label = self._label + (f"\n{render.series_range(data)}" if enough else "  (collecting)")
        show_text(self.query_one(Label), Text(label))


class VerdictPanel(Static):
    """Label, confidence, summary, vital numbers and the exit line."""

    snapshot: reactive[Snapshot | None] = reactive(None)

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        """Redraw, and colour the panel by label."""
        show_text(self, render.verdict_text(snap))
        label = snap.analysis.verdict.label if snap and snap.analysis else ""
        self.set_classes(label)


class FindingsList(OptionList):
    """The findings, most important first; enter opens the evidence behind one."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select", "Evidence")]
    analysis: reactive[Analysis | None] = reactive(None)

    def watch_analysis(self, analysis: Analysis | None) -> None:
        """Rebuild the options, keeping the highlighted finding."""
        keep = self.highlighted
        self.clear_options()
        findings = analysis.findings if analysis else []
        if not findings:
            self.add_option(Option(Text(render.exit_or_starting(analysis), style="dim"), disabled=True))
            return
        summary = analysis.verdict.summary if analysis else None
        self.add_options(Option(render.finding_text(f, summary), id=f.rule) for f in findings)
        self.highlighted = keep if keep is not None and keep < len(findings) else 0

    def finding(self, rule: str | None) -> Finding | None:
        """The finding of rule id ``rule`` in the current analysis."""
        for f in self.analysis.findings if self.analysis else []:
            if f.rule == rule:
                return f
        return None


class GpuCardView(Vertical):
    """One GPU: its numbers and its utilization, GPM SM activity (when read) and memory trends."""

    card: reactive[views.GpuCard | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw a card set before the children existed."""
        self.watch_card(self.card)

    def compose(self) -> ComposeResult:
        """Numbers, then the util, SM activity and memory sparklines."""
        yield Static(classes="gpu-text")
        yield Trend("util %")
        yield Trend("SM active %")
        yield Trend("memory")

    def watch_card(self, card: views.GpuCard | None) -> None:
        """Redraw the numbers and the trends."""
        if card is None or not self.children:
            return
        show_text(self.query_one(".gpu-text", Static), render.gpu_card_text(card))
        util, sm, mem = self.query(Trend)
        util.data, sm.data, mem.data = card.util_series, card.sm_series, card.mem_series
        sm.display = bool(card.sm_series)  # no GPM: the text line says why, no empty trend


class GpuPanel(VerticalScroll):
    """A card per GPU, or why there is none (``n/a: NVML library not found ...``)."""

    def compose(self) -> ComposeResult:
        """The note; cards are mounted as GPUs appear."""
        yield Static(id="gpu-note")

    def show(self, cards: Sequence[views.GpuCard], note: str | None) -> None:
        """Mount a card per GPU index (once), update them, or show the note."""
        show_text(self.query_one("#gpu-note", Static), Text(note or "", style="dim"))
        self.query_one("#gpu-note").display = bool(note)
        views_now = list(self.query(GpuCardView))
        if [v.id for v in views_now] != [f"gpu-{c.index}" for c in cards]:
            for v in views_now:
                v.remove()
            views_now = [GpuCardView(id=f"gpu-{c.index}", classes="gpu-card") for c in cards]
            if views_now:
                self.mount(*views_now)
        for view, card in zip(views_now, cards, strict=True):
            view.card = card


class ProcessTable(DataTable[str | Text]):
    """Main process, DataLoader workers and the rest of the tree; ``s`` cycles the sort."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("s", "cycle_sort", "Sort")]
    processes: reactive[tuple[views.ProcessRow, ...]] = reactive(())
    sort_key: reactive[str] = reactive("cpu")
    HEADERS: ClassVar[dict[str, str]] = {"pid": "PID", "cpu": "CPU %", "rss": "RSS", "read": "read MB/s"}

    def on_mount(self) -> None:
        """Columns, row cursor."""
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in (
            ("pid", "PID"),
            ("role", "role"),
            ("cpu", "CPU %"),
            ("rss", "RSS"),
            ("read", "read MB/s"),
            ("threads", "threads"),
            ("name", "name"),
        ):
            self.add_column(label, key=key)
        self._draw()

    def action_cycle_sort(self) -> None:
        """Sort by the next of CPU, RSS, reads, PID."""
        keys = views.SORT_KEYS
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """A click on a sortable header sorts by it."""
        key = event.column_key.value
        if key in views.SORT_KEYS:
            self.sort_key = key

    def watch_processes(self) -> None:
        """Redraw on new readings."""
        self._draw()

    def watch_sort_key(self) -> None:
        """Redraw in the new order, the sorted column marked."""
        self._draw()

    def _draw(self) -> None:
        if not self.columns:
            return
        for key, label in self.HEADERS.items():
            self.columns[key].label = Text(label + (" ▼" if key == self.sort_key else ""))  # type: ignore[index]
        fill_table(
            self,
            (
                (
                    str(r.pid),
                    (
                        str(r.pid),
                        r.role,
                        Text(views.fmt_pct(r.cpu_pct), justify="right"),
                        Text(views.fmt_bytes(r.rss_bytes), justify="right"),
                        Text(views.fmt_rate(r.read_bytes_per_s), justify="right"),
                        r.threads,
                        r.name,
                    ),
                )
                for r in views.sort_rows(self.processes, self.sort_key)
            ),
        )


class StackTable(DataTable[str | Text]):
    """Hottest frames of the loop and the workers; enter shows the whole stack."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Stack")]
    stack_rows: reactive[tuple[views.StackRow, ...]] = reactive(())

    def on_mount(self) -> None:
        """Columns, row cursor."""
        self.cursor_type = "row"
        self.zebra_stripes = True
        for label in ("share", "thread", "category", "function", "where", "samples"):
            self.add_column(label, key=label)
        self.watch_stack_rows()

    def watch_stack_rows(self) -> None:
        """Redraw on new samples."""
        if not self.columns:
            return
        fill_table(
            self,
            (
                (
                    row_key(r),
                    (
                        Text(views.fmt_share(r.share), justify="right"),
                        r.who,
                        r.category,
                        views.ellipsize(r.function, 28),
                        views.ellipsize(r.location, 20),
                        Text(str(r.samples), justify="right"),
                    ),
                )
                for r in self.stack_rows
            ),
        )

    def row(self, key: str | None) -> views.StackRow | None:
        """The stack row with this key."""
        return next((r for r in self.stack_rows if row_key(r) == key), None)


def row_key(r: views.StackRow) -> str:
    """A stable key of a stack row across refreshes."""
    return f"{r.who}|{r.category}|{r.function}|{r.location}"


class StepsPanel(VerticalScroll):
    """Steps/s, step time, data wait and the DataLoader settings (needs the hook)."""

    steps: reactive[StepsView | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw what was set before the children existed."""
        self.watch_steps(self.steps)

    def compose(self) -> ComposeResult:
        """Numbers, then the steps/s and data-wait trends."""
        yield Static(id="steps-text")
        yield Trend("steps/s", id="steps-rate")
        yield Trend("data wait %", id="steps-wait")

    def watch_steps(self, steps: StepsView | None) -> None:
        """Redraw numbers and trends."""
        if steps is None or not self.children:
            return
        show_text(self.query_one("#steps-text", Static), render.steps_text(steps))
        self.query_one("#steps-rate", Trend).data = steps.steps_series
        self.query_one("#steps-wait", Trend).data = steps.wait_series


class BreakdownBar(Widget):
    """The burst's step-time breakdown as one coloured bar the width of the panel, and its legend."""

    shares: reactive[tuple[tuple[str, float], ...]] = reactive(())

    def render(self) -> Text:
        """Bar and legend sized to the widget's width."""
        return render.breakdown_bar(self.shares, max(10, self.size.width))


class BurstPanel(VerticalScroll):
    """Profiler bursts: whether ``b`` works, the breakdown bar, top operators and kernels, the trace."""

    burst: reactive[BurstView | None] = reactive(None)

    def compose(self) -> ComposeResult:
        """Headline, bar, two tables."""
        yield Static(id="burst-text")
        yield BreakdownBar(id="burst-bar")
        yield Label("top operators (CPU self time)", classes="table-title")
        yield DataTable(id="burst-ops", show_cursor=False, zebra_stripes=True)
        yield Label("top kernels (GPU time)", classes="table-title")
        yield DataTable(id="burst-kernels", show_cursor=False, zebra_stripes=True)

    def on_mount(self) -> None:
        """Table columns; draw what was set before the children existed."""
        self.query_one("#burst-ops", DataTable).add_columns("operator", "self ms", "calls")
        self.query_one("#burst-kernels", DataTable).add_columns("kernel", "total ms", "calls")
        self.watch_burst(self.burst)

    def watch_burst(self, burst: BurstView | None) -> None:
        """Redraw from the last burst (tables and bar hidden until there is one)."""
        if burst is None or not self.children:
            return
        show_text(self.query_one("#burst-text", Static), render.burst_text(burst))
        last = burst.last
        for widget in self.query(".table-title, DataTable, BreakdownBar"):
            widget.display = last is not None
        if last is None:
            return
        self.query_one(BreakdownBar).shares = last.breakdown
        for table_id, rows in (("#burst-ops", last.top_ops), ("#burst-kernels", last.top_kernels)):
            table: DataTable[str | Text] = self.query_one(table_id, DataTable)
            table.clear()
            for name, ms, calls in rows:
                table.add_row(
                    name,
                    Text("n/a" if ms is None else f"{ms:.2f}", justify="right"),
                    Text("n/a" if calls is None else str(calls), justify="right"),
                )


class MemoryPanel(VerticalScroll):
    """Host RSS of the tree and device memory, with their trends."""

    snapshot: reactive[tuple[views.MemoryTrend, tuple[tuple[str, float | None], ...]] | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw what was set before the children existed."""
        self.watch_snapshot(self.snapshot)

    def compose(self) -> ComposeResult:
        """Host numbers and trend, device numbers and trend."""
        yield Static(id="memory-host")
        yield Trend("RSS", id="memory-rss")
        yield Static(id="memory-device")
        yield Trend("device", id="memory-dev")

    def watch_snapshot(self, value: tuple[views.MemoryTrend, tuple[tuple[str, float | None], ...]] | None) -> None:
        """Redraw numbers and trends."""
        if value is None or not self.children:
            return
        memory, allocator = value
        show_text(self.query_one("#memory-host", Static), render.memory_text(memory))
        self.query_one("#memory-rss", Trend).data = memory.rss_series
        show_text(self.query_one("#memory-device", Static), render.device_memory_text(memory, dict(allocator)))
        self.query_one("#memory-dev", Trend).data = memory.device_series
