"""The code injected into a target (torchwatch.inject.payload), run as top-level code of a fresh
interpreter's ``__main__`` (as PyRun_SimpleString runs it), and the reading of its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from torchwatch.inject import payload
from torchwatch.inject.injector import _Workdir

REPO = Path(__file__).resolve().parents[2]

# Runs the payload the way hypno does, then prints what an observer of __main__ would see.
RUNNER = textwrap.dedent(
    """
    import json, sys, time, __main__
    code = open(sys.argv[1]).read()
    before_names = set(vars(__main__))
    before_path = list(sys.path)
    exec(code, vars(__main__))
    time.sleep(float(sys.argv[2]))
    print(json.dumps({
        "new_names": sorted(set(vars(__main__)) - before_names - {"before_names", "before_path"}),
        "path_same": sys.path == before_path,
        "tw_modules": sorted(m for m in sys.modules if m.startswith("twpkg")),
    }))
    """
)


def _run(
    tmp_path: Path, module: str, function: str, thread: bool, pkg: str, deadline: float | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    params = {
        "out": str(out),
        "token": "t0k",
        "deadline": deadline if deadline is not None else time.time() + 30,
        "module": module,
        "function": function,
        "path": pkg,
        "thread": thread,
    }
    code = tmp_path / "code.py"
    code.write_text(payload.source(params))
    done = subprocess.run(
        [sys.executable, "-I", "-c", RUNNER, str(code), "0.5" if thread else "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, json.loads(done.stdout)


@pytest.fixture
def pkg(tmp_path: Path) -> str:
    """A package ``twpkg`` outside sys.path: ``ok()`` returns data, ``boom()`` raises, ``leave()`` exits."""
    root = tmp_path / "lib"
    (root / "twpkg").mkdir(parents=True)
    (root / "twpkg/__init__.py").write_text("")
    (root / "twpkg/entry.py").write_text(
        "import os, sys\n"
        "def ok():\n    return {'pid': os.getpid(), 'n': 3}\n"
        "def boom():\n    raise ValueError('no luck')\n"
        "def leave():\n    sys.exit(7)\n"
    )
    (root / "twpkg/broken.py").write_text("import twpkg.entry\nraise ImportError('half imported')\n")
    return str(root)


def _result(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "out" / payload.RESULT_FILE).read_text())
    return data


@pytest.mark.parametrize("thread", [False, True])
def test_success_reports_back_and_leaves_no_trace_in_main(tmp_path: Path, pkg: str, thread: bool) -> None:
    done, seen = _run(tmp_path, "twpkg.entry", "ok", thread, pkg)
    assert done.returncode == 0 and done.stderr == ""  # nothing written to the target's output
    assert seen["new_names"] == [] and seen["path_same"]
    r = _result(tmp_path)
    assert r["ok"] and r["token"] == "t0k" and r["value"]["n"] == 3 and r["main_thread"] is (not thread)
    assert r["module_file"].startswith(pkg)
    assert "twpkg.entry" in seen["tw_modules"]  # a success stays imported


@pytest.mark.parametrize(
    ("module", "function", "error"),
    [
        ("twpkg.entry", "boom", "ValueError: no luck"),
        ("twpkg.broken", "ok", "ImportError: half imported"),
        ("twpkg.entry", "leave", "SystemExit: 7"),
    ],
)
def test_a_failure_is_undone_reported_and_one_line_on_stderr(
    tmp_path: Path, pkg: str, module: str, function: str, error: str
) -> None:
    done, seen = _run(tmp_path, module, function, False, pkg)
    assert done.returncode == 0  # not even SystemExit ends the target
    assert seen["tw_modules"] == [] and seen["path_same"] and seen["new_names"] == []
    assert done.stderr.count("\n") == 1 and error in done.stderr
    r = _result(tmp_path)
    assert not r["ok"] and error in r["error"]


def test_late_or_abandoned_payload_does_nothing(tmp_path: Path, pkg: str) -> None:
    done, seen = _run(tmp_path, "twpkg.entry", "ok", False, pkg, deadline=time.time() - 1)
    assert done.stderr == "" and seen["tw_modules"] == []
    assert not (tmp_path / "out" / payload.RESULT_FILE).exists()


def test_a_planted_link_at_the_result_name_is_replaced_not_written_through(tmp_path: Path, pkg: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    out = tmp_path / "out"
    out.mkdir()
    (out / payload.RESULT_FILE).symlink_to(victim)
    done, _ = _run(tmp_path, "twpkg.entry", "ok", False, pkg)
    assert done.returncode == 0 and victim.read_text() == "untouched"
    assert not (out / payload.RESULT_FILE).is_symlink() and _result(tmp_path)["ok"]


def test_parameters_must_be_plain_values() -> None:
    with pytest.raises(TypeError):
        payload.source({"out": ["x"]})


def test_workdir_reads_only_a_regular_capped_file_of_the_target_user(tmp_path: Path) -> None:
    work = _Workdir(os.geteuid(), os.getegid(), str(tmp_path))
    try:
        res = work.out / payload.RESULT_FILE
        assert work.read_result() is None
        res.symlink_to(tmp_path / "elsewhere.json")
        (tmp_path / "elsewhere.json").write_text('{"ok": true}')
        assert work.read_result() is None  # not followed
        res.unlink()
        res.write_text("x" * (payload.MAX_RESULT_BYTES + 1))
        assert work.read_result() is None  # over the cap
        res.write_text("[1, 2]")
        assert work.read_result() is None  # not an object
        res.write_text('{"ok": true}')
        assert work.read_result() == {"ok": True}
        assert (os.stat(work.path).st_mode & 0o777) == 0o700  # same user: nothing opened to others
    finally:
        work.close()
    assert not work.path.exists()


def test_workdir_for_another_user_hands_over_only_out(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a directory to another user")
    work = _Workdir(65534, 65534, str(tmp_path))
    try:
        lib = work.write("payload.so", b"\x7fELF")
        assert (os.stat(work.path).st_mode & 0o777) == 0o711 and os.stat(work.path).st_uid == 0
        assert os.stat(work.out).st_uid == 65534 and (os.stat(work.out).st_mode & 0o777) == 0o700
        assert os.stat(lib).st_uid == 0 and (os.stat(lib).st_mode & 0o777) == 0o644
        (work.out / "other").write_text("left by the target")
    finally:
        work.close()
    assert (work.out / "other").exists()  # only what torchwatch expects is removed


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("import time; time.sleep(30)", "did not start within 0.5 s"),  # never says it is ready
        ("import sys; sys.exit(3)", "stopped as it started (exit status 3)"),
        ("print('hello', flush=True)", "stopped as it started"),  # not the ready line
    ],
)
def test_a_helper_that_does_not_say_it_is_ready_is_not_used_and_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, words: str
) -> None:
    from torchwatch.inject import injector

    fake = tmp_path / "helper.py"
    fake.write_text(script + "\n")
    monkeypatch.setattr(injector, "HELPER", fake)
    helper = injector._Helper()
    why = helper.start(timeout_s=0.5)
    assert why is not None and words in why, why
    assert helper.proc is None  # not used for an injection
    assert not injector._LEFT_TO_FINISH or all(p.args[-1] != str(fake) for p in injector._LEFT_TO_FINISH)


def test_the_real_helper_says_it_is_ready_before_the_first_request() -> None:
    from torchwatch.inject.injector import _Helper

    helper = _Helper()
    try:
        assert helper.start(timeout_s=60.0) is None
        proc = helper.proc
        assert proc is not None and proc.poll() is None
        assert helper.start() is None and helper.proc is proc  # started once, reused
    finally:
        helper.close()
    assert proc.poll() is not None
