"""What ``run`` and ``attach`` share: load rules, start a session, drive the TUI or the headless loop, report."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from torchwatch import report
from torchwatch.errors import TorchwatchError
from torchwatch.rules_engine import load_rules
from torchwatch.session import Session, SessionOptions
from torchwatch.target import check_attachable, check_command, exit_status, launch, stop_tree

STATUS_EVERY_S = 10.0  # headless: a status line at least this often, and on every label change


@dataclass
class WatchOptions:
    """Options common to ``run`` and ``attach`` (see ``torchwatch run --help``)."""

    headless: bool = False
    duration: float | None = None
    json_path: str | None = None
    rules_dirs: list[Path] = field(default_factory=list)
    window: float = 10.0
    trace: Path | None = None
    hook: bool = True
    burst_at: tuple[int, ...] = ()
    fail_on: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchOptions:
        """Options from the parsed ``run`` / ``attach`` arguments."""
        return cls(
            args.headless,
            args.duration,
            args.json,
            list(args.rules),
            args.window,
            args.trace,
            hook=not getattr(args, "no_hook", False),
            burst_at=tuple(getattr(args, "burst_at", None) or ()),
            fail_on=tuple(args.fail_on or ()),
        )

    def session_options(self, launched: bool = False) -> SessionOptions:
        """The :class:`SessionOptions` these options ask for (``launched``: by ``run``)."""
        return SessionOptions(window_s=self.window, trace_path=self.trace, hook_expected=launched and self.hook)


FAIL_ON_EXIT = 3  # --fail-on matched (the command itself succeeded)


def hook_env(burst_at: tuple[int, ...] = ()) -> dict[str, str]:
    """The environment that pre-loads the hook in a launched training (``boot/sitecustomize.py``).

    ``TORCHWATCH_HOOK_PATH`` lets an interpreter without torchwatch installed still load it.
    """
    import torchwatch
    import torchwatch.hook

    env = dict(os.environ)
    boot = str(Path(torchwatch.hook.__file__).parent / "boot")
    env["PYTHONPATH"] = boot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHWATCH_HOOK"] = "1"
    env["TORCHWATCH_HOOK_PATH"] = str(Path(torchwatch.__file__).parent.parent)
    if burst_at:
        env["TORCHWATCH_BURST_AT"] = ",".join(str(s) for s in burst_at)
    return env


def _check_json_path(path: str | None) -> None:
    if path in (None, "-"):
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise TorchwatchError(
            f"cannot write the JSON report to {path}: {parent} is not a writable directory",
            "give --json a path in an existing, writable directory",
        )


def run_command(cmd: Sequence[str], opts: WatchOptions) -> int:
    """``torchwatch run``: start ``cmd``, watch it, report; returns the command's exit status.

    Raises:
        TorchwatchError: bad rules, unwritable ``--json`` path, command not found.
    """
    rules = load_rules(opts.rules_dirs)
    _check_json_path(opts.json_path)
    check_command(cmd)
    log_path: Path | None = None
    env = hook_env(opts.burst_at) if opts.hook else None
    if opts.headless:
        child = launch(cmd, env=env)
    else:
        # The TUI owns the terminal: the training's output goes to a log shown when the app exits.
        log_dir = Path(tempfile.mkdtemp(prefix="torchwatch-"))
        log_path = log_dir / "training.log"
        with open(log_path, "wb") as log:
            child = launch(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        session = Session(child.pid, rules, opts.session_options(launched=True))
    except psutil.NoSuchProcess:
        code = exit_status(child.wait())
        print(f"torchwatch: {cmd[0]} exited (status {code}) before it could be watched", file=sys.stderr)
        return code
    session.start()
    status = _drive(session, child, opts, log_path)
    code = status if status is not None else 0
    # --fail-on decides unless the command failed by itself (not stopped by --duration or q)
    if (code == 0 or session.stopped_target) and _failed_on(session, opts):
        return FAIL_ON_EXIT
    return code


def attach_pid(pid: int, opts: WatchOptions) -> int:
    """``torchwatch attach``: watch a running process until it exits, ``--duration`` or Ctrl-C.

    Raises:
        TorchwatchError: see :func:`torchwatch.target.check_attachable`.
    """
    rules = load_rules(opts.rules_dirs)
    _check_json_path(opts.json_path)
    check_attachable(pid)
    try:
        session = Session(pid, rules, opts.session_options())
    except psutil.NoSuchProcess:
        raise TorchwatchError(f"PID {pid} exited while attaching", "start the training again") from None
    session.start()
    _drive(session, None, opts, None)
    return FAIL_ON_EXIT if _failed_on(session, opts) else 0


def _failed_on(session: Session, opts: WatchOptions) -> bool:
    """``--fail-on``: whether the final verdict is one of the labels named (says so on stderr)."""
    if not opts.fail_on:
        return False
    label = session.final().verdict.label
    if label in opts.fail_on:
        print(
            f"torchwatch: verdict {label} is in --fail-on ({','.join(opts.fail_on)}): exit {FAIL_ON_EXIT}",
            file=sys.stderr,
        )
        return True
    return False


def _drive(
    session: Session, child: subprocess.Popen[bytes] | None, opts: WatchOptions, log_path: Path | None
) -> int | None:
    """Watch until the end, write the reports; returns the child's exit status (run) or None."""
    start = time.monotonic()
    code: int | None = None
    try:
        if opts.headless:
            code = _headless(session, child, opts, start)
        else:
            from torchwatch.tui.app import WatchApp

            app = WatchApp(session, child=child, duration=opts.duration, log_path=log_path)
            app.run()
            if child is not None:
                if child.poll() is not None:
                    code = exit_status(child.returncode)
                elif app.stop_training:  # "y" at the quit question, or --duration ran out
                    session.stopped_target = True
                    code = stop_tree(child, session.tree)
                else:  # "n": the user left the training running
                    print(
                        f"torchwatch: the training (PID {child.pid}) keeps running; its output goes to {log_path}",
                        file=sys.stderr,
                    )
                    code = None
    except KeyboardInterrupt:
        if child is not None:
            # Ctrl-C reached the training too (same process group): give it time to stop itself.
            code = stop_tree(child, session.tree, grace_s=10.0, interrupt=False)
    finally:
        session.stop()
    if log_path is not None:
        _show_log(log_path)
    _write_reports(session, child, code, opts, time.monotonic() - start)
    return code


