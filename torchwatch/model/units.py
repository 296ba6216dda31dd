"""Every number for people, in one place: bytes, rates, shares, percentages, times and feature values.

One unit system for bytes everywhere (the report, the status line, every panel of the TUI, rule
texts): binary prefixes, as the kernel and ``free -h`` count memory, ``4.0 KiB``, ``1.5 GiB``. A
value that was not measured prints ``n/a``, never ``0``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchwatch.model.readings import Wait

NA = "n/a"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# One letter per thread state (the processes table's "threads" column; the legend under it).
WAIT_LETTERS: dict[Wait, str] = {
    Wait.RUNNING: "R",
    Wait.DISK: "D",
    Wait.FILE: "F",
    Wait.SYNC: "W",
    Wait.SLEEP: "S",
    Wait.NET: "N",
    Wait.OTHER: "?",
}


def human_bytes(n: float) -> str:
    """Bytes with binary units, 2-3 significant digits: ``512 B``, ``4.0 KiB``, ``2.0 MiB``, ``21 GiB``."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"


def human_duration(seconds: float) -> str:
    """Seconds as a person says them: ``45 s``, ``3 min 10 s``, ``2.5 h``; ``never`` for inf."""
    if seconds != seconds or seconds == float("inf"):
        return "never"
    s = max(0.0, float(seconds))
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{s:.0f} s"


def fmt_bytes(n: float | None) -> str:
    """:func:`human_bytes`, or ``n/a`` for a value that was not measured."""
    return NA if n is None else human_bytes(n)


def fmt_mib_per_s(bytes_per_s: float | None) -> str:
    """A rate in MiB/s as a bare number for a column headed ``MiB/s`` (``0.0`` is a real zero)."""
    return NA if bytes_per_s is None else f"{bytes_per_s / MIB:.1f}"


def fmt_mib_rate(bytes_per_s: float) -> str:
    """A signed rate with its unit, for a growth: ``+3.1 MiB/s``, ``-2.9 MiB/s``."""
    return f"{bytes_per_s / MIB:+.1f} MiB/s"


def fmt_pct(pct: float | None, digits: int = 0) -> str:
    """A percentage already in % units: ``35%`` or ``n/a``."""
    return NA if pct is None else f"{pct:.{digits}f}%"


def fmt_share(share: float | None) -> str:
    """A 0..1 share as a percentage: ``62%`` or ``n/a``."""
    return NA if share is None else f"{100 * share:.0f}%"


def fmt_ms(ms: float | None) -> str:
    """Milliseconds with one decimal: ``312.5 ms`` or ``n/a``."""
    return NA if ms is None else f"{ms:.1f} ms"


def fmt_value(value: float | None, unit: str) -> str:
    """A feature value with its unit (the units of the feature catalogue: ``share``, ``%``, ``bytes``,
    ``bytes/s``, ``ms``, ``steps/s``, ``s``, ``flag``, ``count``, ``CPUs``): ``62%``, ``1.5 MiB/s``,
    ``4.0 KiB``, ``0.065 ms``, ``yes``, ``n/a``."""
    if value is None:
        return NA
    if unit == "share":
        return f"{value:.0%}"
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "bytes/s":
        return f"{human_bytes(value)}/s"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "ms":
        return f"{value:.3g} ms" if abs(value) < 100 else f"{value:.0f} ms"
    if unit == "steps/s":
        return f"{value:.2f} steps/s"
    if unit == "s":
        return f"{value:.0f} s"
    if unit == "flag":
        return "yes" if value else "no"
    if unit == "TFLOP/s":
        return f"{value:.3g} TFLOP/s"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def series_range(values: Sequence[float], unit: str = "") -> str:
    """Lowest and highest value of a series: ``30–55``, ``0.9–1.2 GiB`` (``unit="bytes"``), or one
    value when both print the same."""
    lo, hi = min(values), max(values)
    if unit == "bytes" and hi >= MIB:
        scale, name, digits = (GIB, "GiB", 1) if hi >= GIB else (MIB, "MiB", 0)
        lo_text, hi_text = f"{lo / scale:.{digits}f}", f"{hi / scale:.{digits}f}"
        return f"{hi_text} {name}" if lo_text == hi_text else f"{lo_text}–{hi_text} {name}"
    lo_text, hi_text = f"{lo:.3g}", f"{hi:.3g}"
    return hi_text if lo_text == hi_text else f"{lo_text}–{hi_text}"


def amp_words(
    autocast: bool | None, dtype: str | None = None, device_type: str | None = None, grad_scaler: bool = False
) -> str:
    """Mixed precision in words, the same in rule fixes, the report and the TUI.

    Args:
        autocast: whether an enabled ``torch.autocast`` was seen; ``None``: unknown (no hook).
        dtype / device_type: its dtype and device (``bfloat16``, ``cuda``) when known.
        grad_scaler: a ``GradScaler`` was seen.

    Returns:
        ``unknown (no hook)``, ``autocast bfloat16 on cuda + GradScaler``, ``autocast on``,
        ``no autocast seen`` (with `` (GradScaler on)`` when one was seen anyway).
    """
    if autocast is None:
        return "unknown (no hook)"
    if autocast:
        text = "autocast " + " ".join(p for p in (dtype, f"on {device_type}" if device_type else None) if p)
        text = text if dtype or device_type else "autocast on"
        return text + (" + GradScaler" if grad_scaler else "")
    return "no autocast seen" + (" (GradScaler on)" if grad_scaler else "")
