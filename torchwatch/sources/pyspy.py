"""Python stacks of every thread of the training process, from ``py-spy record`` chunks.

Scheme (measured on a 2-core machine, see bench/): ``py-spy record --nonblocking --idle
--threads --format raw`` over chunks of a few seconds. ``--nonblocking`` never pauses the
target (the default blocking mode slowed a torch loop ~40 % and hid DataLoader waits);
``--idle`` keeps blocked threads, which is where DataLoader waits live. Each py-spy start
costs ~0.06 CPU-s, so chunks are seconds long; ``--subprocesses`` more than doubled the cost,
so workers are read from ``/proc`` thread states instead. ``record`` writes its file only at
the end of a chunk and must never be stopped with SIGTERM (data lost): chunks simply run out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from torchwatch.model.hang import DumpedThread
from torchwatch.model.readings import Frame, Role, SourceStatus, StackSample, Status
from torchwatch.model.text import escape
from torchwatch.sources import FocusedSource, Pace, SourceContext, SourceSpec, container

if TYPE_CHECKING:
    from torchwatch.sources.proc import ProcessTree

_FRAME_RE = re.compile(r"^(?P<name>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_THREAD_RE = re.compile(r"^thread \((?P<tid>0x[0-9a-fA-F]+|\d+)\)(?:: (?P<name>.*))?$")
_PROCESS_RE = re.compile(r"^process (?P<pid>\d+):")


def find_pyspy() -> str | None:
    """Path of the py-spy binary: next to this Python (pip installs it there), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("py-spy")


def parse_raw(
    text: str,
    t: float,
    main_pid: int,
    role_of: Callable[[int], Role],
    tids: Mapping[int, int] | None = None,
) -> list[StackSample]:
    """Parse py-spy's raw (collapsed) output into stack samples.

    Args:
        text: lines ``[process PID:"cmd";]...thread (TID): NAME;frame;...;leaf COUNT`` where a
            frame is ``name (file:line)``, outermost first.
        t: timestamp for every sample (end of the chunk), monotonic seconds.
        main_pid: the PID py-spy was pointed at (used when lines carry no ``process`` frame).
        role_of: role of a PID in the watched tree.
        tids: for a target in another PID namespace (a container), ``{thread ID inside it:
            thread ID in torchwatch's}`` (:func:`~torchwatch.sources.container.thread_map`):
            py-spy names threads as the target sees them (its main thread is 1 when it is
            PID 1 there). Every thread ID of the result is torchwatch's; a line whose thread
            is not in ``tids`` (it exited before the map was read) is dropped, never taken
            for a host thread of the same number. ``None``: IDs are torchwatch's already.

    Returns:
        One :class:`StackSample` per line; malformed lines are skipped. Names (frames, files,
        threads) are the target's text: characters that are not printable come escaped
        (:func:`~torchwatch.model.text.escape`).
    """
    out: list[StackSample] = []
    for raw_line in text.split("\n"):
        line = raw_line if raw_line.isprintable() else escape(raw_line)
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        pid, tid, thread_name = main_pid, None, ""
        frames: list[Frame] = []
        for part in stack.split(";"):
            if tid is None:
                m = _PROCESS_RE.match(part)
                if m:
                    pid = int(m.group("pid"))
                    continue
                m = _THREAD_RE.match(part)
                if m:
                    raw = m.group("tid")
                    tid = int(raw, 16) if raw.startswith("0x") else int(raw)
                    thread_name = m.group("name") or ""
                    continue
            m = _FRAME_RE.match(part)
            if m:
                frames.append(Frame(m.group("name"), m.group("file"), int(m.group("line"))))
        if tid is None:
            continue
        if tids is not None:
            if tid not in tids:
                continue
            tid = tids[tid]
        out.append(
            StackSample(
                t=t,
                pid=pid,
                tid=tid,
                thread_name=thread_name,
                role=role_of(pid),
                is_main_thread=(tid == pid),
                frames=tuple(frames),
                count=int(count_text),
            )
        )
    return out


def explain_failure(stderr: str, pid: int) -> SourceStatus:
    """Turn py-spy's error output into an ``unavailable`` status with the fix."""
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low or "eperm" in low:
        scope = _ptrace_scope()
        hint = "run torchwatch as root or with CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE)"
        if scope not in (None, 0):
            hint += f"; or allow ptrace: echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope (now {scope})"
        return SourceStatus.unavailable(f"py-spy may not read process {pid}: permission denied", hint)
    if "failed to find python version" in low or "failed to find a python interpreter" in low:
        return SourceStatus.unavailable(
            f"py-spy found no Python interpreter in process {pid}",
            "attach to the Python training process itself, or upgrade py-spy for a new Python version",
        )
    first = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "no output")
    return SourceStatus.unavailable(f"py-spy failed: {first}", "pip install -U py-spy")


