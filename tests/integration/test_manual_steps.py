"""A training without ``torch.optim`` (manual SGD after ``loss.backward()``, as pytorch/examples'
word_language_model does) gets its steps from the backward passes: torchwatch's steps/s agrees
with the rate the training prints itself."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, headless_run, torchwatch

pytestmark = pytest.mark.integration
SCENARIO = REPO / "tests" / "scenarios" / "manual_sgd.py"
FINAL = re.compile(r"^demo manual_sgd: done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s$", re.MULTILINE)
PERIODIC = re.compile(r"^demo manual_sgd: step \d+, ([\d.]+) steps/s, loss \S+$", re.MULTILINE)


@pytest.mark.quiet  # two rates over different windows agree only while the CPU the loop gets is steady
def test_a_manual_sgd_loop_reports_the_steps_per_second_it_prints_itself(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    # the training prints to stderr (torchwatch passes it on) and ends by itself well before
    # --duration: torchwatch then stops and reports
    cmd = (sys.executable, str(SCENARIO), "--seconds", "12")
    w = torchwatch(*headless_run(60, out, *cmd), json_path=out, timeout=150)
    assert w.code == 0, w.stderr[-3000:]
    final = FINAL.search(w.stderr)
    assert final is not None, w.stderr[-3000:]
    printed_steps, printed_rate = int(final.group(1)), float(final.group(3))
    periodic = [float(m) for m in PERIODIC.findall(w.stderr)]
    assert w.report is not None
    hook = w.report["hook"]
    assert hook["errors"] == [], hook["errors"]
    # one step per backward pass: the hook counted (nearly) all the steps the loop made
    assert 0.8 * printed_steps <= hook["steps"] <= printed_steps, (hook["steps"], printed_steps)
    rate = hook["steps_per_s"]
    assert rate is not None, hook
    median = statistics.median(periodic) if periodic else float("nan")
    detail = f"torchwatch {rate:.2f} steps/s, printed {printed_rate:.2f} (every 2 s: median {median:.2f})"
    print(detail)  # the figure, shown with pytest -s
    assert rate == pytest.approx(printed_rate, rel=0.10), detail
