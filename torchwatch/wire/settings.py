"""The settings a live trial may change (:data:`SETTINGS`), how each is parsed from
``SETTING=VALUE`` and when it takes effect. The hook (inside the training) and torchwatch (the
reader) import the same table, so they agree by construction.

What each setting may change in what the training computes is its ``numerics`` class:

- ``exact``: nothing (the garbage collector's schedule; where DataLoader batches are made and
  how far ahead; pinned host memory). The same seed gives the same loss, bit for bit.
- ``rounding``: the same arithmetic in another order (intra-op threads split reductions
  differently; cuDNN's benchmark mode picks another algorithm): results may differ in their last
  bits, as between two runs with different thread counts. Allowed without a flag.
- ``precision``: less precise arithmetic (TF32 rounds matmul inputs to a 10-bit mantissa;
  ``medium`` matmul precision to bfloat16). Tried only with ``allow_numerics``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .base import clean_text

__all__ = [
    "ITERATOR",
    "NUMERICS",
    "SETTINGS",
    "STEPS",
    "VALUE_TEXT",
    "WORKERS_PER_CPU",
    "Assignment",
    "NotTried",
    "Setting",
    "check_cpu_bound",
    "check_trial",
    "cpu_bound",
    "find_setting",
    "parse_assignment",
    "show_value",
]


STEPS = "steps"  # the setting takes effect at a step boundary: blocks of steps
ITERATOR = "iterator"  # ... when a DataLoader iterator is made: blocks of whole epochs
NUMERICS = ("exact", "rounding", "precision")
VALUE_TEXT = 64
_INT = re.compile(r"^[0-9]{1,7}$")
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def _positive_int(text: str, hi: int) -> int:
    if not _INT.match(text) or not 1 <= int(text) <= hi:
        raise ValueError(f"expected a whole number from 1 to {hi}")
    return int(text)


def _count(text: str, hi: int) -> int:
    if not _INT.match(text) or int(text) > hi:
        raise ValueError(f"expected a whole number from 0 to {hi}")
    return int(text)


def _flag(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected true or false (1/0, on/off)")


def _threshold(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3:
        raise ValueError("expected 1 to 3 numbers: gen0[,gen1[,gen2]]")
    return tuple(_count(p, 10_000_000) for p in parts)


def _precision(text: str) -> str:
    if text not in ("highest", "high", "medium"):
        raise ValueError("expected highest, high or medium")
    return text


@dataclass(frozen=True)
class Setting:
    """One setting a trial may change.

    Attributes:
        name: its name on the command line (``threads=2``).
        aliases: other names accepted for it.
        mode: :data:`STEPS` or :data:`ITERATOR` (when the change takes effect).
        numerics: one of :data:`NUMERICS` (module docstring).
        what: what it changes in the training, in the user's words (the API it calls).
        refused: when not ``None``, why it is never tried live (the value is still parsed).
    """

    name: str
    aliases: tuple[str, ...]
    mode: str
    numerics: str
    what: str
    refused: str | None = None

    def parse(self, text: str) -> Any:
        """The value of ``text`` for this setting (an int, bool, tuple of ints or str).

        Raises:
            ValueError: not a value of this setting (the message says what is expected).
        """
        text = text.strip()
        if self.name in ("threads", "interop_threads"):
            return _positive_int(text, 4096)
        if self.name == "num_workers":
            return _count(text, 256)
        if self.name == "prefetch_factor":
            return _positive_int(text, 64)
        if self.name == "gc_threshold":
            return _threshold(text)
        if self.name == "matmul_precision":
            return _precision(text)
        return _flag(text)


SETTINGS: tuple[Setting, ...] = (
    Setting("threads", ("num_threads", "torch.set_num_threads", "intra_op_threads"), STEPS, "rounding",
            "torch.set_num_threads(N): the intra-op threads of every op"),
    Setting("interop_threads", ("torch.set_num_interop_threads",), STEPS, "rounding",
            "torch.set_num_interop_threads(N)",
            refused="torch sets the inter-op pool once per process (a second call raises): it could not be put "
            "back, so it is not tried live; set it at the start of the training"),
    Setting("gc_freeze", ("gc.freeze",), STEPS, "exact",
            "gc.freeze(): the objects alive now leave the collector's generations (gc.unfreeze() puts them back)"),
    Setting("gc_threshold", ("gc.set_threshold",), STEPS, "exact",
            "gc.set_threshold(gen0[, gen1[, gen2]]): how often the collector runs"),
    Setting("cudnn_benchmark", ("cudnn.benchmark", "torch.backends.cudnn.benchmark"), STEPS, "rounding",
            "torch.backends.cudnn.benchmark: cuDNN times its algorithms for each new shape and keeps the fastest"),
    Setting("tf32", ("allow_tf32",), STEPS, "precision",
            "torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32"),
    Setting("matmul_precision", ("torch.set_float32_matmul_precision", "float32_matmul_precision"), STEPS,
            "precision", "torch.set_float32_matmul_precision(highest|high|medium)"),
    Setting("num_workers", (), ITERATOR, "exact",
            "the DataLoader's num_workers, for the iterators the trial makes"),
    Setting("pin_memory", (), ITERATOR, "exact", "the DataLoader's pin_memory, for the iterators the trial makes"),
    Setting("prefetch_factor", (), ITERATOR, "exact",
            "the DataLoader's prefetch_factor (batches each worker loads ahead), for the iterators the trial makes"),
    Setting("persistent_workers", (), ITERATOR, "exact", "the DataLoader's persistent_workers",
            refused="a persistent iterator lives in the DataLoader across epochs, with its workers: switching it "
            "on and off would keep or shut down workers the training owns; set it in the DataLoader and "
            "compare two runs (torchwatch compare)"),
)  # fmt: skip

_BY_NAME = {n: s for s in SETTINGS for n in (s.name, *s.aliases)}


def find_setting(name: str) -> Setting | None:
    """The setting called ``name`` (its name or an alias), or ``None``."""
    return _BY_NAME.get(name.strip())


def parse_assignment(text: str) -> tuple[Setting, Any, str]:
    """``SETTING=VALUE`` as ``(setting, value, value text)``.

    Raises:
        ValueError: no ``=``, an unknown setting, or a value it does not take (the message lists
            the settings, or says what value is expected).
    """
    name, sep, value = text.partition("=")
    if not sep or not value.strip():
        raise ValueError(f"{clean_text(text, 40)!r} is not SETTING=VALUE")
    setting = find_setting(name)
    if setting is None:
        names = ", ".join(s.name for s in SETTINGS)
        raise ValueError(f"unknown setting {clean_text(name, 40)!r}: one of {names}")
    try:
        parsed = setting.parse(value)
    except ValueError as exc:
        raise ValueError(f"{setting.name}={clean_text(value, 20)}: {exc}") from None
    return setting, parsed, show_value(parsed)


@dataclass(frozen=True)
class Assignment:
    """A ``SETTING=VALUE`` a live trial may try (:func:`check_trial`).

    Attributes:
        setting: the setting (its canonical name in ``setting.name``).
        value: the parsed value (an int, bool, tuple of ints or str: :meth:`Setting.parse`).
        text: the value as the command line writes it (:func:`show_value`).
    """

    setting: Setting
    value: Any
    text: str


class NotTried(ValueError):
    """A ``SETTING=VALUE`` a live trial does not try; ``str()`` is the one line that says why.

    Attributes:
        why: ``"syntax"`` (not ``SETTING=VALUE``, an unknown setting, a value it does not take),
            ``"refused"`` (never tried live: :attr:`Setting.refused`), ``"numerics"`` (a
            ``precision`` setting without ``allow_numerics``) or ``"cpus"`` (beyond
            :func:`cpu_bound`).
        setting: the setting's name (its canonical name once known, else as written, cleaned).
        text: the value as written (cleaned), or as :func:`show_value` shows it once parsed.
    """

    def __init__(self, message: str, why: str, setting: str, text: str) -> None:
        super().__init__(message)
        self.why = why
        self.setting = setting
        self.text = text


def check_trial(text: str, *, allow_numerics: bool = False, usable_cpus: float | None = None) -> Assignment:
    """``SETTING=VALUE`` parsed and checked for a live trial: the one check both sides make
    (torchwatch before it sends a trial, the hook before it applies one), so they refuse alike.

    Args:
        text: ``SETTING=VALUE`` (a name or an alias of :data:`SETTINGS`).
        allow_numerics: a ``precision`` setting may be tried (``--allow-numerics``).
        usable_cpus: the training's usable CPUs (:func:`cpu_bound`); ``None``: not checked.

    Raises:
        NotTried: the first check that fails, in the order syntax, refused, numerics, cpus.
    """
    name, _sep, raw = text.partition("=")
    try:
        setting, value, shown = parse_assignment(text)
    except ValueError as exc:
        raise NotTried(str(exc), "syntax", clean_text(name.strip(), 40), clean_text(raw, VALUE_TEXT)) from None
    if setting.refused is not None:
        raise NotTried(f"{setting.name} is not tried live: {setting.refused}", "refused", setting.name, shown)
    if setting.numerics == "precision" and not allow_numerics:
        raise NotTried(
            f"{setting.name} changes the precision of the training's arithmetic (what it computes): "
            "only tried with --allow-numerics",
            "numerics", setting.name, shown,
        )  # fmt: skip
    why = check_cpu_bound(setting, value, usable_cpus)
    if why is not None:
        raise NotTried(why, "cpus", setting.name, shown)
    return Assignment(setting, value, shown)


def show_value(value: object) -> str:
    """A setting's value as the command line writes it (``true``, ``4``, ``700,10,10``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return clean_text(str(value), VALUE_TEXT)


