"""FLOPs of one training step, counted in the training, and a CPU's matmul peak measured once.

Standard library only; ``torch`` is the training's own module. A burst counts the FLOPs of its
warmup step (:mod:`torchwatch.hook.burst`): the step the profiler discards anyway, so the count
costs no profiled step. :class:`FlopStep` enters a ``TorchDispatchMode`` at that step's start
and leaves it at its end (both in the main thread, at step boundaries): every aten op of the
step passes through it, and the ops with a FLOP formula in ``torch.utils.flop_counter`` (matmuls,
convolutions and their backward, attention) add their count. That is what
``torch.utils.flop_counter.FlopCounterMode`` counts, without its module tracker (global module
hooks, which make ``torch.compile`` warn and cost a Python call per module) and with the CPU's
attention kernel, which its registry lacks (a transformer block on the CPU read 0.92 of its
analytic count with it, 1.01 here). Measured on this repository's CPU models
(``bench/compile_flops.py``): the counted step costs 0.05-0.3 steps more than a plain one
(``FlopCounterMode``: 0.1-1.6); the profiler's own FLOP estimate (``with_flops``, which needs
``record_shapes``) costs 0.03-0.25 more per profiled step, three per burst, and misses convolution
backward (0.34 of a conv net's count) and the CPU's attention.

A compiled model keeps running compiled under the mode: it declares ``ignore_compile_internals``
(pytorch PR 161648, August 2025; torch 2.13 has it), without which dynamo skips a frame it meets
under a dispatch mode and marks it "skip" for good (measured: a compiled model run once under a
plain mode ran eagerly from then on, and recompiled no more). The count of compiled code is then
that of the ops inductor leaves to aten (matmuls, convolutions, attention by default; not its own
``max-autotune`` templates). A torch without ``ignore_compile_internals`` gets no count once
something compiled (the note says so).

On a CPU the achieved FLOP/s are compared with a peak measured once per process
(:func:`cpu_peak`): square matmuls of the step's dtype with the training's own intra-op threads,
the best rate of a few in about 50 ms, run in the same warmup step after the count.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from .. import wire

ENV = "TORCHWATCH_FLOPS"
"""``TORCHWATCH_FLOPS=0`` in the training's environment: bursts count no FLOPs (for the bench's
before/after)."""

PEAK_N = 512  # matmul size of the CPU peak: 268 MFLOP a call, 0.1-5 ms on today's CPUs
PEAK_BUDGET_S = 0.05  # time the CPU peak may take (once per process and dtype)
PEAK_MAX_CALLS = 200
_DTYPES = ("float32", "bfloat16", "float16", "float64")
_peaks: dict[tuple[str, int], tuple[float, float]] = {}  # (dtype, threads) -> (FLOP/s, ms it took)
_mode_cls: Any = None


def enabled() -> bool:
    """Whether bursts count FLOPs (``TORCHWATCH_FLOPS`` is not ``0``)."""
    return os.environ.get(ENV, "1").strip() != "0"


def _registry(torch: Any) -> dict[Any, Any]:
    """torch's FLOP formulas by op, with the CPU's flash attention (forward and backward), which
    ``flop_registry`` lacks, mapped to the CUDA kernels' formulas (same arguments)."""
    from torch.utils.flop_counter import flop_registry

    reg = dict(flop_registry)
    aten = torch.ops.aten
    for cpu, cuda in (
        ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward"),
    ):
        with contextlib.suppress(Exception):
            if hasattr(aten, cpu) and getattr(aten, cuda) in flop_registry:
                reg.setdefault(getattr(aten, cpu), flop_registry[getattr(aten, cuda)])
    return reg


