"""bench/suite_cpu.py: reading process-accounting records and joining them to the tests that started
them (the benchmark's own unit tests, on made-up records)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("suite_cpu", REPO / "bench" / "suite_cpu.py")
assert _spec is not None and _spec.loader is not None
sc = importlib.util.module_from_spec(_spec)
sys.modules["suite_cpu"] = sc  # its dataclasses look their module up
_spec.loader.exec_module(sc)


def _record(pid: int, ppid: int, start: int, ticks: int, comm: str, version: int = 3) -> bytes:
    """One acct v3 record: ``ticks`` of user time (1/100 s; below 8192 a comp_t is the value itself)."""
    head = sc.ACCT_V3.pack(0, version, 0, 0, 0, 0, pid, ppid, start, 0.0, ticks, 0)
    return head + b"\0" * (48 - len(head)) + comm.encode().ljust(16, b"\0")


def test_comp_t_decodes_its_exponent() -> None:
    assert sc._comp_t(100) == 100
    assert sc._comp_t((1 << 13) | 5) == 40  # 5 x 8


def test_records_are_read_with_their_cpu_and_a_wrong_version_refused(tmp_path: Path) -> None:
    path = tmp_path / "acct"
    path.write_bytes(_record(10, 1, 1000, 350, "python") + _record(11, 10, 1001, 7, "py-spy"))
    procs = sc.read_acct(path)
    assert [(p.pid, p.ppid, p.start, p.cpu_s, p.comm) for p in procs] == [
        (10, 1, 1000, 3.5, "python"),
        (11, 10, 1001, 0.07, "py-spy"),
    ]
    path.write_bytes(_record(10, 1, 1000, 1, "python", version=2))
    with pytest.raises(ValueError, match="version 2"):
        sc.read_acct(path)


def test_each_process_is_joined_to_its_own_line_or_its_nearest_logged_ancestor(tmp_path: Path) -> None:
    log = tmp_path / "argv.log"
    log.write_text(
        "5\t1\t990.0\t-\tpython -c import sys;exec(eval(sys.stdin.readline()))\n"
        "10\t5\t1000.2\ttests/a.py::test_x (call)\tpython /r/demo/cpu_bound.py --seconds 9\n"
        # PID 10 reused later by another test's process: the start time tells them apart
        "10\t5\t1500.0\ttests/b.py::test_y (call)\tpython -m torchwatch run -- x\n"
    )
    procs = [
        sc.Proc(10, 5, 1000, 4.0, "python"),  # the demo
        sc.Proc(12, 10, 1002, 1.0, "pt_data_worker"),  # a fork of it (a DataLoader worker)
        sc.Proc(13, 12, 1003, 0.5, "py-spy"),  # a program below the fork
        sc.Proc(10, 5, 1500, 0.3, "python"),  # the reused PID
        sc.Proc(20, 5, 1600, 2.0, "python"),  # a fork of the xdist worker, which outlived the accounting
        sc.Proc(30, 99, 1700, 1.0, "python3.11"),  # nothing logged above it
    ]
    rows = {(p.pid, p.start): (test, kind) for p, test, kind in sc.attribute(procs, sc.read_log(log))}
    assert rows[(10, 1000)] == ("tests/a.py::test_x (call)", "training")
    assert rows[(12, 1002)] == ("tests/a.py::test_x (call)", "fork of training")
    assert rows[(13, 1003)] == ("tests/a.py::test_x (call)", "exe: py-spy")
    assert rows[(10, 1500)] == ("tests/b.py::test_y (call)", "torchwatch")
    assert rows[(20, 1600)] == ("-", "fork of pytest and its xdist workers (in-process tests)")
    assert rows[(30, 1700)] == ("-", "exe: python3.11")


def test_the_report_counts_starts_and_groups_by_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        (sc.Proc(1, 0, 0, 3.0, "python"), "tests/a.py::t1 (call)", "training"),
        (sc.Proc(2, 0, 0, 0.5, "python"), "tests/a.py::t2 (call)", "training"),
        (sc.Proc(3, 0, 0, 1.5, "py-spy"), "tests/b.py::t (call)", "exe: py-spy"),
    ]
    sc.report(rows, top=5)
    out = capsys.readouterr().out
    assert "3 processes, 5 CPU-s" in out
    assert "Python starts of >= 1 CPU-s (about one torch import each): 1 {'training': 1}" in out
    assert "     3.5  70.0 %  tests/a.py\n" in out
