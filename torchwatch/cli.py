"""Command line: ``torchwatch run [OPTIONS] -- CMD...`` and ``torchwatch attach [OPTIONS] PID``.

Errors are one line on stderr with a hint; exit 2 for usage, 1 for "cannot watch"; never a
traceback (DESIGN.md CLI contract).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from torchwatch import __version__
from torchwatch.errors import TorchwatchError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with a hint, exit 2."""

    def error(self, message: str) -> NoReturn:
        """Raise a one-line :class:`UsageError` (exit 2) instead of printing usage."""
        raise UsageError(message, f"see: {self.prog} --help")


def _duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--duration must be a number of seconds, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--duration must be a positive number of seconds, not {text}")
    return value


LABELS = ("cpu-bound", "gpu-bound", "io-bound", "dataloader-bound", "undetermined")


def _labels(text: str) -> tuple[str, ...]:
    labels = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [x for x in labels if x not in LABELS]
    if bad or not labels:
        raise argparse.ArgumentTypeError(f"--fail-on takes labels from {', '.join(LABELS)}, not {text!r}")
    return labels


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--burst-at takes step numbers like 100,500, not {text!r}") from None
    if any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError(f"--burst-at step numbers start at 1, not {text!r}")
    return steps


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--headless", action="store_true", help="no TUI: a live status line on stderr, the final report on stdout"
    )
    p.add_argument(
        "--duration",
        type=_duration,
        metavar="SECONDS",
        help="stop watching after SECONDS (run: then stop the command with SIGINT, SIGTERM, SIGKILL)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the final report as JSON ('-' for stdout)")
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
        type=_duration,
        default=10.0,
        metavar="SECONDS",
        help="seconds of readings each verdict is computed over (default: 10)",
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
        help=f"exit {3} when the final verdict is one of these labels (for CI); the command's own failure wins",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = _Parser(prog="torchwatch", description="Tells you, live, why your PyTorch training is slow.")
    parser.add_argument("--version", action="version", version=f"torchwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="launch a training command and watch it",
        description="Launch COMMAND and watch it; exits with COMMAND's exit code.",
        usage="torchwatch run [OPTIONS] -- COMMAND [ARGS...]",
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
        "attach", help="watch a running training process", description="Watch the running process PID and its children."
    )
    _common(attach)
    attach.add_argument("pid", metavar="PID", help="PID of the training process")
    burst = sub.add_parser(
        "burst",
        help="ask a hooked training for a torch.profiler burst and print its summary",
        description="Ask the hook in PID for a short torch.profiler burst (it must catch the signal), wait for it, "
        "print the step-time breakdown and the trace path.",
    )
    burst.add_argument("pid", metavar="PID", help="PID of the training process (started by torchwatch run, or hooked)")
    burst.add_argument("--steps", type=int, default=3, metavar="N", help="active steps to record (1-20, default 3)")
    burst.add_argument("--wait", type=_duration, default=60.0, metavar="SECONDS", help="give up after SECONDS")
    burst.add_argument("--json", metavar="PATH", help="also write the summary as JSON ('-' for stdout)")
    rules = sub.add_parser("rules", help="check or list diagnosis rules")
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=_Parser, required=True)
    check = rules_sub.add_parser("check", help="validate the *.toml rule files of DIR")
    check.add_argument("dir", type=Path, metavar="DIR")
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
    return parser


def _add_doctor(sub: Any) -> None:
    """``torchwatch doctor [PID] [--json]`` (torchwatch/doctor.py)."""
    doctor = sub.add_parser(
        "doctor",
        help="check what works on this machine and, with PID, for that process",
        description="Check ptrace, py-spy, NVML, PSI, delay accounting, CPU quota, /dev/shm and the hook "
        "directory, and with PID whether it can be watched and injected into. Exit 0 when everything needed works.",
    )
    doctor.add_argument("pid", nargs="?", metavar="PID", help="a training process to check too")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")


def _rules_command(args: argparse.Namespace) -> int:
    from torchwatch.rules_engine import load_dir, load_rules

    if args.rules_command == "check":
        found = load_dir(args.dir)
        print(f"{len(found)} rule(s) OK in {args.dir}: {', '.join(r.id for r in found) or 'none'}")
        return 0
    for r in sorted(load_rules(args.rules), key=lambda r: r.id):
        print(f"{r.id:28s} {r.label:17s} {r.severity:9s} when {r.when.text}")
        print(f"{'':28s} source: {r.source}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from torchwatch.watch import WatchOptions, run_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command to run", "usage: torchwatch run [OPTIONS] -- python train.py")
    return run_command(cmd, WatchOptions.from_args(args))


def _attach(args: argparse.Namespace) -> int:
    from torchwatch.watch import WatchOptions, attach_pid

    try:
        pid = int(args.pid)
    except ValueError:
        raise UsageError(f"PID must be a number, not {args.pid!r}", "find it with: pgrep -af python") from None
    return attach_pid(pid, WatchOptions.from_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchwatch`` console script. Returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        if args.command == "rules":
            return _rules_command(args)
        if args.command == "doctor":
            from torchwatch.doctor import doctor_command

            return doctor_command(args.pid, args.json)
        if args.command == "burst":
            from torchwatch.bursts import burst_command

            return burst_command(args.pid, args.steps, args.wait, args.json)
        return _run(args) if args.command == "run" else _attach(args)
    except TorchwatchError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("torchwatch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
