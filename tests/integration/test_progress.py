"""A real CPU training under ``torchwatch run --headless --json`` whose loss turns NaN at a known
step: ``loss-not-finite`` names that step, the verdict is the one the loop earns without it, and
the epoch, batch and loss torchwatch reports are the ones the script printed; its epochs go through a
``tqdm`` bar, whose total (the run's epochs) the report names."""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, headless_run, torchwatch

pytestmark = pytest.mark.integration
SCENARIO = REPO / "tests" / "scenarios" / "loss_nan.py"
PRINTED = re.compile(r"^loss_nan: epoch (\d+) batch (\d+) step (\d+) loss (\S+) t \S+$", re.MULTILINE)
NAN_AT = 70


def test_a_loss_that_turns_nan_is_named_with_its_step_and_the_progress_is_the_scripts(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    pytest.importorskip("tqdm", reason="the scenario's bars are tqdm's")
    cmd = (sys.executable, str(SCENARIO), "--nan-at", str(NAN_AT), "--tqdm")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    w = torchwatch(*headless_run(90, out, *cmd), json_path=out, timeout=180, env=env)
    assert w.code == 0, w.stderr[-3000:]
    printed = {int(s): (int(e), int(b), float(v)) for e, b, s, v in PRINTED.findall(w.stderr)}
    # once beside two spinning processes (2026-11-29) 149 of the 150 lines were read: the message
    # names the missing steps and the stderr lines that carry the script's words but not its line
    missing = [s for s in range(1, 151) if s not in printed]
    odd = [line for line in w.stderr.splitlines() if "loss_nan:" in line and not PRINTED.match(line)]
    assert len(printed) == 150, f"steps missing {missing}; lines not read: {odd[:5]!r}\n{w.stderr[-1500:]}"
    assert w.report is not None
    report = w.report
    p = report["progress"]
    # the epoch and the batch in it: the ones the script printed at some step, of its length
    assert p["epoch_len"] == 50
    assert (p["epoch"], p["batch"]) in {(e, b) for e, b, _v in printed.values()}, p
    assert (p["epoch"], p["batch"]) == (3, 50), p  # the end of the last epoch is published as it ends
    # The hook's steps are optimizer steps: the script's steps with a NaN loss skip theirs (as a
    # GradScaler does), so the hook's step N is the script's step at which N-1 optimizer steps were made.
    by_hook_step: dict[int, tuple[int, int, float]] = {}
    made = 0
    for s in sorted(printed):
        by_hook_step.setdefault(made + 1, printed[s])
        made += math.isfinite(printed[s][2])
    # the last loss read is the one printed at its step
    assert p["loss"] == pytest.approx(by_hook_step[p["loss_step"]][2], rel=1e-3), p
    # the NaN: named at a step the script printed NaN, after a finite reading before NAN_AT
    assert math.isnan(by_hook_step[p["nonfinite_step"]][2]) and p["nonfinite_step"] == NAN_AT, p
    assert 0 < p["last_finite_step"] < NAN_AT and math.isfinite(by_hook_step[p["last_finite_step"]][2]), p
    findings = [f["rule"] for f in report["findings"]]
    assert "loss-not-finite" in findings, findings
    nan = next(f for f in report["findings"] if f["rule"] == "loss-not-finite")
    assert nan["evidence"]["loss_nonfinite_step"] == p["nonfinite_step"]
    assert f"since step {p['nonfinite_step']}" in nan["summary"]
    # beside the verdict, never in it: listed last, the verdict says nothing of the loss
    assert findings[-1] in ("loss-not-finite", "loss-spike", "loss-stalled"), findings
    assert "loss" not in report["verdict"]["summary"].lower(), report["verdict"]
    assert f"progress: epoch {p['epoch']}" in w.stdout
    # the run's total, from its tqdm bar of epochs (closed at the end of the loop: its last reading
    # stays), and the share of it done with the bar of batches inside it
    assert (p["bar_desc"], p["bar_total"]) == ("Epochs", 3), p
    assert p["bar_n"] in (2, 3) and 0.9 < p["bar_share"] <= 1.0 and p["bar_eta_s"] is not None, p
    assert 'tqdm "Epochs"' in w.stdout
