"""Run ``tests/unit/_hook_script.py`` (a tiny hooked training) in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("_hook_script.py")
REPO = Path(__file__).resolve().parents[2]


def hook_script(mode: str, directory: Path, traces: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python _hook_script.py MODE DIRECTORY`` with ``TORCHWATCH_TRACE_DIR=traces`` and ``env``."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(directory)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "TORCHWATCH_TRACE_DIR": str(traces), **env},
        check=False,
    )


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON object the script printed last (after checking it exited 0)."""
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out
