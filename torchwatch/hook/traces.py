"""Burst traces on disk: where they go, and how a burst's trace is exported, summarised, gzipped
and its summary written (for :class:`torchwatch.hook.burst.Burster`, in its summary thread).

Where traces go (:func:`trace_dir`, one folder per training process and one per burst, so
that HolisticTraceAnalysis, which keeps one trace per rank of a folder, and TensorBoard's
profiler plugin, which reads ``*.pt.trace.json.gz``, each find exactly one burst)::

    <trace_dir>/<host>_<pid>_<YYYYmmdd-HHMMSS>/          the run (this training process)
        burst-1/<host>_<pid>[.rank<r>].1.pt.trace.json.gz  burst 1
        burst-1.summary.json                              its summary, beside the folder
        burst-2/...
    <trace_dir>/<group>/                                 a burst asked of every rank with one group name
        <host>_<pid>.rank<r>.<n>.pt.trace.json.gz        one trace per rank: one multi-rank trace for HTA
    <trace_dir>/<group>.<host>_<pid>.rank<r>.<n>.summary.json   each rank's summary, beside the folder

The rank (when known) is in the file name and in the trace's ``distributedInfo``: kineto writes
that key itself once ``torch.distributed`` is initialised (rank, world size, backend, process
groups); for a rank without it (identity from the environment only) the hook adds
``{"rank": r}``, which is what HolisticTraceAnalysis reads to tell the ranks of a folder apart.

Every folder is made and checked through :mod:`torchwatch.wire.files` (ours, not open to
others, not a link); files are written by name inside them, temporary ones renamed into place.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import wire

__all__ = ["burst_folder", "export_trace", "run_name", "trace_dir", "write_summary"]


def trace_dir() -> Path:
    """Where traces and their summaries are kept after the process exits:
    ``$TORCHWATCH_TRACE_DIR``, else ``$XDG_CACHE_HOME/torchwatch/traces`` (``~/.cache`` by default)."""
    if os.environ.get("TORCHWATCH_TRACE_DIR"):
        return Path(os.environ["TORCHWATCH_TRACE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torchwatch" / "traces"


def run_name(instance: wire.Instance, started_wall: float) -> str:
    """The folder of this training's traces: ``<host>_<pid>_<YYYYmmdd-HHMMSS>`` (local time the
    hook started).

    ``<host>_<pid>`` is the worker name TensorBoard's ``tensorboard_trace_handler`` uses. A
    burst asked of every rank with a group name goes to the group's folder instead (see the
    module docstring), one trace per rank.
    """
    return f"{_host()}_{instance.pid}_{time.strftime('%Y%m%d-%H%M%S', time.localtime(started_wall))}"


def _skip_to_object(src: Any) -> None:
    """Read ``src`` (a JSON file) up to and including its first ``{``, so that what follows can
    be written after an opening of our own.

    Raises:
        ValueError: the file does not start with a JSON object.
    """
    while True:
        ch = src.read(1)
        if ch == b"{":
            return
        if ch not in (b" ", b"\t", b"\r", b"\n"):
            raise ValueError("not a Chrome trace: it does not start with a JSON object")


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _host() -> str:
    """This machine's name as a file name: ``A-Z a-z 0-9 . -`` (others become ``-``), at most 64."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "host"


def burst_folder(trace_root: Path, run: str, group: str | None, n: int) -> tuple[int, Path]:
    """Open (creating as needed) the folder of burst ``n`` of the run ``run`` (or of the group
    ``group``) under ``trace_root``: ``(its fd, its path)``; the caller closes the fd. A
    group's folder may already exist, made by another rank of this user (the same
    checks apply: ours, not open to others, not a link).

    Raises:
        OSError: a folder cannot be made or fails a check.
    """
    base_fd = wire.prepare_dir(trace_root, parents=True)
    try:
        if group is not None:
            return wire.private_subdir(base_fd, group), trace_root / group
        run_fd = wire.private_subdir(base_fd, run)
    finally:
        os.close(base_fd)
    try:
        return wire.private_subdir(run_fd, f"burst-{n}"), trace_root / run / f"burst-{n}"
    finally:
        os.close(run_fd)


def export_trace(
    prof: Any, burst_fd: int, folder: Path, pid: int, n: int, max_bytes: int,
    rank: Callable[[], int | None], stem: Callable[[], str],
) -> dict[str, Any]:  # fmt: skip
    """Export burst ``n``'s trace (``prof``, a stopped ``torch.profiler.profile``) into ``folder``
    (open as ``burst_fd``, which the caller closes), summarise it if it is within ``max_bytes``,
    gzip it as ``<stem()>.<n>.pt.trace.json.gz``, with ``{"distributedInfo": {"rank": r}}`` added
    when kineto did not write it and ``rank()`` is known. Returns the summary's and the trace's
    fields (:class:`wire.BurstResult`'s).

    Raises:
        OSError, ValueError: the trace folder cannot be used, or the trace cannot be read.
    """
    # Temp names end in neither .json nor .gz: HTA, reading the folder while another rank is
    # still writing, takes every such file for a rank's trace.
    raw_name = f"{wire.TEMP_PREFIX}raw.{pid}.{n}.part"
    gz_name = f"{wire.TEMP_PREFIX}gz.{pid}.{n}.part"
    out: dict[str, Any] = {}
    try:
        for name in (raw_name, gz_name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=burst_fd)
        # torch writes by path: inside our own 0700 folder, which nobody else can change
        prof.export_chrome_trace(str(folder / raw_name))
        st = os.stat(raw_name, dir_fd=burst_fd, follow_symlinks=False)
        out["trace_bytes"] = size = st.st_size
        if size > max_bytes:
            out["trace_path"] = None
            out["trace_note"] = (
                f"trace of {size / 1e6:.0f} MB exceeds the {max_bytes / 1e6:.0f} MB bound: deleted unread"
            )
            out["error"] = out["trace_note"] + " (profile fewer steps)"
            return out
        from .summary import load_trace, summarize_trace

        trace = load_trace(folder / raw_name)
        try:
            out.update(summarize_trace(trace))
            has_rank = isinstance(trace.get("distributedInfo"), dict)
        finally:
            del trace
        rank_ = rank()
        head = b"" if has_rank or rank_ is None else b'{"distributedInfo": {"rank": %d}, ' % rank_
        final = f"{stem()}.{n}.pt.trace.json.gz"
        if _exists(final, burst_fd):
            raise OSError(f"{folder / final} already exists")
        fd = os.open(
            gz_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=burst_fd
        )
        with (
            open(raw_name, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW, dir_fd=burst_fd)) as src,
            os.fdopen(fd, "wb") as raw_dst,
            gzip.GzipFile(fileobj=raw_dst, mode="wb", compresslevel=3) as dst,
        ):
            if head:
                _skip_to_object(src)
                dst.write(head)
            shutil.copyfileobj(src, dst, 1 << 20)
        os.rename(gz_name, final, src_dir_fd=burst_fd, dst_dir_fd=burst_fd)
        out["trace_path"] = str(folder / final)
        out["trace_dir"] = str(folder)
        out["trace_gz_bytes"] = os.stat(final, dir_fd=burst_fd).st_size
    finally:
        for name in (raw_name, gz_name):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=burst_fd)
    return out


def write_summary(trace_root: Path, run: str, group: str | None, stem: str, n: int, last: wire.BurstResult) -> None:
    """Write burst ``n``'s summary ``last`` beside its folder (not in it: HTA reads every ``.json`` of the
    folder it is given): ``burst-<n>.summary.json`` in the run folder, or
    ``<group>.<host>_<pid>.rank<r>.<n>.summary.json`` beside a group's folder."""
    if group is None:
        where, name = trace_root / run, f"burst-{n}.summary.json"
    else:
        where, name = trace_root, f"{group}.{stem}.{n}.summary.json"
    fd = wire.open_dir(where, (os.geteuid(),), private=group is None)
    try:
        wire.write_atomic(fd, name, wire.encode_json(last.to_json()))
    finally:
        os.close(fd)
