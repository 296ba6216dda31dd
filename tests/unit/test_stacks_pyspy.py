"""torchwatch.analysis.stacks and the py-spy raw parser, on recorded py-spy output and synthetic frames."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from torchwatch.analysis import stacks
from torchwatch.model.readings import Frame, Role, StackSample, Status
from torchwatch.sources import pyspy
from torchwatch.sources.pyspy import explain_failure, parse_raw

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pyspy"
SITE = "/usr/lib/python3.11/site-packages/torch"
DL = f"{SITE}/utils/data/dataloader.py"


def load(name: str, main_pid: int) -> list[StackSample]:
    text = (FIXTURES / name).read_text()
    return parse_raw(text, 12.5, main_pid, lambda pid: Role.MAIN if pid == main_pid else Role.WORKER)


def counts_by(samples: list[StackSample], key: object) -> Counter[str]:
    c: Counter[str] = Counter()
    for s in samples:
        c[key(s)] += s.count  # type: ignore[operator]
    return c


# --- recorded: num_workers=0 ----------------------------------------------------------------


def test_nw0_parsed_fields() -> None:
    samples = load("dataloader_nw0.raw", 5524)
    assert len(samples) == 3
    assert {(s.pid, s.tid, s.thread_name, s.is_main_thread, s.role) for s in samples} == {
        (5524, 5524, "MainThread", True, Role.MAIN)
    }
    assert [s.count for s in samples] == [46, 2, 1]
    assert all(s.t == 12.5 for s in samples)
    first = samples[0]
    assert first.frames[0] == Frame("<module>", "/tmp/dl.py", 13)
    assert first.frames[-1] == Frame("D.__getitem__", "/tmp/dl.py", 7)
    assert first.frames[1].filename == DL and first.frames[1].line == 725


def test_nw0_main_thread_is_in_data_fetch() -> None:
    samples = load("dataloader_nw0.raw", 5524)
    assert [stacks.phase(s.frames) for s in samples] == ["data", "backward", "optimizer"]
    assert [stacks.data_part(s.frames) for s in samples] == ["fetch", None, None]
    fetch = sum(s.count for s in samples if stacks.data_part(s.frames) == "fetch")
    assert fetch / sum(s.count for s in samples) > 0.9


# --- recorded: num_workers=2, --subprocesses ----------------------------------------------


def test_nw2_processes_threads_and_counts() -> None:
    samples = load("dataloader_nw2_subprocesses.raw", 4236)
    assert len(samples) == 26
    assert {s.pid for s in samples} == {4236, 4279, 4280}  # innermost `process` frame wins
    assert {s.pid: s.role for s in samples} == {
        4236: Role.MAIN,
        4279: Role.WORKER,
        4280: Role.WORKER,
    }
    names = {s.thread_name for s in samples}
    assert names == {"MainThread", "QueueFeederThread", "Thread-1 (_serve)"}
    main_threads = {(s.pid, s.tid) for s in samples if s.is_main_thread}
    assert main_threads == {(4236, 4236), (4279, 4279), (4280, 4280)}
    assert all(s.tid != s.pid for s in samples if not s.is_main_thread)
    assert {(s.pid, s.tid) for s in samples if s.thread_name == "QueueFeederThread"} == {
        (4236, 4281),
        (4236, 4282),
        (4280, 4284),
        (4279, 4283),
    }
    # no frame is a leftover `process ...` or `thread ...` element
    assert not any(f.name.startswith(("process ", "thread ")) for s in samples for f in s.frames)
    main = [s for s in samples if s.pid == 4236 and s.is_main_thread]
    assert sum(s.count for s in main) == 49


def test_nw2_main_process_waits_on_the_queue() -> None:
    samples = load("dataloader_nw2_subprocesses.raw", 4236)
    main = [s for s in samples if s.pid == 4236 and s.is_main_thread]
    phases = counts_by(main, lambda s: stacks.phase(s.frames))
    assert phases == Counter({"data": 31, "forward": 8, "backward": 5, "optimizer": 2, "other": 3})
    parts = counts_by([s for s in main if stacks.phase(s.frames) == "data"], lambda s: stacks.data_part(s.frames))
    assert parts["queue"] == 29
    assert parts.most_common(1)[0][0] == "queue"
    assert "fetch" not in parts  # the dataset runs in the workers, not in the main process


def test_nw2_workers_fetch_in_their_main_thread() -> None:
    samples = load("dataloader_nw2_subprocesses.raw", 4236)
    for pid in (4279, 4280):
        worker = [s for s in samples if s.pid == pid and s.is_main_thread]
        parts = counts_by(worker, lambda s: stacks.data_part(s.frames) or "none")
        assert parts.most_common(1)[0][0] == "fetch", (pid, parts)


# --- parser edge cases ----------------------------------------------------------------------


def test_parse_raw_skips_malformed_lines_and_reads_hex_tids() -> None:
    # garbage, an empty line, a bad count, a line without a thread element, then two good ones
    text = """garbage

