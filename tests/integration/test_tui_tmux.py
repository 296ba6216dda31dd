"""The TUI in a real terminal: tmux runs ``torchwatch run -- python demo/dataloader_bound.py``.

Within 20 s the screen shows "dataloader-bound" and a fix naming num_workers; ``q`` then ``y``
(stop the training) ends torchwatch (exit 0) and the training, and no process of the tree is left.
Run alone with ``pytest -s tests/integration/test_tui_tmux.py`` to see the captured screen.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import REPO
from tests.tmux import Tmux, alive, descendants

pytestmark = [
    pytest.mark.integration,
    pytest.mark.quiet,  # the demo's label on the screen
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed: the real-terminal TUI test needs it"
    ),
]

VERDICT_WITHIN_S = 60.0
"""How long the test waits for the label on the screen: 3 x the 20 s it once had to come in (how
soon it comes: ``bench/first_verdict.py``, the same session under ``--headless``)."""


def test_tui_in_tmux_shows_the_verdict_and_q_stops_everything(tmp_path: Path) -> None:
    tmux = Tmux()
    python = shlex.quote(sys.executable)
    command = (
        f"cd {shlex.quote(str(REPO))} && {python} -m torchwatch run -- {python} demo/dataloader_bound.py"
        " --device cpu --seconds 120; echo TW_EXIT=$?; sleep 60"
    )
    tmux("new-session", "-d", "-x", "80", "-y", "24", "-s", "tw", command)
    try:
        shell = int(tmux("list-panes", "-t", "tw", "-F", "#{pane_pid}").split()[0])
        tree: set[int] = set()

        def collect() -> None:
            tree.update(descendants(shell))

        start = time.monotonic()
        screen = tmux.wait_for(lambda s: "dataloader-bound" in s and "num_workers" in s, VERDICT_WITHIN_S, collect)
        took = time.monotonic() - start
        (tmp_path / "screen.txt").write_text(screen)
        print(f"\n--- captured after {took:.1f} s ---\n{screen}--- end ---")
        assert "dataloader-bound" in screen and "num_workers" in screen, screen
        names = {psutil.Process(p).name() for p in tree if alive(p)}
        assert len(tree) >= 2 and any("python" in n for n in names), names  # torchwatch and the training

        tmux("send-keys", "-t", "tw", "q")
        asked = tmux.wait_for(lambda s: "still running" in s, 10.0, collect)
        assert "y: stop the training" in asked, asked
        tmux("send-keys", "-t", "tw", "y")
        tmux.wait_for(lambda s: "TW_EXIT=" in s, 90.0)  # a deadline: SIGINT, SIGTERM graces and the report
        done = tmux.history()
        assert "TW_EXIT=0" in done, done  # a stop torchwatch was asked for is no failure
        assert "-> dataloader-bound" in done, done  # the final report, printed after the app
        left = {pid for pid in tree if alive(pid)}
        assert not left, [(p, psutil.Process(p).cmdline()) for p in left]
    finally:
        tmux.kill()
