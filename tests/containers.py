"""Real containers without a container engine, for the tests of trainings in containers.

A :func:`pod` is what a container runtime makes of a training, made with ``unshare`` (util-linux)
as root: its own PID namespace (the training is PID 1 there, its threads have small IDs), and
as asked its own mount namespace with a new ``/proc`` (``mount``), its own ``/tmp`` and
``/dev/shm`` (tmpfs: ``own_tmp``), its own root (``own_root``: the machine's root bind-mounted, recursively, on a
fresh directory and ``pivot_root``-ed into, so ``/proc/PID/root`` is not torchwatch's ``/``), its
own network namespace (``net``), and cgroups named as a kubelet names a container's, with a
cgroup v1 CPU quota and memory limit or none (``limits``: the groups are made under
``/sys/fs/cgroup/{cpu,memory}`` and the pod enters them before ``unshare``). The pod's
processes are killed when it ends, failed or not: ``unshare --kill-child`` ends the namespace's
PID 1 with it, and the kernel ends every other process of a PID namespace whose PID 1 exits;
then the directory and the groups are removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUP_V1 = Path("/sys/fs/cgroup")


def refused(**kinds: bool) -> str:
    """Why a :func:`pod` of these ``kinds`` cannot be made here (``""``: it can): not root, no
    ``unshare``, the kernel refusing a namespace, or no cgroup v1 ``cpu``/``memory`` hierarchy."""
    if os.geteuid() != 0:
        return "pods need root (unshare, mount, cgroups)"
    if shutil.which("unshare") is None or shutil.which("pivot_root") is None:
        return "unshare or pivot_root not found (util-linux)"
    try:
        with pod(["true"], **kinds) as p:
            p.proc.wait(timeout=30)
            code = p.proc.returncode
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a pod: {exc}"
    return "" if code == 0 else f"unshare {' '.join(k for k, v in kinds.items() if v)} refused here (exit {code})"


@dataclass
class Limits:
    """The pod's cgroups, laid out as a kubelet's cgroupfs driver lays out a container's
    (``kubepods/besteffort/pod<UID>/<64 hex digits>`` under a group of the test's own in the v1
    ``cpu`` and ``memory`` hierarchies), with a CPU quota (CPUs: ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``) and a memory limit (bytes) on the container's group; ``None``: that
    limit is not set (a container made without ``--cpus`` / ``--memory``).

    Attributes:
        container_id: the container's 64 hex digits (its group's name: torchwatch reads the first 12).
        pod_uid: the pod's UID (``pod<UID>`` in the path).
    """

    cpus: float | None = 1.0
    memory: int | None = 2 << 30
    container_id: str = field(default_factory=lambda: secrets.token_hex(32))
    pod_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    groups: list[Path] = field(default_factory=list)

    def make(self) -> list[Path]:
        """Create the groups (every directory of the path, each recorded for :meth:`remove`) and
        set the limits; returns the container's ``cgroup.procs`` files (``cpu``, ``memory``)."""
        path = Path(f"torchwatch-pod-{secrets.token_hex(4)}", "kubepods", "besteffort", f"pod{self.pod_uid}")
        path /= self.container_id
        leaves = []
        for hierarchy in ("cpu", "memory"):
            g = CGROUP_V1 / hierarchy
            for part in path.parts:
                g /= part
                g.mkdir()
                self.groups.append(g)
            leaves.append(g)
        cpu, mem = leaves
        if self.cpus is not None:
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(round(self.cpus * 100000)))
        if self.memory is not None:
            (mem / "memory.limit_in_bytes").write_text(str(self.memory))
        return [cpu / "cgroup.procs", mem / "cgroup.procs"]

    def remove(self) -> None:
        """Remove the groups, innermost first (their processes are gone by then; retried while the kernel lets go)."""
        for g in reversed(self.groups):
            for _ in range(50):
                try:
                    g.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@dataclass
class Pod:
    """A running pod.

    Attributes:
        proc: the ``unshare`` process (torchwatch's namespace); ``proc.stdout`` is the pod's.
        lines: the pod's stderr so far (read in the background).
        root: the pod's root directory as torchwatch sees it (``own_root``), else ``None``.
        limits: its cgroups and their limits (:class:`Limits`), or ``None``.
    """

    proc: subprocess.Popen[str]
    root: Path | None
    limits: Limits | None
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_stderr(self, text: str, timeout: float = 120.0) -> None:
        """Wait until a line of the pod's stderr holds ``text`` (a demo's ``: step``).

        Raises:
            TimeoutError: not within ``timeout`` s, or the pod ended first (its last lines in the message).
        """
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"no {text!r} from the pod: {''.join(self.lines[-20:])}")
            time.sleep(0.1)

    def init_pid(self, timeout: float = 30.0, exe: str = "python") -> int:
        """The host PID of the pod's PID 1 once it runs ``exe`` (after the set-up shell's execs).

        Raises:
            TimeoutError: it did not within ``timeout`` s (the pod's stderr in the message).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
                if children:
                    pid = int(children[0])
                    if exe in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                        return pid
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise TimeoutError(f"the pod's PID 1 did not start {exe} (exit {self.proc.poll()})")


def _end(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the pod's every process (unshare, its PID 1 and what that started: PID 1's
    death ends the rest too, but asynchronously) and wait until all are gone."""
    import psutil

    try:
        inside = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        inside = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in inside:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    psutil.wait_procs(inside, timeout=10)