def _headless(session: Session, child: subprocess.Popen[bytes] | None, opts: WatchOptions, start: float) -> int | None:
    last_label, last_print = None, 0.0
    while True:
        now = time.monotonic()
        if child is not None and child.poll() is not None:
            return exit_status(child.returncode)
        if child is None and session.target_gone:
            return None
        if opts.duration is not None and now - start >= opts.duration:
            if child is None:
                return None
            session.stopped_target = True
            return stop_tree(child, session.tree)
        analysis = session.latest
        label = analysis.verdict.label if analysis else None
        if label != last_label or now - last_print >= STATUS_EVERY_S:
            print(report.status_line(analysis, now - start), file=sys.stderr, flush=True)
            last_label, last_print = label, now
        time.sleep(0.25)


def _show_log(path: Path, lines: int = 40) -> None:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    if text:
        sys.stdout.write("\n".join(text[-lines:]) + "\n")
        print(f"torchwatch: the training's output ({len(text)} lines) is in {path}", file=sys.stderr)


def _write_reports(
    session: Session, child: subprocess.Popen[bytes] | None, code: int | None, opts: WatchOptions, watched_s: float
) -> None:
    analysis = session.final()
    pid = child.pid if child is not None else session.tree.root
    node = session.tree.nodes().get(session.main_pid or pid) or session.tree.nodes().get(pid)
    cmdline = [str(a) for a in child.args] if child is not None else list(node.cmdline if node else ())  # type: ignore[union-attr]
    data = report.build(
        analysis,
        session.statuses(),
        pid=pid,
        cmdline=cmdline,
        exit_code=code,
        window_s=session.options.window_s,
        watched_s=watched_s,
        history=session.history,
        own_usage=session.own_usage(),
        hook=session.hook_summary(),
    )
    text = report.render_text(data)
    if opts.json_path == "-":
        print(text, file=sys.stderr)
        print(report.dumps(data))
    else:
        print(text, flush=True)
        if opts.json_path:
            try:
                Path(opts.json_path).expanduser().write_text(report.dumps(data) + "\n")
            except OSError as exc:
                print(f"torchwatch: error: cannot write {opts.json_path}: {exc.strerror or exc}", file=sys.stderr)