WORKERS_PER_CPU = 4
"""DataLoader workers per usable CPU a trial may try at most: the most torchwatch ever advises
(workers that mostly wait on storage, ``analysis.workers.io_bound_workers``'s cap; each worker
also holds ``prefetch_factor`` batches in memory)."""


def cpu_bound(setting: Setting, usable_cpus: float | None) -> int | None:
    """The largest value of ``setting`` a live trial may set on a process with ``usable_cpus``
    (its affinity and cgroup quota, :func:`torchwatch.wire.cpus.usable_cpus`), or ``None`` when
    the setting has no CPU bound or the CPUs are unknown.

    - ``threads``: the usable CPUs, rounded up. Intra-op threads beyond them time-share the CPUs,
      and every op waits at its barrier for the thread that lost its CPU (4,096 threads on 2 CPUs
      made the steps 35 times slower until ``--max-s``): nothing to learn from trying more.
    - ``num_workers``: :data:`WORKERS_PER_CPU` per usable CPU, rounded up.
    """
    if usable_cpus is None or not math.isfinite(usable_cpus) or usable_cpus <= 0:
        return None
    cpus = max(1, math.ceil(usable_cpus - 1e-9))
    if setting.name == "threads":
        return cpus
    if setting.name == "num_workers":
        return WORKERS_PER_CPU * cpus
    return None


def check_cpu_bound(setting: Setting, value: object, usable_cpus: float | None) -> str | None:
    """Why ``value`` is beyond :func:`cpu_bound` (one line), or ``None`` when it is within it.

    Used by both sides: torchwatch before it sends a trial, the hook before it applies one.
    """
    bound = cpu_bound(setting, usable_cpus)
    if bound is None or not isinstance(value, int) or isinstance(value, bool) or value <= bound:
        return None
    assert usable_cpus is not None
    per = "" if setting.name == "threads" else f" ({WORKERS_PER_CPU} per CPU)"
    return (
        f"{setting.name}={value} is beyond the {bound}{per} that the training's {usable_cpus:g} usable CPUs "
        "carry: refused (more only wait for a CPU)"
    )
