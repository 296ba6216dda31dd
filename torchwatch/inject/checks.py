"""Whether torchwatch may and should run code inside a target process, each "no" with its fix.

Pure functions of :class:`~torchwatch.inject.facts.Host` and
:class:`~torchwatch.inject.facts.Target` (plus a stat function and a hook detector that tests
replace), so every refusal can be tested without the situation it describes. The rules are
the kernel's (ptrace(2) "Ptrace access mode checking"; Yama's ``ptrace_scope``,
Documentation/admin-guide/LSM/Yama.rst) and CPython's (PEP 768 for ``sys.remote_exec``).

``torchwatch doctor PID`` prints the same findings.
"""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torchwatch.inject.facts import Host, Target, View, read_view

Level = Literal["ok", "warn", "fail"]
Method = Literal["remote_exec", "ptrace"]

OLDEST = (3, 10)  # the hook and the payload use 3.10 syntax
REMOTE_EXEC_SINCE = (3, 14)  # PEP 768
HOOK_FALLBACK = "or call torchwatch.hook.install() at the top of the training script"


@dataclass(frozen=True)
class Finding:
    """One check's result.

    Attributes:
        level: ``ok``; ``warn`` (works, with a caveat); ``fail`` (injection refused).
        check: short name, e.g. ``"ptrace-permission"``.
        finding: one sentence, no trailing period.
        fix: what to do, or ``None``.
    """

    level: Level
    check: str
    finding: str
    fix: str | None = None

    def line(self) -> str:
        """``LEVEL  check: finding (fix)`` on one line."""
        text = f"{self.level:<4}  {self.check}: {self.finding}"
        return text + (f" ({self.fix})" if self.fix else "")


@dataclass(frozen=True)
class Plan:
    """The verdict on one target: how to inject, or why not.

    Attributes:
        method: ``remote_exec`` (PEP 768), ``ptrace`` (the hypno/pyinjector library), or
            ``None`` when a check failed.
        findings: every check, in the order they were made.
    """

    method: Method | None
    findings: tuple[Finding, ...]

    @property
    def refusals(self) -> list[Finding]:
        """The failed checks."""
        return [f for f in self.findings if f.level == "fail"]

    def reason(self) -> str:
        """The refusals as one line: ``finding (fix); finding (fix)``; empty when allowed."""
        return "; ".join(f.finding + (f" ({f.fix})" if f.fix else "") for f in self.refusals)


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def permission(host: Host, target: Target) -> Finding:
    """ptrace(2) access check, PTRACE_MODE_ATTACH_REALCREDS: same real uid and gid as all of the
    target's (real, effective, saved), and the target dumpable; or CAP_SYS_PTRACE."""
    name = "ptrace-permission"
    if target.uids is None or target.gids is None:
        return Finding("fail", name, f"cannot read the owner of PID {target.pid}", "check the PID")
    if host.has_cap_ptrace:
        return Finding("ok", name, "torchwatch has CAP_SYS_PTRACE")
    same = all(u == host.uids[0] for u in target.uids) and all(g == host.gids[0] for g in target.gids)
    # /proc/PID belongs to root instead of the process's user when it is not dumpable
    non_dumpable = target.proc_owner == 0 and target.uids[1] != 0
    if same and not non_dumpable:
        return Finding("ok", name, f"same user as PID {target.pid}: {_user(host.uids[0])}")
    if same:
        return Finding(
            "fail",
            name,
            f"PID {target.pid} is not dumpable (setuid, or prctl(PR_SET_DUMPABLE, 0)): "
            "only CAP_SYS_PTRACE may trace it",
            "run torchwatch with sudo",
        )
    if host.uids[1] == 0:
        return Finding(
            "fail",
            name,
            "torchwatch runs as root but without CAP_SYS_PTRACE (a container's default)",
            "start the container with --cap-add SYS_PTRACE, or run torchwatch on the host",
        )
    return Finding(
        "fail",
        name,
        f"PID {target.pid} belongs to {_user(target.uids[0])} and torchwatch runs as {_user(host.uids[0])} "
        "without CAP_SYS_PTRACE",
        f"run torchwatch as {_user(target.uids[0]).split(' ')[0]}, or with sudo",
    )