def _mode_class() -> Any:
    """The counting ``TorchDispatchMode`` subclass (made once, when torch is there)."""
    global _mode_cls
    if _mode_cls is not None:
        return _mode_cls
    from torch._ops import HigherOrderOperator
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Counting(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Adds the FLOPs of each op with a formula; runs every op unchanged."""

        # A higher-order operator (torch.cond, flex_attention, a user's triton kernel) met under
        # a mode that does not take them raises NotImplementedError in the training: this mode
        # takes them and runs them as they are (uncounted), with itself popped as for any op.
        supports_higher_order_operators = True

        def __init__(self, registry: dict[Any, Any]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.registry = registry
            self.flops = 0
            self.by_dtype: dict[str, int] = {}
            self.device: str | None = None
            self.device_index: int | None = None
            self.errors = 0

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # dynamo (a torch that asks this) neither skips the compiled code nor marks it "skip"
            # for good because of this mode (it does both for a mode without this: a compiled
            # model run once under it ran eagerly from then on); compiled kernels run as compiled.
            return True

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if isinstance(func, HigherOrderOperator):
                return out
            formula = self.registry.get(getattr(func, "_overloadpacket", None))
            if formula is not None:
                try:
                    n = int(formula(*args, **kwargs, out_val=out))
                    self.flops += n
                    first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "device")), None)
                    if first is not None:
                        dtype = str(first.dtype).replace("torch.", "")
                        self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + n
                        if self.device is None:
                            self.device, self.device_index = first.device.type, first.device.index
                except Exception:
                    self.errors += 1
            return out

    _mode_cls = _Counting
    return _Counting


class FlopStep:
    """One step counted: :meth:`start` at its first boundary, :meth:`stop` at the next.

    Raises nothing: a failure is a ``flops_note`` in the result.
    """

    def __init__(self, torch: Any, mode: Any, t0: float) -> None:
        self.torch = torch
        self.mode = mode
        self.t0 = t0
        self.on = True
        self.blocked = False  # a mode of the training's was on top of ours once: the count is void

    @classmethod
    def start(cls, torch: Any, now: float | None = None) -> tuple[FlopStep | None, str | None]:
        """Enter the counting mode at ``now`` (monotonic s, the step boundary; default: the clock).
        Returns ``(the step, None)`` or ``(None, why not)``.

        Refused when any dispatch mode is on the stack already (the training's own, as
        ``FlopCounterMode`` around a whole step, ``optimizer.step()`` included): ours would be
        pushed inside the training's ``with`` block, whose ``__exit__`` pops the innermost mode,
        torchwatch's, and leaves the training's own on the stack for the rest of the run.
        """
        try:
            from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

            theirs = _get_current_dispatch_mode_stack()
            if theirs:
                names = ", ".join(sorted({type(m).__name__ for m in theirs}))
                return None, wire.clean_text(
                    f"FLOPs not counted: the training has a dispatch mode of its own on the stack at the step "
                    f"boundary ({names}): torchwatch's, pushed inside it, would be popped by its exit",
                    wire.TEXT,
                )
            if not hasattr(TorchDispatchMode, "ignore_compile_internals") and _compiled():
                # a torch that does not ask marks a compiled frame met under any dispatch mode
                # "skip" for good: the training would run eagerly from then on
                return None, "FLOPs not counted: under this torch the count would undo torch.compile"
            mode = _mode_class()(_registry(torch))
            mode.__enter__()
        except Exception as exc:
            return None, wire.clean_text(f"FLOPs not counted: {exc!r}", wire.TEXT)
        return cls(torch, mode, time.monotonic() if now is None else now), None

    def stop(self, now: float) -> dict[str, Any]:
        """Leave the mode, only from where :meth:`start` put it (the bottom of the stack, then
        its top: never pop the training's own), and return the :data:`wire.FLOP_FIELDS` it
        measured. A mode of the training's above ours leaves it on (:attr:`on`): the caller
        tries again at a later boundary. A mode no longer on the stack (the training's code
        popped it) is left alone: nothing is popped in its place."""
        if not self.on:
            return {}
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

            stack: list[Any] = list(_get_current_dispatch_mode_stack())
        except Exception:
            stack = [self.mode]
        blocked = {"flops_note": "FLOPs not counted: the training entered a dispatch mode of its own in that step"}
        if not any(m is self.mode for m in stack):
            self.on = False  # popped by someone else: never pop anything in its place
            return {"flops_note": "FLOPs not counted: the training's code popped torchwatch's counting mode"}
        if len(stack) != 1 or stack[0] is not self.mode:
            self.blocked = True  # left on: the caller tries again at the next boundary
            return blocked
        try:
            self.mode.__exit__(None, None, None)
        except Exception as exc:
            return {"flops_note": wire.clean_text(f"FLOPs not counted: {exc!r}", wire.TEXT)}
        self.on = False
        if self.blocked:
            return blocked
        mode: Any = self.mode
        out: dict[str, Any] = {"flop_step_ms": round((now - self.t0) * 1000, 4)}
        if mode.errors and not mode.flops:
            out["flops_note"] = f"FLOPs not counted: {mode.errors} formulas failed"
            return out
        out["flops_per_step"] = float(mode.flops)
        if mode.by_dtype:
            out["flops_dtype"] = wire.clean_text(max(mode.by_dtype.items(), key=lambda kv: kv[1])[0], 32)
        if mode.device is not None:
            out["flops_device"] = wire.clean_text(mode.device, 16)
            name = _device_name(self.torch, mode.device, mode.device_index)
            if name:
                out["device_name"] = wire.clean_text(name, wire.NAME)
        if not mode.flops:
            out["flops_note"] = "no matmul, convolution or attention in the counted step"
        return out


def _compiled() -> bool:
    """Whether ``torch.compile`` compiled a frame in this process (read without creating a key)."""
    counters = getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    frames = counters.get("frames") if isinstance(counters, dict) else None
    try:
        return bool(frames and int(frames.get("total", 0)) > 0)
    except Exception:
        return True


def _device_name(torch: Any, device: str, index: int | None) -> str | None:
    """The GPU's name (``NVIDIA H100 80GB HBM3``) or the CPU's model (``/proc/cpuinfo``)."""
    try:
        if device == "cuda":
            return str(torch.cuda.get_device_name(index if index is not None else torch.cuda.current_device()))
        if device == "cpu":
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.lower().startswith("model name"):
                        return line.split(":", 1)[1].strip()
    except Exception:
        return None
    return None


def cpu_peak(torch: Any, dtype: str | None) -> tuple[float, float] | None:
    """The CPU's matmul peak for ``dtype`` with the training's intra-op threads, FLOP/s, and the
    ms measuring it took; measured once per process, dtype and thread count (then remembered).

    Square ``PEAK_N`` matmuls into a preallocated output, the best rate of those that fit in
    ``PEAK_BUDGET_S`` (at most ``PEAK_MAX_CALLS``): a dense GEMM's rate, the most the CPU's math
    units give this dtype through torch's kernels (not the data sheet's peak); one timed call at least,
    whatever the budget. ``None`` on failure.
    """
    name = dtype if dtype in _DTYPES else "float32"
    try:
        threads = int(torch.get_num_threads())
        key = (name, threads)
        if key in _peaks:
            return _peaks[key]
        t_start = time.perf_counter()
        tdtype = getattr(torch, name)
        n = PEAK_N
        with torch.no_grad():
            a = torch.randn(n, n).to(tdtype)
            b = torch.randn(n, n).to(tdtype)
            out = torch.empty(n, n, dtype=tdtype)
            torch.mm(a, b, out=out)  # first call: kernel selection, caches
            best, calls = 0.0, 0
            # one timed call at least: on a loaded machine the set-up alone can outlast the budget
            # (a CI beside 8 busy processes got no peak at all)
            while calls < PEAK_MAX_CALLS and (calls == 0 or time.perf_counter() - t_start < PEAK_BUDGET_S):
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                dt = time.perf_counter() - t0
                if dt > 0:
                    best = max(best, 2.0 * n**3 / dt)
                calls += 1
        if best <= 0:
            return None
        _peaks[key] = (best, round((time.perf_counter() - t_start) * 1000, 3))
        return _peaks[key]
    except Exception:
        return None
