"""The in-process hook, read from outside: its published files, and burst requests.

The hook (``torchwatch.hook``) writes ``hook.json`` and a ``counters`` file into a directory
named after its process instance (:class:`torchwatch.wire.Instance`); this source reads
both twice a second. torchwatch often runs as root and the directory belongs to the training's
user, so every file there is treated as hostile (:mod:`torchwatch.wire.files`): read only
through a checked directory descriptor, only regular files of that user, size-capped,
schema-checked, and only when they name the very process watched (PID, start time and PID
namespace), so neither PID reuse nor a stale or planted directory passes for a live hook.

A burst is asked for by writing ``request.json`` (a new root-owned file renamed into place,
never chown'ed) and sending the hook's signal, only after these checks: the signal is one of
SIGUSR1, SIGUSR2 or a real-time signal, the hook announced that it owns it, and
``/proc/PID/status`` ``SigCgt`` shows it is caught (a process that does not catch SIGUSR2 is
killed by it, kineto#406). The signal goes through a pidfd taken before the checks, so it
reaches the process checked or nobody.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchwatch import wire
from torchwatch.model.readings import OTHER_RANKS_EVERY, HookState, SourceStatus, Status
from torchwatch.model.text import escape
from torchwatch.sources import FocusedSource, SourceContext, SourceSpec, set_interval
from torchwatch.sources.proc import catches

NO_HOOK_HINT = "start the training with torchwatch run, or call torchwatch.hook.install() at the top of the script"


def running_no_hook_hint(pid: int) -> str:
    """The hint for a command that needs the hook in the running training ``pid`` (burst, trial):
    :data:`NO_HOOK_HINT`, or inject it now with ``attach --keep-hook``."""
    return (
        "start the training with torchwatch run, call torchwatch.hook.install() at the top of the script, "
        f"or inject it into the running training: torchwatch attach {pid} --keep-hook (torchwatch detach {pid} "
        "takes it out)"
    )


BOOT_NOTE_BYTES = 400  # as the boot writes it (torchwatch/hook/boot/sitecustomize.py)
BOOT_FAILED_HINT = (
    "the training's Python could not load torchwatch's hook from torchwatch's own directory: install torchwatch "
    "where that Python can read it, or call torchwatch.hook.install() in the training"
)
BASE_REFUSED_HINT = (
    "set TORCHWATCH_DIR in the training's environment to a private directory of the training's user "
    "(e.g. $HOME/.cache/torchwatch), then start the training again"
)


def _environ(pid: int) -> dict[str, str] | None:
    """``TORCHWATCH_DIR`` and ``TMPDIR`` of ``pid`` (``{}`` when unreadable); ``None`` when the
    file reads empty: a process is in that state from the moment its ``execve`` releases the
    parent of a ``vfork`` (``subprocess.Popen`` returns then) until the kernel has laid out the
    new environment (85 of 100 reads right after ``Popen`` here), so a caller must look again
    rather than take the default directory for good."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)  # ARG_MAX-sized at most; the variables we need come with it
    except OSError:
        return {}
    if not raw:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"TORCHWATCH_DIR", b"TMPDIR"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _status(pid: int, key: str) -> list[str]:
    """The fields of one line of ``/proc/PID/status`` (``[]`` when absent or unreadable); only
    that line is split (the file has ~60 lines and is read every hook read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = "\n" + f.read(1 << 16)  # the kernel escapes a newline in Name, the one free-text field
    except OSError:
        return []
    at = text.find(f"\n{key}:")
    if at < 0:
        return []
    start = at + len(key) + 2
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)].split()


def _uid(pid: int) -> int | None:
    try:
        return int(_status(pid, "Uid")[0])
    except (IndexError, ValueError):
        return None


def instance_of(pid: int) -> wire.Instance:
    """The process instance behind host ``pid``, as its own hook names it: its PID in its own
    PID namespace (last ``NSpid:`` field), start time and PID-namespace inode.

    Raises:
        wire.WireError: the process is gone or cannot be read (one-line reason).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = wire.stat_start(f.read())
        ns = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except FileNotFoundError:
        raise wire.WireError(f"PID {pid} has exited") from None
    except PermissionError:
        raise wire.WireError(f"not allowed to read PID {pid}: run torchwatch as its user") from None
    except OSError as exc:
        raise wire.WireError(f"cannot read PID {pid}: {exc.strerror or exc}") from None
    nspid = _status(pid, "NSpid") or [str(pid)]
    try:
        local = int(nspid[-1])
    except ValueError:
        raise wire.WireError(f"PID {pid}: unreadable NSpid") from None
    return wire.Instance(local, start, ns)


