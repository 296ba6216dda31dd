"""Shared helpers for the torchwatch demo trainings.

Argument parsing (``--seconds``, ``--device``, ``--relieve``, optional
``--num-workers``), seeding, moving batches to the device, a small CNN and one
plain classification step (``small_cnn``, ``sgd_step``), and the training
loop driver that prints ``demo NAME: step N, R steps/s`` about every 2 s to
stderr and, at the end (also on Ctrl-C / SIGTERM), the final line::

    demo NAME: done, STEPS steps in SECONDS s, RATE steps/s

bench/relieve.py parses that final line; keep its format.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from typing_extensions import Self

REPORT_EVERY_S = 2.0


def parse_args(
    name: str,
    doc: str | None,
    num_workers: bool = False,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Parse the flags every demo has (plus ``--num-workers`` if asked)."""
    parser = argparse.ArgumentParser(
        prog=f"demo/{name}.py",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="train for this many seconds of wall time, then exit 0 (default 30)",
    )
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=default_device,
        help=f"device to train on (default here: {default_device})",
    )
    parser.add_argument("--relieve", action="store_true", help="remove this demo's bottleneck (see description)")
    if num_workers:
        parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    return args


def seed(value: int = 0) -> None:
    """Seed torch (CPU and CUDA) so runs are comparable."""
    torch.manual_seed(value)


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a batch (tensor or tuple/list of tensors) to ``device``."""
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=batch.is_pinned())
    return type(batch)(to_device(b, device) for b in batch)


class DeviceBatches:
    """Random batches of in-memory tensors, indexed where the tensors live (no DataLoader, no copy).

    Iterating gives one epoch of ``len(x) // batch`` batches drawn with replacement; on CUDA the
    indices are drawn on the device, so the host never waits for the data.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int) -> None:
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(max(1, len(self.x) // self.batch)):
            idx = torch.randint(len(self.x), (self.batch,), device=self.x.device)
            yield self.x[idx], self.y[idx]


def small_cnn() -> torch.nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One ordinary classification step; returns the detached loss."""
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return loss.detach()


def say(name: str, text: str) -> None:
    """Print ``demo NAME: TEXT`` to stderr and flush."""
    sys.stderr.write(f"demo {name}: {text}\n")
    sys.stderr.flush()


def _raise_interrupt(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


class Run:
    """Context manager around one demo's setup + training loop.

    Handles SIGINT and SIGTERM anywhere inside the ``with`` block: prints the
    final line and exits 130 without a traceback.
    """

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.device = device
        self.steps = 0
        self.t0: float | None = None
        self.last_loss: torch.Tensor | None = None

    def __enter__(self) -> Self:
        # Also when started in the background by a non-interactive shell, which
        # would otherwise leave SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _say(self, text: str) -> None:
        say(self.name, text)

    def _final(self) -> None:
        with contextlib.suppress(Exception):  # the final line matters more
            self._sync()
        elapsed = 0.0 if self.t0 is None else time.perf_counter() - self.t0
        rate = self.steps / elapsed if elapsed > 0 else 0.0
        self._say(f"done, {self.steps} steps in {elapsed:.1f} s, {rate:.1f} steps/s")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if exc_type is KeyboardInterrupt:
            self._final()
            sys.exit(130)
        if exc_type is None:
            self._final()

    def train(self, loader: Iterable[Any], step: Callable[[Any], torch.Tensor], seconds: float, steps: int = 0) -> None:
        """Run ``step(batch)`` over ``loader`` (epoch after epoch) for ``seconds``, or until
        ``steps`` steps when that is > 0 and comes first.

        ``step`` returns the loss tensor; it is only read (``.item()``, which
        synchronizes on CUDA) when a progress line is printed.
        """
        self.t0 = time.perf_counter()
        deadline = self.t0 + seconds
        last_t, last_steps = self.t0, 0
        it: Any = None
        try:
            while True:
                it = iter(loader)
                for batch in it:
                    self.last_loss = step(batch)
                    self.steps += 1
                    now = time.perf_counter()
                    if now - last_t >= REPORT_EVERY_S:
                        loss = self.last_loss.item()  # syncs on CUDA, like real logging
                        now = time.perf_counter()
                        rate = (self.steps - last_steps) / (now - last_t)
                        self._say(f"step {self.steps}, {rate:.1f} steps/s, loss {loss:.4f}")
                        last_t, last_steps = now, self.steps
                    if now >= deadline or self.steps == steps:
                        return
        finally:
            # Stop DataLoader worker processes now, not at interpreter exit.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
