"""Thin widgets: each holds its slice of an Observation in a reactive and draws it with :mod:`render`.

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
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Label, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from torchwatch.faces.tui import render, views
from torchwatch.model.findings import Finding
from torchwatch.model.observation import BurstView, GpuRow, Observation, ProcessRow, RankView, StackRow, Straggler
from torchwatch.model.units import fmt_bytes, fmt_mib_per_s, fmt_pct, fmt_share, series_range

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


def _plain(value: str | Text) -> Text:
    """A cell as plain text: DataTable reads a ``str`` cell as console markup, and a process
    named ``[/x]`` (the target's own text) would end the app with a MarkupError."""
    # as DataTable makes a str cell of a one-line row, less the markup
    return value if isinstance(value, Text) else Text(value, end="", no_wrap=True)


def fill_table(table: DataTable[str | Text], rows: Iterable[CellRow]) -> None:
    """Show ``rows`` in ``table``: cells updated in place when the rows are the same keys in the
    same order, else the rows replaced, the cursor kept on its row key when it is still there.
    ``str`` cells are shown as they are, never read as markup."""
    rows = [(key, [_plain(v) for v in cells]) for key, cells in rows]
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

    def __init__(self, label: str, *, unit: str = "", id: str | None = None) -> None:
        super().__init__(id=id, classes="trend")
        self._label = label
        self._unit = unit

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
        label = self._label + (f"\n{series_range(data, self._unit)}" if enough else "  (collecting)")
        show_text(self.query_one(Label), Text(label))


class VerdictPanel(Static):
    """Label, confidence, summary, vital numbers and the exit line."""

    observation: reactive[Observation | None] = reactive(None)

    def watch_observation(self, obs: Observation | None) -> None:
        """Redraw, and colour the panel by label."""
        show_text(self, render.verdict_text(obs))
        label = obs.verdict.label if obs and obs.verdict else ""
        self.set_classes(label)


class FindingsList(OptionList):
    """The findings, most important first; enter opens the evidence behind one."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select", "Evidence")]
    observation: reactive[Observation | None] = reactive(None)

    def watch_observation(self, obs: Observation | None) -> None:
        """Rebuild the options, keeping the highlighted finding."""
        keep = self.highlighted
        self.clear_options()
        findings = obs.findings if obs else ()
        if obs is None or not findings:
            self.add_option(Option(Text(render.exit_or_starting(obs), style="dim"), disabled=True))
            return
        summary = obs.verdict.summary if obs.verdict else None
        self.add_options(Option(render.finding_text(f, obs.catalogue, summary), id=f.rule) for f in findings)
        self.highlighted = keep if keep is not None and keep < len(findings) else 0

    def finding(self, rule: str | None) -> Finding | None:
        """The finding of rule id ``rule`` in the current observation."""
        for f in self.observation.findings if self.observation else ():
            if f.rule == rule:
                return f
        return None


class GpuCardView(Vertical):
    """One GPU: its numbers and its utilization, GPM SM activity (when read) and memory trends."""

    card: reactive[GpuRow | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw a card set before the children existed."""
        self.watch_card(self.card)

    def compose(self) -> ComposeResult:
        """Numbers, then the util, SM activity and memory sparklines."""
        yield Static(classes="gpu-text")
        yield Trend("util %")
        yield Trend("SM active %")
        yield Trend("memory", unit="bytes")

    def watch_card(self, card: GpuRow | None) -> None:
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

    def show(self, cards: Sequence[GpuRow], note: str | None) -> None:
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
    processes: reactive[tuple[ProcessRow, ...]] = reactive(())
    sort_key: reactive[str] = reactive("cpu")
    HEADERS: ClassVar[dict[str, str]] = {"pid": "PID", "cpu": "CPU %", "rss": "RSS", "read": "read MiB/s"}

    def on_mount(self) -> None:
        """Columns, row cursor."""
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in (
            ("pid", "PID"),
            ("role", "role"),
            ("cpu", "CPU %"),
            ("rss", "RSS"),
            ("read", "read MiB/s"),
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
                        Text(fmt_pct(r.cpu_pct), justify="right"),
                        Text(fmt_bytes(r.rss_bytes), justify="right"),
                        Text(fmt_mib_per_s(r.read_bytes_per_s), justify="right"),
                        r.threads,
                        r.name,
                    ),
                )
                for r in views.sort_rows(self.processes, self.sort_key)
            ),
        )


