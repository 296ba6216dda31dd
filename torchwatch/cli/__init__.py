"""Command line: ``torchwatch run [OPTIONS] -- CMD...``, ``attach``, ``detach``, ``burst``, ``rules`` and ``doctor``.

Errors are one line on stderr with a hint and a non-zero exit, never a traceback; the exit
statuses are in :data:`EXIT_STATUS` (printed by ``--help``, listed in the README).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from torchwatch import __version__
from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError, UsageError
from torchwatch.model.labels import LABELS
from torchwatch.model.text import escape
from torchwatch.watch import caps

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import StopSignals

log = logging.getLogger(__name__)

# Every TORCHWATCH_* variable torchwatch or its hook reads (tests/unit/test_cli.py checks the code
# against this list, and the README against it).
ENVIRONMENT = {
    "TORCHWATCH_DIR": "where the hook publishes its state (default $TMPDIR/torchwatch-UID); "
    "torchwatch reads it from the training's environment",
    "TORCHWATCH_SIGNAL": "the signal that asks the hook for a profiler burst (default SIGUSR2)",
    "TORCHWATCH_BURST_AT": "optimizer steps at which the hook runs a burst by itself (set by --burst-at)",
    "TORCHWATCH_BURST_COOLDOWN_S": "seconds the hook refuses a new burst after one (default 5)",
    "TORCHWATCH_TRACE_DIR": "where burst traces are written (default ~/.cache/torchwatch/traces)",
    "TORCHWATCH_FLOPS": "'0': bursts count no FLOPs in their warmup step (no FLOP/s, no MFU)",
    "TORCHWATCH_HOOK": "'1' makes the hook's sitecustomize install the hook (set by run)",
    "TORCHWATCH_HOOK_PATH": "the directory holding the torchwatch package the hook is loaded from, by "
    "path (set by run)",
    "TORCHWATCH_BOOT_NOTE": "the file where run's hook boot says why it could not load the hook (set by run)",
    "TORCHWATCH_SPAWNED_RANK": "set by the hook around torch.multiprocessing.spawn: the processes it "
    "starts are ranks and get the hook (their DataLoader workers do not); not for users",
    "TORCHWATCH_JOB": "the job key every rank of the job shares on every node (the training_job label); "
    "wins over TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT and SLURM_JOB_ID (docs/fleet.md)",
    "TORCHWATCH_NODE_NAME": "serve: the host label (default the hostname; in a Kubernetes pod, the node's name)",
}

EXIT_STATUS = (
    ("N", "run: the training's own exit status (128+N when signal N ended it)"),
    ("0", "torchwatch stopped the training as asked (--duration, q in the TUI), or watching ended normally"),
    (
        "3",
        "--fail-on: the final verdict is one of its labels, or it names hang and a hang was recorded "
        "(and the status would have been 0)",
    ),
    ("2", "usage error: a bad option or value, a malformed rule file"),
    (
        "1",
        "cannot watch (no such PID, not Python, another user's process, command not found, "
        "a PID whose tree holds several trainings, unwritable --json/--trace/--log-file), a --json report that "
        "could not be written at the end, an internal error, or stdout closed before the report",
    ),
    (
        "128+N",
        "torchwatch got signal N (SIGINT 130, SIGTERM 143, SIGHUP 129): it stopped the training, "
        "wrote the report, then ended by that signal",
    ),
)


_USAGE = ("2", "usage error: a bad option or value")
_SIGNAL = ("128+N", "torchwatch got signal N (SIGINT 130, SIGTERM 143): it stopped, then ended by that signal")
_INTERRUPTED = ("130", "interrupted (Ctrl-C)")

# Each command's own exit statuses (its --help prints them); run's are EXIT_STATUS.
COMMAND_EXIT_STATUS: dict[str, tuple[tuple[str, str], ...]] = {
    "run": EXIT_STATUS,
    "attach": tuple(row for row in EXIT_STATUS if row[0] != "N"),
    "detach": (
        ("0", "the hook was taken out"),
        _USAGE,
        ("1", "nothing taken out: no such PID, no hook attach injected, another user's process, the injection failed"),
        _INTERRUPTED,
    ),
    "burst": (
        ("0", "the burst's summary was printed"),
        _USAGE,
        ("1", "no burst: no such PID, no hook in it, the signal not caught, refused, timed out"),
        _INTERRUPTED,
    ),
    "trial": (
        ("0", "the speed-up was measured (its interval is printed)"),
        _USAGE,
        ("1", "not measured: no such PID, no hook in it, refused, the training ended or --max-s passed first"),
        _SIGNAL,
    ),
    "doctor": (("0", "everything needed works"), _USAGE, ("1", "something needed does not work (printed)")),
    "compare": (("0", "the comparison was printed"), ("2", "a bad option, or a file that is not a torchwatch report")),
    "serve": (
        ("0", "--duration ran out"),
        _USAGE,
        ("1", "cannot serve (the port is taken, an unwritable --log-file)"),
        ("128+N", "SIGTERM or SIGINT stopped it (143, 130)"),
    ),
    "rules": (("0", "the rules are valid (check) or were listed"), ("2", "a malformed rule file or a bad option")),
    "completion": (("0", "the script was printed"), ("2", "a shell other than bash, zsh, fish")),
}


def epilog(command: str = "run") -> str:
    """The text after ``--help`` of ``command``: its exit statuses (:data:`COMMAND_EXIT_STATUS`)
    and the environment variables."""
    lines = ["exit status:"]
    lines += [f"  {code:6s} {text}" for code, text in COMMAND_EXIT_STATUS[command]]
    lines += ["", "environment (set in the training's environment; run sets the hook's itself):"]
    lines += [f"  {name:28s} {text}" for name, text in ENVIRONMENT.items()]
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with a hint, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Raise a one-line :class:`UsageError` (exit 2) instead of printing usage."""
        raise UsageError(message, f"see: {self.prog} --help")


