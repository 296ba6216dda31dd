"""``%load_ext torchwatch`` and ``%torchwatch`` in a real Jupyter kernel (nbclient + ipykernel): the
verdict shows in the notebook while the training cell runs, the next cell runs, and the watcher
ends with the kernel."""

from __future__ import annotations

import os
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.integration

LABELS = ("cpu-bound", "gpu-bound", "io-bound", "dataloader-bound", "undetermined")

# ~15 s of a CPU-heavy step loop (the magic's watcher reads the kernel from outside and its hook inside)
TRAINING = """
import time, torch
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + 15
while time.time() < end:
    x = torch.randn(64, 256)
    for _ in range(30):
        x = torch.tanh(model(x))
    opt.zero_grad(); x.sum().backward(); opt.step()
"""


def _text(cell: dict) -> str:
    return "\n".join(o.get("text") or o.get("data", {}).get("text/plain", "") for o in cell["outputs"])


def test_the_magic_shows_the_verdict_and_the_watcher_ends_with_the_kernel() -> None:
    cells = [
        "%load_ext torchwatch",
        "%torchwatch",
        "import torchwatch.notebook as _tw; _tw._WATCHER.proc.pid",
        TRAINING,
        "print('next cell ran')",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3").execute()  # the kernel is shut down after
    shown = _text(nb.cells[1])
    assert "watching this kernel" in shown and "hook installed" in shown, shown
    status = [line for line in shown.splitlines() if line.startswith("torchwatch [")]
    assert status and any(label in status[-1] for label in LABELS), shown  # updated while the training cell ran
    assert "steps/s" in status[-1], shown  # the hook in the kernel counted steps
    assert _text(nb.cells[4]) == "next cell ran\n"
    watcher = int(_text(nb.cells[2]))
    deadline = time.monotonic() + 30  # attach ends with its target, and the kernel's atexit stops it
    while time.monotonic() < deadline and os.path.exists(f"/proc/{watcher}"):
        time.sleep(0.2)
    if os.path.exists(f"/proc/{watcher}"):
        os.kill(watcher, 9)
        pytest.fail(f"the watcher (PID {watcher}) outlived its kernel")