class RanksTable(DataTable[str | Text]):
    """The ranks of the job side by side, the straggler highlighted; ``enter`` shows the rank under
    the cursor in the other panels (its stacks, steps, burst), ``a`` goes back to the straggler."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "choose", "Show rank"),
        Binding("a", "auto", "Straggler"),
    ]
    observation: reactive[Observation | None] = reactive(None)

    class Chosen(Message):
        """The user chose the rank the panels show (``None``: the straggler, or the lowest rank)."""

        def __init__(self, rank: int | None) -> None:
            super().__init__()
            self.rank = rank

    def on_mount(self) -> None:
        """Columns, row cursor."""
        self.cursor_type = "row"
        for label in ("rank", "PID", "step ms", "data wait ms", "compute ms", "collective wait ms", "CPU %", "label"):
            self.add_column(label, key=label)

    def watch_observation(self) -> None:
        """Redraw on a new Observation."""
        obs = self.observation
        if obs is None or not self.columns:
            return
        fill_table(self, (rank_row(obs.ranks[r], obs.focus_rank, obs.straggler) for r in sorted(obs.ranks)))

    def action_choose(self) -> None:
        """Show the rank under the cursor."""
        if 0 <= self.cursor_row < self.row_count:
            self.post_message(self.Chosen(int(str(self.ordered_rows[self.cursor_row].key.value))))

    def action_auto(self) -> None:
        """Show the straggler again (the lowest rank when there is none)."""
        self.post_message(self.Chosen(None))


def rank_row(view: RankView, focus: int, straggler: Straggler | None) -> CellRow:
    """One row of :class:`RanksTable`: ``●`` marks the rank shown, the straggler's row is bold red."""
    r = view.reading
    style = "bold red" if straggler is not None and straggler.rank == view.rank else ""

    def ms(v: float | None) -> Text:
        return Text("n/a" if v is None else f"{v:.1f}", justify="right", style=style)

    label = view.verdict.label if view.verdict is not None else "n/a"
    if style:
        label += f"  ◀ straggler ({straggler.score:.2f})" if straggler is not None else ""
    return (
        str(view.rank),
        (
            Text(("● " if view.rank == focus else "  ") + str(view.rank), style=style),
            Text(str(view.pid or "?"), style=style),
            ms(r.step_ms if r else None),
            ms(r.data_wait_ms if r else None),
            ms(r.compute_ms if r else None),
            ms(r.collective_wait_ms if r else None),
            Text(fmt_pct(r.cpu_pct if r else None), justify="right", style=style),
            Text(label, style=style),
        ),
    )


class StackTable(DataTable[str | Text]):
    """Hottest frames of the loop and the workers; enter shows the whole stack."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Stack")]
    stack_rows: reactive[tuple[StackRow, ...]] = reactive(())

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
                        Text(fmt_share(r.share), justify="right"),
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

    def row(self, key: str | None) -> StackRow | None:
        """The stack row with this key."""
        return next((r for r in self.stack_rows if row_key(r) == key), None)


def row_key(r: StackRow) -> str:
    """A stable key of a stack row across refreshes."""
    return f"{r.who}|{r.category}|{r.function}|{r.location}"


class StepsPanel(VerticalScroll):
    """Steps/s, step time, the epoch and the loss, data wait and the DataLoader settings, the
    steps/s, data-wait and loss trends (needs the hook)."""

    observation: reactive[Observation | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw what was set before the children existed."""
        self.watch_observation(self.observation)

    def compose(self) -> ComposeResult:
        """Numbers, then the steps/s and data-wait trends."""
        yield Static(id="steps-text")
        yield Trend("steps/s", id="steps-rate")
        yield Trend("data wait %", id="steps-wait")
        yield Trend("loss (5 s medians)", id="steps-loss")

    def watch_observation(self, obs: Observation | None) -> None:
        """Redraw numbers and trends."""
        if obs is None or not self.children:
            return
        steps = obs.focus.steps
        show_text(self.query_one("#steps-text", Static), render.steps_text(obs))
        self.query_one("#steps-rate", Trend).data = steps.steps_series
        self.query_one("#steps-wait", Trend).data = steps.wait_series
        loss = self.query_one("#steps-loss", Trend)
        series = obs.focus.progress.loss_series if obs.focus.progress is not None else ()
        loss.display = bool(series)  # no loss read: no row (a training without one keeps its layout)
        loss.data = series


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
        last = burst.last if not burst.error else None
        for widget in self.query(".table-title, DataTable, BreakdownBar"):
            widget.display = last is not None
        if last is None:
            return
        self.query_one(BreakdownBar).shares = last.breakdown_share
        for table_id, rows in (("#burst-ops", last.top_cpu_ops), ("#burst-kernels", last.top_kernels)):
            table: DataTable[str | Text] = self.query_one(table_id, DataTable)
            table.clear()
            for op in rows:
                table.add_row(
                    Text(op.name), Text(f"{op.ms:.2f}", justify="right"), Text(str(op.calls), justify="right")
                )


class MemoryPanel(VerticalScroll):
    """Host RSS of the tree and device memory (NVML, and the focus rank's allocator), with their trends."""

    observation: reactive[Observation | None] = reactive(None)

    def on_mount(self) -> None:
        """Draw what was set before the children existed."""
        self.watch_observation(self.observation)

    def compose(self) -> ComposeResult:
        """Host numbers and trend, device numbers and trend."""
        yield Static(id="memory-host")
        yield Static(id="memory-limit")
        yield Trend("RSS", unit="bytes", id="memory-rss")
        yield Static(id="memory-device")
        yield Trend("device", unit="bytes", id="memory-dev")
        yield Trend("allocated", unit="bytes", id="memory-alloc")

    def watch_observation(self, obs: Observation | None) -> None:
        """Redraw numbers and trends."""
        if obs is None or not self.children:
            return
        memory = obs.memory
        show_text(self.query_one("#memory-host", Static), render.memory_text(memory))
        show_text(self.query_one("#memory-limit", Static), render.memory_limit_text(memory))
        self.query_one("#memory-rss", Trend).data = memory.rss_series
        device = render.device_memory_text(memory, obs.focus.device_memory)
        show_text(self.query_one("#memory-device", Static), device)
        self.query_one("#memory-dev", Trend).data = memory.device_series
        alloc = self.query_one("#memory-alloc", Trend)
        alloc.display = bool(obs.focus.device_memory.allocated_series)  # unknown: the text line says why
        alloc.data = obs.focus.device_memory.allocated_series