def _base(pid: int, uid: int | None, root: str | None = None) -> tuple[Path, bool]:
    """The target's hook base directory, as the target names it, and whether that is settled
    (``False`` while its environment reads empty, mid-``execve``: :func:`_environ`; the default
    directory is returned then). A relative ``TORCHWATCH_DIR`` is taken from its working
    directory (the hook fixes it when it starts), except across mount namespaces (``root`` set:
    :func:`torchwatch.wire.root_of`), where it stays relative and is refused when opened."""
    env = _environ(pid)
    base = wire.base_dir(env or {}, uid)
    if not base.is_absolute() and root is None:
        with contextlib.suppress(OSError):
            base = Path(os.readlink(f"/proc/{pid}/cwd")) / base
    return base, env is not None


def hook_dir(pid: int) -> Path | None:
    """Where the hook of ``pid`` publishes (from its environment, owner and instance); ``None``
    when the process cannot be read."""
    try:
        inst = instance_of(pid)
    except wire.WireError:
        return None
    return _base(pid, _uid(pid), wire.root_of(pid))[0] / inst.dir_name


class HookReader:
    """Reads the published files of one process's hook, safely (see the module docstring).

    Args:
        pid: the training process (a PID of torchwatch's namespace).
        directory: its hook directory, as the process names it; default :func:`hook_dir`.

    A process in another mount namespace (a container) names its directory in its own view of
    the filesystem: it is reached through ``/proc/PID/root`` (:attr:`root`), every component
    opened without following links out of that root (:func:`torchwatch.wire.open_dir_in`), and
    the same owner, mode and size checks apply.

    Attributes:
        reason: why the last read found no usable hook (one line; ``""`` after a good read).
        missing: the last read found no files at all (the hook has not published, or is gone),
            as opposed to files that were refused.
        gone: the process exited, or its PID now belongs to another process.
        seen: the hook published at least once.
        root: ``/proc/PID/root`` when the process sees another filesystem, else ``None``.
    """

    def __init__(self, pid: int, directory: Path | None = None) -> None:
        self.pid = pid
        self.uid = _uid(pid)
        self.root = wire.root_of(pid)
        try:
            self.instance: wire.Instance | None = instance_of(pid)
            self.reason = ""
        except wire.WireError as exc:
            self.instance, self.reason = None, str(exc)
        self.dir: Path | None = directory
        self.base: Path | None = None
        self._settled = directory is not None or self.instance is None  # see _locate
        self._locate()
        self.missing = True
        self.gone = False
        self._info: dict[str, Any] | None = None
        self._record: wire.HookRecord | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._last_step_end = 0.0
        self._written = 0  # the counters' entry count at the last read: later reads decode what is newer
        self.seen = False

    def _locate(self) -> None:
        """Name the hook directory from the target's environment, again on every read until
        that environment could be read (a process caught mid-``execve`` shows none: it would
        otherwise be looked for in the default directory for good, while its hook publishes
        under its ``TORCHWATCH_DIR``)."""
        if not self._settled:
            assert self.instance is not None
            base, self._settled = _base(self.pid, self.uid, self.root)
            self.dir = base / self.instance.dir_name
        self.base = self.dir.parent if self.dir is not None else None

    # -- checks -----------------------------------------------------------------------------
    def _still_same(self) -> str:
        """Why ``pid`` is no longer the process this reader was made for ("" when it is)."""
        if self.instance is None:
            return self.reason or f"PID {self.pid} cannot be read"
        try:
            now = instance_of(self.pid)
        except wire.WireError as exc:
            return str(exc)
        if now != self.instance:
            return f"PID {self.pid} is now another process (its start time or PID namespace changed)"
        return ""

    def _open(self) -> int:
        """The hook directory, opened and checked (this user's, private).

        Raises:
            FileNotFoundError: no directory. wire.Unsafe / OSError / wire.WireError: refused.
        """
        self._locate()
        if self.dir is None or self.uid is None:
            raise wire.WireError(self.reason or f"PID {self.pid} cannot be read")
        return wire.open_dir_in(self.root, self.dir, (self.uid,), private=True)

    def base_refused(self) -> str:
        """Why no hook of this process can publish at all: its base directory (``$TMPDIR/
        torchwatch-UID`` or ``TORCHWATCH_DIR``) is one the hook refuses, as its own check does
        (:func:`torchwatch.wire.files.prepare_dir`: a symbolic link, another user's, writable
        by others without the sticky bit), so a hook there turns itself off. One line naming the
        directory and the check (escaped: the path comes from the training's environment);
        ``""`` when it is fine, missing (the hook creates it) or cannot be told."""
        self._locate()
        if self.base is None or self.uid is None:
            return ""
        try:
            fd = wire.open_dir_in(self.root, self.base, (self.uid,), private=False)
        except wire.Unsafe as exc:
            return escape(str(exc))
        except OSError:
            return ""
        os.close(fd)
        return ""

    def _fail(self, reason: str, missing: bool = False) -> None:
        self.reason, self.missing = reason, missing
        self._info = self._record = None
        self._stamp = None

    # -- reading ----------------------------------------------------------------------------
    def record(self) -> wire.HookRecord | None:
        """The checked ``hook.json``, re-read only when it changed; ``None`` (and
        :attr:`reason`) when there is none, it is refused, or the process is another one."""
        why = self._still_same()
        if why:
            self._fail(why, missing=True)
            self.gone = self.instance is not None
            return None
        try:
            fd = self._open()
        except FileNotFoundError:
            self._fail(f"no hook in PID {self.pid}", missing=True)
            return None
        except (OSError, ValueError) as exc:
            self._fail(f"hook files of PID {self.pid} refused: {exc}")
            return None
        try:
            return self._read_state(fd)
        finally:
            os.close(fd)

    def _read_state(self, fd: int) -> wire.HookRecord | None:
        assert self.uid is not None and self.instance is not None
        try:
            st = os.stat(wire.STATE_FILE, dir_fd=fd, follow_symlinks=False)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp and self._record is not None:
                return self._record
            rec = wire.HookRecord.decode(wire.read_json(fd, wire.STATE_FILE, (self.uid,), wire.STATE_MAX_BYTES))
        except FileNotFoundError:
            self._fail(f"no hook in PID {self.pid}", missing=True)
            return None
        except (OSError, ValueError, RecursionError, MemoryError) as exc:
            self._fail(f"hook files of PID {self.pid} refused: {exc}")
            return None
        if rec.instance != self.instance:
            self._fail(
                f"hook files of PID {self.pid} refused: written by process {rec.instance.dir_name}, "
                f"not by {self.instance.dir_name} (a stale or foreign directory)"
            )
            return None
        self._record, self._info, self._stamp = rec, rec.to_json(), stamp
        self.reason, self.missing = "", False
        return rec

    def last_words(self) -> wire.HookRecord | None:
        """``hook.json`` as the hook left it when its process exited: read without checking that
        the PID is still that process (it is gone), but only from this reader's directory (named
        after the process's PID, start time and PID namespace, so a reused PID has another one)
        and only when the record names that same process. The hook keeps its files at exit
        only after a CUDA out-of-memory error (:mod:`torchwatch.hook.oom`); ``None`` otherwise,
        and on any refusal."""
        if self.instance is None or self.uid is None:
            return None
        try:
            fd = self._open()
        except (OSError, ValueError):
            return None
        try:
            rec = wire.HookRecord.decode(wire.read_json(fd, wire.STATE_FILE, (self.uid,), wire.STATE_MAX_BYTES))
        except (OSError, ValueError, RecursionError, MemoryError):
            return None
        finally:
            os.close(fd)
        return rec if rec.instance == self.instance else None

    def info(self) -> dict[str, Any] | None:
        """``hook.json`` as a checked dict (see :meth:`record`); ``None`` when there is none."""
        return self._info if self.record() is not None else None

    def counters(self) -> wire.CounterSnapshot | None:
        """The checked ``counters``; ``None`` (and :attr:`reason`) when missing or refused."""
        if self.instance is None or self._still_same():
            return None
        try:
            fd = self._open()
        except (OSError, ValueError) as exc:
            self._fail(f"hook files of PID {self.pid} refused: {exc}", isinstance(exc, FileNotFoundError))
            return None
        try:
            assert self.uid is not None
            return wire.read_counters(fd, (self.uid,), self.instance, since=self._written)
        except FileNotFoundError:
            self._fail(f"no hook in PID {self.pid}", missing=True)
        except wire.Busy as exc:
            self.reason = str(exc)
        except (OSError, ValueError) as exc:
            self._fail(f"hook files of PID {self.pid} refused: {exc}")
        finally:
            os.close(fd)
        return None

    def read(self, now: float) -> HookState | None:
        """One reading, or ``None`` when the hook has not published (yet) or was refused."""
        rec = self.record()
        if rec is None:
            return None
        snap = self.counters()
        if snap is None:
            return None
        self._written = snap.written
        new = tuple(e for e in snap.entries if e[0] > self._last_step_end)
        detailed = tuple(s for s in snap.rank_steps() if s.end > self._last_step_end)
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
            record=rec,
            rank_steps=detailed,
        )

    # -- bursts -----------------------------------------------------------------------------
    def burst_possible(self) -> tuple[bool, str]:
        """Whether a burst may be asked for now, and if not, why (one line)."""
        rec = self.record()
        if rec is None:
            hint = f": {running_no_hook_hint(self.pid)}" if self.missing else ""
            return False, (self.reason or f"no hook in PID {self.pid}") + hint
        signum = rec.signal
        name = wire.signal_name(signum)
        if not wire.signal_allowed(signum):
            errors = "; ".join(rec.errors)
            return False, f"bursts are off in PID {self.pid}" + (f" ({errors})" if errors else f" (signal {name})")
        if not rec.signal_owned:
            errors = "; ".join(rec.errors)
            return False, f"the hook in PID {self.pid} does not own {name}" + (f" ({errors})" if errors else "")
        if not catches(self.pid, signum):
            return False, f"PID {self.pid} does not catch {name} (SigCgt): sending it would kill the process"
        state = rec.burst.state if rec.burst is not None else "idle"
        if state != "idle":
            return False, f"a burst is already {state}"
        return True, f"ready ({name})"

    def request_burst(self, params: wire.BurstRequest | None = None) -> tuple[bool, str]:
        """Write ``request.json`` (``params``, else the default bounds) and send the hook's
        signal, after the safety checks. The hook clamps each bound to its safe range.

        Returns:
            ``(sent, message)``; the result appears later in ``info()["burst"]["last"]``.
        """
        ok, why = self.burst_possible()
        if not ok:
            return False, why
        rec = self.record()
        if rec is None:
            return False, self.reason
        sent, message = self._send(params if params is not None else wire.BurstRequest(), rec)
        if not sent:
            return False, message
        count = rec.burst.count if rec.burst is not None else 0
        return True, f"burst #{count + 1} requested from PID {self.pid}"

    def request_trial(self, request: wire.TrialRequest | wire.TrialStop) -> tuple[bool, str]:
        """Write a live trial's ``request.json`` (a :class:`~torchwatch.wire.TrialRequest`
        or a :class:`~torchwatch.wire.TrialStop`) and send the hook's signal, after the same checks as a
        burst's (the hook owns and catches its signal); the hook answers in ``record().trial``.

        Returns:
            ``(sent, message)``.
        """
        ok, why = self.burst_possible()
        rec = self.record()
        if rec is None:
            return False, why
        if not ok and not why.startswith("a burst is already"):
            return False, why
        return self._send(request, rec)

    def _send(
        self, request: wire.BurstRequest | wire.TrialRequest | wire.TrialStop, rec: wire.HookRecord
    ) -> tuple[bool, str]:
        """Write ``request`` as ``request.json`` and signal the hook of ``rec``."""
        if self.dir is None:
            return False, self.reason
        try:
            fd = self._open()
            try:
                # A new file of ours (root's, when root runs torchwatch), renamed into place:
                # nothing of the target user's is opened for writing or chown'ed.
                wire.write_atomic(fd, wire.REQUEST_FILE, wire.encode_json(request.to_json()), 0o644)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            return False, f"cannot write {self.dir / wire.REQUEST_FILE}: {getattr(exc, 'strerror', None) or exc}"
        assert self.instance is not None
        return send_burst_signal(self.pid, self.instance, rec.signal)


