"""Hostile hook files of any shape, type, size and kind: the reader gives a reason, never a
traceback, a hang or a large read.

The files are planted for a live process (this one) in its correctly named hook directory,
so every check runs: directory, file kind, owner, size, JSON, schema, process instance.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchwatch import wire
from torchwatch.model.readings import Status
from torchwatch.sources.hook import HookReader, HookSource

READ_CAP = 50 * 1024 * 1024  # the acceptance bound: never more than 50 MB read for one file


@contextlib.contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block takes longer than ``seconds``."""

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"reader blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class CountingReads:
    """Counts the bytes the reader reads (``os.read`` / ``os.pread`` in torchwatch.wire)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real_pread, real_read = os.pread, os.read

        def pread(fd: int, n: int, offset: int) -> bytes:
            data = real_pread(fd, n, offset)
            self.bytes += len(data)
            return data

        def read(fd: int, n: int) -> bytes:
            data = real_read(fd, n)
            self.bytes += len(data)
            return data

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "read", read)


def _valid_state() -> dict[str, Any]:
    me = wire.self_instance()
    last = {
        "id": 1,
        "mode": "steps",
        "started_at": 5.0,
        "steps": 3,
        "step_time_ms": 10.0,
        "breakdown_share": {"cpu_exec": 0.5, "other": 0.5},
        "top_cpu_ops": [{"name": "aten::mm", "self_ms": 1.0, "calls": 3}],
        "sync": {"calls_per_step": 0.0, "ms_per_step": 0.0},
    }
    return wire.HookRecord(
        me,
        "3.11",
        "2.13",
        1.0,
        int(signal.SIGUSR2),
        True,
        dataloaders=(wire.LoaderInfo(0, 8, False, None, False, None, "DS", "collate", 3, 0.1, 64),),
        burst=wire.BurstState(last=wire.BurstResult.decode(last, "last")),
    ).to_json()


@pytest.fixture
def hook_dir(tmp_path: Path) -> Path:
    d = tmp_path / wire.self_instance().dir_name
    d.mkdir(mode=0o700)
    return d


def _check_reader(d: Path, reads: CountingReads) -> HookReader:
    """Read ``d`` the way torchwatch does: every path ends in a result or a reason."""
    before = reads.bytes
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with watchdog(10):
        reader = HookReader(os.getpid(), d)
        reading = reader.read(time.monotonic())
        ok, why = reader.burst_possible()
        source = HookSource(expected=False)
        source._readers[os.getpid()] = reader
        source.sample(time.monotonic(), os.getpid())
    if reading is None:
        assert reader.reason and "\n" not in reader.reason
        assert source.status.status is not Status.OK and source.status.reason
    assert why and "\n" not in why and (ok or why)
    assert reads.bytes - before <= 2 * READ_CAP
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < READ_CAP // 1024  # KiB
    return reader


def _write(d: Path, name: str, data: bytes) -> None:
    path = d / name
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), replacement=json_values)
def test_any_field_replaced_by_anything(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject, replacement: Any
) -> None:
    state = _valid_state()
    paths = _paths(state)[1:]
    path = data.draw(st.sampled_from(paths))
    node: Any = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = replacement
    _write(hook_dir, wire.STATE_FILE, json.dumps(state).encode())
    reader = _check_reader(hook_dir, CountingReads(monkeypatch))
    info = reader.info()
    if info is not None:  # accepted: then every string in it is printable
        for p in _paths(info):
            node = info
            for key in p:
                node = node[key]
            assert not isinstance(node, str) or node.isprintable()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_any_json_value_as_hook_json(hook_dir: Path, monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    _write(hook_dir, wire.STATE_FILE, json.dumps(value).encode())
    reader = _check_reader(hook_dir, CountingReads(monkeypatch))
    assert reader.info() is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=wire.COUNTERS_SIZE + 64), keep_header=st.booleans(), size=st.integers(0, 2))
def test_any_bytes_as_counters(
    hook_dir: Path, monkeypatch: pytest.MonkeyPatch, raw: bytes, keep_header: bool, size: int
) -> None:
    _write(hook_dir, wire.STATE_FILE, json.dumps(_valid_state()).encode())
    if keep_header:  # a valid header of this process, then anything
        fd = os.open(hook_dir, os.O_RDONLY | os.O_DIRECTORY)
        c = wire.Counters(fd, wire.self_instance())
        os.close(fd)
        body = bytearray(bytes(c._mm))
        c.close()
        body[wire.HEADER.size - len(raw[:48]) : wire.HEADER.size] = raw[:48]
        raw = bytes(body)[: [wire.COUNTERS_SIZE, len(raw) + 100, wire.COUNTERS_SIZE + 8][size]]
    _write(hook_dir, wire.COUNTERS_FILE, raw)
    _check_reader(hook_dir, CountingReads(monkeypatch))


def _kinds(d: Path, name: str) -> Iterator[str]:
    """Plant ``name`` as each hostile kind of file in turn; yields the kind's label."""
    path = d / name

    def clear() -> None:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            path.rmdir()
        elif path.exists():
            path.unlink()

    for label, make in (
        ("symlink to /dev/zero", lambda: path.symlink_to("/dev/zero")),
        ("symlink to /etc/shadow", lambda: path.symlink_to("/etc/shadow")),
        ("dangling symlink", lambda: path.symlink_to(d / "nowhere")),
        ("fifo", lambda: os.mkfifo(path)),
        ("directory", lambda: path.mkdir()),
        ("sparse 100 MB", lambda: (path.write_bytes(b""), os.truncate(path, 100 * 1024 * 1024))),
        ("deep nesting", lambda: path.write_bytes(b"[" * 200_000 + b"]" * 200_000)),
        ("deep objects", lambda: path.write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)),
        ("not utf-8", lambda: path.write_bytes(b"\xff\xfe{}")),
        ("empty", lambda: path.write_bytes(b"")),
        ("char device", lambda: os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))),
        ("world-writable file", lambda: (path.write_bytes(b"{}"), os.chmod(path, 0o666))),
    ):
        clear()
        try:
            make()
        except PermissionError:
            continue  # mknod needs root
        yield label
    clear()


@pytest.mark.parametrize("name", [wire.STATE_FILE, wire.COUNTERS_FILE])
def test_hostile_file_kinds(hook_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    if name == wire.COUNTERS_FILE:
        _write(hook_dir, wire.STATE_FILE, json.dumps(_valid_state()).encode())
    reads = CountingReads(monkeypatch)
    seen = []
    for label in _kinds(hook_dir, name):
        reader = _check_reader(hook_dir, reads)
        assert reader.read(time.monotonic()) is None, label
        seen.append(label)
    assert "fifo" in seen and "symlink to /dev/zero" in seen and "sparse 100 MB" in seen


def test_hostile_directory_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = wire.self_instance().dir_name
    reads = CountingReads(monkeypatch)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / wire.STATE_FILE).write_text(json.dumps(_valid_state()))
    d = tmp_path / name
    d.symlink_to(real)  # a symbolic link to a directory that holds a valid hook.json
    assert "symbolic link" in _check_reader(d, reads).reason
    d.unlink()
    d.write_text("a file")
    assert "not a directory" in _check_reader(d, reads).reason
    d.unlink()
    real.rename(d)
    os.chmod(d, 0o777)  # writable by anyone: anyone could have swapped its files
    assert "writable by other users" in _check_reader(d, reads).reason
    os.chmod(d, 0o700)
    assert _check_reader(d, reads).info() is not None  # and the same directory, private, is read
