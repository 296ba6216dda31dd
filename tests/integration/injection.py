"""Injection test helpers: the target scripts (a plain loop, a torch loop, a numbers loop, a holder;
``make_scripts``; the fixture ``scripts`` in conftest.py), the interpreters to run them with, and a running
target that is always ended."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

LOOP = textwrap.dedent(
    """
    import os, sys, time
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        time.sleep(0.005)
        x = [i * i for i in range(2000)]
    print("done", flush=True)
    """
)


TORCH_LOOP = textwrap.dedent(
    """
    import os, sys, time, torch
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        model(torch.randn(256, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    print("done", flush=True)
    """
)


NUMBERS_LOOP = textwrap.dedent(
    """
    import os, sys, time, torch
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 128, generator=g)
    want = a @ b
    print("ready", os.getpid(), flush=True)
    end = time.monotonic() + float(sys.argv[1])
    n = 0
    while time.monotonic() < end:
        got = a @ b
        x = torch.tanh(got).sum().item() + sum(float(i) * 0.5 for i in range(50))
        if not torch.equal(got, want) or x != x:
            print("mismatch at", n, flush=True)
            sys.exit(3)
        n += 1
    """
)


INJECT_TIMEOUT_S = 60.0
"""One injection's deadline in a test whose subject is what the injection does, not how soon (that
is bench/inject.py's): the default 10 s was missed once in CI (four workers on 2 cores) by the
first injection into a plain loop; 60 s is ~6x the longest wall time measured beside two spinning
processes (docs/development.md)."""


def _interpreter(version: str) -> str | None:
    """A ``python3.X`` binary: pyenv's first, then PATH (CI machines without pyenv)."""
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python{version}"))
    return found[-1] if found else shutil.which(f"python{version}")


def make_scripts() -> Path:
    """A new directory every user can read, with the target scripts (the caller removes it)."""
    d = Path(tempfile.mkdtemp(prefix="tw-inject-test-"))
    os.chmod(d, 0o755)
    (d / "loop.py").write_text(LOOP)
    (d / "torch_loop.py").write_text(TORCH_LOOP)
    (d / "numbers_loop.py").write_text(NUMBERS_LOOP)
    for f in d.iterdir():
        os.chmod(f, 0o644)
    return d


@contextlib.contextmanager
def running(cmd: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """Start a target that prints ``ready PID`` and yield it once ready; killed at the end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), f"target did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


HOLDER = textwrap.dedent(
    """
    import ctypes, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_SEIZE = 0x4206  # traces without stopping the tracee
    if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
        print("error", ctypes.get_errno(), flush=True)
        sys.exit(1)
    print("seized", flush=True)
    time.sleep(60)
    """
)
