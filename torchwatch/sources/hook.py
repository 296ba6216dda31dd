"""The in-process hook, read from outside: its published files, and burst requests.

The hook (``torchwatch.hook``) writes ``hook.json`` and a ``counters`` file into a per-process
directory; this source reads both twice a second. A burst is asked for by writing
``request.json`` and sending the hook's signal, and only after two checks (DESIGN.md, safety):
the hook announced that it owns the signal, and ``/proc/PID/status`` ``SigCgt`` shows the
signal is caught. A process that does not catch SIGUSR2 would be killed by it (kineto#406).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchwatch.hook import publish
from torchwatch.readings import HookState, SourceStatus, Status
from torchwatch.target import catches

NO_HOOK_HINT = "start the training with torchwatch run, or call torchwatch.hook.install() at the top of the script"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"TORCHWATCH_DIR", b"TMPDIR"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def hook_dir(pid: int) -> Path:
    """Where the hook of ``pid`` publishes (from its environment and owner)."""
    return publish.base_dir(_environ(pid), _uid(pid)) / str(pid)


class HookReader:
    """Reads the published files of one process's hook.

    Args:
        pid: the training process.
        directory: its hook directory; default :func:`hook_dir`.
    """

    def __init__(self, pid: int, directory: Path | None = None) -> None:
        self.pid = pid
        self.dir = directory or hook_dir(pid)
        self._info: dict[str, Any] | None = None
        self._mtime: int | None = None
        self._last_step_end = 0.0
        self.seen = False  # published at least once

    def info(self) -> dict[str, Any] | None:
        """``hook.json``, re-read only when it changed; ``None`` when there is none."""
        path = self.dir / publish.STATE_FILE
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            self._info, self._mtime = None, None
            return None
        if mtime != self._mtime:
            data = publish.read_json(path)
            if data is not None and data.get("schema") == publish.SCHEMA:
                self._info, self._mtime = data, mtime
        return self._info

    def read(self, now: float) -> HookState | None:
        """One reading, or ``None`` when the hook has not published (yet)."""
        info = self.info()
        if info is None:
            return None
        snap = publish.read_counters(self.dir / publish.COUNTERS_FILE)
        if snap is None:
            return None
        new = tuple(e for e in snap.entries if e[0] > self._last_step_end)
        if new:
            self._last_step_end = new[-1][0]
        self.seen = True
        return HookState(
            t=now,
            pid=self.pid,
            steps=snap.steps,
            batches=snap.batches,
            data_wait_s=snap.data_wait_s,
            in_next_since=snap.in_next_since,
            new_steps=new,
            first_step_t=snap.first_step_t,
            info=info,
        )

    def burst_possible(self) -> tuple[bool, str]:
        """Whether a burst may be asked for now, and if not, why (one line)."""
        info = self.info()
        if info is None:
            return False, f"no hook in PID {self.pid}: {NO_HOOK_HINT}"
        signum = int(info.get("signal") or 0)
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        if not info.get("signal_owned"):
            errors = "; ".join(info.get("errors") or [])
            return False, f"the hook in PID {self.pid} does not own {name}" + (f" ({errors})" if errors else "")
        if not catches(self.pid, signum):
            return False, f"PID {self.pid} does not catch {name} (SigCgt): sending it would kill the process"
        state = (info.get("burst") or {}).get("state")
        if state not in (None, "idle"):
            return False, f"a burst is already {state}"
        return True, f"ready ({name})"

    def request_burst(self, params: dict[str, Any] | None = None) -> tuple[bool, str]:
        """Write ``request.json`` and send the hook's signal, after the safety checks.

        Returns:
            ``(sent, message)``; the result appears later in ``info()["burst"]["last"]``.
        """
        ok, why = self.burst_possible()
        if not ok:
            return False, why
        info = self.info() or {}
        signum = int(info["signal"])
        path = self.dir / publish.REQUEST_FILE
        try:
            publish.write_json_atomic(path, dict(params or {}))
            owner = self.dir.stat().st_uid
            if os.geteuid() == 0 and owner != 0:
                os.chown(path, owner, -1)  # the hook must be able to read what root wrote
        except OSError as exc:
            return False, f"cannot write {path}: {exc.strerror or exc}"
        # re-check right before sending: the handler may have changed in between
        if not catches(self.pid, signum):
            return False, f"PID {self.pid} stopped catching signal {signum}: not sent"
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return False, f"PID {self.pid} exited"
        except PermissionError:
            return False, f"not allowed to signal PID {self.pid}: run torchwatch as its user"
        return True, f"burst #{int((info.get('burst') or {}).get('count') or 0) + 1} requested from PID {self.pid}"


class HookSource:
    """Sampler of the hook of the training process the session diagnoses.

    Args:
        main_pid: returns the training process to read (the session's choice), or ``None``.
        expected: the hook was pre-loaded (``torchwatch run``): its absence means "starting"
            until torch is imported, not "unavailable".
        interval: seconds between reads.
    """

    name = "hook"

    def __init__(self, main_pid: Callable[[], int | None], expected: bool, interval: float = 0.5) -> None:
        self.interval = interval
        self.expected = expected
        self.status = SourceStatus(Status.STARTING, "waiting for the training process")
        self._main_pid = main_pid
        self._readers: dict[int, HookReader] = {}

    def reader(self) -> HookReader | None:
        """The reader of the current training process, or ``None`` before it is found."""
        pid = self._main_pid()
        if pid is None:
            return None
        rd = self._readers.get(pid)
        if rd is None:
            rd = self._readers[pid] = HookReader(pid)
        return rd

    def sample(self, now: float) -> Sequence[object]:
        """Read the hook's files once; sets :attr:`status`."""
        rd = self.reader()
        if rd is None:
            return []
        reading = rd.read(now)
        if reading is None:
            if rd.seen or not Path(f"/proc/{rd.pid}").exists():
                self.status = SourceStatus.gone("the training exited (its hook removed its files)")
            elif self.expected:
                self.status = SourceStatus(Status.STARTING, "waiting for the training to import torch")
            else:
                self.status = SourceStatus.unavailable(f"no hook in PID {rd.pid}", NO_HOOK_HINT)
            return []
        self.status = SourceStatus.ok()
        return [reading]

    def close(self) -> None:
        """Nothing to release (files are read, not held open)."""
        with contextlib.suppress(Exception):
            self._readers.clear()
