"""The DataLoaders of the training as ``hook.json`` carries them: the settings the user passed and
what the hook measured on each (:class:`LoaderInfo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import _TIME_MAX, _U63, NAME, _Obj

__all__ = ["LOADER_SETTINGS", "LoaderInfo"]


@dataclass(frozen=True)
class LoaderInfo:
    """One DataLoader's settings as the user passed them, and what the hook measured on it.

    Attributes:
        num_workers, batch_size, prefetch_factor: as passed (``None`` when not set, e.g.
            ``batch_size`` with a ``batch_sampler``). pin_memory, persistent_workers, drop_last: as passed.
        multiprocessing_context: ``fork``, ``spawn``, ``forkserver`` or ``None``.
        dataset, collate_fn: type or function names. batches: batches taken. wait_s: s in
        ``__next__``. batch_bytes: bytes of the tensors of the first batch (``None``: not yet).
    """

    num_workers: int
    batch_size: int | None
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    multiprocessing_context: str | None
    dataset: str
    collate_fn: str
    batches: int
    wait_s: float
    batch_bytes: int | None
    drop_last: bool = False

    @classmethod
    def decode(cls, value: object, where: str) -> LoaderInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            num_workers=o.integer("num_workers", 0, 1 << 16),
            batch_size=o.integer("batch_size", 0, _U63, optional=True),
            pin_memory=o.flag("pin_memory"),
            prefetch_factor=o.integer("prefetch_factor", 0, 1 << 20, optional=True),
            persistent_workers=o.flag("persistent_workers"),
            multiprocessing_context=o.text("multiprocessing_context", 32, optional=True),
            dataset=o.text("dataset", NAME, optional=True) or "",
            collate_fn=o.text("collate_fn", NAME, optional=True) or "",
            batches=o.integer("batches", 0, _U63),
            wait_s=o.number("wait_s", 0.0, _TIME_MAX),
            batch_bytes=o.integer("batch_bytes", 0, _U63, optional=True),
            drop_last=o.flag("drop_last", optional=True) or False,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (the keys torchwatch's report shows)."""
        return dict(self.__dict__)

    def settings_text(self) -> str:
        """The settings a fix quotes, as the user would write them: ``num_workers=2,
        batch_size=32, pin_memory=False, prefetch_factor=2, persistent_workers=False`` (the last two
        only with workers, where they apply; ``batch_size`` only when set)."""
        parts = [f"num_workers={self.num_workers}"]
        if self.batch_size is not None:
            parts.append(f"batch_size={self.batch_size}")
        parts.append(f"pin_memory={self.pin_memory}")
        if self.num_workers:
            parts.append(f"prefetch_factor={self.prefetch_factor}")
            parts.append(f"persistent_workers={self.persistent_workers}")
        return ", ".join(parts)


LOADER_SETTINGS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last")
"""The :class:`LoaderInfo` fields that are settings the user passed, in the order the report and
the TUI show them (each face iterates this list: a new setting is a field, its decoding, and a
name here)."""
