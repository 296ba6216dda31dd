"""Ranks: who this process is in a distributed job, and the ranks it starts. Standard library only.

**Identity** (:class:`Identity`, published as ``hook.json``'s ``rank``): ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` and a job key from the environment, where
torchrun (``python -m torch.distributed.run``), accelerate and deepspeed put them; else from
``torch.distributed`` once ``init_process_group`` has run (wrapped, so the hook learns the rank,
world size and backend as soon as they exist); else, for a rank started by
``torch.multiprocessing.spawn``, the process index that torch passes to its function (the local
rank). Each value says where it came from. A DataLoader worker never gets here: forked workers
switch the hook off at fork and spawned ones never install it.

**torch.multiprocessing.spawn ranks** (:func:`patch_spawn`). A spawned rank and a spawned
DataLoader worker run the very same command line (``python -c "from multiprocessing.spawn
import spawn_main; ..." --multiprocessing-fork``), and when the hook's ``sitecustomize`` runs in
the child nothing has been unpickled yet: the child cannot tell what it is. Its parent can: a
rank is started by ``start_processes`` (which ``spawn`` calls), a worker by a DataLoader. So the
parent's hook wraps ``start_processes``: while torch starts the processes (and only then: the
environment is put back as soon as torch builds its ``ProcessContext``, before it joins them)
the environment carries the variables that pre-load the hook (which the parent's hook took out
of its own environment at install) and :data:`SPAWN_MARK`, the parent's hook directory name.
The child's ``sitecustomize`` installs the hook when it sees the mark, and the hook takes the
mark and the pre-load variables out of the rank's environment at once, so the rank's own
DataLoader workers, spawned later, inherit neither. Installing in every spawned child and
deciding later (when torch's ``_wrap`` or the DataLoader's ``_worker_loop`` runs) was not chosen:
it would put a hook, a signal handler and an import watcher in every spawned worker for a while,
and without the parent's help the child would not even run the hook's ``sitecustomize``.

Ranks started with ``start_method="fork"`` or ``"forkserver"`` get no hook (a fork inherits the
parent's hook switched off; the fork server runs no ``sitecustomize``); the parent's hook says so
in its errors.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import socket
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from .. import wire

SPAWN_MARK = "TORCHWATCH_SPAWNED_RANK"
"""Set by the hook of a process around its ``torch.multiprocessing.start_processes`` calls: the
processes started then are ranks (value: the parent's hook directory name, ``<pid>-<start>-<pidns>``)."""

# (field, environment variable, smallest value)
_ENV_INTS = (
    ("rank", "RANK", 0),
    ("local_rank", "LOCAL_RANK", 0),
    ("world_size", "WORLD_SIZE", 1),
    ("local_world_size", "LOCAL_WORLD_SIZE", 1),
    ("group_rank", "GROUP_RANK", 0),
)
_ENV = "env"
_DIST = "torch.distributed"
_INDEX = "mp.spawn index"
_PARENT = "mp.spawn parent"


def take_spawn_mark(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Remove :data:`SPAWN_MARK` from the environment; the parent's hook directory name it held
    when it is one (``None`` otherwise)."""
    env = os.environ if environ is None else environ
    value = env.pop(SPAWN_MARK, None)
    if value is None or wire.Instance.from_dir_name(value) is None:
        return None
    return value


def _env_int(environ: Mapping[str, str], name: str, lo: int) -> int | None:
    text = environ.get(name, "").strip()
    if not text.isdigit() or len(text) > 7:
        return None
    value = int(text)
    return value if lo <= value <= wire.MAX_RANKS else None


def spawn_index() -> int | None:
    """The index ``torch.multiprocessing.spawn`` gave this process (``fn(i, *args)``), once its
    function runs; ``None`` in any other process."""
    mp = sys.modules.get("multiprocessing.process")
    if mp is None:
        return None
    proc = mp.current_process()
    target = getattr(proc, "_target", None)
    where = (getattr(target, "__module__", None), getattr(target, "__name__", None))
    if where != ("torch.multiprocessing.spawn", "_wrap"):
        return None
    args = getattr(proc, "_args", ())
    index = args[1] if isinstance(args, tuple) and len(args) > 1 else None
    return index if isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= wire.MAX_RANKS else None


def _tcp_address(init_method: object) -> str | None:
    """``host:port`` of a ``tcp://host:port`` init method."""
    if isinstance(init_method, str) and init_method.startswith("tcp://"):
        rest = init_method[len("tcp://") :].split("?", 1)[0].strip("/")
        return wire.clean_text(rest, 200) or None
    return None


_LOOPBACK = ("localhost", "127.", "::1", "0:0:0:0:0:0:0:1")


def job_from_env(environ: Mapping[str, str]) -> str | None:
    """The key every rank of one job shares, on every node, from the environment its launcher
    set (the first that is there); ``None`` when none is.

    1. ``TORCHWATCH_JOB``: the user's own (on Kubernetes, the pod spec sets it from the downward
       API, e.g. the ``batch.kubernetes.io/job-name`` label).
    2. ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; not ``none``, torchrun's default, which
       unrelated jobs share): stays the same when an elastic job restarts.
    3. ``MASTER_ADDR:MASTER_PORT``: the rendezvous endpoint (torchrun sets it to rank 0's store
       on every node; so do Kubeflow's PyTorchJob and most Slurm scripts). A loopback address is
       every machine's own, so it is qualified by this machine's name (``host/127.0.0.1:29500``):
       two single-node jobs on two nodes are not one job.
    4. ``slurm:SLURM_JOB_ID[.SLURM_STEP_ID]``: one step of a Slurm job.

    A pod's cgroup path names only the pod (one per node), never the job: it is not used.
    """
    explicit = environ.get("TORCHWATCH_JOB", "").strip()
    if explicit:
        return wire.clean_text(explicit, wire.NAME) or None
    run_id = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return wire.clean_text(run_id, wire.NAME) or None
    addr, port = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "").strip()
    if addr and port:
        if addr.startswith(_LOOPBACK):
            addr = f"{socket.gethostname()}/{addr}"
        return wire.clean_text(f"{addr}:{port}", wire.NAME) or None
    slurm, step = environ.get("SLURM_JOB_ID", "").strip(), environ.get("SLURM_STEP_ID", "").strip()
    if slurm.isdigit():
        return f"slurm:{slurm}" + (f".{step}" if step.isdigit() else "")
    return None


class Identity:
    """What this process knows of its place in a distributed job.

    Args:
        spawned_by: the parent's hook directory name when ``torch.multiprocessing.spawn``
            started this process (:func:`take_spawn_mark`), else ``None``.
    """

    def __init__(self, spawned_by: str | None = None) -> None:
        self.spawned_by = spawned_by
        self.dist_rank: int | None = None
        self.dist_world: int | None = None
        self.backend: str | None = None
        self.init_address: str | None = None

    def learn(self, dist: Any, init_method: object = None) -> None:
        """Read rank, world size and backend from ``torch.distributed`` (the module) when its
        default process group exists; never raises."""
        with contextlib.suppress(Exception):
            if init_method is not None and self.init_address is None:
                self.init_address = _tcp_address(init_method)
            if not dist.is_available() or not dist.is_initialized():
                return
            rank, world = dist.get_rank(), dist.get_world_size()
            if isinstance(rank, int) and 0 <= rank <= wire.MAX_RANKS:
                self.dist_rank = rank
            if isinstance(world, int) and 1 <= world <= wire.MAX_RANKS:
                self.dist_world = world
            self.backend = wire.clean_text(str(dist.get_backend()), 32) or None

    def info(self, torch: Any = None, environ: Mapping[str, str] | None = None) -> wire.RankInfo | None:
        """The identity as published (``None`` when nothing says this is a rank).

        Args:
            torch: the imported ``torch`` (read ``torch.distributed`` if not learnt yet).
            environ: default ``os.environ`` (read each time: a ``spawn`` function often sets
                ``MASTER_ADDR`` before ``init_process_group``).
        """
        env = os.environ if environ is None else environ
        if self.dist_rank is None and torch is not None:
            dist = getattr(torch, "distributed", None)
            if dist is not None:
                self.learn(dist)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}

        def put(field: str, value: Any, source: str) -> None:
            if value is not None and field not in values:
                values[field] = value
                sources[field] = source

        for field, var, lo in _ENV_INTS:
            put(field, _env_int(env, var, lo), _ENV)
        put("rank", self.dist_rank, _DIST)
        put("world_size", self.dist_world, _DIST)
        # Also without the parent's mark: a hook that attach injected into a spawned rank.
        put("local_rank", spawn_index(), _INDEX)
        put("job", job_from_env(env), _ENV)
        if self.spawned_by is not None:
            put("job", f"mp.spawn:{self.spawned_by}", _PARENT)
        put("job", self.init_address, _DIST)
        put("backend", self.backend, _DIST)
        if not values and self.spawned_by is None:
            return None
        return wire.RankInfo(
            **values,
            spawned_by=self.spawned_by,
            sources=tuple((f, sources[f]) for f in wire.RANK_FIELDS if f in sources),
        )