def own_tmp_commands(old: str, keep: Sequence[str]) -> list[str]:
    """Shell commands (run inside a new mount namespace, as root) that give it a ``/tmp`` of its own
    (a tmpfs) in which only the paths of ``keep`` that lie under ``/tmp`` are still seen, at the
    same place: the interpreter's environment and the checkout the pod runs from, as an image
    carries them (CI makes its venv and clones the checkout under ``/tmp``: without them the pod's
    ``python`` is not found). ``old``: an empty directory outside ``/tmp`` where the old ``/tmp``
    is bound while the paths are bound back (unmounted after)."""
    o = shlex.quote(old)
    out = [f"mount --bind /tmp {o}", "mount -t tmpfs -o mode=1777,size=64m torchwatch-pod-tmp /tmp"]
    tops = sorted({Path(os.path.abspath(k)) for k in keep if os.path.abspath(k).startswith("/tmp/")})
    for top in tops:
        if any(other != top and top.is_relative_to(other) for other in tops):
            continue
        rel = shlex.quote(str(top.relative_to("/tmp")))
        out += [f"mkdir -p /tmp/{rel}", f"mount --bind {o}/{rel} /tmp/{rel}"]
    out.append(f"umount {o}")
    return out


@contextlib.contextmanager
def pod(
    argv: Sequence[str],
    *,
    mount: bool = True,
    own_tmp: bool = False,
    own_root: bool = False,
    net: bool = False,
    limits: Limits | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    stdout: int | None = subprocess.DEVNULL,
) -> Iterator[Pod]:
    """Run ``argv`` as PID 1 of a new pod (module docstring); on exit every process of it is
    killed and what was made for it removed, whatever happened.

    Args:
        mount: a mount namespace with its own ``/proc`` (``unshare --mount-proc``); without it
            only the PID namespace is new (``/proc`` is torchwatch's).
        own_tmp, own_root: a tmpfs on ``/tmp``; a root of its own (both need ``mount``).
        net: a network namespace of its own.
        limits: its cgroups (a container's and pod's IDs in their path), with a cgroup v1 CPU
            quota and memory limit or none.
        env: its environment (default this process's). cwd: its working directory.
        stdout: where its standard output goes (``subprocess.PIPE`` to read it); stderr is piped.
    """
    if (own_tmp or own_root) and not mount:
        raise ValueError("own_tmp and own_root need a mount namespace")
    root: Path | None = None
    if own_root:
        # outside /tmp (which own_tmp covers), on the root filesystem the pod's root is bound from
        root = Path(tempfile.mkdtemp(prefix="torchwatch-pod-", dir="/var/tmp"))
    setup = ["set -e"]
    old_tmp: Path | None = None
    if own_tmp:
        old_tmp = Path(tempfile.mkdtemp(prefix="torchwatch-pod-oldtmp-", dir="/var/tmp"))
        setup += own_tmp_commands(str(old_tmp), keep=(sys.prefix, str(REPO), str(cwd)))
        setup.append("mount -t tmpfs -o mode=1777,size=64m torchwatch-pod-shm /dev/shm")  # as docker's own
    run = shlex.join(argv)
    if root is not None:
        # as a runtime does: the new root bound, pivot_root into it, the old one unmounted (so the
        # kernel names the pod's files from its own root, /usr/lib/..., as in a real container)
        r = shlex.quote(str(root))
        setup += [f"mount --rbind / {r}", f"cd {r}", f"pivot_root . .{r}", f"umount -l {r}"]
        run = f"sh -c {shlex.quote(f'cd {shlex.quote(str(cwd))} && exec {run}')}"
    setup.append(f"exec {run}")
    flags = ["--pid", "--fork", "--kill-child"] + (["--mount-proc"] if mount else []) + (["--net"] if net else [])
    command = ["unshare", *flags, "sh", "-c", "; ".join(setup)]
    enter = limits.make() if limits is not None else []
    if enter:  # enter the groups first, so that the whole pod is in them
        command = [
            "sh",
            "-c",
            "".join(f"echo $$ > {shlex.quote(str(p))}; " for p in enter) + 'exec "$@"',
            "sh",
            *command,
        ]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(env if env is not None else os.environ),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield Pod(proc, root, limits)
    finally:
        _end(proc)
        for made in (root, old_tmp):
            if made is not None:
                with contextlib.suppress(OSError):
                    made.rmdir()  # the bind mount went with the pod's mount namespace
        if limits is not None:
            limits.remove()


PODMAN_NPROC = 4096
"""The container's ``RLIMIT_NPROC`` (podman sets one: its default, and the machine's own hard limit
as well, were refused here by runc with EPERM, 4096 was not). It counts the processes of the uid
(root) on the whole machine; a training of the tests starts a few."""


