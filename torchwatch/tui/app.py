"""A first live screen: the verdict, the findings with evidence and fixes, the source statuses.

The app polls :attr:`Session.latest` once a second (sampling runs in the session's own
threads); it never calls psutil, NVML or py-spy.
"""

from __future__ import annotations

import subprocess
import time
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static

from torchwatch.diagnosis import Analysis
from torchwatch.report import format_value, status_text
from torchwatch.session import Session


def verdict_text(analysis: Analysis | None, exited: str | None) -> Text:
    """Rich text of the verdict panel: label, confidence, summary, and the exit line if any."""
    text = Text()
    if analysis is None:
        text.append("starting: waiting for the first readings", style="dim")
    else:
        v = analysis.verdict
        text.append(v.label.upper(), style="bold")
        text.append(f"  confidence {v.confidence:.2f}\n")
        text.append(v.summary)
    if exited:
        text.append(f"\n{exited}", style="bold yellow")
    return text


def findings_text(analysis: Analysis | None) -> Text:
    """Rich text of every finding: summary, evidence and fixes."""
    text = Text()
    if analysis is None or not analysis.findings:
        text.append("No finding yet.", style="dim")
        return text
    for f in analysis.findings:
        text.append(f"[{f.severity}] {f.rule} → {f.label}\n", style="bold")
        text.append(f"  {f.summary}\n")
        ev = ", ".join(f"{k}={format_value(k, v)}" for k, v in f.evidence.items())
        text.append(f"  evidence: {ev}\n", style="dim")
        for fx in f.fixes:
            text.append(f"  fix: {fx.title}: ", style="green")
            text.append(f"{fx.detail}\n")
    return text


class WatchApp(App[None]):
    """Live verdict screen for ``torchwatch run`` and ``torchwatch attach``.

    Args:
        session: a started session.
        child: the launched command (``run``), stopped by the caller after the app exits.
        duration: seconds after which the app exits by itself, or ``None``.
    """

    CSS_PATH = "app.tcss"
    TITLE = "torchwatch"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit (stops a launched training)")]

    def __init__(
        self, session: Session, child: subprocess.Popen[bytes] | None = None, duration: float | None = None
    ) -> None:
        super().__init__()
        self.session = session
        self.child = child
        self.duration = duration
        self._start = time.monotonic()

    def compose(self) -> ComposeResult:
        """Verdict panel, scrollable findings, source statuses, key footer."""
        yield Header()
        yield Static(id="verdict")
        with VerticalScroll(id="findings"):
            yield Static(id="findings-body")
        yield Static(id="sources")
        yield Footer()

    def on_mount(self) -> None:
        """Show the command, draw once, then redraw every second."""
        self.sub_title = " ".join(self.child.args) if self.child is not None else f"PID {self.session.tree.root}"  # type: ignore[arg-type]
        self.refresh_view()
        self.set_interval(1.0, self.refresh_view)

    def _exited(self) -> str | None:
        if self.child is not None and self.child.poll() is not None:
            return f"The training exited with status {self.child.returncode}; last readings kept. Press q."
        if self.child is None and self.session.target_gone:
            return "The process exited; last readings kept. Press q."
        return None

    def refresh_view(self) -> None:
        """Redraw every panel from the session's latest analysis."""
        exited = self._exited()
        analysis = self.session.last_alive if exited else self.session.latest
        panel = self.query_one("#verdict", Static)
        panel.update(verdict_text(analysis, exited))
        panel.set_classes(analysis.verdict.label if analysis else "")
        self.query_one("#findings-body", Static).update(findings_text(analysis))
        self.query_one("#sources", Static).update(
            "  ".join(status_text(n, s) for n, s in self.session.statuses().items())
        )
        if self.duration is not None and time.monotonic() - self._start >= self.duration:
            self.exit()
