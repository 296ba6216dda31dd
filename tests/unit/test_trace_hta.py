"""A real burst's trace folder opens in HolisticTraceAnalysis (HTA), as the README says.

HTA reads every ``.json``/``.gz`` of the folder it is given and keeps one trace per rank, so a
burst folder must hold that burst's trace and nothing else (the summary sits beside it).
The training is CPU-only: HTA's GPU analyses (temporal and idle-time breakdown) need kernels,
so the test loads the folder and checks what a CPU trace holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.hookrun import hook_script, result
from torchwatch.faces.burst import burst_lines
from torchwatch.wire import BurstResult

hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is in the test extra")


def test_hta_loads_a_real_bursts_folder(tmp_path: Path) -> None:
    proc = hook_script("burst", tmp_path / "tw", tmp_path / "traces")
    last = result(proc)["state"]["burst"]["last"]
    folder = Path(last["trace_dir"])
    assert (folder.parent / "burst-1.summary.json").exists()  # beside the folder, not in it
    lines = burst_lines(BurstResult.decode(last, "last"))
    assert f"    its folder: {folder} (HolisticTraceAnalysis; TensorBoard: its parent)" in lines

    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    assert list(analysis.t.traces) == [0]  # one trace, as rank 0
    df = analysis.t.get_trace(0)
    names = set(analysis.t.symbol_table.get_sym_table())
    steps = [n for n in names if n.startswith("ProfilerStep#")]
    assert len(steps) >= last["steps"]
    assert "aten::addmm" in names or "aten::linear" in names  # the model's operators
    assert {int(i) for i in df["iteration"] if i >= 0}  # HTA split the events into the ProfilerStep iterations
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert all(len(k) == 0 for k in kernels)  # a CPU trace: no kernels, and no error saying so