def yama(host: Host) -> Finding:
    """Yama's ``ptrace_scope``: 0 classic; 1 only ancestors (or a tracer the target named with
    PR_SET_PTRACER); 2 only CAP_SYS_PTRACE; 3 nobody, until reboot."""
    name = "yama"
    scope = host.ptrace_scope
    if scope is None:
        return Finding("ok", name, "no Yama ptrace restrictions (/proc/sys/kernel/yama/ptrace_scope absent)")
    if scope == 0:
        return Finding("ok", name, "ptrace_scope 0: the classic permission rules apply")
    if scope == 3:
        return Finding(
            "fail",
            name,
            "ptrace_scope 3: ptrace is off for every process, root included, until the next boot",
            f"set kernel.yama.ptrace_scope to 0, 1 or 2 in /etc/sysctl.d/ and reboot, {HOOK_FALLBACK}",
        )
    if host.has_cap_ptrace:
        return Finding("ok", name, f"ptrace_scope {scope}: CAP_SYS_PTRACE may attach to any process")
    if scope == 1:
        return Finding(
            "fail",
            name,
            "ptrace_scope 1: only a process's ancestors may attach to it, and torchwatch is not one",
            "run torchwatch with sudo, or allow it: echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope",
        )
    return Finding("fail", name, f"ptrace_scope {scope}: only CAP_SYS_PTRACE may attach", "run torchwatch with sudo")


def process_state(target: Target) -> Finding:
    """Zombies, stopped processes and processes another tracer holds cannot be injected."""
    name, pid = "process-state", target.pid
    if target.state in ("Z", "X"):
        return Finding("fail", name, f"PID {pid} has exited", "start the training again")
    if target.tracer_pid:
        who = f"PID {target.tracer_pid}" + (f" ({target.tracer_name})" if target.tracer_name else "")
        return Finding(
            "fail",
            name,
            f"PID {pid} is already traced by {who}: one tracer at a time",
            "detach the debugger (gdb, strace, or py-spy without --nonblocking) and try again",
        )
    if target.state == "t":
        return Finding("fail", name, f"PID {pid} is stopped by a tracer", "detach the debugger first")
    if target.state == "T":
        return Finding("fail", name, f"PID {pid} is stopped (SIGSTOP or Ctrl-Z)", f"resume it: kill -CONT {pid}")
    if target.state == "D":
        return Finding("warn", name, f"PID {pid} waits on the disk (state D): injection waits until it wakes")
    return Finding("ok", name, f"PID {pid} runs (state {target.state})")


def interpreter(target: Target) -> Finding:
    """The target must be CPython 3.10 or newer."""
    name, py = "python", target.python
    if py is None:
        if target.exe is None and not target.cmdline:
            return Finding("fail", name, f"cannot tell whether PID {target.pid} is Python (its files are unreadable)")
        return Finding(
            "fail",
            name,
            f"PID {target.pid} ({target.name}) is not a Python process",
            "give the PID of the training's Python process: pgrep -af python",
        )
    if (py.major, py.minor) < OLDEST:
        return Finding(
            "fail", name, f"PID {target.pid} runs Python {py}: torchwatch's hook needs 3.10 or newer", HOOK_FALLBACK
        )
    return Finding("ok", name, f"Python {py} ({py.evidence})")