thread (1): X;f (a.py:1) notanumber
f (a.py:1);g (b.py:2) 5
thread (0x1a2b): worker;f (/x/a.py:3);g (/x/b.py:4) 7
thread (99);h (/x/c.py:9) 2
"""
    samples = parse_raw(text, 1.0, 99, lambda pid: Role.MAIN)
    assert [(s.pid, s.tid, s.thread_name, s.count, s.is_main_thread) for s in samples] == [
        (99, 0x1A2B, "worker", 7, False),
        (99, 99, "", 2, True),
    ]
    assert samples[0].frames == (Frame("f", "/x/a.py", 3), Frame("g", "/x/b.py", 4))


# --- synthetic frames ---------------------------------------------------------------------

MOD = Frame("<module>", "/home/u/train.py", 40)


def test_importlib_is_startup() -> None:
    frames = (
        MOD,
        Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
        Frame("<module>", f"{SITE}/__init__.py", 1),
    )
    assert stacks.phase(frames) == "startup"


def test_optimizer_step() -> None:
    frames = (
        MOD,
        Frame("Optimizer.profile_hook_step.<locals>.wrapper", f"{SITE}/optim/optimizer.py", 530),
        Frame("SGD.step", f"{SITE}/optim/sgd.py", 127),
        Frame("sgd", f"{SITE}/optim/sgd.py", 306),
    )
    assert stacks.phase(frames) == "optimizer"
    assert stacks.data_part(frames) is None


def test_zero_grad_is_optimizer() -> None:
    assert stacks.phase((MOD, Frame("Module.zero_grad", f"{SITE}/nn/modules/module.py", 2))) == "optimizer"


def test_backward_inside_optimizer_closure_is_backward() -> None:
    frames = (
        MOD,
        Frame("LBFGS.step", f"{SITE}/optim/lbfgs.py", 300),
        Frame("closure", "/home/u/train.py", 30),
        Frame("Tensor.backward", f"{SITE}/_tensor.py", 623),
        Frame("backward", f"{SITE}/autograd/__init__.py", 395),
    )
    assert stacks.phase(frames) == "backward"


def test_forward_inside_optimizer_closure_is_forward() -> None:
    frames = (
        MOD,
        Frame("LBFGS.step", f"{SITE}/optim/lbfgs.py", 300),
        Frame("closure", "/home/u/train.py", 30),
        Frame("Module._wrapped_call_impl", f"{SITE}/nn/modules/module.py", 1736),
        Frame("Net.forward", "/home/u/train.py", 12),
    )
    assert stacks.phase(frames) == "forward"


def test_pin_memory() -> None:
    frames = (
        MOD,
        Frame("_BaseDataLoaderIter.__next__", DL, 725),
        Frame("_SingleProcessDataLoaderIter._next_data", DL, 790),
        Frame("pin_memory", f"{SITE}/utils/data/_utils/pin_memory.py", 60),
    )
    assert stacks.phase(frames) == "data"
    assert stacks.data_part(frames) == "pin"


def test_worker_start_and_windows_paths() -> None:
    win = "C:\\py\\Lib\\site-packages\\torch\\utils\\data\\dataloader.py"
    frames = (
        MOD,
        Frame("DataLoader.__iter__", win, 505),
        Frame("DataLoader._get_iterator", win, 438),
        Frame("_MultiProcessingDataLoaderIter.__init__", win, 1176),
    )
    assert stacks.phase(frames) == "data"
    assert stacks.data_part(frames) == "start"


def test_plain_user_code_is_other() -> None:
    assert stacks.phase((MOD, Frame("log_metrics", "/home/u/train.py", 3))) == "other"
    assert stacks.data_part(()) is None


def test_top_frame_skips_library() -> None:
    user = Frame("D.__getitem__", "/home/u/data.py", 7)
    frames = (MOD, user, Frame("open", "/usr/lib/python3.11/site-packages/PIL/Image.py", 3))
    assert stacks.top_frame(frames) == user
    assert stacks.top_frame(frames, skip_library=False) == frames[-1]
    assert stacks.top_frame(()) is None


# --- explain_failure ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stderr",
    [
        "Error: Permission Denied (os error 13)",
        "Error: Operation not permitted (os error 1)",
    ],
)
def test_permission_denied_hint(stderr: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspy, "_ptrace_scope", lambda: 1)
    st = explain_failure(stderr, 4242)
    assert st.status is Status.UNAVAILABLE
    assert "4242" in (st.reason or "") and "permission denied" in (st.reason or "")
    assert "CAP_SYS_PTRACE" in (st.hint or "")
    assert "ptrace_scope" in (st.hint or "")


def test_permission_denied_without_yama(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspy, "_ptrace_scope", lambda: None)
    st = explain_failure("permission denied", 1)
    assert "CAP_SYS_PTRACE" in (st.hint or "") and "ptrace_scope" not in (st.hint or "")


def test_no_python_interpreter() -> None:
    st = explain_failure("Error: Failed to find python version from target process", 7)
    assert st.status is Status.UNAVAILABLE
    assert "no Python interpreter" in (st.reason or "") and "7" in (st.reason or "")
    assert st.hint


def test_other_failure_quotes_first_line() -> None:
    st = explain_failure("\n  boom: something odd\nmore\n", 7)
    assert st.reason == "py-spy failed: boom: something odd"
    assert explain_failure("", 7).reason == "py-spy failed: no output"


def _record_in_thread(src: pyspy.PySpySource, pid: int) -> tuple[threading.Thread, list[list[object]]]:
    got: list[list[object]] = []
    th = threading.Thread(target=lambda: got.append(src.sample(time.monotonic(), pid)))
    th.start()
    return th, got


@pytest.mark.skipif(pyspy.find_pyspy() is None, reason="py-spy not installed")
def test_a_chunk_cut_short_returns_what_py_spy_sampled_so_far() -> None:
    """Going back to the fast cadence ends a long steady chunk at once: py-spy writes its samples
    on SIGINT."""
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(10000))"])
    try:
        src = pyspy.PySpySource(lambda pid: Role.MAIN, lambda: True, rate=20, chunk=30.0)
        src._first = False  # a steady chunk of 30 s, not the short first one
        th, got = _record_in_thread(src, target.pid)
        time.sleep(3.0)
        t0 = time.monotonic()
        src.cut_short()
        th.join(15)
        assert not th.is_alive() and time.monotonic() - t0 < 15
        assert got and got[0] and all(isinstance(s, StackSample) and s.pid == target.pid for s in got[0])
        assert src.status.status is Status.OK and src._failures == 0
    finally:
        target.kill()
        target.wait()


def test_a_chunk_cut_before_py_spy_wrote_anything_is_no_failure(tmp_path: Path) -> None:
    """SIGINT before py-spy set its handler ends it with nothing written: not counted toward the
    three failures that mark py-spy unavailable."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    src = pyspy.PySpySource(lambda pid: Role.MAIN, lambda: True, chunk=30.0, binary=str(fake))
    # Margins: measured beside one busy process on 2 CPUs (60 chunks), py-spy's process was there
    # 42 ms after the chunk began and the cut chunk returned 15 ms after cut_short(); 10 s is
    # hundreds of times that. Its CI failure was no load: the suite ran with SIGINT ignored, which
    # the fake py-spy inherited (it ran its 30 s out and the join gave up first).
    for _ in range(3):
        th, got = _record_in_thread(src, os.getpid())
        deadline = time.monotonic() + 10
        while src._proc is None and time.monotonic() < deadline:
            time.sleep(0.01)
        src.cut_short()
        th.join(10)
        assert got == [[]]
    assert src._failures == 0 and src.status.status is not Status.UNAVAILABLE
