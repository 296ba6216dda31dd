"""The hook is loaded by path, never by the import name (torchwatch.wire.bypath, the run boot).

A training's environment may hold another ``torchwatch`` (the package index's 0.0.0 placeholder,
``torchwatch-tui``): the hook still comes from this torchwatch, the training's own ``import
torchwatch`` still gets its package, and when the hook cannot be loaded the report says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torchwatch
from tests.unit.bypath import stand_in
from torchwatch.model.readings import Status
from torchwatch.sources.hook import HookSource
from torchwatch.watch.lifecycle import hook_env

ROOT = str(Path(torchwatch.__file__).parent.parent)  # the directory holding this torchwatch package
BYPATH = Path(torchwatch.__file__).parent / "wire" / "bypath.py"

PROBE = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_bp", {str(BYPATH)!r})
bp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bp)
hook = bp.load({ROOT!r}, "torchwatch.hook")
again = bp.load({ROOT!r}, "torchwatch.hook.runtime")
try:
    import torchwatch
    theirs = getattr(torchwatch, "STAND_IN", False)
except ImportError:
    theirs = None
print(json.dumps({{"hook": hook.__name__, "hook_file": hook.__file__, "runtime": again.__name__,
    "installs": callable(hook.install), "theirs": theirs,
    "by_name": sorted(m for m in sys.modules if m.split(".")[0] == "torchwatch")}}))
"""


def probe(cwd: Path, *python_args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Load the hook by path in a new interpreter (started in ``cwd``: ``-c`` puts it on sys.path)."""
    r = subprocess.run(
        [sys.executable, *python_args, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, object] = json.loads(r.stdout.splitlines()[-1])
    return out


def test_another_torchwatch_gets_the_hook_under_a_private_name(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(stand_in(tmp_path / "site")))
    out = probe(tmp_path, env=env)
    assert out["hook"] == "_torchwatch_by_path.hook" and out["runtime"] == "_torchwatch_by_path.hook.runtime"
    assert out["hook_file"] == str(Path(torchwatch.__file__).parent / "hook" / "__init__.py")
    assert out["installs"] is True
    assert out["theirs"] is True  # the training's own import torchwatch: still the stand-in
    assert out["by_name"] == ["torchwatch"]  # nothing of this torchwatch under the name torchwatch


def test_no_torchwatch_at_all_gets_the_hook_and_leaves_the_name_free(tmp_path: Path) -> None:
    out = probe(tmp_path, "-S", "-E")  # no site-packages: this interpreter has no torchwatch
    assert out["hook"] == "_torchwatch_by_path.hook" and out["installs"] is True
    assert out["theirs"] is None and out["by_name"] == []


def test_the_same_torchwatch_is_loaded_by_its_name(tmp_path: Path) -> None:
    """This very package importable as torchwatch: one copy, so the training's own
    ``torchwatch.hook.install()`` and run's hook are the same."""
    out = probe(tmp_path)
    assert out["hook"] == "torchwatch.hook" and out["runtime"] == "torchwatch.hook.runtime"
    assert out["theirs"] is False


def test_a_hook_that_cannot_load_says_why_in_the_report(tmp_path: Path) -> None:
    """The boot copied away from its install and pointed at a torchwatch without the hook: one
    line on the training's stderr and in the note, and the hook source's status says it."""
    boot = tmp_path / "boot"
    boot.mkdir()
    shutil.copy(Path(torchwatch.__file__).parent / "hook" / "boot" / "sitecustomize.py", boot)
    note = tmp_path / "notes" / "note"
    note.parent.mkdir()
    env = {
        **hook_env(boot_note=note),
        "PYTHONPATH": str(boot),
        "TORCHWATCH_HOOK_PATH": str(stand_in(tmp_path / "site")),
    }
    r = subprocess.run(
        [sys.executable, "-c", "print('trained')"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert r.returncode == 0 and r.stdout == "trained\n"  # the training is untouched
    said = note.read_text()
    assert "could not be loaded by Python" in said and "bypath.py is missing" in said
    assert r.stderr.startswith("torchwatch hook: not installed:") and len(r.stderr.splitlines()) == 1
    source = HookSource(expected=True, boot_note=note)
    source.sample(time.monotonic(), os.getpid())  # this process has no hook either
    assert source.status.status is Status.UNAVAILABLE
    assert source.status.reason.startswith("the hook did not load: this torchwatch")
    quiet = HookSource(expected=True, boot_note=tmp_path / "notes" / "none")  # no note: still starting
    quiet.sample(time.monotonic(), os.getpid())
    assert quiet.status.status is Status.STARTING