def send_burst_signal(pid: int, expect: wire.Instance, signum: int) -> tuple[bool, str]:
    """Send burst signal ``signum`` to ``pid``, only if it is still ``expect`` and catches it.

    The pidfd is taken first, the checks made after: if the PID is reused in between, the
    checks see the new process and refuse; if not, the pidfd can only reach the process
    checked. Falls back to ``os.kill`` where pidfds are not supported (Linux < 5.3).

    Returns:
        ``(sent, message)``.
    """
    name = wire.signal_name(signum)
    if not wire.signal_allowed(signum):
        return False, f"{name} is not a burst signal (SIGUSR1, SIGUSR2, SIGRTMIN+N): not sent"
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False, f"PID {pid} exited"
    except (AttributeError, OSError):
        pidfd = None  # no pidfd support: os.kill below, right after the checks
    try:
        try:
            now = instance_of(pid)
        except wire.WireError as exc:
            return False, f"{exc}: not sent"
        if now != expect:
            return False, f"PID {pid} is now another process: not sent"
        if not catches(pid, signum):
            return False, f"PID {pid} does not catch {name} (SigCgt): not sent"
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            return False, f"PID {pid} exited"
        except PermissionError:
            return False, f"not allowed to signal PID {pid}: run torchwatch as its user"
        return True, f"{name} sent"
    finally:
        if pidfd is not None:
            os.close(pidfd)