def patch_init(hook: Any) -> list[tuple[Any, str, Any]]:
    """Wrap ``torch.distributed.init_process_group``: after it returns, learn rank, world size
    and backend and republish. Returns what to put back (``(owner, name, original)``).

    ``hook`` gives ``identity`` (:class:`Identity`), ``active()``, ``publish()``, ``error(msg)``.
    """
    dc: Any = importlib.import_module("torch.distributed.distributed_c10d")
    dist: Any = importlib.import_module("torch.distributed")
    orig = dc.init_process_group
    try:
        sig: inspect.Signature | None = inspect.signature(orig)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = orig(*args, **kwargs)
        if hook.active():
            try:
                init_method = kwargs.get("init_method")
                if init_method is None and sig is not None:
                    with contextlib.suppress(TypeError):
                        init_method = sig.bind(*args, **kwargs).arguments.get("init_method")
                hook.identity.learn(dist, init_method)
                hook.publish()
            except Exception as exc:
                hook.error(f"rank identity: {exc!r}")
        return result

    undo = [(dc, "init_process_group", orig)]
    dc.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group
        undo.append((dist, "init_process_group", orig))
    return undo


def _boot_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def rank_environment(parent: wire.Instance, burst_at: tuple[int, ...], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables set while ``start_processes`` starts ranks: those that pre-load the hook
    (``PYTHONPATH`` with the boot directory first, ``TORCHWATCH_HOOK``, ``TORCHWATCH_HOOK_PATH``,
    ``TORCHWATCH_BURST_AT``) and :data:`SPAWN_MARK`."""
    path = environ.get("PYTHONPATH")
    out = {
        "TORCHWATCH_HOOK": "1",
        "TORCHWATCH_HOOK_PATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "PYTHONPATH": _boot_dir() + (os.pathsep + path if path else ""),
        SPAWN_MARK: parent.dir_name,
    }
    if burst_at:
        out["TORCHWATCH_BURST_AT"] = ",".join(str(s) for s in burst_at)
    return out


def _swap_env(values: Mapping[str, str]) -> dict[str, str | None]:
    """Set ``values`` in ``os.environ``; returns the previous values (``None``: was unset)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return saved


def _restore_env(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def patch_spawn(hook: Any) -> list[tuple[Any, str, Any]]:
    """Wrap ``torch.multiprocessing.start_processes`` (``spawn`` calls it) so that the processes
    it starts with the ``spawn`` method are ranks with a hook (see the module docstring).
    Returns what to put back.

    ``hook`` gives ``instance``, ``burst_at``, ``spawned_ranks`` (a list of PIDs), ``active()``,
    ``publish()``, ``error(msg)``.
    """
    sp: Any = importlib.import_module("torch.multiprocessing.spawn")
    tmp: Any = importlib.import_module("torch.multiprocessing")
    orig_start = sp.start_processes
    orig_init = sp.ProcessContext.__init__
    try:
        sig: inspect.Signature | None = inspect.signature(orig_start)
    except (TypeError, ValueError):
        sig = None
    pending: list[dict[str, str | None]] = []  # environments to put back (one per call in progress)

    def put_back() -> None:
        while pending:
            _restore_env(pending.pop())

    @functools.wraps(orig_start)
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        marked = False
        if hook.active() and sig is not None:
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                method = bound.arguments.get("start_method")
                if method == "spawn":
                    pending.append(_swap_env(rank_environment(hook.instance, hook.burst_at, os.environ)))
                    marked = True
                else:
                    hook.error(f"ranks started with start_method={method!r} get no hook: use 'spawn'")
            except TypeError:
                pass  # torch raises the same error itself
            except Exception as exc:
                hook.error(f"torch.multiprocessing.spawn: {exc!r}")
        try:
            return orig_start(*args, **kwargs)
        finally:
            if marked:
                put_back()

    @functools.wraps(orig_init)
    def __init__(ctx: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(ctx, *args, **kwargs)
        if not pending:
            return
        put_back()  # every rank is started: its children must not inherit the mark
        try:
            pids = [p.pid for p in getattr(ctx, "processes", ()) if isinstance(getattr(p, "pid", None), int)]
            hook.spawned_ranks.extend(pids[: wire.MAX_SPAWNED - len(hook.spawned_ranks)])
            hook.publish()
        except Exception as exc:
            hook.error(f"torch.multiprocessing.spawn: {exc!r}")

    undo: list[tuple[Any, str, Any]] = [(sp, "start_processes", orig_start), (sp.ProcessContext, "__init__", orig_init)]
    sp.start_processes = start_processes
    sp.ProcessContext.__init__ = __init__
    if getattr(tmp, "start_processes", None) is orig_start:
        tmp.start_processes = start_processes
        undo.append((tmp, "start_processes", orig_start))
    return undo
