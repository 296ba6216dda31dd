"""The Slurm prolog and epilog (deploy/slurm/) run as root: a directory another user can write is
never written in, and a pid file there is never believed (issue 49: the prolog wrote with ``>``
into TORCHWATCH_SD whatever its owner, so a link planted there made root overwrite any file)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import users

MakeUser = Callable[[], users.User]

SLURM = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
NODE = socket.gethostname().split(".")[0]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root, and the attack needs a second user")


@pytest.fixture
def root_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tw-slurm-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(script: str, run: Path, sd: Path | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TORCHWATCH": "/bin/true", "TORCHWATCH_RUN": str(run), "SLURM_JOB_ID": "77"}
    if sd is not None:
        env["TORCHWATCH_SD"] = str(sd)
    return subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, text=True, timeout=60)


def _as(user: users.User, *cmd: str) -> None:
    subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", *cmd], check=True)


def test_the_prolog_writes_no_file_in_a_directory_another_user_can_write(make_user: MakeUser, root_dir: Path) -> None:
    other = make_user()
    victim = root_dir / "victim"
    victim.write_text("root's\n")
    os.chmod(victim, 0o600)
    sd = root_dir / "sd"
    sd.mkdir(mode=0o755)
    os.chown(sd, other.uid, other.gid)
    _as(other, "ln", "-s", str(victim), str(sd / f".{NODE}.json.tmp"))  # the name the old prolog wrote
    run = root_dir / "run"
    done = _run("prolog.sh", run, sd)
    assert done.returncode == 0
    assert victim.read_text() == "root's\n"
    assert not (sd / f"{NODE}.json").exists()
    assert (run / "job.77").is_file()  # the rest of the prolog went on


def test_the_prolog_writes_its_target_file_in_a_directory_of_roots(root_dir: Path) -> None:
    sd = root_dir / "sd"
    sd.mkdir(mode=0o755)
    run = root_dir / "run"
    assert _run("prolog.sh", run, sd).returncode == 0
    target = sd / f"{NODE}.json"
    assert f'"targets": ["{NODE}:9400"]' in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in sd.iterdir()] == [target.name]  # no temporary file left
    assert (run / "serve.pid").read_text().strip().isdigit()


def test_a_run_directory_of_another_user_is_neither_used_nor_believed(make_user: MakeUser, root_dir: Path) -> None:
    other = make_user()
    run = root_dir / "run"
    run.mkdir(mode=0o755)
    os.chown(run, other.uid, other.gid)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (run / "serve.pid").write_text(f"{sleeper.pid}\n")  # as the other user would: a PID of root's
        (run / "job.77").write_text("")
        assert _run("epilog.sh", run, None).returncode == 0
        assert sleeper.poll() is None  # not killed on the word of another user's file
        assert _run("prolog.sh", run, None).returncode == 0
        assert sorted(p.name for p in run.iterdir()) == ["job.77", "serve.pid"]  # nothing written there
        assert stat.S_IMODE(run.stat().st_mode) == 0o755 and run.stat().st_uid == other.uid  # not chmod'ed
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
