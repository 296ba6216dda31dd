"""The options commands share, each declared once: the value parsers (one-line errors), ``-v`` and
``--log-file``, ``--prometheus``, and the watch options of ``run`` and ``attach`` (``serve`` takes
some of them, with shorter help), read back as one frozen :class:`WatchOptions`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchwatch.model.errors import UsageError
from torchwatch.model.labels import LABELS

if TYPE_CHECKING:
    from torchwatch.watch.session import SessionOptions


def positive(option: str) -> Callable[[str], float]:
    """A parser of ``option``'s value: a finite number of seconds above 0 (else argparse's one-line error)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} must be a number of seconds, not {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{option} must be a positive number of seconds, not {text}")
        return value

    return parse


duration = positive("--duration")


def count(option: str) -> Callable[[str], int]:
    """A parser of ``option``'s value: a whole number, 1 or more."""

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

    value = positive("--window")(text)
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


def steps(text: str) -> tuple[int, ...]:
    """``--burst-at STEP[,STEP...]``: optimizer step numbers, 1 or more."""
    try:
        found = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--burst-at takes step numbers like 100,500, not {text!r}") from None
    if any(s < 1 for s in found):
        raise argparse.ArgumentTypeError(f"--burst-at step numbers start at 1, not {text!r}")
    return found


def _listen(text: str) -> tuple[str, int]:
    """``--prometheus [HOST:]PORT`` (:func:`torchwatch.exposition.parse_listen`)."""
    from torchwatch.exposition import parse_listen

    try:
        return parse_listen(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def logging_options(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``-v`` and ``--log-file``, accepted before (``top``) and after the command name."""
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


# Each watch option once: its flags and argparse keywords (help included). A command that takes
# one with other help text (serve) gives its own with watch_option.
_WATCH: dict[str, dict[str, Any]] = {
    "--headless": dict(
        action="store_true",
        help="no TUI: a live status line on stderr, the final report on stdout (also chosen without a terminal)",
    ),
    "--duration": dict(
        type=duration,
        metavar="SECONDS",
        help="stop watching after SECONDS (run: then stop the command with SIGINT, SIGTERM, SIGKILL; exit 0)",
    ),
    "--json": dict(
        metavar="PATH",
        help="also write the final report as JSON to PATH, into PATH if it is a directory, or on stdout with '-' "
        "(run --headless: the training's stdout then goes to stderr)",
    ),
    "--rules": dict(
        metavar="DIR",
        action="append",
        type=Path,
        default=[],
        help="add or override rules from the *.toml files in DIR (repeatable)",
    ),
    "--window": dict(
        type=_window,
        default=10.0,
        metavar="SECONDS",
        help="seconds of readings each verdict is computed over, 3 to 300 (default: 10)",
    ),
    "--trace": dict(
        metavar="PATH", type=Path, help="append every analysis (features, findings, verdict) to PATH as JSON lines"
    ),
    "--fail-on": dict(
        type=_labels,
        metavar="LABEL[,LABEL...]",
        help="exit 3 when the final verdict is one of these labels, or (hang) when a hang was recorded (for CI); "
        "the command's own failure wins",
    ),
    "--hang-after": dict(
        type=positive("--hang-after"),
        metavar="SECONDS",
        help="a process that stepped and then makes no step for SECONDS is hung: every thread of every rank and "
        "DataLoader worker is dumped once (default: max(30 s, 20 x its p95 step time))",
    ),
    "--sampling": dict(
        choices=("adaptive", "fast"),
        default="adaptive",
        help="adaptive (default): sample fast until the verdict settles, then at a steady cadence that costs a "
        "third, fast again on any change; fast: the fast cadence throughout (to compare, or for a short run)",
    ),
    "--prometheus": dict(
        type=_listen,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (HOST defaults to 127.0.0.1: this machine only)",
    ),
}

# The options only run (--no-hook, --burst-at) or only attach (--no-inject, --keep-hook) has, at
# their value when not given: every watch command's namespace then holds every WatchOptions field.
_ONE_COMMAND_ONLY = {"no_hook": False, "burst_at": None, "no_inject": False, "keep_hook": False}


def watch_option(p: argparse.ArgumentParser, flag: str, help: str | None = None) -> None:
    """Add the watch option ``flag`` (``--window``, ``--duration``, ...) to ``p``, with ``help``
    instead of its own help text when given.

    Raises:
        KeyError: ``flag`` is not a watch option.
    """
    kwargs = dict(_WATCH[flag])
    if isinstance(kwargs.get("default"), list):
        kwargs["default"] = list(kwargs["default"])  # each parser its own (``--rules``)
    if help is not None:
        kwargs["help"] = help
    p.add_argument(flag, **kwargs)


def watch_options(p: argparse.ArgumentParser) -> None:
    """Every watch option (run's and attach's), then ``-v`` and ``--log-file``."""
    for flag in _WATCH:
        watch_option(p, flag)
    logging_options(p)
    p.set_defaults(**_ONE_COMMAND_ONLY)


@dataclass(frozen=True)
class WatchOptions:
    """Options common to ``run`` and ``attach`` (see ``torchwatch run --help``): ``duration``,
    ``window`` and ``hang_after`` in s; ``json_path`` ``'-'`` is stdout."""

    headless: bool = False
    duration: float | None = None
    json_path: str | None = None
    rules_dirs: tuple[Path, ...] = ()
    window: float = 10.0
    trace: Path | None = None
    hook: bool = True
    burst_at: tuple[int, ...] = ()
    fail_on: tuple[str, ...] = ()
    inject: bool = True
    keep_hook: bool = False
    hang_after: float | None = None
    prometheus: tuple[str, int] | None = None
    adaptive: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchOptions:
        """Options from the parsed ``run`` / ``attach`` arguments (declared by :func:`watch_options`)."""
        return cls(
            headless=args.headless,
            duration=args.duration,
            json_path=args.json,
            rules_dirs=tuple(args.rules),
            window=args.window,
            trace=args.trace,
            hook=not args.no_hook,
            burst_at=tuple(args.burst_at or ()),
            fail_on=tuple(args.fail_on or ()),
            inject=not args.no_inject,
            keep_hook=bool(args.keep_hook),
            hang_after=args.hang_after,
            prometheus=args.prometheus,
            adaptive=args.sampling != "fast",
        )

    def session_options(self, launched: bool = False) -> SessionOptions:
        """The :class:`SessionOptions` these options ask for (``launched``: by ``run``)."""
        from torchwatch.watch.session import SessionOptions

        return SessionOptions(
            window_s=self.window,
            trace_path=self.trace,
            hook_expected=launched and self.hook,
            hang_after=self.hang_after,
            adaptive=self.adaptive,
        )
