"""``torchwatch run`` and ``attach``: load rules, start a session, drive the TUI or the headless loop, report.

How a watch ends decides torchwatch's exit status (the README's "Exit status" table):

- the training exits by itself: its own status (128+N when signal N ended it);
- torchwatch stops it as asked (``--duration``, ``q`` in the TUI), or leaves it running: 0;
- ``--fail-on`` matches the final verdict, and the status would otherwise be 0: 3;
- a stop signal to torchwatch (SIGINT, SIGTERM, SIGHUP): the training is stopped, the report
  written, then torchwatch ends by that signal (a shell sees 128+N; see :mod:`torchwatch.watch.lifecycle`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import psutil

from torchwatch.analysis.rules_engine import Rule, load_rules
from torchwatch.cli.injecting import Injected, detach_hook, inject_hook, inject_job, job_report
from torchwatch.cli.options import WatchOptions
from torchwatch.faces import hang, report
from torchwatch.faces import memory as memfaces
from torchwatch.faces.headless import status_line
from torchwatch.inject.injector import Injector
from torchwatch.model import files
from torchwatch.model.errors import EXIT_CANNOT_WATCH, EXIT_FAIL_ON, TorchwatchError, shell_status
from torchwatch.model.observation import Observation
from torchwatch.model.origin import Origin
from torchwatch.model.report import InjectionReport, MemoryReport
from torchwatch.model.text import terminal_safe
from torchwatch.watch.job import distinct_trainings, find_job, several_trainings_error
from torchwatch.watch.lifecycle import (
    Launched,
    StopSignals,
    hook_env,
    launch,
    needs_own_group,
    stop_launched,
    terminal_delivers_interrupts,
)
from torchwatch.watch.session import Session
from torchwatch.watch.target import check_attachable, check_command, check_proc_namespace

log = logging.getLogger(__name__)

STATUS_EVERY_S = 10.0  # headless: a status line at least this often, and on every label change
# headless: the loop looks for a new verdict this long after the analysis tick, by when the rules
# have run (an evaluation takes 2-5 ms of CPU on a small tree, measured with cProfile; more on a
# loaded machine, and a late one is only printed a tick later).
VERDICT_LAG_S = 0.05
# The hang record holds every thread's stack of every process (file names, function names, the
# training's own code): readable by whoever runs torchwatch only, as an ssh key is.
HANG_FILE_MODE = 0o600


@dataclass(frozen=True)
class Ending:
    """How watching ended.

    Attributes:
        by: a key of :data:`torchwatch.faces.report.ENDINGS` (``exit``, ``duration``, ``quit``,
            ``left running``, ``error``, or the name of the signal torchwatch got).
        code: the training's shell-style exit status, ``None`` when not known (attach) or running.
        unwritten: the ``--json`` report could not be written (the run then exits 1, "cannot
            watch", unless a signal or the training's own failure decides the status).
    """

    by: str
    code: int | None = None
    unwritten: bool = False

    @property
    def signal(self) -> int | None:
        """The stop signal that ended torchwatch, if one did."""
        return int(signal.Signals[self.by]) if self.by.startswith("SIG") else None


class Exporter:
    """``--prometheus``: the metrics server, rendering the watched session's latest Observation.

    It listens before the training starts (a port in use stops torchwatch with nothing started)
    and shows ``torchwatch_targets 0`` until :attr:`session` is set.

    Raises:
        TorchwatchError: the address cannot be bound (see :class:`~torchwatch.exposition.MetricsServer`).
    """

    def __init__(self, listen: tuple[str, int]) -> None:
        from torchwatch.exposition import MetricsServer
        from torchwatch.faces.prometheus import ObservationCollector

        self.session: Session | None = None
        self._origins: dict[int, Origin] = {}
        collector = ObservationCollector(self._latest, socket.gethostname(), self._origin)
        self.server = MetricsServer(collector, *listen)
        print(f"torchwatch: Prometheus metrics on {self.server.url}", file=sys.stderr)

    @classmethod
    def start(cls, listen: tuple[str, int] | None) -> Exporter | None:
        """An exporter on ``listen``, or ``None`` when ``--prometheus`` was not given."""
        return None if listen is None else cls(listen)

    def _latest(self) -> list[Observation | None]:
        session = self.session
        return [] if session is None else [session.latest_observation]

    def _origin(self) -> dict[int, Origin]:
        """The watched process's owner (uid, container, pod), read once, at the first scrape that has it."""
        obs = self.session.latest_observation if self.session is not None else None
        if obs is not None and obs.target.pid not in self._origins:
            from torchwatch.sources.origin import origin_of

            self._origins = {obs.target.pid: origin_of(obs.target.pid)}
        return self._origins


def check_trace_path(path: Path | None) -> None:
    """Check, before watching, that ``--trace PATH`` can be appended to (it is created, 0600, if
    missing), opened as the session will (:func:`torchwatch.model.files.open_append`).

    Raises:
        TorchwatchError: PATH is a directory, cannot be created or written, or is refused (a
            symbolic link, another user's file, a directory another user can change).
    """
    if path is None:
        return
    try:
        os.close(files.open_append(path.expanduser()))
    except OSError as exc:
        raise TorchwatchError(
            f"cannot write the trace to {path}: {exc.strerror or exc}",
            files.UNSAFE_HINT.format(option="--trace")
            if isinstance(exc, files.UnsafePath)
            else "give --trace a file path in an existing, writable directory",
        ) from None


def has_terminal() -> bool:
    """Whether the TUI can run: it reads keys from stdin and draws on stderr (Textual's choice)."""
    try:
        return sys.stdin is not None and sys.stderr is not None and sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _headless_without_terminal(opts: WatchOptions) -> WatchOptions:
    """The options to use: headless when no terminal can show the TUI (said in one line)."""
    if opts.headless or has_terminal():
        return opts
    print("torchwatch: no terminal for the TUI (stdin or stderr is not a TTY): running --headless", file=sys.stderr)
    return replace(opts, headless=True)


def run_command(cmd: Sequence[str], opts: WatchOptions, stops: StopSignals) -> int:
    """``torchwatch run``: start ``cmd``, watch it, report; returns torchwatch's exit status.

    Args:
        cmd: the command and its arguments.
        opts: the parsed options.
        stops: the stop signals torchwatch catches (installed by the caller).

    Raises:
        TorchwatchError: ``/proc`` is another PID namespace's, bad rules, unwritable ``--json`` or
            ``--trace`` path, command not found.
    """
    check_proc_namespace()  # before the training starts: no PID of it could be read
    rules = load_rules(opts.rules_dirs)
    report.check_json_path(opts.json_path)
    check_trace_path(opts.trace)
    check_command(cmd)
    opts = _headless_without_terminal(opts)
    with contextlib.ExitStack() as stack:
        exporter = Exporter.start(opts.prometheus)
        if exporter is not None:
            stack.callback(exporter.server.stop)
        return _run(cmd, rules, opts, stops, exporter)


def _run(
    cmd: Sequence[str], rules: list[Rule], opts: WatchOptions, stops: StopSignals, exporter: Exporter | None
) -> int:
    """:func:`run_command` once the checks passed: launch, watch, report."""
    with tempfile.TemporaryDirectory(prefix="torchwatch-boot-") as boot_dir:
        # where the hook's boot says why it could not load the hook (read by the hook source)
        note = Path(boot_dir) / "note" if opts.hook else None
        return _run_noted(cmd, rules, opts, stops, exporter, note)


def _run_noted(
    cmd: Sequence[str],
    rules: list[Rule],
    opts: WatchOptions,
    stops: StopSignals,
    exporter: Exporter | None,
    note: Path | None,
) -> int:
    log_path: Path | None = None
    env = hook_env(opts.burst_at, boot_note=note) if opts.hook else None
    if opts.headless:
        # With the JSON on stdout the training's stdout goes to stderr, so stdout stays valid JSON.
        child = launch(cmd, stdout=2 if opts.json_path == "-" else None, env=env, own_group=needs_own_group(False))
    else:
        # The TUI owns the terminal: the training's output goes to a log shown when the app exits.
        log_dir = Path(tempfile.mkdtemp(prefix="torchwatch-"))
        log_path = log_dir / "training.log"
        with open(log_path, "wb") as log_file:
            child = launch(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, own_group=True
            )
    try:
        session = Session(
            child.pid, rules, replace(opts.session_options(launched=True), hook_boot_note=note), child=child
        )
    except psutil.NoSuchProcess:
        code = shell_status(child.wait() or 0)
        child.close()
        print(f"torchwatch: {cmd[0]} exited (status {code}) before it could be watched", file=sys.stderr)
        return code
    if exporter is not None:
        exporter.session = session
    session.start()
    ending = _drive(session, child, opts, log_path, stops)
    return _exit_status(ending, session, opts)


def attach_pid(pid: int, opts: WatchOptions, stops: StopSignals) -> int:
    """``torchwatch attach``: watch a running process until it exits, ``--duration``, ``q`` or a signal.

    Unless ``--no-inject``, the hook is injected into the training first and taken out again at
    the end unless ``--keep-hook`` (:mod:`torchwatch.cli.injecting`); a refused or failed
    injection leaves one line on stderr and the watch goes on from outside.

    Raises:
        TorchwatchError: see :func:`torchwatch.watch.target.check_attachable`.
    """
    rules = load_rules(opts.rules_dirs)
    report.check_json_path(opts.json_path)
    check_trace_path(opts.trace)
    tree = check_attachable(pid)
    opts = _headless_without_terminal(opts)
    job = find_job(pid)
    if not job.is_job and pid not in tree.mains():
        trainings = distinct_trainings(tree, pid)
        if len(trainings) > 1:  # never pick one of several unrelated trainings silently
            raise several_trainings_error(pid, trainings)
    if job.is_job:
        print(job.line(), file=sys.stderr)
    with contextlib.ExitStack() as stack:
        exporter = Exporter.start(opts.prometheus)
        if exporter is not None:
            stack.callback(exporter.server.stop)
        injected: list[Injected] = []
        injector: Injector | None = None
        if opts.inject:
            injector = stack.enter_context(Injector())
            injector.warm_up()
            if job.is_job:
                injected = inject_job(injector, job)
            else:
                mains = tree.mains()
                into = pid if pid in mains or not mains else mains[0]
                injected = [inject_hook(injector, into)]
        started = {d.pid: _started(d.pid) for d in injected}
        try:
            # a hook just injected has not published yet: "starting", not "unavailable", until it does
            hooked = any(d.hooked for d in injected)
            session = Session(job.root, rules, replace(opts.session_options(), hook_expected=hooked))
        except psutil.NoSuchProcess:
            raise TorchwatchError(f"PID {job.root} exited while attaching", "start the training again") from None
        if job.kind == "mp.spawn" and job.launcher is not None:
            # the launcher has no hook to say which of its spawned children are ranks: attach found them
            session.tree.mark_spawned_ranks(job.launcher, [m.pid for m in job.ranks])
            session.tree.refresh()
        if job.is_job:
            injection: dict[str, Any] | None = job_report(job, injected, opts.inject)
        else:
            injection = injected[0].report() if injected else None
        if exporter is not None:
            exporter.session = session
        try:
            session.start()
            ending = _drive(session, None, opts, None, stops, injection)
        finally:
            if injector is not None and not opts.keep_hook:
                for d in injected:
                    if d.ours:
                        _take_out(injector, d.pid, started[d.pid])
    return _exit_status(ending, session, opts)


def _started(pid: int) -> float | None:
    """``pid``'s start time (psutil), ``None`` when it is gone: with the PID, who it is."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _take_out(injector: Injector, pid: int, started: float | None) -> None:
    """Detach the hook attach injected (one line on stderr), unless the training is gone: its PID
    exited, or now names another process (another start time)."""
    try:
        if psutil.Process(pid).create_time() != started:
            return
    except psutil.Error:
        return
    done, line, hint = detach_hook(injector, pid)
    text = f"torchwatch: {line}" + (f" (hint: {hint})" if hint else "")
    if not done:
        text += f"; to try again: torchwatch detach {pid}"
    print(text, file=sys.stderr)


def _exit_status(ending: Ending, session: Session, opts: WatchOptions) -> int:
    """torchwatch's exit status for ``ending`` (see the module docstring)."""
    sig = ending.signal
    if sig is not None:
        return 128 + sig
    if ending.by == "error":
        return EXIT_CANNOT_WATCH
    own = ending.code if ending.by == "exit" and ending.code is not None else 0
    if own == 0 and ending.unwritten:
        return EXIT_CANNOT_WATCH
    if own == 0 and _failed_on(session, opts):
        return EXIT_FAIL_ON
    return own


def _failed_on(session: Session, opts: WatchOptions) -> bool:
    """``--fail-on``: whether the final verdict is one of the labels named, or ``hang`` is named and
    a hang was recorded (says so on stderr)."""
    if not opts.fail_on:
        return False
    if "hang" in opts.fail_on and session.hang.recorded:
        print(f"torchwatch: a hang was recorded and --fail-on names hang: exit {EXIT_FAIL_ON}", file=sys.stderr)
        return True
    label = session.final().verdict.label
    if label in opts.fail_on:
        print(
            f"torchwatch: verdict {label} is in --fail-on ({','.join(opts.fail_on)}): exit {EXIT_FAIL_ON}",
            file=sys.stderr,
        )
        return True
    return False


def _drive(
    session: Session,
    child: Launched | None,
    opts: WatchOptions,
    log_path: Path | None,
    stops: StopSignals,
    injection: dict[str, Any] | None = None,
) -> Ending:
    """Watch until the end, stop what must be stopped, write the reports; how it ended.

    ``injection``: what attach did to get inside (the report's ``injection`` key).
    """
    start = time.monotonic()
    ending = Ending("error")
    try:
        ending = (
            _headless(session, child, opts, start, stops)
            if opts.headless
            else _tui(session, child, opts, log_path, stops)
        )
    except Exception as exc:  # a bug must not cost the report, nor leave the training behind
        log.exception("watching failed")
        print(f"torchwatch: error: watching failed: {exc!r} (the report follows)", file=sys.stderr)
        if child is not None:
            session.stopped_target = True
            ending = Ending("error", stop_launched(child, session.tree.mains(), signals=stops))
    finally:
        log.debug("watching ended: %s", ending)
        if child is not None and ending.by != "left running":
            child.close()
        session.stop()
    if not _write_reports(session, child, ending, opts, time.monotonic() - start, log_path, injection):
        ending = replace(ending, unwritten=True)
    return ending


def _stop(session: Session, child: Launched, stops: StopSignals, by: str) -> Ending:
    """Stop the launched training as asked (``by``: ``duration`` or ``quit``), unless a signal overtakes."""
    session.stopped_target = True
    code = stop_launched(child, session.tree.mains(), signals=stops)
    return Ending(signal.Signals(stops.first).name, code) if stops.first is not None else Ending(by, code)


def _stopped_by_signal(session: Session, child: Launched | None, stops: StopSignals) -> Ending:
    """torchwatch got a stop signal: stop the launched training (see :func:`stop_launched`).

    A training in a process group of its own never got the signal: torchwatch passes it on.
    """
    sig = stops.first
    assert sig is not None
    code = None
    if child is not None:
        session.stopped_target = True
        code = stop_launched(
            child,
            session.tree.mains(),
            first=sig,
            already_sent=sig == signal.SIGINT and not child.own_group and terminal_delivers_interrupts(),
            signals=stops,
        )
    return Ending(signal.Signals(sig).name, code)


def _tui(
    session: Session, child: Launched | None, opts: WatchOptions, log_path: Path | None, stops: StopSignals
) -> Ending:
    from torchwatch.faces.tui.app import WatchApp
    from torchwatch.faces.tui.terminal import hangup_safe_terminal

    app = WatchApp(
        session, child=child, duration=opts.duration, log_path=log_path, stop_requested=lambda: bool(stops.received)
    )
    try:
        with hangup_safe_terminal():
            app.run()
    except Exception:  # e.g. the terminal hung up while the app drew: the report still comes
        log.exception("the TUI ended with an error")
    if stops.first is not None:
        return _stopped_by_signal(session, child, stops)
    timed_out = app.ended_by == "duration"
    if child is None:
        return Ending("exit" if session.target_gone else "duration" if timed_out else "quit")
    if child.poll() is not None:
        return Ending("exit", shell_status(child.poll() or 0))
    if app.stop_training:  # "y" at the quit question, or --duration ran out
        return _stop(session, child, stops, "duration" if timed_out else "quit")
    child.leave_running()
    print(
        f"torchwatch: the training (PID {child.pid}) keeps running; its output goes to {log_path}",
        file=sys.stderr,
    )
    return Ending("left running")


def _headless(session: Session, child: Launched | None, opts: WatchOptions, start: float, stops: StopSignals) -> Ending:
    last_label: tuple[str, int | None, tuple[float, str] | None, tuple[str, ...]] | None = None
    last_print = 0.0
    status_ok = True
    while True:
        now = time.monotonic()
        if stops.first is not None:
            return _stopped_by_signal(session, child, stops)
        if child is not None and child.poll() is not None:
            return Ending("exit", shell_status(child.poll() or 0))
        if child is None and session.target_gone:
            return Ending("exit")
        if opts.duration is not None and now - start >= opts.duration:
            return _stop(session, child, stops, "duration") if child is not None else Ending("duration")
        obs = session.latest_observation
        # A new straggler (or none any more), a hang and its end, a torch.compile finding (an event:
        # a recompile, a graph break, the recompile limit) are news as much as a new label.
        label = (
            (
                obs.verdict.label,
                obs.straggler.rank if obs.straggler is not None else None,
                (obs.hang.fired_s, obs.hang.state) if obs.hang is not None else None,
                tuple(f.rule for f in obs.findings if f.rule.startswith("compile-")),
            )
            if obs is not None and obs.verdict is not None
            else None
        )
        if status_ok and (label != last_label or now - last_print >= STATUS_EVERY_S):
            # a closed stderr ends the status lines, not the watch
            status_ok = _emit(status_line(obs, now - start), sys.stderr, fatal=False)
            last_label, last_print = label, now
        # Sleep until the next verdict, the training's exit or a stop signal, whichever comes
        # first: no wake-up of its own between two evaluations of the rules.
        wait = session.until_analysis(time.monotonic()) + VERDICT_LAG_S
        if opts.duration is not None:
            wait = min(wait, max(0.0, start + opts.duration - time.monotonic()))
        if child is not None:
            child.wait(wait, wake_fd=stops.wake_fd)
        else:
            stops.wait(wait)


def _emit(text: str, stream: TextIO, fatal: bool = True, raw: bool = False) -> bool:
    """Print ``text`` on ``stream``; whether it worked. Unless ``raw`` (the training's own output,
    shown as it would have been without torchwatch), every character that is not printable but
    newlines and tabs is escaped first (:func:`torchwatch.model.text.terminal_safe`): a status
    line or a report carries the target's text, and none of it may act on the terminal.

    Raises:
        BrokenPipeError: the reader went away (a closed pipe, or a terminal that hung up: EIO),
            when ``fatal``; the CLI then ends quietly.
    """
    try:
        print(text if raw else terminal_safe(text), file=stream, flush=True)
        return True
    except OSError as exc:
        if not fatal or exc.errno not in (errno.EPIPE, errno.EIO):
            if fatal:
                raise
            return False
        raise BrokenPipeError(errno.EPIPE, "the reader of the report went away") from None


def _show_log(path: Path, lines: int = 40) -> None:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    if text and _emit("\n".join(text[-lines:]), sys.stdout, fatal=False, raw=True):
        _emit(f"torchwatch: the training's output ({len(text)} lines) is in {path}", sys.stderr, fatal=False)


def _write_hang_file(obs: Observation, report_path: Path) -> None:
    """The recorded hang's threads in ``<report stem>.hang.txt`` beside the report, written as the
    report is (a new file renamed into place, never through a symlink), mode 0600: the stacks of
    every process are for the operator only (:data:`HANG_FILE_MODE`); nothing when none was recorded."""
    if obs.hang is None:
        return
    path = hang.hang_path(report_path)
    try:
        report.write_atomic(path, hang.hang_file_text(obs.hang, report_path.name) + "\n", HANG_FILE_MODE)
    except OSError as exc:
        print(f"torchwatch: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
    else:
        _emit(f"torchwatch: hang record written to {path}", sys.stderr, fatal=False)


def _write_memory_file(memory: MemoryReport | None, report_path: Path) -> None:
    """The out-of-memory records in full in ``<report stem>.memory.txt`` beside the report, written as
    the report is (a new file renamed into place, never through a symlink), mode 0600 (stacks and
    command names are the operator's); nothing when none was recorded."""
    if memory is None or not memory.records:
        return
    path = memfaces.memory_path(report_path)
    try:
        report.write_atomic(path, memfaces.memory_file_text(memory, report_path.name), HANG_FILE_MODE)
    except OSError as exc:
        print(f"torchwatch: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
    else:
        _emit(f"torchwatch: memory record written to {path}", sys.stderr, fatal=False)


def _write_reports(
    session: Session,
    child: Launched | None,
    ending: Ending,
    opts: WatchOptions,
    watched_s: float,
    log_path: Path | None = None,
    injection: dict[str, Any] | None = None,
) -> bool:
    """The JSON report first (a file survives a closed terminal), then the end of the training's
    output (TUI) and the text report; whether the JSON report (if asked for) was written."""
    obs = session.final_observation()
    pid = obs.target.pid
    injected = None if injection is None else InjectionReport.from_json(injection)
    data = report.build(obs, ended_by=ending.by, exit_code=ending.code, watched_s=watched_s, injection=injected)
    text = report.render_text(data)
    if opts.json_path == "-":
        _emit(text, sys.stderr, fatal=False)
        _emit(report.dumps(data), sys.stdout)
        return True
    written = True
    if opts.json_path:
        target = report.json_target(opts.json_path, pid)
        try:
            report.write_atomic(target, report.dumps(data) + "\n")
        except OSError as exc:
            written = False
            print(
                f"torchwatch: error: cannot write {target}: {exc.strerror or exc} (the report follows on stdout; "
                f"exit {EXIT_CANNOT_WATCH})",
                file=sys.stderr,
            )
        else:
            if target != Path(opts.json_path).expanduser():
                _emit(f"torchwatch: JSON report written to {target}", sys.stderr, fatal=False)
            _write_hang_file(obs, target)
            _write_memory_file(data.memory, target)
    if log_path is not None:
        _show_log(log_path)
    _emit(text, sys.stdout)
    return written
