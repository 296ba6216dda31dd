"""The lock that runs ``quiet`` tests alone across xdist workers (tests/quiet.py): each holder here
is its own ``quiet.Lock`` (its own open files, as each worker has), in threads of this process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import quiet


@pytest.fixture
def lock_dir() -> Iterator[Path]:
    path = quiet.make_dir()
    yield path
    quiet.remove_dir(path)


def _hold(lock: quiet.Lock, is_quiet: bool, name: str, events: list[str], release: threading.Event) -> None:
    with lock.hold(is_quiet):
        events.append(f"{name} in")
        release.wait(10)
        events.append(f"{name} out")


def _start(lock_dir: Path, is_quiet: bool, name: str, events: list[str]) -> tuple[threading.Thread, threading.Event]:
    release = threading.Event()
    thread = threading.Thread(target=_hold, args=(quiet.Lock(lock_dir), is_quiet, name, events, release), daemon=True)
    thread.start()
    return thread, release


def _until(events: list[str], entry: str) -> None:
    deadline = time.monotonic() + 5
    while entry not in events:
        assert time.monotonic() < deadline, events
        time.sleep(0.01)


def test_tests_that_are_not_quiet_run_together(lock_dir: Path) -> None:
    events: list[str] = []
    a, release_a = _start(lock_dir, False, "a", events)
    b, release_b = _start(lock_dir, False, "b", events)
    _until(events, "a in")
    _until(events, "b in")  # both inside at once
    release_a.set()
    release_b.set()
    a.join(5)
    b.join(5)
    assert sorted(events) == ["a in", "a out", "b in", "b out"]


def test_a_quiet_test_waits_for_the_running_ones_and_no_new_one_starts_before_it(lock_dir: Path) -> None:
    """A running test; a quiet one waits for it; a test asked for after the quiet one waits for the
    quiet one to end (it does not overtake: a quiet test never starves behind short tests)."""
    events: list[str] = []
    a, release_a = _start(lock_dir, False, "a", events)
    _until(events, "a in")
    q, release_q = _start(lock_dir, True, "q", events)
    time.sleep(0.2)
    b, release_b = _start(lock_dir, False, "b", events)
    time.sleep(0.3)
    assert events == ["a in"], events  # q waits for a, b waits behind q
    release_a.set()
    _until(events, "q in")
    time.sleep(0.2)
    assert "b in" not in events  # q runs alone
    release_q.set()
    _until(events, "b in")
    release_b.set()
    for t in (a, q, b):
        t.join(5)
    assert events == ["a in", "a out", "q in", "q out", "b in", "b out"]


def test_a_lock_held_by_a_holder_that_goes_away_is_released(lock_dir: Path) -> None:
    """A worker that dies releases what it held (its files close): the next quiet test runs."""
    first = quiet.Lock(lock_dir)
    cm = first.hold(True)
    cm.__enter__()
    events: list[str] = []
    q, release_q = _start(lock_dir, True, "q", events)
    time.sleep(0.2)
    assert events == []
    first.close()  # as a dying worker's files close
    _until(events, "q in")
    release_q.set()
    q.join(5)
    with contextlib.suppress(OSError):  # its files are closed: nothing left to release
        cm.__exit__(None, None, None)


INNER = """
import json, os, time
import pytest

def _record(name):
    start = time.monotonic()
    time.sleep(0.4)
    with open(os.environ["QUIET_LOG"], "a") as f:
        f.write(json.dumps([name, start, time.monotonic(), os.environ.get("OMP_NUM_THREADS")]) + "\\n")

@pytest.mark.quiet
@pytest.mark.parametrize("i", range(3))
def test_quiet(i):
    _record(f"quiet{i}")

@pytest.mark.parametrize("i", range(12))
def test_other(i):
    _record(f"other{i}")
"""


def test_a_real_xdist_session_runs_quiet_tests_alone_and_the_others_side_by_side(tmp_path: Path) -> None:
    """The suite's own hooks (tests/conftest.py) in a small pytest -n 3 session: no test runs
    while a quiet one does, the quiet ones run as one block, the others overlap, and only the
    others get one OpenMP thread."""
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    quiet: alone\n")
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER")}
    env.update(QUIET_LOG=str(log), PYTHONPATH=str(repo))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup"]
    proc = subprocess.run(
        [*command, "test_inner.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 15, runs
    quiet_runs = [r for r in runs if r[0].startswith("quiet")]
    others = [r for r in runs if r[0].startswith("other")]
    for name, start, end, _ in quiet_runs:
        overlapping = [r[0] for r in runs if r[0] != name and r[1] < end and r[2] > start]
        assert overlapping == [], (name, overlapping)
    # one block: no other test runs between the first quiet test's start and the last one's end
    block = (min(r[1] for r in quiet_runs), max(r[2] for r in quiet_runs))
    assert [r[0] for r in others if r[1] < block[1] and r[2] > block[0]] == [], (block, others)
    side_by_side = sum(1 for a in others for b in others if a[0] < b[0] and a[1] < b[2] and b[1] < a[2])
    assert side_by_side >= 3, others
    assert {r[3] for r in quiet_runs} == {None} and {r[3] for r in others} == {"1"}, runs


class _Item:
    """What ``tests.conftest._order`` reads of a collected test: its node id and its markers."""

    def __init__(self, nodeid: str, quiet_: bool = False) -> None:
        self.nodeid = nodeid
        self._quiet = quiet_

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "quiet" and self._quiet else None


def test_the_suite_sends_the_quiet_block_first_then_the_lead_in_then_the_rest_in_its_order() -> None:
    """The order the suite's tests are sent in (tests/conftest.py), and xdist told to keep it: with
    its default reorder it sends the largest groups first (a 60 s compile group among them), and
    the quiet block waited behind them."""
    from tests import conftest

    lead = conftest.LEAD_IN
    items = [
        _Item("tests/integration/test_compile.py::test_a"),
        _Item("tests/unit/test_x.py::test_b"),
        _Item(f"{lead}::test_c"),
        _Item("tests/integration/test_demos.py::test_d", quiet_=True),
        _Item(f"{lead}::test_e"),
        _Item("tests/integration/test_ranks.py::test_f", quiet_=True),
    ]
    items.sort(key=conftest._order)  # type: ignore[arg-type]
    assert [i.nodeid.rsplit("::", 1)[1] for i in items] == ["test_d", "test_f", "test_c", "test_e", "test_a", "test_b"]
    root = Path(__file__).resolve().parents[2]
    assert (root / lead).is_file(), lead
    addopts = re.search(r'^addopts = "(.*)"$', (root / "pyproject.toml").read_text(), re.M)
    assert addopts is not None and "--no-loadscope-reorder" in addopts.group(1).split()
