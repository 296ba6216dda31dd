"""Issue 38: root must not write where a watched user points, nor show the user's text raw.

torchwatch runs as root on other users' trainings. Each test reproduces one finding of the
security pass and checks it no longer works: output files (``--log-file``, ``--trace``, the hang
record) reached through a planted link or a directory another user can change; target text (a
frame's name, a command line, a process name) reaching a log as a line of its own, the terminal
as an escape sequence or the TUI as markup; the metrics server and ``serve`` made to spend
without bound; a hook directory pre-created by another user; ``rules check`` on a FIFO or
``/dev/zero``; ``compare`` on mistyped reports. Cross-user cases run as real throw-away users
(``make_user``, root only); every process a test starts is ended in a ``finally``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import users
from tests.unit.hangs import _reading, _view
from tests.unit.reports import analysed, features, observation
from torchwatch.cli import configure_logging, main
from torchwatch.cli.drive import _emit, _write_hang_file, check_trace_path
from torchwatch.faces import report
from torchwatch.faces.headless import status_line
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.readings import Role, Status
from torchwatch.sources.hook import HookSource
from torchwatch.sources.proc import TreeNode
from torchwatch.sources.pyspy import dump_threads
from torchwatch.watch.discover import find_trainings, loads_torch
from torchwatch.watch.fleet import Fleet
from torchwatch.watch.hang import HangRecorder
from torchwatch.watch.observe import target_view

MakeUser = Callable[[], users.User]
REPO = Path(__file__).resolve().parents[2]
# a command line and a frame name as an attacker would write them: an OSC title, a screen clear, a
# forged log record on a line of its own
EVIL = "\x1b]0;pwned\x07\x1b[2J"
FORGED = "\n1999-01-01 00:00:00,000 CRITICAL 1 MainThread torchwatch: FORGED"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh directory under /tmp that every user can reach (mode 1777, like /tmp)."""
    d = Path(tempfile.mkdtemp(prefix="tw-out-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def secret() -> Iterator[Path]:
    """A root-only file (0600) an attacker would like root to append to."""
    d = Path(tempfile.mkdtemp(prefix="tw-root-", dir="/tmp"))
    path = d / "root-only"
    path.write_text("root's\n")
    os.chmod(path, 0o600)
    yield path
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def quiet_logging() -> Iterator[None]:
    """Whatever a test configures, torchwatch's logging goes back to stderr after it."""
    yield
    configure_logging(False, None)


def _as(user: users.User, *args: str) -> None:
    r = user.run(list(args))
    assert r.returncode == 0, r.stderr


def _users_dir(user: users.User, parent: Path, name: str = "theirs") -> Path:
    """A directory of ``user`` (0755) under ``parent``."""
    d = parent / name
    _as(user, "mkdir", "-m", "0755", str(d))
    return d


def _unchanged(path: Path) -> bool:
    st = path.stat()
    return path.read_text() == "root's\n" and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)


def _stop(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(10)


# -- --log-file and --trace: never through a link, never in another user's directory ---------------
def test_log_file_through_a_link_another_user_planted_is_refused(
    make_user: MakeUser, shared_tmp: Path, secret: Path, capsys: pytest.CaptureFixture[str], quiet_logging: None
) -> None:
    """The reported case: the training's user plants ``log -> root-only file`` in its directory."""
    other = make_user()
    theirs = _users_dir(other, shared_tmp)
    _as(other, "ln", "-s", str(secret), str(theirs / "tw.log"))
    assert main(["-v", "--log-file", str(theirs / "tw.log"), "rules", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the log" in err and f"uid {other.uid}" in err
    assert _unchanged(secret)


def test_log_file_refusals_say_why_and_a_good_path_gets_a_private_file(
    make_user: MakeUser, shared_tmp: Path, secret: Path, tmp_path: Path, quiet_logging: None
) -> None:
    other = make_user()
    theirs = _users_dir(other, shared_tmp)
    _as(other, "ln", "-s", str(secret.parent), str(shared_tmp / "dirlink"))  # a link on the way, theirs
    _as(other, "touch", str(shared_tmp / "precreated.log"))  # the name taken first in a sticky /tmp
    os.symlink(secret, tmp_path / "mine.log")  # a link even in root's own directory
    cases = {
        theirs / "new.log": f"belongs to uid {other.uid}",
        shared_tmp / "dirlink" / "root-only": f"symbolic link of uid {other.uid}",
        shared_tmp / "precreated.log": "",  # another user's file (or EACCES from fs.protected_regular)
        tmp_path / "mine.log": "is a symbolic link",
    }
    for path, why in cases.items():
        with pytest.raises(TorchwatchError) as info:
            configure_logging(False, path)
        assert why in info.value.message, (path, info.value.message)
    assert _unchanged(secret)
    good = tmp_path / "tw.log"
    configure_logging(False, good)
    logging.getLogger("torchwatch.test").warning("one record")
    configure_logging(False, None)  # closes the file
    assert stat.S_IMODE(good.stat().st_mode) == 0o600 and good.read_text().count("one record") == 1


def test_trace_path_refuses_a_link_and_another_users_directory(
    make_user: MakeUser, shared_tmp: Path, secret: Path, tmp_path: Path
) -> None:
    other = make_user()
    theirs = _users_dir(other, shared_tmp)
    _as(other, "ln", "-s", str(secret), str(theirs / "trace.jsonl"))
    os.symlink(secret, tmp_path / "trace.jsonl")
    for path in (theirs / "trace.jsonl", tmp_path / "trace.jsonl", theirs / "fresh.jsonl"):
        with pytest.raises(TorchwatchError, match="cannot write the trace"):
            check_trace_path(path)
    assert _unchanged(secret)
    check_trace_path(tmp_path / "ok.jsonl")
    assert stat.S_IMODE((tmp_path / "ok.jsonl").stat().st_mode) == 0o600


def test_json_report_in_another_users_directory_is_refused_before_watching(
    make_user: MakeUser, shared_tmp: Path
) -> None:
    other = make_user()
    theirs = _users_dir(other, shared_tmp)
    with pytest.raises(TorchwatchError, match=f"belongs to uid {other.uid}"):
        report.check_json_path(str(theirs / "r.json"))


def test_files_follow_a_link_of_root_on_the_way(tmp_path: Path) -> None:
    """A link that only root (or the caller) can change is followed (``/var/run -> /run``)."""
    from torchwatch.model import files

    real = tmp_path / "real"
    real.mkdir()
    os.symlink("real", tmp_path / "alias")
    os.close(files.open_append(tmp_path / "alias" / "x.log"))
    files.write_atomic(tmp_path / "alias" / "r.json", "{}\n", 0o600)
    assert (real / "x.log").exists() and (real / "r.json").read_text() == "{}\n"


# -- the hang record: 0600, and a frame's name never makes a log line of its own ----------------------
def test_the_hang_file_is_private(tmp_path: Path) -> None:
    obs = types.SimpleNamespace(hang=_view())
    _write_hang_file(obs, tmp_path / "r.json")  # type: ignore[arg-type]
    assert stat.S_IMODE((tmp_path / "r.hang.txt").stat().st_mode) == 0o600


TARGET = f"""
import time
src = "def f():\\n    print('ready', flush=True)\\n    while True:\\n        time.sleep(0.05)\\n"
ns = {{"time": time}}
exec(compile(src, {("train" + EVIL + ".py")!r}, "exec"), ns)
f = ns["f"]
name = {("step" + FORGED)!r}
f.__code__ = f.__code__.replace(co_name=name, co_qualname=name)
f()  # says "ready" from inside f: the dump that follows finds it on the stack
"""


class _OneTrainingTree:
    """A process tree of one training process (the hang recorder's view of it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def nodes(self) -> dict[int, TreeNode]:
        return {self.pid: TreeNode(self.pid, 1, Role.MAIN, "python", ("python",), 0.0)}

    def mains(self) -> list[int]:
        return [self.pid]

    def pids(self) -> list[int]:
        return [self.pid]


def test_a_frame_name_with_a_newline_stays_on_the_hang_recorders_log_line(
    make_user: MakeUser, tmp_path: Path, quiet_logging: None
) -> None:
    """Another user's training names a function ``step\\n<forged record>`` and its file with an
    escape sequence: py-spy's real dump of it reaches root's log as one escaped line."""
    other = make_user()
    target = other.popen([other.python(), "-c", TARGET], stdout=subprocess.PIPE)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        log_path = tmp_path / "tw.log"
        configure_logging(False, log_path)
        rec = HangRecorder(_OneTrainingTree(target.pid), started=0.0, hang_after=5.0, dump=dump_threads)  # type: ignore[arg-type]
        rec.feed([_reading(target.pid, 0, ((1.0, 0.1, 0.0),))])
        assert rec.check(6.5)
        rec.join(60.0)
        view = rec.view(7.0)
        configure_logging(False, None)
    finally:
        _stop(target)
    assert view is not None and view.state == "hang", view
    lines = log_path.read_text().splitlines()
    assert any("hang recorded:" in line and "FORGED" in line for line in lines), lines
    assert not any(line.startswith("1999-01-01") for line in lines), lines  # no forged record
    assert all("\x1b" not in line and "\x07" not in line for line in lines)
    frames = [f for d in view.dumps for t in d.threads for f in t.frames]
    assert any("\\n1999-01-01" in f.name for f in frames), frames
    assert all(f.name.isprintable() and f.filename.isprintable() for f in frames)


def test_log_records_are_one_line_each(tmp_path: Path, quiet_logging: None) -> None:
    path = tmp_path / "tw.log"
    configure_logging(False, path)
    log = logging.getLogger("torchwatch.test")
    log.warning("hang recorded: %s", "at step" + FORGED + EVIL)
    try:
        raise ValueError("bad frame" + FORGED)
    except ValueError:
        log.exception("failed")
    configure_logging(False, None)
    lines = path.read_text().splitlines()
    records = [ln for ln in lines if not ln.startswith(" ")]  # tracebacks are indented
    assert len(records) == 2 and not any(ln.startswith("1999-01-01") for ln in lines)
    assert all(ln.isprintable() for ln in lines)


# -- the terminal: a command line's escape sequences never reach it raw ---------------------------------
def test_a_command_lines_escapes_are_escaped_in_the_report_and_status_line() -> None:
    obs = observation(analysed(features(data_wait_share=0.9)))
    obs = dataclasses.replace(obs, target=target_view(4242, ("python", EVIL, FORGED), None, False))
    text = report.render_text(report.build(obs, watched_s=3.0))
    assert "\x1b" not in text and "\x07" not in text and "FORGED" in text
    assert not any(line.startswith("1999-01-01") for line in text.splitlines())
    data = json.loads(report.dumps(report.build(obs, watched_s=3.0)))
    assert "\x1b" not in json.dumps(data, ensure_ascii=False)

    class Stream:
        written = ""

        def write(self, s: str) -> None:
            self.written += s

        def flush(self) -> None:
            pass

    stream = Stream()
    _emit(status_line(obs, 3.0) + " " + EVIL, stream)  # type: ignore[arg-type]
    assert "\x1b" not in stream.written and "\\x1b]0;pwned" in stream.written


def test_attach_headless_prints_another_users_command_line_escaped(make_user: MakeUser) -> None:
    """The reported case, end to end: root attaches to another user's process whose argv holds
    an OSC sequence and a forged line; nothing of it reaches root's terminal raw."""
    other = make_user()
    target = other.popen(
        [other.python(), "-c", "import time; print('ready', flush=True); time.sleep(120)", EVIL, FORGED],
        stdout=subprocess.PIPE,
    )
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torchwatch",
                "attach",
                "--headless",
                "--no-inject",
                "--duration",
                "3",
                str(target.pid),
            ],
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
    finally:
        _stop(target)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout + done.stderr
    assert b"\x1b" not in out and b"\x07" not in out and b"\\x1b]0;pwned" in done.stdout
    assert not any(line.startswith(b"1999-01-01") for line in out.splitlines())


# -- the TUI: a process named [/x] is shown, not read as markup ----------------------------------------
def test_a_process_named_like_markup_does_not_crash_the_tui() -> None:
    from tests.unit.recorded import recorded_session
    from tests.unit.render import FakeChild, run
    from torchwatch.faces.tui.widgets import ProcessTable
    from torchwatch.model.observation import ProcessRow

    async def check(app: Any, pilot: Any) -> None:
        table = app.query_one(ProcessTable)
        table.processes = (ProcessRow(1, "main", "[/x]", 5.0, 512, 0.0, "R1", 1),)
        await pilot.pause()
        assert str(table.get_cell("1", "name")) == "[/x]"
        assert "[/x]" in str(app.query_one("#top").border_title)

    child = FakeChild()
    child.args = ["python", "[/x]", "[bold]"]
    app = run(recorded_session(), check, child=child)
    assert app.return_code in (None, 0)


# -- the metrics server: tests/unit/test_metrics_http.py -----------------------------------------------


# -- serve: stronger evidence, and caps per user and in all ------------------------------------------------
FAKE_TORCH = """
import mmap, os, sys, time
d = sys.argv[1]
maps = []
for name in ("libtorch.so", "libtorch_cpu.so", "libtorch_python.so"):
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(b"\\0" * 4096)
    with open(path, "rb") as f:
        maps.append(mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ))
print("ready", flush=True)
time.sleep(120)
"""


def test_a_process_mapping_files_named_like_libtorch_is_not_a_training(make_user: MakeUser, shared_tmp: Path) -> None:
    other = make_user()
    d = _users_dir(other, shared_tmp)
    fake = other.popen([other.python(), "-c", FAKE_TORCH, str(d)], stdout=subprocess.PIPE)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready"
        assert not loads_torch(fake.pid)
        assert fake.pid not in find_trainings()
    finally:
        _stop(fake)


SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"


def test_serve_watches_at_most_max_per_user_of_one_user_and_the_others_still(
    make_user: MakeUser, capsys: pytest.CaptureFixture[str]
) -> None:
    """One user starts more look-alikes than its share: the excess is left out (said once), and
    another user's training is still watched."""
    greedy, other = make_user(), make_user()
    procs: list[subprocess.Popen[str]] = []
    fleet = Fleet([], window_s=10.0)
    try:
        for user in (greedy,) * 5 + (other,):
            procs.append(user.popen([user.python(), "-c", SLEEPER], stdout=subprocess.PIPE))
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        found = {p.pid: psutil.Process(p.pid).create_time() for p in procs}
        started, _ = fleet.update(found)
        assert len([pid for pid in started if pid != procs[-1].pid]) == 4  # MAX_PER_USER, the default
        assert procs[-1].pid in started
        assert fleet.update(found) == ([], [])  # the one left out stays out while the places are taken
        assert capsys.readouterr().err.count("for now: 4 trainings of uid") == 1
    finally:
        fleet.stop()
        for p in procs:
            _stop(p)


# -- the hook directory another user made first: said, with the fix --------------------------------------
def test_a_hook_base_dir_another_user_created_first_is_reported_with_the_fix(
    make_user: MakeUser, shared_tmp: Path
) -> None:
    victim, other = make_user(), make_user()
    _as(other, "mkdir", "-m", "0755", str(shared_tmp / f"torchwatch-{victim.uid}"))
    training = victim.popen(
        [victim.python(), "-c", SLEEPER], stdout=subprocess.PIPE, env=victim.env(TMPDIR=str(shared_tmp))
    )
    try:
        assert training.stdout is not None and training.stdout.readline().strip() == "ready"
        source = HookSource(expected=True)
        source.sample(time.monotonic(), training.pid)
    finally:
        _stop(training)
    st = source.status
    assert st.status is Status.UNAVAILABLE, st
    assert f"torchwatch-{victim.uid} belongs to uid {other.uid}" in st.reason and "TORCHWATCH_DIR" in st.reason
    assert st.hint is not None and "TORCHWATCH_DIR" in st.hint
    assert "import torch" not in st.reason


# -- rules check: a FIFO never blocks, /dev/zero is never read -----------------------------------------
def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a runaway read dies here, not the machine


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "huge-sparse-file"])
def test_rules_check_refuses_what_is_not_a_rule_file_in_one_line(tmp_path: Path, kind: str) -> None:
    d = tmp_path / "rules"
    d.mkdir()
    bad = d / "bad.toml"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "dev-zero-link":
        os.symlink("/dev/zero", bad)
    else:
        with open(bad, "wb") as f:
            f.truncate(10 << 30)  # 10 GiB of nothing, on no disk
    done = subprocess.run(
        [sys.executable, "-m", "torchwatch", "rules", "check", str(d)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # a FIFO used to block forever: the timeout is the failure
        preexec_fn=_limited,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "bad rule file" in done.stderr and "Traceback" not in done.stderr


# -- compare: a report of the wrong types is one line naming the field, exit 2 ---------------------------
@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("verdict",), 3, "'verdict' is a number, expected an object"),
        (("verdict", "label"), 3, "'verdict.label' is a number"),
        (("target", "cmdline"), 5, "'target.cmdline' is a number, expected a list of strings"),
        (("feature_units",), ["s"], "'feature_units' is a list"),
        (("hook", "amp", "dtype"), 16, "'hook.amp.dtype' is a number"),
        (("hook", "step_time_ms"), "fast", "'hook.step_time_ms' is a string"),
        (("window",), 10, "'window' is a number"),
    ],
)
def test_compare_on_a_mistyped_report_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: tuple[str, ...], value: Any, field: str
) -> None:
    from tests.unit.reports import _report

    good = _report(2.0, 0, 0.9)
    bad = json.loads(json.dumps(good))
    holder = bad
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(good))
    b.write_text(json.dumps(bad))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "b.json" in err and "Traceback" not in err
    assert "internal error" not in err


def test_compare_shows_a_reports_command_line_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.reports import _report

    a, b = _report(2.0, 0, 0.9), _report(4.0, 1, 0.1)
    b["target"]["cmdline"] = ["python", EVIL, FORGED]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert main(["compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith("1999-01-01") for line in out.splitlines())