class HookSource(FocusedSource):
    """Sampler of the hooks of the training processes: the one the session diagnoses (the focus
    of each :meth:`sample`; its status is the source's) and every other rank of the job.

    Args:
        expected: the hook was pre-loaded (``torchwatch run``): its absence means "starting"
            until torch is imported, not "unavailable".
        interval: seconds between reads.
        rank_pids: returns every training process (rank) of the tree; their hooks are read too
            (one reading each per round). ``None``: the focus process only.
        boot_note: the file where ``torchwatch run``'s boot writes why it could not load the hook
            (``TORCHWATCH_BOOT_NOTE``); when it holds a line and no hook published, the status says it.
    """

    name = "hook"

    def __init__(
        self,
        expected: bool,
        interval: float = 0.5,
        rank_pids: Callable[[], Sequence[int]] | None = None,
        boot_note: Path | None = None,
    ) -> None:
        self.interval = interval
        self._boot_note = boot_note
        self._boot_said = ""
        self._rank_pids = rank_pids
        self._round = 0
        self.expected = expected
        self.status = SourceStatus(Status.STARTING, "waiting for the training process")
        self._readers: dict[int, HookReader] = {}

    def reader(self, pid: int | None) -> HookReader | None:
        """The reader of training process ``pid`` (the focus), or ``None`` when there is none yet."""
        if pid is None:
            return None
        rd = self._readers.get(pid)
        if rd is None:
            rd = self._readers[pid] = HookReader(pid)
        return rd

    def sample(self, now: float, focus: int | None) -> Sequence[object]:
        """Read the hook's files of ``focus`` (the PID the session diagnoses) once, and every other
        rank's every :data:`OTHER_RANKS_EVERY` calls; sets :attr:`status` (with the reason when
        refused). ``focus`` ``None``: nothing read."""
        rd = self.reader(focus)
        if rd is None:
            return []
        reading = rd.read(now)
        others = self._other_ranks(rd.pid, now)  # a launcher without a hook may be the focus
        if reading is None:
            if rd.gone and rd.seen:
                self.status = SourceStatus.gone("the training exited (its hook removed its files)")
            elif rd.gone:
                self.status = SourceStatus.gone(rd.reason)
            elif not Path(f"/proc/{rd.pid}").exists() or (rd.seen and rd.missing):
                self.status = SourceStatus.gone("the training exited (its hook removed its files)")
            elif not rd.missing:
                self.status = SourceStatus.unavailable(rd.reason, NO_HOOK_HINT)
            elif refused := rd.base_refused():
                said = "the hook is off: it refuses its directory" if self.expected else f"no hook in PID {rd.pid}"
                self.status = SourceStatus.unavailable(
                    f"{said}: {refused} (another user may have made it first); set TORCHWATCH_DIR for the "
                    "training to a private directory of its user",
                    BASE_REFUSED_HINT,
                )
            elif self.expected and (said := self.boot_failure()):
                self.status = SourceStatus.unavailable(f"the hook did not load: {said}", BOOT_FAILED_HINT)
            elif self.expected:
                self.status = SourceStatus(Status.STARTING, "waiting for the training to import torch")
            else:
                self.status = SourceStatus.unavailable(f"no hook in PID {rd.pid}", NO_HOOK_HINT)
            return others
        self.status = SourceStatus.ok()
        return [reading, *others]

    def boot_failure(self) -> str:
        """The line the boot wrote when it could not load the hook (escaped, at most
        :data:`BOOT_NOTE_BYTES`), ``""`` when none. Read without following a link; kept once read."""
        if self._boot_said or self._boot_note is None:
            return self._boot_said
        try:
            fd = os.open(self._boot_note, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        try:
            data = os.read(fd, BOOT_NOTE_BYTES)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        self._boot_said = escape(" ".join(data.decode("utf-8", "replace").split()))
        return self._boot_said

    def _other_ranks(self, focus: int, now: float) -> list[HookState]:
        """One reading of every other rank's hook (none of them sets the status)."""
        if self._rank_pids is None:
            return []
        self._round += 1
        if self._round % OTHER_RANKS_EVERY:
            return []  # the other ranks at half the rate: their medians need no more, 8 ranks cost less
        pids = [p for p in self._rank_pids() if p != focus]
        for gone in [p for p in self._readers if p != focus and p not in pids]:
            del self._readers[gone]  # a rank that exited: its PID may be reused
        out = []
        for pid in pids:
            rd = self._readers.get(pid)
            if rd is None:
                rd = self._readers[pid] = HookReader(pid)
            reading = rd.read(now)
            if reading is not None:
                out.append(reading)
        return out

    def close(self) -> None:
        """Nothing to release (files are read, not held open)."""
        with contextlib.suppress(Exception):
            self._readers.clear()


def _make(ctx: SourceContext) -> HookSource:
    opts = ctx.options
    return HookSource(expected=opts.hook_expected, rank_pids=ctx.tree.mains, boot_note=opts.hook_boot_note)


def _pending(src: HookSource) -> str | None:
    """``"hook"`` while a pre-loaded hook has published nothing yet."""
    return "hook" if src.expected and src.status.status is Status.STARTING else None


# The hook's files: twice a second fast, each second steady; the channel to the training (bursts, trials).
SPEC = SourceSpec(
    name="hook",
    readings=(HookState,),
    make=_make,
    ticked=True,
    words=("hook", "burst"),
    fast=lambda options: {"interval_s": 0.5},
    steady=lambda fast, window_s: {"interval_s": max(fast["interval_s"], 1.0)},
    apply=set_interval,
    pending=_pending,
    role="channel",
)
