"""``torchwatch serve``: trainings found from outside (libtorch mapped, topmost of their tree), sessions
started for new ones and dropped for ended ones, one /metrics for all, SIGTERM ends it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.unit.prom import free_port
from torchwatch.watch.discover import find_trainings, loads_torch
from torchwatch.watch.fleet import Fleet

REPO = Path(__file__).resolve().parents[2]
# a torch process that starts a torch child (as torchrun starts its ranks), and a Python process without torch
TORCH_TREE = (
    "import subprocess, sys, time, torch\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time, torch; print(1, flush=True); time.sleep(120)'],"
    " stdout=subprocess.PIPE)\n"
    "child.stdout.readline(); print('ready', child.pid, flush=True); time.sleep(120)\n"
)


@pytest.fixture
def torch_tree() -> Iterator[tuple[int, int]]:
    """``(parent, child)``: two processes that loaded torch, the child started by the parent."""
    proc = subprocess.Popen([sys.executable, "-c", TORCH_TREE], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        child = int(line[1])
        yield proc.pid, child
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)  # the PID the parent started and still waits on
        proc.kill()
        proc.wait()


def test_loads_torch_reads_the_maps() -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        assert not loads_torch(plain.pid)
        assert not loads_torch(1 << 30)  # no such process: False, no error
    finally:
        plain.kill()
        plain.wait()


def test_the_topmost_torch_process_is_the_training(torch_tree: tuple[int, int]) -> None:
    parent, child = torch_tree
    assert loads_torch(parent) and loads_torch(child)
    found = find_trainings()
    assert parent in found and child not in found  # the child is one of its processes (a rank, a worker)
    assert found[parent] == pytest.approx(psutil.Process(parent).create_time())
    assert os.getpid() not in found  # torchwatch never finds itself
    assert parent not in find_trainings(exclude=[parent])


def test_fleet_starts_new_trainings_and_drops_ended_ones() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fleet = Fleet([], window_s=10.0)
    try:
        when = psutil.Process(proc.pid).create_time()
        started, dropped = fleet.update({proc.pid: when})
        assert started == [proc.pid] and dropped == []
        assert fleet.update({proc.pid: when}) == ([], [])  # watched already
        proc.kill()
        proc.wait()
        started, dropped = fleet.update({})
        assert dropped == [proc.pid] and fleet.sessions() == {}
    finally:
        fleet.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_process_that_cannot_be_watched_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = Fleet([], window_s=10.0)
    assert fleet.update({1 << 30: 1.0}) == ([], [])
    assert fleet.update({1 << 30: 1.0}) == ([], [])
    assert capsys.readouterr().err.count("not watching PID") == 1


def test_serve_exports_and_sigterm_stops_it_cleanly() -> None:
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "torchwatch", "serve", "--prometheus", f"127.0.0.1:{port}", "--scan", "1"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stderr is not None
        assert "Prometheus metrics on" in serve.stderr.readline()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "torchwatch_targets{" in body
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=60)
    assert serve.returncode == -signal.SIGTERM, err  # ends by the signal, as run and attach do
    assert "torchwatch serve: stopped" in err and "Traceback" not in err
    with socket.socket() as s:  # the port is closed
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_launcher_in_its_rendezvous_is_watched_once_it_starts_a_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """A torchrun agent found before it starts its ranks (a multi-node rendezvous takes minutes)
    is looked at again every scan, not refused for good: watched once a rank runs below it."""
    script = (
        "import subprocess, sys, time; sys.stdin.readline()\n"
        "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(rank.pid, flush=True); time.sleep(60)\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", script, "torch.distributed.run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    fleet = Fleet([], window_s=10.0)
    rank = None
    try:
        when = psutil.Process(agent.pid).create_time()
        assert fleet.update({agent.pid: when}) == ([], [])
        assert fleet.update({agent.pid: when}) == ([], [])
        err = capsys.readouterr().err
        assert err.count("launcher with no rank yet") == 1 and "not watching" not in err
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write("go\n")
        agent.stdin.flush()
        rank = int(agent.stdout.readline())
        assert fleet.update({agent.pid: when}) == ([agent.pid], [])
    finally:
        fleet.stop()
        if rank is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
        agent.kill()
        agent.wait()


def test_the_host_label_is_the_node_name_when_given() -> None:
    from torchwatch.cli.serve import node_name

    assert node_name({"TORCHWATCH_NODE_NAME": "gpu-node-7"}) == "gpu-node-7"
    assert node_name({}) == socket.gethostname()


# A process that maps, executable, files named like torch's binding and extension from a directory
# of its own (issue 49: serve counted it as a training). ``full`` adds a torch/__init__.py beside
# the extension, as a look-alike tree would.
LOOKALIKE = """
import mmap, os, sys, time
d, full = sys.argv[1], sys.argv[2] == "1"
os.makedirs(os.path.join(d, "torch", "lib"), exist_ok=True)
if full:
    open(os.path.join(d, "torch", "__init__.py"), "w").close()
maps = []
for name in ("torch/lib/libtorch_python.so", "torch/_C.cpython-311-x86_64-linux-gnu.so"):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(b"\\x7fELF" + b"\\0" * 4092)
    with open(path, "rb") as f:
        maps.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC))
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("full", ["0", "1"])
def test_files_named_like_torch_mapped_as_code_are_no_training(tmp_path: Path, full: str) -> None:
    fake = subprocess.Popen([sys.executable, "-c", LOOKALIKE, str(tmp_path), full], stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        maps = Path(f"/proc/{fake.pid}/maps").read_text()
        assert "libtorch_python.so" in maps and "/torch/_C" in maps  # what the old check looked for
        assert not loads_torch(fake.pid)
        assert fake.pid not in find_trainings()
    finally:
        fake.kill()
        fake.wait()


def test_a_real_import_torch_is_a_training(torch_tree: tuple[int, int]) -> None:
    parent, child = torch_tree
    assert loads_torch(parent) and loads_torch(child)