@dataclass
class Podman:
    """A running podman container (:func:`podman`).

    Attributes:
        pod: the ``podman run`` process (``pod.proc``) and the container's stderr (``pod.lines``,
            :meth:`Pod.wait_stderr`).
        name: the container's name. command: podman and its global options (its own storage).
    """

    pod: Pod
    name: str
    command: list[str]

    def inspect(self, field: str, timeout: float = 60.0) -> str:
        """``podman inspect --format {{.FIELD}}`` of the container (``State.Pid``: its PID 1 on the host; ``Id``)."""
        done = subprocess.run(
            [*self.command, "inspect", "--format", "{{." + field + "}}", self.name],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        return done.stdout.strip()


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace (``/proc/self/mountinfo``)."""
    prefix = str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def podman_command(base: Path) -> list[str]:
    """``podman`` with global options that keep all it makes under ``base``: storage (vfs: no
    overlay module needed; no image is pulled, the root is a directory), run files and its temporary
    directory; cgroups by podman itself (no systemd here) and no event log. runc when it is
    installed: crun 1.8 (Debian 12's) refuses a hybrid cgroup host whose v2 hierarchy has a
    controller (``cgroups in hybrid mode not supported, drop all controllers from cgroupv2``)."""
    out = ["podman"] + (["--runtime", "runc"] if shutil.which("runc") else [])
    out += ["--cgroup-manager", "cgroupfs", "--storage-driver", "vfs", "--events-backend", "none"]
    return [*out, "--root", str(base / "storage"), "--runroot", str(base / "run"), "--tmpdir", str(base / "tmp")]


@contextlib.contextmanager
def podman(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    stdout: int | None = subprocess.DEVNULL,
) -> Iterator[Podman]:
    """Run ``argv`` in a rootful podman container whose root is a directory made here (no image):
    the machine's ``/usr`` and this interpreter's environment and the checkout bound read-only at
    their paths (as an image carries them), its own ``/tmp`` (in its root), no network, its own
    PID, mount, IPC and UTS namespaces and cgroups (``/libpod_parent/libpod-<id>``). On exit the
    container is removed (``podman rm -f``: its processes killed), then everything under its
    directory, once no mount is left there (podman's own ``/dev/shm`` is a mount under it while
    the container lives).

    Args:
        env: variables set in the container (besides podman's own: ``PATH``, ``HOSTNAME``, ...).
        cwd: its working directory. stdout: where its standard output goes; stderr is piped.
    """
    import resource

    base = Path(tempfile.mkdtemp(prefix="torchwatch-podman-", dir="/var/tmp"))
    rootfs = base / "rootfs"
    (rootfs / "tmp").mkdir(parents=True)
    os.chmod(rootfs / "tmp", 0o1777)
    for link in ("bin", "lib", "lib64", "sbin"):  # Debian's merged /usr
        (rootfs / link).symlink_to(f"usr/{link}")
    binds: list[str] = []
    for p in sorted(
        {"/usr", os.path.realpath(sys.base_prefix), sys.prefix, os.path.realpath(sys.prefix), str(REPO), str(cwd)}
    ):
        if not any(p == b or p.startswith(b + "/") for b in binds):
            binds.append(p)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    name = f"torchwatch-{secrets.token_hex(4)}"
    command = podman_command(base)
    run = [*command, "run", "--rm", "--name", name, "--network", "none", "--workdir", str(cwd)]
    run += ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={PODMAN_NPROC}:{PODMAN_NPROC}"]
    for b in binds:
        run += ["--volume", f"{b}:{b}:ro"]
    for k, v in (env or {}).items():
        run += ["--env", f"{k}={v}"]
    run += ["--rootfs", str(rootfs), *argv]
    proc = subprocess.Popen(
        run, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        yield Podman(Pod(proc, rootfs, None), name, command)
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*command, "rm", "--force", "--time", "0", name], capture_output=True, timeout=60)
        _end(proc)
        if _mounts_under(base):  # never remove what a mount shows (a bound /usr would go with it)
            for point in sorted(_mounts_under(base), reverse=True):
                subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=30)
        if not _mounts_under(base):
            shutil.rmtree(base, ignore_errors=True)
        for hierarchy in CGROUP_V1.iterdir():  # podman's groups (its conmons'), when no other container is in them
            for group in ("libpod_parent/conmon", "libpod_parent"):
                with contextlib.suppress(OSError):
                    (hierarchy / group).rmdir()


def podman_refused() -> str:
    """Why :func:`podman` cannot run a container here (``""``: it can): not root, no podman, or
    the error of ``podman run ... true`` (its last line)."""
    if os.geteuid() != 0:
        return "podman containers are made as root here"
    if shutil.which("podman") is None:
        return "podman not installed (Debian: apt-get install podman runc)"
    try:
        with podman(["true"]) as c:
            c.pod.proc.wait(timeout=120)
            code = c.pod.proc.returncode
            time.sleep(0.2)  # the stderr reader's last lines
            err = "".join(c.pod.lines).strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run podman: {exc}"
    return "" if code == 0 else f"podman cannot run a container here: {err[-1] if err else f'exit {code}'}"
