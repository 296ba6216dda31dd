"""The live TUI of ``torchwatch run`` and ``torchwatch attach``.

Verdict first: the top panel says what limits the training, how sure, and what to change;
below it, tabs show the readings behind it (GPU, processes, stacks, steps, bursts, memory,
the training's log). The app never calls psutil, NVML or py-spy, nor reads the store: a reader
thread that it starts on mount and joins on unmount gets the session's
:class:`~torchwatch.model.observation.Observation` once per refresh and posts a
:class:`~torchwatch.faces.tui.messages.ObservationRead`; widgets change only from those messages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.filter import LineFilter, Monochrome, NoColor
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, Log, OptionList, Static, TabbedContent, TabPane

from torchwatch.faces import report
from torchwatch.faces.hang import notice
from torchwatch.faces.trial import outcome_lines
from torchwatch.faces.tui import render
from torchwatch.faces.tui.feed import LogTail, Reader
from torchwatch.faces.tui.messages import LogRead, ObservationRead, ReaderFailed
from torchwatch.faces.tui.screens import EvidenceScreen, HelpScreen, QuitScreen, StackScreen
from torchwatch.faces.tui.widgets import (
    BurstPanel,
    FindingsList,
    GpuPanel,
    MemoryPanel,
    ProcessTable,
    RanksTable,
    StackTable,
    StepsPanel,
    VerdictPanel,
    show_text,
)
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.observation import ChildProcess, Observation
from torchwatch.model.text import escape_all
from torchwatch.model.trials import Outcome

STOP_POLL_S = 0.2  # how soon a stop signal ends the app (the report follows)
TRIAL_END_WAIT_S = 7.0  # on exit: the trial-stop wait (5 s) and a poll
PANELS = ("gpu", "processes", "stacks", "steps", "burst", "memory", "log", "ranks")
NAVIGATION_HELP = (
    ("tab / shift+tab", "move between the findings, the panel tabs and the panel's rows"),
    ("← / →", "previous / next panel (on the findings or the tabs)"),
    ("↑ / ↓, page up / down", "move between rows"),
    ("1 … 7", "show a panel: " + ", ".join(PANELS)),
    ("enter (findings)", "the evidence behind a finding: its readings and stack samples"),
    ("enter (stacks)", "the whole stack of a row"),
    ("s (processes)", "sort by CPU, RSS, reads or PID"),
    ("escape", "back / close"),
)


_NO_COLOR = NoColor()  # every style's colours replaced by the terminal's defaults


class Watched(Protocol):
    """What the TUI needs of a watch session: the Observation to show, the rank to show, that
    someone is looking, and the burst and the live trial it may ask for."""

    def observe(self) -> Observation:
        """The Observation to show now."""
        ...

    def choose_rank(self, rank: int | None) -> None:
        """Show ``rank`` from the next Observation on; ``None``: the straggler, else the lowest rank."""
        ...

    def wake(self, why: str) -> None:
        """Someone is looking (``why``: a key was pressed): sample at the fast cadence now."""
        ...

    def request_burst(self) -> tuple[bool, str]:
        """Ask the focus rank's hook for a profiler burst: ``(sent, message)``."""
        ...

    def try_setting(self, assignment: str, stopped: Callable[[], int | None]) -> Outcome:
        """Run a live trial of ``assignment`` (``SETTING=VALUE``) on the training, blocking until
        it ends; ``stopped`` returns non-``None`` when the app is leaving (the trial is ended).

        Raises:
            TorchwatchError: the trial could not be asked for (the message says why).
        """
        ...


