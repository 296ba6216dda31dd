"""Real, throw-away unprivileged users for tests of what another user on the machine can do.

torchwatch is run as root on other users' trainings, so the attacks worth testing are those
of a second, unprivileged user (planting files, swapping a file for a symbolic link) against
root or against the training's user. Tests get users from the ``make_user`` fixture
(``tests/conftest.py``): created with ``useradd`` under unique names, removed with
``userdel`` at the end; the fixture skips when the tests do not run as root or ``useradd`` is
missing.

The test interpreter may live where other users cannot reach it (pyenv under ``/root``), so
:meth:`User.python` finds one they can run that imports the same torch and torchwatch.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_names = itertools.count()


@dataclass(frozen=True)
class User:
    """A throw-away user: name, uid, gid."""

    name: str
    uid: int
    gid: int

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for this user's processes: no root HOME, this repo and its packages
        importable, ``extra`` on top."""
        path = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])
        base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHWATCH_", "PYTHON"))}
        base.update(HOME="/nonexistent", USER=self.name, LOGNAME=self.name, TMPDIR="/tmp", PYTHONPATH=path)
        base.update(extra)
        return base

    def python(self) -> str:
        """An interpreter of this Python version that this user can run with torch importable.

        Raises:
            RuntimeError: none found.
        """
        return _python_for(self.uid, self.gid)

    def popen(self, args: list[str], **kw: Any) -> subprocess.Popen[str]:
        """Start ``args`` as this user (no supplementary groups), text mode."""
        kw.setdefault("env", self.env())
        kw.setdefault("cwd", "/")
        return subprocess.Popen(args, user=self.uid, group=self.gid, extra_groups=[], text=True, **kw)

    def run(self, args: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``args`` as this user to its end, output captured."""
        kw.setdefault("env", self.env())
        kw.setdefault("cwd", "/")
        return subprocess.run(
            args,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
            **kw,
        )


@functools.cache
def _python_for(uid: int, gid: int) -> str:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = User("probe", uid, gid)
    why: list[str] = []
    for exe in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if not os.path.exists(exe):
            continue
        try:
            r = probe.run([exe, "-c", "import torch, torchwatch.hook"], timeout=120)
        except OSError as e:  # not executable by that user (an interpreter under /root)
            why.append(f"{exe}: {e}")
            continue
        if r.returncode == 0:
            return exe
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        why.append(f"{exe}: {last}")
    raise RuntimeError(
        f"no Python {version} that uid {uid} can run with torch importable from {sysconfig.get_paths()['purelib']}"
        f" (is every directory above it readable by other users?): {'; '.join(why)}"
    )


def available() -> str:
    """Why real users cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to create users"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "useradd/userdel not found"
    return ""


def create() -> User:
    """Create a user with a unique name (``twt<pid>x<n>``), no home, no login shell.

    Raises:
        subprocess.CalledProcessError: useradd failed.
    """
    name = f"twt{os.getpid()}x{next(_names)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
        check=True,
        capture_output=True,
    )
    import pwd

    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid)


def remove(user: User) -> None:
    """Kill what is left of ``user``'s processes (each by its PID: every process of a
    throw-away user was started by the test), then ``userdel`` it (files it left stay)."""
    import psutil

    killed = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uids.real == user.uid:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.append(proc)
    # userdel refuses a user whose process still exists: the killed ones (a training's orphaned
    # DataLoader workers, say) must be gone first, or the user stays behind
    psutil.wait_procs(killed, timeout=10)
    subprocess.run(["userdel", user.name], check=False, capture_output=True)