def _interpreter_options(cmdline: Sequence[str]) -> list[str]:
    """The interpreter's own options: argv[1:] up to the script, ``-c`` or ``-m``."""
    out: list[str] = []
    args = list(cmdline[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or a == "-" or a == "--":
            break
        out.append(a)
        if a in ("-c", "-m"):
            break
        if a in ("-X", "-W") and i + 1 < len(args):
            out.append(args[i + 1])
            i += 1
        i += 1
    return out


def remote_debug_disabled(environ: dict[str, str] | None, cmdline: Sequence[str]) -> str | None:
    """Why PEP 768 remote execution is off in a Python 3.14+ target, or ``None`` when it is on.

    Off with ``-X disable_remote_debug``, or ``PYTHON_DISABLE_REMOTE_DEBUG`` set to a non-empty
    value unless ``-E`` or ``-I`` make the interpreter ignore ``PYTHON*`` variables. (An
    interpreter built ``--without-remote-debug`` is only found out when ``sys.remote_exec`` fails.)
    """
    opts = _interpreter_options(cmdline)
    for i, o in enumerate(opts):
        value = o[2:] if o.startswith("-X") and len(o) > 2 else (opts[i + 1] if o == "-X" and i + 1 < len(opts) else "")
        if value == "disable_remote_debug":
            return "started with -X disable_remote_debug"
    flags = "".join(o[1:] for o in opts if o.startswith("-") and not o.startswith("--") and o[1:2] not in ("X", "W"))
    ignores_env = "E" in flags or "I" in flags
    if environ and environ.get("PYTHON_DISABLE_REMOTE_DEBUG") and not ignores_env:
        return "PYTHON_DISABLE_REMOTE_DEBUG is set in its environment"
    return None


def injector_missing() -> str | None:
    """Why the ptrace injector cannot be used here, or ``None`` when ``hypno`` and ``pyinjector`` import."""
    for module in ("hypno", "pyinjector"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"the Python package {module} is not installed"
        except (ImportError, ValueError):
            return f"the Python package {module} cannot be imported"
    return None


def method(host: Host, target: Target, missing_injector: str | None) -> tuple[Method | None, Finding | None]:
    """How to inject into ``target``: PEP 768 when both sides run the same 3.14+ Python, else ptrace.

    Returns:
        The method (``None`` when refused) and the finding that says so; no finding at all for
        a target that is not Python 3.10+ (:func:`interpreter` already says why).
    """
    name, py, pid = "injector", target.python, target.pid
    if py is None or (py.major, py.minor) < OLDEST:
        return None, None
    note = ""
    if (py.major, py.minor) >= REMOTE_EXEC_SINCE:
        why = remote_debug_disabled(dict(target.environ) if target.environ is not None else None, target.cmdline)
        if why:
            return None, Finding(
                "fail",
                name,
                f"remote debugging is disabled in PID {pid} ({why})",
                f"restart it without that setting, {HOOK_FALLBACK}",
            )
        if host.python == (py.major, py.minor) and host.free_threaded == py.free_threaded:
            if host.remote_debug_enabled:
                return "remote_exec", Finding("ok", name, "sys.remote_exec (PEP 768): runs at the next safe point")
            note = "; torchwatch's own Python has remote debugging disabled"
        else:
            note = (
                f"; sys.remote_exec needs torchwatch on Python {py} too (it runs on {host.python[0]}.{host.python[1]})"
            )
    if missing_injector:
        return None, Finding("fail", name, f"no injector: {missing_injector}{note}", "pip install 'hypno>=1.1,<2'")
    return "ptrace", Finding("ok", name, f"ptrace injector (hypno){note}")


def namespaces(host: Host, target: Target, view: View | None = None) -> list[Finding]:
    """What another mount, PID or user namespace changes for an injection.

    Another mount namespace (a container) is fine when the target can reach the injection's
    files: a temporary directory it sees as torchwatch does, or else one of its own that
    torchwatch reaches through ``/proc/PID/root`` and places them in (:class:`View`); refused
    only when neither works. The injected code imports torchwatch from :attr:`Host.package_root`
    (warned when the target does not see that directory: then only a torchwatch installed in
    its own Python is found). Another PID namespace only renames the process (the hook inside
    names itself by its inner PID; torchwatch translates). ``view`` ``None``: no other root.
    """
    out: list[Finding] = []
    ours, theirs, pid = host.namespaces, target.namespaces, target.pid
    if view is not None and view.root is not None:
        where = "in another mount namespace (a container)"
        if view.shared_tmp is not None:
            out.append(
                Finding("ok", "mount-namespace", f"PID {pid} is {where} and sees {view.shared_tmp} as torchwatch does")
            )
        elif view.own_tmp is not None:
            out.append(
                Finding(
                    "ok",
                    "mount-namespace",
                    f"PID {pid} is {where} with a {view.own_tmp} of its own: the injection's files are placed "
                    f"there through {view.root}",
                )
            )
        else:
            out.append(
                Finding(
                    "fail",
                    "mount-namespace",
                    f"PID {pid} is {where} and torchwatch cannot place files it can read: {view.why}",
                    "run torchwatch inside the same container, or start the training with torchwatch run",
                )
            )
        if view.package:
            out.append(Finding("ok", "package-view", f"PID {pid} sees torchwatch at {host.package_root}"))
        else:
            out.append(
                Finding(
                    "warn",
                    "package-view",
                    f"PID {pid} does not see torchwatch's files at {host.package_root}: the injected code "
                    "loads only a torchwatch installed in its own Python",
                    "pip install torchwatch in the container, or mount torchwatch's directory into it",
                )
            )
    if "pid" in ours and "pid" in theirs and ours["pid"] != theirs["pid"]:
        inner = target.ns_pids[-1] if target.ns_pids else pid
        out.append(
            Finding(
                "warn",
                "pid-namespace",
                f"PID {pid} is PID {inner} inside its own PID namespace: its hook files are named {inner}",
            )
        )
    if "user" in ours and "user" in theirs and ours["user"] != theirs["user"]:
        out.append(
            Finding(
                "warn",
                "user-namespace",
                f"PID {pid} is in another user namespace: torchwatch's capabilities may not reach it",
            )
        )
    return out


StatFn = Callable[[str], os.stat_result]


def readable_by(path: str, uid: int, gids: Sequence[int], stat_fn: StatFn = os.stat) -> str | None:
    """The first component of ``path`` that user ``uid`` (groups ``gids``) cannot reach, or ``None``.

    Directories need search (x) permission, the last component read (r) permission, by the
    owner, group or other bits that apply to that user (root reaches everything).
    """
    if uid == 0:
        return None
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        here = str(Path(*parts[:i]))
        try:
            st = stat_fn(here)
        except OSError:
            return here
        need = 0o4 if i == len(parts) and not stat.S_ISDIR(st.st_mode) else 0o1
        if st.st_uid == uid:
            bits = st.st_mode >> 6
        elif st.st_gid in gids:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        if not bits & need:
            return here
    return None


def package_access(host: Host, target: Target, stat_fn: StatFn = os.stat) -> Finding:
    """The target's user must be able to read torchwatch's own files (the payload imports them)."""
    name = "package-access"
    probe = os.path.join(host.package_root, "torchwatch", "inject", "probe.py")
    if target.uids is None or target.uids[1] == host.uids[1]:
        return Finding("ok", name, f"the target reads torchwatch from {host.package_root}")
    gids = [*(target.gids or ()), *target.groups]
    blocked = readable_by(probe, target.uids[1], gids, stat_fn)
    if blocked is None:
        return Finding("ok", name, f"{_user(target.uids[1])} can read torchwatch at {host.package_root}")
    return Finding(
        "warn",
        name,
        f"{_user(target.uids[1])} cannot read {blocked}: the injected code finds torchwatch only if its "
        "own environment has it",
        "install torchwatch where that user can read it (e.g. in the training's environment)",
    )


def hook_evidence(target: Target) -> str | None:
    """Why ``target`` already has a torchwatch hook, or ``None``.

    The single place that knows how a hook announces itself (today: ``TORCHWATCH_HOOK=1`` in the
    environment, set by ``torchwatch run``, or a ``hook.json`` in its published directory,
    ``<pid>-<start>-<pidns>`` named as :attr:`torchwatch.wire.Instance.dir_name`, checked
    with ``lstat``: nothing is opened or followed; in a container, through its root:
    :func:`torchwatch.wire.open_dir_in`).
    """
    from torchwatch import wire

    env = dict(target.environ or {})
    if env.get("TORCHWATCH_HOOK") == "1":
        return "TORCHWATCH_HOOK=1 in its environment (started by torchwatch run)"
    if target.uids is None or target.start_ticks is None:
        return None
    inner = target.ns_pids[-1] if target.ns_pids else target.pid
    ns = target.namespaces.get("pid", "")
    if not (ns.startswith("pid:[") and ns.endswith("]") and ns[5:-1].isdigit()):
        return None
    name = wire.Instance(inner, target.start_ticks, int(ns[5:-1])).dir_name
    path = wire.base_dir(env, target.uids[0]) / name / wire.STATE_FILE
    root = wire.root_of(target.pid)  # in a container: its path, reached through its root
    try:
        if root is None:
            st = os.lstat(path)
        else:
            fd = wire.open_dir_in(root, path.parent, set(target.uids), private=True)
            try:
                st = os.lstat(wire.STATE_FILE, dir_fd=fd)
            finally:
                os.close(fd)
    except OSError:
        return None
    return f"its hook publishes in {path.parent}" if stat.S_ISREG(st.st_mode) else None


def evaluate(
    host: Host,
    target: Target,
    *,
    missing_injector: str | None = None,
    hooked: Callable[[Target], str | None] = hook_evidence,
    stat_fn: StatFn = os.stat,
    view: View | None = None,
) -> Plan:
    """Every check on ``target``, and the method to use when none failed.

    Args:
        host, target: from :func:`~torchwatch.inject.facts.read_host` / ``read_target``.
        missing_injector: :func:`injector_missing`'s answer (passed in so tests can set it).
        hooked: :func:`hook_evidence` (tests pass a stand-in).
        stat_fn: ``os.stat`` for :func:`package_access`.
        view: what the target sees of torchwatch's files (:func:`~torchwatch.inject.facts.read_view`);
            default read from the machine.

    Returns:
        A :class:`Plan`; ``plan.method`` is ``None`` when any finding failed.
    """
    findings = [process_state(target), permission(host, target), yama(host), interpreter(target)]
    how, finding = method(host, target, missing_injector)
    if finding is not None:
        findings.append(finding)
    if view is None:
        view = read_view(target.pid, host.package_root, target.uids[1] if target.uids else None)
    findings.extend(namespaces(host, target, view))
    findings.append(package_access(host, target, stat_fn))
    evidence = hooked(target)
    if evidence:
        findings.append(
            Finding(
                "fail",
                "hook",
                f"PID {target.pid} already has a torchwatch hook: {evidence}",
                f"attach reads it as it is: torchwatch attach {target.pid}",
            )
        )
    else:
        findings.append(Finding("ok", "hook", f"no torchwatch hook in PID {target.pid} yet"))
    failed = any(f.level == "fail" for f in findings)
    return Plan(None if failed else how, tuple(findings))