def _ptrace_scope() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def foreign_tids(pid: int) -> dict[int, int] | None:
    """``{thread ID inside: thread ID in torchwatch's namespace}`` for a process ``pid`` whose own
    PID namespace is not torchwatch's (its ``NSpid`` has more than one entry), read after a
    py-spy run; ``None`` when it shares torchwatch's (py-spy's IDs are then ours already)."""
    ids = container.ns_ids(pid)
    if len(ids) < 2:
        return None
    return container.thread_map(pid)


class PySpySource(FocusedSource):
    """Stacks of every thread of the training process the session diagnoses, one py-spy chunk a call.

    Args:
        role_of: role of a PID in the watched tree.
        alive: whether the watched root still runs.
        rate: samples per second per thread (20: ~1-2 % of one core with 3 s chunks).
        chunk: seconds per py-spy run; the first run is half as long for a faster verdict.
        binary: py-spy path; default :func:`find_pyspy`.
    """

    name = "py-spy"

    def __init__(
        self,
        role_of: Callable[[int], Role],
        alive: Callable[[], bool],
        rate: int = 20,
        chunk: float = 3.0,
        binary: str | None = None,
    ) -> None:
        self.role_of = role_of
        self.alive = alive
        self.rate = rate
        self.chunk = chunk
        self.interval = 0.0  # back to back: each call blocks for one chunk
        self.binary = binary or find_pyspy()
        self.status = (
            SourceStatus(Status.STARTING)
            if self.binary
            else SourceStatus.unavailable("py-spy not found", "pip install py-spy (it ships the binary)")
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._first = True
        self._failures = 0
        self._closed = False
        self._cut = False  # the running chunk was ended early on purpose: not a failure
        self.cpu_s = 0.0  # CPU seconds all py-spy runs used (user + system)

    def sample(self, now: float, focus: int | None) -> list[object]:
        """Record one chunk of ``focus`` (blocks ``chunk`` seconds) and return its stack samples;
        ``focus`` ``None`` (no training process found yet): none, after a 0.2 s pause."""
        if self.binary is None or self._closed or self.status.status is Status.UNAVAILABLE:
            time.sleep(0.5)
            return []
        pid = focus
        if pid is None:
            time.sleep(0.2)
            return []
        seconds = self.chunk / 2 if self._first else self.chunk
        with tempfile.TemporaryDirectory(prefix="torchwatch-pyspy-") as tmp:
            out_path = Path(tmp) / "raw.txt"
            cmd = [
                self.binary,
                "record",
                "--nonblocking",
                "--idle",
                "--threads",
                "--full-filenames",
                "--format",
                "raw",
                "--rate",
                str(self.rate),
                "--duration",
                str(max(1, round(seconds))),
                "--pid",
                str(pid),
                "--output",
                str(out_path),
            ]
            try:
                proc = self._proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            except OSError as exc:
                self._proc = None
                self.status = SourceStatus.unavailable(f"cannot run py-spy: {exc}", "pip install py-spy")
                return []
            code, err = self._reap(proc, seconds + 15)
            self._proc = None
            cut, self._cut = self._cut, False
            text = out_path.read_text(errors="replace") if out_path.exists() else ""
        end = time.monotonic()
        if text:
            self._first = False
            self._failures = 0
            self.status = SourceStatus.ok()
            return list(parse_raw(text, end, pid, self.role_of, foreign_tids(pid)))
        if not self.alive():
            self.status = SourceStatus.gone()
            return []
        if code != 0 and not cut:  # a chunk cut before py-spy set its SIGINT handler wrote nothing
            self._failures += 1
            # A Python that is still starting has no interpreter state yet: retry a few times.
            if self._failures >= 3 or "permission" in err.decode(errors="replace").lower():
                self.status = explain_failure(err.decode(errors="replace"), pid)
        return []

    def _reap(self, proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, bytes]:
        """Wait for one py-spy run; add its CPU time (``wait4`` rusage) to :attr:`cpu_s`."""
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            assert proc.stderr is not None
            err = proc.stderr.read()
            proc.stderr.close()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere
            proc.wait()
            usage = None
        finally:
            killer.cancel()
        if usage is not None:
            self.cpu_s += usage.ru_utime + usage.ru_stime
        return proc.returncode, err

    def cut_short(self) -> None:
        """End the running chunk now (SIGINT: py-spy writes what it sampled and exits, and the
        next chunk starts at the current :attr:`rate`): a slow steady chunk must not hold the
        fast cadence back for seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._cut = True
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)

    def close(self) -> None:
        """Stop a running py-spy with SIGINT (SIGTERM would lose its data) and stop sampling."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(2)
                proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()


DUMP_TIMEOUT_S = 10.0  # a dump takes 0.01-0.03 s here (a py-spy start); a stuck one is killed
DUMP_MAX_BYTES = 8 << 20  # 8 MiB of JSON: thousands of deep threads


def parse_dump(text: str) -> tuple[DumpedThread, ...]:
    """Threads from ``py-spy dump --json`` output (a list of threads, frames innermost first).

    Frame, file and thread names are the target's text: characters that are not printable come
    escaped (:func:`~torchwatch.model.text.escape`), so none makes a line of its own in a log,
    the hang record or the terminal.

    Raises:
        ValueError: not the JSON py-spy writes (the message says what is wrong).
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy dump: expected a list of threads")
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("frames"), list):
            raise ValueError("py-spy dump: a thread without frames")
        frames = []
        for f in reversed(item["frames"]):
            if isinstance(f, dict) and isinstance(f.get("line"), int):
                frames.append(Frame(escape(str(f.get("name", "?"))), escape(str(f.get("filename", "?"))), f["line"]))
        tid = item.get("os_thread_id") or item.get("thread_id")
        out.append(
            DumpedThread(
                tid=tid if isinstance(tid, int) else 0,
                name=escape(str(item.get("thread_name") or "")),
                active=bool(item.get("active")),
                frames=tuple(frames),
            )
        )
    return tuple(out)


def dump_threads(
    pid: int, binary: str | None = None, timeout: float = DUMP_TIMEOUT_S, nonblocking: bool = False
) -> tuple[tuple[DumpedThread, ...], str | None, float]:
    """Every thread of ``pid`` once, with ``py-spy dump --json`` (Python frames only).

    py-spy pauses the process (ptrace) only while it reads the stacks: 0.01-0.03 s for a
    training rank or a DataLoader worker on the 2-core test machine; ``nonblocking`` reads
    them without pausing it (py-spy's ``--nonblocking``: a frame may be read mid-change). ``--native`` is left out:
    it took 0.2-1.15 s per process there (0.76 CPU-s for a rank loading libtorch's symbols),
    40-100x more, and would take minutes over 8 ranks of 8 workers.

    Returns:
        ``(threads, error, seconds)``: the threads (main thread first), why there are none
        (one line, ``None`` when it worked) and the dump's wall time, s. Never raises.
    """
    binary = binary or find_pyspy()
    if binary is None:
        return (), "py-spy not found (pip install py-spy)", 0.0
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [
                binary,
                "dump",
                "--json",
                "--full-filenames",
                "--pid",
                str(pid),
                *(["--nonblocking"] if nonblocking else []),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return (), f"py-spy dump of PID {pid} took over {timeout:g} s: stopped", time.monotonic() - t0
    except OSError as exc:
        return (), f"cannot run py-spy: {exc}", time.monotonic() - t0
    took = time.monotonic() - t0
    if done.returncode != 0:
        return (), explain_failure(done.stderr.decode(errors="replace"), pid).reason or "py-spy failed", took
    if len(done.stdout) > DUMP_MAX_BYTES:
        return (), f"py-spy dump of PID {pid}: over {DUMP_MAX_BYTES >> 20} MiB of output", took
    try:
        threads = parse_dump(done.stdout.decode(errors="replace"))
    except ValueError as exc:
        return (), str(exc), took
    tids = foreign_tids(pid)
    if tids is not None:  # a container's thread IDs: torchwatch's, or dropped (see parse_raw)
        threads = tuple(replace(t, tid=tids[t.tid]) for t in threads if t.tid in tids)
    main = [t for t in threads if t.tid == pid]
    return (*main, *(t for t in threads if t.tid != pid)), None, took


def _role_in(tree: ProcessTree) -> Callable[[int], Role]:
    """The role of a PID in ``tree`` (``other`` when it is not in it)."""

    def role_of(pid: int) -> Role:
        node = tree.nodes().get(pid)
        return node.role if node else Role.OTHER

    return role_of


def _make(ctx: SourceContext) -> PySpySource:
    opts = ctx.options
    return PySpySource(_role_in(ctx.tree), ctx.tree.root_alive, rate=opts.pyspy_rate, chunk=opts.pyspy_chunk_s)


def _steady(fast: Pace, window_s: float) -> Pace:
    """A quarter of the fast rate (at least 5 Hz) in chunks of 8 s (at most 0.8 of the window: a
    chunk and py-spy's start, 0.1-0.5 s, must fit in it); never faster than ``fast``."""
    rate = int(fast["rate"])
    return {"rate": min(rate, max(5, rate // 4)), "chunk_s": max(fast["chunk_s"], min(8.0, 0.8 * window_s))}


def _apply(src: PySpySource, pace: Pace) -> None:
    """Set the rate and chunk; going faster, cut a slow chunk short, so the fast readings start now."""
    faster = int(pace["rate"]) > src.rate
    src.rate, src.chunk = int(pace["rate"]), pace["chunk_s"]
    if faster:
        src.cut_short()


# py-spy blocks for a chunk: a thread of its own. Its "rate" (Hz) and "chunk_s" (s) are paced.
SPEC = SourceSpec(
    name="py-spy",
    readings=(StackSample,),
    make=_make,
    ticked=False,
    words=("py-spy",),
    fast=lambda options: {"rate": options.pyspy_rate, "chunk_s": options.pyspy_chunk_s},
    steady=_steady,
    apply=_apply,
    helper_cpu_s=lambda src: src.cpu_s,
    pending=lambda src: "stacks" if src.status.status is Status.STARTING else None,
)
