"""Who a process is in a distributed job (:class:`RankInfo`: rank, world size, job key, and where
each answer came from), as ``hook.json`` carries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import NAME, WireError, _Obj, clean_text
from .identity import Instance

__all__ = ["MAX_RANKS", "MAX_SPAWNED", "RANK_FIELDS", "RANK_SOURCES", "RankInfo"]


RANK_SOURCES = ("env", "torch.distributed", "mp.spawn index", "mp.spawn parent")
RANK_FIELDS = ("rank", "local_rank", "world_size", "local_world_size", "group_rank", "job", "backend")
MAX_RANKS = 1 << 20  # ranks and world sizes above this are not a real job's
MAX_SPAWNED = 256  # PIDs of the ranks one torch.multiprocessing.spawn call started, kept in hook.json


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in a distributed job, and where each answer came from.

    Attributes:
        rank, world_size: the global rank and the number of ranks (``RANK``, ``WORLD_SIZE``, or
            ``torch.distributed.get_rank()`` / ``get_world_size()`` once initialised).
        local_rank, local_world_size: the rank on this machine and the ranks on it
            (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; for ``torch.multiprocessing.spawn`` ranks the
            process index passed to the function is the local rank when nothing else says).
        group_rank: the machine's index among the job's machines (``GROUP_RANK``, torchrun).
        job: a key shared by every rank of one job: ``TORCHELASTIC_RUN_ID`` (torchrun, unless
            ``none``), else ``MASTER_ADDR:MASTER_PORT``, else the address of a ``tcp://``
            ``init_method``, else ``mp.spawn:<the spawning process's hook directory name>``.
        backend: the default process group's backend (``gloo``, ``nccl``, ...) once initialised.
        spawned_by: the hook directory name (:attr:`Instance.dir_name`) of the process whose
            ``torch.multiprocessing.spawn`` started this rank; ``None`` otherwise.
        sources: ``(field, source)`` for each field set: ``env``, ``torch.distributed``,
            ``mp.spawn index`` or ``mp.spawn parent`` (:data:`RANK_SOURCES`).
    """

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    group_rank: int | None = None
    job: str | None = None
    backend: str | None = None
    spawned_by: str | None = None
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, field: str) -> str | None:
        """Where ``field`` came from (one of :data:`RANK_SOURCES`), ``None`` when unset."""
        return dict(self.sources).get(field)

    @classmethod
    def decode(cls, value: object, where: str) -> RankInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        src = _Obj(o.d.get("sources") or {}, f"{where}.sources")
        unknown = [k for k in src.d if k not in RANK_FIELDS]
        if unknown:
            raise WireError(f"{src.where}: unknown key {clean_text(str(unknown[0]), 40)!r}")
        spawned = o.text("spawned_by", 64, optional=True)
        if spawned is not None and Instance.from_dir_name(spawned) is None:
            raise WireError(f"{where}.spawned_by: not a hook directory name")
        return cls(
            rank=o.integer("rank", 0, MAX_RANKS, optional=True),
            local_rank=o.integer("local_rank", 0, MAX_RANKS, optional=True),
            world_size=o.integer("world_size", 1, MAX_RANKS, optional=True),
            local_world_size=o.integer("local_world_size", 1, MAX_RANKS, optional=True),
            group_rank=o.integer("group_rank", 0, MAX_RANKS, optional=True),
            job=o.text("job", NAME, optional=True),
            backend=o.text("backend", 32, optional=True),
            spawned_by=spawned,
            sources=tuple((k, src.text(k, 32, choices=RANK_SOURCES)) for k in RANK_FIELDS if k in src.d),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``sources`` as ``{field: source}``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (*RANK_FIELDS, "spawned_by")}
        out["sources"] = dict(self.sources)
        return out