class WatchApp(App[None]):
    """Live view of a watch session.

    Args:
        watched: what to show: a started :class:`~torchwatch.watch.session.Session`, or any
            :class:`Watched` (tests build real Observations from recorded readings).
        child: the launched command (``run``); ``q`` asks whether to stop it, and
            :attr:`stop_training` tells the caller what the user chose.
        duration: seconds after which the app exits by itself, or ``None``.
        log_path: the file the training's output goes to (``run``), tailed in the Log panel.
        refresh_s: seconds between two reads of the session (the display's refresh).
        clock: monotonic clock in seconds (``watched_seconds`` of the ``e`` report); tests freeze it.
        report_dir: directory ``e`` writes the JSON report to (the current directory by default).
        stop_requested: polled every :data:`STOP_POLL_S` s; when it returns ``True`` (torchwatch
            got SIGTERM, SIGHUP or SIGINT) the app exits at once.

    Attributes:
        stop_training: after the app exits, whether the caller should stop the launched
            training (``True`` unless the user quit with "leave it running").
        ended_by: why the app exited: ``"quit"``, ``"duration"`` or ``"signal"``.
    """

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "torchwatch"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", tooltip="quit (run: asks whether to stop the training too)"),
        Binding("question_mark", "help", "Keys", key_display="?", tooltip="this list of keys"),
        Binding("b", "burst", "Burst", tooltip="profile a few training steps with torch.profiler (needs the hook)"),
        Binding(
            "t",
            "trial",
            "Try fix",
            tooltip="try the highlighted finding's fix on the training (on/off blocks of steps), then put it back",
        ),
        Binding("p", "pause", "Pause", tooltip="pause / resume the display (sampling and analysis go on)"),
        Binding("e", "export", "Report", tooltip="write the JSON report to torchwatch-report-PID-TIME.json here"),
        Binding("left", "panel(-1)", "Previous panel", show=False),
        Binding("right", "panel(1)", "Next panel", show=False),
        *(Binding(str(i + 1), f"show_panel({i})", f"Show {name}", show=False) for i, name in enumerate(PANELS)),
    ]
    observation: reactive[Observation | None] = reactive(None)
    paused: reactive[bool] = reactive(False)

    def __init__(
        self,
        watched: Watched,
        child: ChildProcess | None = None,
        duration: float | None = None,
        *,
        log_path: Path | None = None,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        report_dir: Path | None = None,
        stop_requested: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self.stop_requested = stop_requested
        self.ended_by = "quit"
        self.watched = watched
        self.child = child
        self.duration = duration
        self.log_path = log_path
        self.refresh_s = refresh_s
        self.clock = clock
        self.report_dir = report_dir
        self.stop_training = child is not None
        self._started = clock()
        self._reader: Reader | None = None
        self._pending: Observation | None = None
        self._held_lines: deque[str] = deque(maxlen=2000)
        self._trial_running: str | None = None  # the setting a live trial is trying now
        self._leaving = False  # set on exit: a running trial is ended (the old value put back)
        self._trial_ended = threading.Event()
        self._shown_started = float("-inf")  # when the read now drawn began (monotonic s): see ObservationRead

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's line filters; with ``NO_COLOR`` set, no colour at all (no-color.org: "prevents
        the addition of ANSI color"), where Textual's own answer to it, its Monochrome filter, still
        draws every cell in 24-bit greys (242 colour sequences on one screen, counted in tmux)."""
        filters = list(super().get_line_filters())
        if not self.no_color:
            return filters
        return [f for f in filters if not isinstance(f, Monochrome)] + [_NO_COLOR]

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        """Verdict and findings on top, the panels in tabs, the source statuses, the key footer."""
        with Vertical(id="top"):
            yield VerdictPanel(id="verdict")
            yield FindingsList(id="findings")
        with TabbedContent(id="panels"):
            with TabPane("GPU", id="gpu"):
                yield GpuPanel(id="gpu-panel")
            with TabPane("Processes", id="processes"), Vertical():
                yield ProcessTable(id="process-table")
                yield Static(
                    "threads: R run · W wait · D disk · F file · S sleep · N socket · s: sort", classes="legend"
                )
            with TabPane("Stacks", id="stacks"):
                yield StackTable(id="stack-table")
            with TabPane("Steps", id="steps"):
                yield StepsPanel(id="steps-panel")
            with TabPane("Burst", id="burst"):
                yield BurstPanel(id="burst-panel")
            with TabPane("Memory", id="memory"):
                yield MemoryPanel(id="memory-panel")
            with TabPane("Log", id="log"), Vertical():
                yield Static(id="log-title", classes="legend")
                yield Log(id="log-view", max_lines=2000)
            with TabPane("Ranks", id="ranks"), Vertical():
                yield RanksTable(id="ranks-table")
                yield Static(
                    "● the rank the other panels show · enter: show the rank under the cursor · a: the straggler",
                    classes="legend",
                )
        yield Static(id="sources")
        yield Footer()

    def on_mount(self) -> None:
        """Draw once, start the reader thread and the duration timer."""
        self._size_classes(self.size.height)
        self.refresh_view()
        top = self.query_one("#top")
        top.border_title = Text(f"torchwatch · {self._command()}")  # the command is the target's text: no markup
        self.query_one("#log-title", Static).update(self._log_title())
        nvml = self.observation.status("nvml") if self.observation else None
        if nvml is None or nvml.status.value != "ok":
            self.query_one(TabbedContent).active = "processes"
        self.query_one(FindingsList).focus()
        if self.observation is None or len(self.observation.ranks) < 2:
            self.query_one(TabbedContent).hide_tab("ranks")  # one process: no ranks to compare
        self._reader = Reader(
            self.watched.observe, self.post_message, self.refresh_s, LogTail(self.log_path) if self.log_path else None
        )
        self._reader.start()
        if self.duration is not None:
            self.set_timer(self.duration, self._time_up)
        if self.stop_requested is not None:
            self.set_interval(STOP_POLL_S, self._check_stop)

    def _time_up(self) -> None:
        self.ended_by = "duration"
        self.exit()

    def _check_stop(self) -> None:
        if self.stop_requested is not None and self.stop_requested():
            self.ended_by = "signal"
            self.exit()

    def on_unmount(self) -> None:
        """Join the reader thread (the session's samplers belong to the caller); a live trial is
        ended and its old value read back first (at most :data:`TRIAL_END_WAIT_S`)."""
        self._leaving = True
        if self._trial_running is not None:
            self._trial_ended.wait(TRIAL_END_WAIT_S)
        if self._reader is not None:
            self._reader.stop()

    def on_resize(self, event: events.Resize) -> None:
        """Keep the layout usable: fewer finding lines on short terminals, more on tall ones."""
        self._size_classes(event.size.height)

    def _size_classes(self, height: int) -> None:
        self.set_class(height >= 40, "-tall")
        self.set_class(height < 30, "-short")

    def _command(self) -> str:
        target = self.observation.target if self.observation else None
        if self.child is not None:
            return " ".join(escape_all(str(a) for a in self.child.args))
        return f"PID {target.pid}" if target is not None else "starting"

    def _log_title(self) -> str:
        if self.log_path is not None:
            return f"the training's output, also in {self.log_path} (printed again when torchwatch exits)"
        if self.child is not None:
            return "the training's output is printed when torchwatch exits"
        return "attach: the training writes to its own terminal; torchwatch cannot show its output"

    # -- reading ------------------------------------------------------------------------------
    def refresh_view(self) -> None:
        """Get the Observation now, on this thread, and draw it (first frame; tests)."""
        started = time.monotonic()
        obs = self.watched.observe()
        self._shown_started = max(self._shown_started, started)
        self._show(obs)

    def on_observation_read(self, message: ObservationRead) -> None:
        """A new Observation: draw it, or keep it for later while paused.

        Dropped once the app is shutting down: Textual removes the screens' widgets before
        ``on_unmount`` joins the reader thread, so a late Observation finds no panel to draw on.
        """
        if self.is_running and message.started >= self._shown_started:
            self._shown_started = message.started
            self._show(message.observation)

    def _show(self, obs: Observation) -> None:
        if self.paused:
            self._pending = obs
        else:
            self.observation = obs

    def on_log_read(self, message: LogRead) -> None:
        """New lines of the training's output (held while paused; dropped once shutting down)."""
        if not self.is_running:
            return
        if self.paused:
            self._held_lines.extend(message.lines)
        else:
            self.query_one(Log).write_lines(message.lines)

    def on_reader_failed(self, message: ReaderFailed) -> None:
        """Say that reading failed; the reader keeps trying."""
        self.notify(message.error, severity="error", timeout=10, markup=False)

    def watch_observation(self, old: Observation | None, obs: Observation | None) -> None:
        """Hand the verdict, the findings and the shown panel their part of the Observation
        (unchanged parts do not redraw; hidden panels catch up when shown)."""
        if obs is None:
            return
        self.query_one(VerdictPanel).observation = obs
        self.query_one(FindingsList).observation = obs
        if len(obs.ranks) > 1 and (old is None or len(old.ranks) < 2):
            self.query_one(TabbedContent).show_tab("ranks")
        self._fill_panel(self.query_one(TabbedContent).active, obs)
        show_text(
            self.query_one("#sources", Static), render.sources_text(obs.statuses, notice(obs.hang), obs.sampling.mode)
        )
        self._hang_news(old, obs)
        if isinstance(self.screen, EvidenceScreen):
            self.screen.observation = obs
        if old is None or old.focus.burst.possible != obs.focus.burst.possible:
            self.refresh_bindings()

    def _hang_news(self, old: Observation | None, obs: Observation) -> None:
        """A notification when the recorder fires, when its dump is in, and when the hang becomes a stall."""
        before = (old.hang.fired_s, old.hang.state) if old is not None and old.hang is not None else None
        now = (obs.hang.fired_s, obs.hang.state) if obs.hang is not None else None
        line = notice(obs.hang)
        if now is not None and now != before and line is not None:
            # the notice quotes the target's frames: plain text, never markup
            self.notify(line, severity="error" if now[1] != "stall" else "warning", timeout=30, markup=False)

    def _fill_panel(self, panel: str, obs: Observation) -> None:
        if panel == "gpu":
            self.query_one(GpuPanel).show(obs.gpus, obs.gpu_note)
        elif panel == "processes":
            self.query_one(ProcessTable).processes = obs.processes
        elif panel == "stacks":
            self.query_one(StackTable).stack_rows = obs.focus.stacks
        elif panel == "steps":
            self.query_one(StepsPanel).observation = obs
        elif panel == "burst":
            self.query_one(BurstPanel).burst = obs.focus.burst
        elif panel == "memory":
            self.query_one(MemoryPanel).observation = obs
        elif panel == "ranks":
            self.query_one(RanksTable).observation = obs

    def on_ranks_table_chosen(self, message: RanksTable.Chosen) -> None:
        """Show the rank chosen in the other panels (py-spy follows it from its next chunk)."""
        self.watched.choose_rank(message.rank)
        shown = "the straggler (or the lowest rank)" if message.rank is None else f"rank {message.rank}"
        self.notify(f"showing {shown} from the next analysis")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """A panel comes into view: draw it from the latest Observation."""
        if self.observation is not None and event.pane.id:
            self._fill_panel(event.pane.id, self.observation)

    # -- keys ---------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``b`` is greyed out in the footer while a burst cannot be asked for."""
        if action == "burst":
            return True if self.observation is not None and self.observation.focus.burst.possible else None
        if action == "trial":
            return True if self._trial_assignment()[0] is not None else None
        return True

    def _trial_assignment(self) -> tuple[str | None, str]:
        """The live fix of the highlighted finding (``SETTING=VALUE``), or ``None`` and why not."""
        if self._trial_running is not None:
            return None, f"a trial of {self._trial_running} is running"
        if self.observation is None or not self.observation.focus.steps.steps:
            return None, "no step measured yet (the trial needs the hook's step times)"
        findings = self.query_one(FindingsList)
        i = findings.highlighted
        obs_findings = self.observation.findings
        finding = obs_findings[i] if i is not None and 0 <= i < len(obs_findings) else None
        if finding is None:
            return None, "no finding highlighted"
        for fx in finding.fixes:
            if fx.trial:
                return fx.trial, ""
        return None, f"no fix of {finding.rule} can be tried live"

    def on_key(self, event: events.Key) -> None:
        """Any key sends the session's samplers back to the fast cadence (someone is looking: the
        panels should move at full rate); a greyed-out ``b`` still answers: it says why no
        burst can be taken."""
        self.watched.wake("a key was pressed in the TUI")
        if event.key == "b" and self.check_action("burst", ()) is None:
            reason = self.observation.focus.burst.reason if self.observation else "no reading yet"
            self.notify(f"burst unavailable: {reason}", severity="warning", markup=False)
        if event.key == "t" and self.check_action("trial", ()) is None:
            self.notify(f"no live trial: {self._trial_assignment()[1]}", severity="warning", markup=False)

    def action_burst(self) -> None:
        """Ask the hook for a profiler burst (the result appears in the Burst panel)."""
        self.query_one(TabbedContent).active = "burst"
        self._request_burst()

    @work(thread=True, exclusive=True, group="burst")
    def _request_burst(self) -> None:
        try:
            ok, message = self.watched.request_burst()
        except Exception as exc:
            ok, message = False, f"burst request failed: {exc!r}"
        self.call_from_thread(self.notify, message, severity="information" if ok else "error", markup=False)

    def action_trial(self) -> None:
        """Try the highlighted finding's live fix (the result comes as a notification, and goes
        to the report)."""
        assignment, why = self._trial_assignment()
        if assignment is None:
            self.notify(f"no live trial: {why}", severity="warning", markup=False)
            return
        self._trial_running = assignment
        self._trial_ended.clear()
        self.refresh_bindings()
        self.notify(f"trying {assignment} on the training (up to a minute); the old value is put back after",
                    markup=False)  # fmt: skip
        self._run_trial(assignment)

    @work(thread=True, exclusive=True, group="trial")
    def _run_trial(self, assignment: str) -> None:
        try:
            out = self.watched.try_setting(assignment, lambda: 15 if self._leaving else None)
            lines = outcome_lines(out)
            message, severity = "\n".join(lines[:2] + [ln for ln in lines if "NOT put back" in ln]), "information"
        except TorchwatchError as exc:
            message, severity = f"no trial: {exc.one_line()}", "error"
        except Exception as exc:  # a trial must never take the app down
            message, severity = f"trial failed: {exc!r}", "error"
        finally:
            self._trial_ended.set()
        if not self._leaving:
            with contextlib.suppress(Exception):  # the app may be closing
                self.call_from_thread(self._trial_done, message, severity)

    def _trial_done(self, message: str, severity: str) -> None:
        self._trial_running = None
        self.refresh_bindings()
        self.notify(message, severity=severity, timeout=20, markup=False)  # type: ignore[arg-type]

    def action_pause(self) -> None:
        """Freeze the display; sampling and analysis go on."""
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        """Mark the top panel; on resume draw what arrived meanwhile."""
        top = self.query_one("#top")
        top.border_subtitle = "PAUSED: sampling continues, p resumes" if paused else ""
        top.set_class(paused, "-paused")
        if not paused:
            if self._pending is not None:
                self.observation, self._pending = self._pending, None
            if self._held_lines:
                self.query_one(Log).write_lines(list(self._held_lines))
                self._held_lines.clear()

    def action_export(self) -> None:
        """Write the JSON report of what is on screen."""
        if self.observation is None or self.observation.verdict is None:
            self.notify("no verdict yet: nothing to report", severity="warning")
            return
        self._export(self.observation)

    @work(thread=True, group="export")
    def _export(self, obs: Observation) -> None:
        path = (self.report_dir or Path.cwd()) / report.default_name(obs.target.pid)
        try:
            data = report.build(obs, watched_s=self.clock() - self._started)
            report.write_atomic(path, report.dumps(data) + "\n")
        except Exception as exc:  # the report must never take the app down
            self.call_from_thread(self.notify, f"cannot write the report: {exc}", severity="error", markup=False)
            return
        self.call_from_thread(self.notify, f"report written to {path}", markup=False)

    def action_help(self) -> None:
        """Show every key binding."""
        rows = [
            (b.key_display or b.key, b.tooltip or b.description)
            for b in self.BINDINGS
            if isinstance(b, Binding) and b.show
        ]
        self.push_screen(HelpScreen([*rows, *NAVIGATION_HELP]))

    def _panels(self) -> tuple[str, ...]:
        """The panels shown: the Ranks panel only for a job of several ranks."""
        obs = self.observation
        return PANELS if obs is not None and len(obs.ranks) > 1 else tuple(p for p in PANELS if p != "ranks")

    def action_panel(self, step: int) -> None:
        """Show the previous / next panel."""
        tabs = self.query_one(TabbedContent)
        panels = self._panels()
        i = panels.index(tabs.active) if tabs.active in panels else 0
        tabs.active = panels[(i + step) % len(panels)]

    def action_show_panel(self, index: int) -> None:
        """Show panel number ``index`` (0-based) of :data:`PANELS` (the Ranks panel: ``8``, with
        several ranks)."""
        if PANELS[index] in self._panels():
            self.query_one(TabbedContent).active = PANELS[index]

    async def action_quit(self) -> None:
        """Quit; in ``run`` mode with the training alive, first ask whether to stop it."""
        if self.child is None or self.child.poll() is not None:
            self.exit()
            return

        def chosen(choice: str | None) -> None:
            if choice is None:
                return
            self.stop_training = choice == "stop"
            self.exit()

        self.push_screen(QuitScreen(self.child.pid), chosen)

    # -- drill-down ---------------------------------------------------------------------------
    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Enter on a finding: its evidence."""
        if isinstance(event.option_list, FindingsList) and event.option.id and self.observation is not None:
            self.push_screen(EvidenceScreen(event.option.id, self.observation))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a stack row: the whole stack."""
        table = event.data_table
        if isinstance(table, StackTable):
            row = table.row(event.row_key.value)
            if row is not None:
                self.push_screen(StackScreen(row))
