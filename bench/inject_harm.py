"""Does ``torchwatch attach`` leave a training as it was? The CLI, several times in a row, per condition.

For each condition of ``tests/integration/_harm_target.py`` (an interval timer at 100 Hz and
2 kHz, a fork every step, DataLoader workers, all at once, a GIL held in C), a training runs a
fixed number of steps, and ``torchwatch attach --headless --duration D PID`` (injecting the hook,
then taking it out) is run ``--attaches`` times in a row while it trains. The training must end
on its own with exit 0 and the checksum of a run nobody attached to. Prints a row per
condition: attaches that injected and took the hook out, the training's exit, checksum same or
not, and its steps/s against the clean run's::

    python bench/inject_harm.py --attaches 5            # ~3 min on 2 cores

Run as root it starts each training as ``nobody`` when that user can run this Python with torch
(root attaching to another user's training, as operators do); else as itself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "tests" / "integration" / "_harm_target.py"
sys.path.insert(0, str(REPO))
from tests.integration._harm_target import CONDITIONS  # noqa: E402


def _run(args: list[str], log: Path, steps: int, as_nobody: bool) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(TARGET), "--steps", str(steps), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kw: dict[str, object] = {"user": "nobody", "group": "nogroup", "extra_groups": []} if as_nobody else {}
    out = log.open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/", **kw)  # type: ignore[call-overload]


def _steps(log: Path) -> int:
    found = re.findall(rb"^step (\d+)$", log.read_bytes(), re.M)
    return int(found[-1]) if found else 0


def _finish(proc: subprocess.Popen[bytes], log: Path, started: float) -> tuple[int | None, str, float]:
    try:
        code: int | None = proc.wait(600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    took = time.monotonic() - started
    found = re.search(rb"checksum (\S+) ticks", log.read_bytes())
    return code, found.group(1).decode() if found else "none", took


def _nobody_can_run() -> bool:
    """Whether ``nobody`` can run this Python with torch (not when it lives under /root, say)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import torch"], user="nobody", group="nogroup", capture_output=True, check=False
        )
    except OSError:
        return False
    return done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attaches", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0, help="each attach's --duration (s)")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default: outlasts the attaches)")
    args = parser.parse_args()
    steps = args.steps or max(400, int(args.attaches * (args.duration + 3) * 60))
    as_nobody = os.geteuid() == 0 and _nobody_can_run()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        clean_log = Path(tmp) / "clean.log"
        t0 = time.monotonic()
        _, clean, clean_s = _finish(_run([], clean_log, steps, as_nobody), clean_log, t0)
        print(f"clean run: {steps} steps in {clean_s:.1f} s, checksum {clean} (as {'nobody' if as_nobody else 'me'})")
        print(f"{'condition':20s} {'injected':>8s} {'out':>4s} {'exit':>5s} {'checksum':>9s} {'s':>6s}  lines")
        for name, extra in CONDITIONS.items():
            log = Path(tmp) / f"{name}.log"
            t0 = time.monotonic()
            proc = _run(extra, log, steps, as_nobody)
            while _steps(log) < 20 and proc.poll() is None:
                time.sleep(0.1)
            injected = taken_out = 0
            notes: list[str] = []
            for _ in range(args.attaches):
                if proc.poll() is not None:
                    break
                done = subprocess.run(
                    [sys.executable, "-m", "torchwatch", "attach", "--headless", "--duration", str(args.duration),
                     str(proc.pid)],
                    cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
                )  # fmt: skip
                injected += "hook injected into" in done.stderr
                taken_out += "hook taken out of" in done.stderr
                notes += [line for line in done.stderr.splitlines() if "outside only" in line or "cannot take" in line]
            code, checksum, took = _finish(proc, log, t0)
            same = "same" if checksum == clean else "DIFFERS"
            print(
                f"{name:20s} {injected:8d} {taken_out:4d} {code!s:>5s} {same:>9s} {took:6.1f}  "
                + ("; ".join(n[:160] for n in notes[:2]) or "-"),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
