"""The TUI's progress in a real terminal at 80×24 and 120×40: tmux runs ``torchwatch run`` on a training
that shows its epochs with a ``tqdm`` bar; the Steps panel (key ``4``) shows the epoch and its time
left, the run's bar, and the loss with its sparkline, on the screen itself (no scrolling)."""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import sys
import time

import psutil
import pytest

from tests.integration.conftest import REPO
from tests.tmux import Tmux, alive, descendants

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the real-terminal test needs it"),
]

SHOWN_WITHIN_S = 120.0
"""How long the test waits for the loss's sparkline (20 s of 5 s medians after the first step): the
training steps from ~3 s alone; 6× that, for a suite on a busy machine (torch's import beside 3 other
workers took 25 s)."""
EPOCH = re.compile(r"epoch (\d+) · (\d+)/50 · ")
BAR = re.compile(r'tqdm "Epochs" (\d+)/40 · ')
LOSS = re.compile(r"loss \S+ at step \d+.*  ([▁▂▃▄▅▆▇█ ]{2,})")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_the_steps_panel_shows_the_epoch_the_runs_bar_and_the_loss_sparkline(size: tuple[int, int]) -> None:
    pytest.importorskip("tqdm", reason="the training's bar is tqdm's")
    tmux = Tmux()
    python = shlex.quote(sys.executable)
    scenario = shlex.quote(str(REPO / "tests" / "scenarios" / "loss_nan.py"))
    command = (
        f"cd {shlex.quote(str(REPO))} && OMP_NUM_THREADS=1 {python} -m torchwatch run -- {python} {scenario}"
        " --tqdm --epochs 40 --nan-at 100000 --sleep 0.05; sleep 60"
    )
    tmux("new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), "-s", "tw", command)
    tree: set[int] = set()
    try:
        shell = int(tmux("list-panes", "-t", "tw", "-F", "#{pane_pid}").split()[0])

        def show_steps() -> None:
            tree.update(descendants(shell))
            tmux("send-keys", "-t", "tw", "4")  # the Steps panel (again: the app may not have been up)

        def shown(screen: str) -> bool:
            return bool(EPOCH.search(screen) and BAR.search(screen) and LOSS.search(screen))

        screen = tmux.wait_for(shown, SHOWN_WITHIN_S, show_steps)
        print(f"\n--- {size[0]}x{size[1]} ---\n{screen}--- end ---")
        lines = screen.splitlines()
        assert len(lines) <= size[1] and all(len(line) <= size[0] for line in lines), "the capture is the pane's"
        epoch, bar, loss = EPOCH.search(screen), BAR.search(screen), LOSS.search(screen)
        assert epoch and bar and loss, screen
        # the bar counts finished epochs, the DataLoader's epoch the one running: one apart, or the
        # same for a moment (tqdm updates its n when the next epoch is asked for, 0.1 s apart at most)
        assert int(epoch.group(1)) - int(bar.group(1)) in (0, 1), screen
        assert len(set(loss.group(1).strip())) >= 1 and loss.group(1).strip(), screen
    finally:
        tmux.kill()
        time.sleep(0.5)
        for pid in tree:
            if alive(pid):
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