def _positive(option: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a number of seconds, not {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{option} must be a positive number of seconds, not {text}")
        return value

    return parse


_duration = _positive("--duration")

# serve's caps (torchwatch.watch.fleet.Fleet; in a module of their own, so --help needs no watch machinery)
MAX_TRAININGS = caps.MAX_TRAININGS
MAX_PER_USER = caps.MAX_PER_USER


def _count(option: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number, not {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option} must be 1 or more, not {text}")
        return value

    return parse


def _window(text: str) -> float:
    """``--window``: seconds within the bounds of :data:`torchwatch.watch.session.WINDOW_MIN_S` / ``MAX_S``."""
    from torchwatch.watch.session import WINDOW_MAX_S, WINDOW_MIN_S

    value = _positive("--window")(text)
    if not WINDOW_MIN_S <= value <= WINDOW_MAX_S:
        raise argparse.ArgumentTypeError(
            f"--window must be {WINDOW_MIN_S:g} to {WINDOW_MAX_S:g} seconds, not {text} "
            f"({WINDOW_MIN_S:g} s: one py-spy recording of the loop must end in every window; "
            f"{WINDOW_MAX_S:g} s: the readings torchwatch keeps)"
        )
    return value


def _labels(text: str) -> tuple[str, ...]:
    labels = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [x for x in labels if x not in (*LABELS, "hang")]
    if bad or not labels:
        raise argparse.ArgumentTypeError(f"--fail-on takes labels from {', '.join(LABELS)} and hang, not {text!r}")
    return labels


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--burst-at takes step numbers like 100,500, not {text!r}") from None
    if any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError(f"--burst-at step numbers start at 1, not {text!r}")
    return steps


def _listen(text: str) -> tuple[str, int]:
    """``--prometheus [HOST:]PORT`` (:func:`torchwatch.faces.prometheus.parse_listen`)."""
    from torchwatch.faces.prometheus import parse_listen

    try:
        return parse_listen(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _prometheus_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prometheus",
        type=_listen,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (HOST defaults to 127.0.0.1: this machine only)",
    )


def _logging_options(p: argparse.ArgumentParser, top: bool) -> None:
    """``-v`` and ``--log-file``, accepted before and after the command name."""
    default_v: object = False if top else argparse.SUPPRESS
    default_f: object = None if top else argparse.SUPPRESS
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default_v,
        help="log debug messages (on stderr, or to --log-file; with the TUI only --log-file shows them)",
    )
    p.add_argument("--log-file", type=Path, metavar="PATH", default=default_f, help="append torchwatch's log to PATH")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--headless",
        action="store_true",
        help="no TUI: a live status line on stderr, the final report on stdout (also chosen without a terminal)",
    )
    p.add_argument(
        "--duration",
        type=_duration,
        metavar="SECONDS",
        help="stop watching after SECONDS (run: then stop the command with SIGINT, SIGTERM, SIGKILL; exit 0)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the final report as JSON to PATH, into PATH if it is a directory, or on stdout with '-' "
        "(run --headless: the training's stdout then goes to stderr)",
    )
    p.add_argument(
        "--rules",
        metavar="DIR",
        action="append",
        type=Path,
        default=[],
        help="add or override rules from the *.toml files in DIR (repeatable)",
    )
    p.add_argument(
        "--window",
        type=_window,
        default=10.0,
        metavar="SECONDS",
        help="seconds of readings each verdict is computed over, 3 to 300 (default: 10)",
    )
    p.add_argument(
        "--trace",
        metavar="PATH",
        type=Path,
        help="append every analysis (features, findings, verdict) to PATH as JSON lines",
    )
    p.add_argument(
        "--fail-on",
        type=_labels,
        metavar="LABEL[,LABEL...]",
        help="exit 3 when the final verdict is one of these labels, or (hang) when a hang was recorded (for CI); "
        "the command's own failure wins",
    )
    p.add_argument(
        "--hang-after",
        type=_positive("--hang-after"),
        metavar="SECONDS",
        help="a process that stepped and then makes no step for SECONDS is hung: every thread of every rank and "
        "DataLoader worker is dumped once (default: max(30 s, 20 x its p95 step time))",
    )
    p.add_argument(
        "--sampling",
        choices=("adaptive", "fast"),
        default="adaptive",
        help="adaptive (default): sample fast until the verdict settles, then at a steady cadence that costs a "
        "third, fast again on any change; fast: the fast cadence throughout (to compare, or for a short run)",
    )
    _prometheus_option(p)
    _logging_options(p, top=False)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="torchwatch",
        description="Tells you, live, why your PyTorch training is slow.",
        epilog=epilog(),
        formatter_class=fmt,
    )
    parser.add_argument("-V", "--version", action="version", version=f"torchwatch {__version__}")
    _logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="launch a training command and watch it",
        description="Launch COMMAND and watch it; exits with COMMAND's exit status (0 when torchwatch stopped it).",
        usage="torchwatch run [OPTIONS] -- COMMAND [ARGS...]",
        epilog=epilog(),
        formatter_class=fmt,
    )
    _common(run)
    run.add_argument(
        "--no-hook", action="store_true", help="do not pre-load the in-process hook (outside readings only)"
    )
    run.add_argument(
        "--burst-at",
        type=_steps,
        metavar="STEP[,STEP...]",
        help="run a torch.profiler burst at these optimizer steps (the trace path is in the report)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the training command")
    attach = sub.add_parser(
        "attach",
        help="watch a running training process",
        description="Watch the running process PID and its children (torchwatch itself and its helpers excluded). "
        "A PID that is not a training but whose tree holds several (PID 1, a shell running two) is refused with "
        "their PIDs: attach to one, or watch them all with torchwatch serve.",
        epilog=epilog("attach"),
        formatter_class=fmt,
    )
    _common(attach)
    attach.add_argument("pid", metavar="PID", help="PID of the training process")
    attach.add_argument(
        "--no-inject",
        action="store_true",
        help="do not inject the hook into the training (outside readings only: no step times, data wait, "
        "DataLoader settings or bursts)",
    )
    attach.add_argument(
        "--keep-hook",
        action="store_true",
        help="leave the injected hook in the training when attach ends (take it out later with torchwatch detach)",
    )
    detach = sub.add_parser(
        "detach",
        help="take the hook that attach injected out of a training",
        description="Take the hook torchwatch attach injected out of PID: its burst signal handler is put back, "
        "torch is unpatched and the hook's files are removed. attach does this itself when it ends.",
        epilog=epilog("detach"),
        formatter_class=fmt,
    )
    detach.add_argument("pid", metavar="PID", help="PID of the training process")
    _logging_options(detach, top=False)
    burst = sub.add_parser(
        "burst",
        help="ask a hooked training for a torch.profiler burst and print its summary",
        description="Ask the hook in PID for a short torch.profiler burst (it must catch the signal), wait for it "
        "(a spinner on a terminal), print the step-time breakdown and the trace path.",
        epilog=epilog("burst"),
        formatter_class=fmt,
    )
    burst.add_argument("pid", metavar="PID", help="PID of the training process (started by torchwatch run, or hooked)")
    burst.add_argument("--steps", type=int, default=3, metavar="N", help="active steps to record (1-20, default 3)")
    burst.add_argument("--wait", type=_duration, default=60.0, metavar="SECONDS", help="give up after SECONDS")
    burst.add_argument("--json", metavar="PATH", help="also write the summary as JSON ('-' for stdout)")
    _logging_options(burst, top=False)
    trial = sub.add_parser(
        "trial",
        help="try a setting on a running training, live, and measure what it buys",
        description="Switch SETTING to VALUE in the hooked training PID (every rank of its job) for a block of "
        "steps, back for the next (on, off, off, on, ...), until the speed-up's 95 % interval is within +-5 % "
        "or --max-s passes; then put the training's value back (or keep it with --keep when faster). "
        "Settings: " + ", ".join(s.name for s in _trial_settings() if s.refused is None) + ". "
        "DataLoader settings alternate whole epochs. TF32 and matmul precision change numerics: only with "
        "--allow-numerics.",
        epilog=epilog("trial"),
        formatter_class=fmt,
    )
    trial.add_argument("pid", metavar="PID", help="PID of the training (a rank or the launcher of a job)")
    trial.add_argument("assignment", metavar="SETTING=VALUE", help="e.g. threads=2, num_workers=4, gc_freeze=1")
    trial.add_argument("--steps", type=int, default=None, metavar="N", help="steps per block (default: about 2 s)")
    trial.add_argument(
        "--max-s", type=float, default=60.0, metavar="SECONDS", help="end the trial after this long (5-600, default 60)"
    )
    trial.add_argument(
        "--keep", action="store_true", help="keep the new value at the end when the trial found it faster"
    )
    trial.add_argument(
        "--allow-numerics",
        action="store_true",
        help="allow settings that change the arithmetic's precision (tf32, matmul_precision)",
    )
    trial.add_argument("--json", metavar="PATH", help="also write the result as JSON ('-' for stdout)")
    _logging_options(trial, top=False)
    rules = sub.add_parser(
        "rules",
        help="check or list diagnosis rules",
        epilog=epilog("rules"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=_Parser, required=True)
    check = rules_sub.add_parser("check", help="validate the *.toml rule files of DIR")
    check.add_argument("dir", type=Path, metavar="DIR")
    _logging_options(check, top=False)
    listing = rules_sub.add_parser("list", help="print the rules in use with their thresholds' sources")
    listing.add_argument(
        "--rules",
        metavar="DIR",
        action="append",
        type=Path,
        default=[],
        help="include the rules of DIR, as run and attach would",
    )
    _add_doctor(sub)
    _add_compare(sub)
    _add_serve(sub)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Print the completion script for SHELL, made from this parser. bash: add "
        "'source <(torchwatch completion bash)' to ~/.bashrc; zsh: the same with zsh in ~/.zshrc; fish: "
        "torchwatch completion fish > ~/.config/fish/completions/torchwatch.fish",
        epilog=epilog("completion"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell")
    _logging_options(completion, top=False)
    _logging_options(listing, top=False)
    return parser


def _add_doctor(sub: Any) -> None:
    """``torchwatch doctor [PID] [--json]`` (torchwatch/doctor.py)."""
    doctor = sub.add_parser(
        "doctor",
        help="check what works on this machine and, with PID, for that process",
        description="Check ptrace, py-spy, NVML, PSI, delay accounting, CPU quota, /dev/shm and the hook "
        "directory, and with PID whether it can be watched and injected into. Exit 0 when everything needed works.",
        epilog=epilog("doctor"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("pid", nargs="?", metavar="PID", help="a training process to check too")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    _logging_options(doctor, top=False)


def _add_compare(sub: Any) -> None:
    """``torchwatch compare A.json B.json [--markdown]`` (torchwatch/faces/compare.py)."""
    compare = sub.add_parser(
        "compare",
        help="compare two JSON reports: speedup, verdicts, settings that differ, features that moved",
        description="Compare report A (before) with report B (after), both written by run/attach --json: steps/s "
        "change (x, %), both verdicts, the settings that differ and those that do not, the features that moved "
        "most. Exit 2 when a file is not a torchwatch report.",
        epilog=epilog("compare"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument("a", metavar="A.json", help="the report before the change")
    compare.add_argument("b", metavar="B.json", help="the report after the change")
    compare.add_argument("--markdown", action="store_true", help="print Markdown, for a pull-request comment")
    _logging_options(compare, top=False)


def _add_serve(sub: Any) -> None:
    """``torchwatch serve [--prometheus [HOST:]PORT]`` (torchwatch/cli/serve.py)."""
    serve = sub.add_parser(
        "serve",
        help="watch every PyTorch training on this machine (one exporter per node)",
        description="Look for PyTorch trainings every --scan seconds (Python interpreters that imported torch, "
        "topmost of their tree: a torchrun launcher with its ranks; at most --max-trainings, --max-per-user of one "
        "user) and watch each from outside, with the "
        "readings of torchwatch's hook where a training carries it; nothing is injected. New trainings are "
        "picked up, ended ones dropped. --prometheus serves them all; without it a status line per training "
        "goes to stderr. SIGTERM or SIGINT stops it (exit 128+N).",
        epilog=epilog("serve"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _prometheus_option(serve)
    serve.add_argument(
        "--web-config-file",
        type=Path,
        metavar="FILE",
        help="TLS and basic auth of --prometheus, in the Prometheus exporter-toolkit's web config format "
        "(tls_server_config, basic_auth_users; docs/security.md)",
    )
    serve.add_argument(
        "--scan", type=_positive("--scan"), default=5.0, metavar="SECONDS", help="look for trainings every SECONDS"
    )
    serve.add_argument("--window", type=_window, default=10.0, metavar="SECONDS", help="verdict window, 3 to 300")
    serve.add_argument("--duration", type=_duration, metavar="SECONDS", help="stop after SECONDS")
    serve.add_argument("--rules", metavar="DIR", action="append", type=Path, default=[], help="add rules from DIR")
    serve.add_argument(
        "--max-trainings",
        type=_count("--max-trainings"),
        default=MAX_TRAININGS,
        metavar="N",
        help=f"watch at most N trainings at once (default {MAX_TRAININGS}; each costs a session and a py-spy)",
    )
    serve.add_argument(
        "--max-per-user",
        type=_count("--max-per-user"),
        default=MAX_PER_USER,
        metavar="N",
        help=f"watch at most N trainings of one user at once (default {MAX_PER_USER})",
    )
    serve.add_argument(
        "--hang-after",
        type=_positive("--hang-after"),
        metavar="SECONDS",
        help="a process that stepped and then makes no step for SECONDS is hung (default: max(30 s, 20 x its "
        "p95 step time)); torchwatch_rank_hang and the hang alert read it",
    )
    _logging_options(serve, top=False)


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record comes (the TUI swaps it out
    while it runs, so log lines never land on its screen)."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` to the current ``sys.stderr``."""
        self.stream = sys.stderr
        super().emit(record)


class _LogFile(logging.StreamHandler):  # type: ignore[type-arg]
    """``--log-file``: a handler on a file opened by :func:`torchwatch.model.files.open_append`
    (never through a symbolic link, nor in a directory another user can change), closed with it."""

    def close(self) -> None:
        """Flush and close the file."""
        try:
            self.flush()
            self.stream.close()
        finally:
            super().close()


class OneLineFormatter(logging.Formatter):
    """Every record on one line of its own: the message (which may carry a target's text: a
    frame's function name, a command line) has its characters that are not printable escaped
    (:func:`torchwatch.model.text.escape`), and a traceback's lines are indented, so nothing
    written by a watched process can pass for a record of its own in the log."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line, its message escaped."""
        safe = logging.makeLogRecord(record.__dict__)
        safe.message = escape(record.message)
        return super().formatMessage(safe)

    def formatException(self, ei: Any) -> str:
        """The traceback, each line escaped and indented."""
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        """The stack, each line escaped and indented."""
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape(line) for line in text.split("\n"))


def configure_logging(verbose: bool, log_file: Path | None) -> None:
    """Configure the ``torchwatch`` loggers: warnings (debug with ``verbose``) on stderr, or every
    record from info up (debug with ``verbose``) appended to ``log_file``. Every record is one
    line (:class:`OneLineFormatter`); the file is opened as :func:`torchwatch.model.files.open_append`
    does (created 0600; a symbolic link, another user's file or a directory another user can
    change is refused).

    Raises:
        TorchwatchError: ``log_file`` cannot be opened for appending, or is refused.
    """
    root = logging.getLogger("torchwatch")
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler: logging.Handler
    if log_file is not None:
        try:
            stream = os.fdopen(files.open_append(log_file.expanduser()), "a", encoding="utf-8")
        except OSError as exc:
            raise TorchwatchError(
                f"cannot write the log to {log_file}: {exc.strerror or exc}",
                files.UNSAFE_HINT.format(option="--log-file")
                if isinstance(exc, files.UnsafePath)
                else "give --log-file a path in an existing, writable directory",
            ) from None
        handler = _LogFile(stream)
        handler.setFormatter(
            OneLineFormatter("%(asctime)s %(levelname)s %(process)d %(threadName)s %(name)s: %(message)s")
        )
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
    else:
        handler = _CurrentStderr()
        handler.setFormatter(OneLineFormatter("torchwatch: %(levelname)s: %(message)s"))
        root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    root.addHandler(handler)


def _rules_command(args: argparse.Namespace) -> int:
    from torchwatch.analysis.rules_engine import load_dir, load_rules

    if args.rules_command == "check":
        found = load_dir(args.dir)
        print(f"{len(found)} rule(s) OK in {args.dir}: {', '.join(r.id for r in found) or 'none'}")
        return 0
    for r in sorted(load_rules(args.rules), key=lambda r: r.id):
        print(f"{r.id:28s} {r.label:17s} {r.severity:9s} when {r.when.text}")
        print(f"{'':28s} source: {r.source}")
    return 0


def _watch(args: argparse.Namespace, stops: StopSignals) -> int:
    from torchwatch.cli.drive import WatchOptions, attach_pid, run_command

    opts = WatchOptions.from_args(args)
    if args.command == "run":
        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            raise UsageError("no command to run", "usage: torchwatch run [OPTIONS] -- python train.py")
        return run_command(cmd, opts, stops)
    try:
        pid = int(args.pid)
    except ValueError:
        raise UsageError(f"PID must be a number, not {args.pid!r}", "find it with: pgrep -af python") from None
    return attach_pid(pid, opts, stops)


_STDOUT_CLOSED = TorchwatchError(
    "stdout is closed: what torchwatch had to print there was not written",
    "run it with an open stdout (or --json PATH for the report)",
)


def _quiet_stdout() -> None:
    """stdout's reader went away: point stdout at /dev/null so the exit's flush cannot fail too
    (the recipe of the Python documentation's note on SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _trial_settings() -> tuple[Any, ...]:
    from torchwatch.wire import SETTINGS

    return SETTINGS


def main(argv: Sequence[str] | None = None, *, exit_by_signal: bool = False) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Args:
        exit_by_signal: when a stop signal ended ``run`` or ``attach``, end the process by that
            signal after the report (the console script does; tests calling ``main`` do not).
    """
    from torchwatch.watch.lifecycle import StopSignals

    parser = build_parser()
    stops = StopSignals()
    code = 0
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        configure_logging(args.verbose, args.log_file)
        if args.command == "rules":
            code = _rules_command(args)
        elif args.command == "completion":
            from torchwatch.cli.completion import script

            sys.stdout.write(script(args.shell, build_parser()))
            code = 0
        elif args.command == "doctor":
            from torchwatch.cli.doctor import doctor_command

            code = doctor_command(args.pid, args.json)
        elif args.command == "compare":
            from torchwatch.faces.compare import compare_files

            print(compare_files(args.a, args.b, args.markdown))
            code = 0
        elif args.command == "serve":
            from torchwatch.cli.serve import serve_command

            with stops:
                code = serve_command(
                    args.prometheus,
                    stops,
                    scan_s=args.scan,
                    window_s=args.window,
                    duration=args.duration,
                    rules_dirs=args.rules,
                    max_trainings=args.max_trainings,
                    max_per_user=args.max_per_user,
                    hang_after=args.hang_after,
                    web_config=args.web_config_file,
                )
        elif args.command == "detach":
            from torchwatch.cli.injecting import detach_command

            code = detach_command(args.pid)
        elif args.command == "trial":
            from torchwatch.cli.trial import trial_command

            with stops:
                code = trial_command(
                    args.pid,
                    args.assignment,
                    steps=args.steps,
                    max_s=args.max_s,
                    keep=args.keep,
                    allow_numerics=args.allow_numerics,
                    json_path=args.json,
                    stopped=lambda: stops.first,
                )
        elif args.command == "burst":
            from torchwatch.cli.burst import burst_command

            code = burst_command(args.pid, args.steps, args.wait, args.json)
        else:
            with stops:
                code = _watch(args, stops)
        if sys.stdout is None:  # started with stdout closed (>&-): what it had to say went nowhere
            print(_STDOUT_CLOSED.one_line(), file=sys.stderr)
            code = code or _STDOUT_CLOSED.exit_code
        else:
            sys.stdout.flush()  # a closed stdout shows here, inside the handlers below
    except TorchwatchError as exc:
        print(exc.one_line(), file=sys.stderr)
        code = exc.exit_code
    except BrokenPipeError:
        _quiet_stdout()  # quietly, as `| head` expects (the Python documentation's note on SIGPIPE)
        code = code or _STDOUT_CLOSED.exit_code
    except KeyboardInterrupt:
        print("torchwatch: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:
        log.debug("internal error", exc_info=True)
        print(
            f"torchwatch: error: internal error: {exc!r} (hint: run again with -v --log-file PATH and report the log)",
            file=sys.stderr,
        )
        code = 1
    if stops.first is not None:
        code = 128 + stops.first
        if exit_by_signal:
            stops.exit_like_the_signal()
    return code


def entry() -> NoReturn:
    """The ``torchwatch`` console script and ``python -m torchwatch``."""
    sys.exit(main(exit_by_signal=True))


if __name__ == "__main__":  # pragma: no cover
    entry()
