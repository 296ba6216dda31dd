"""IDs and files of a training in a container, read from outside (torchwatch.sources.container,
torchwatch.wire.roots, the py-spy source's thread IDs), on recorded text, a planted directory
tree and real pods (tests/containers.py, root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.containers import pod, refused
from torchwatch import wire
from torchwatch.cli import doctor
from torchwatch.inject import facts
from torchwatch.model.readings import Role
from torchwatch.sources import container
from torchwatch.sources.pyspy import PySpySource, find_pyspy, parse_raw

CID = "3f1e" + "a" * 60
POD = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"

SPIN = """
import os, sys, threading, time
def idle():
    while True:
        time.sleep(0.05)
threading.Thread(target=idle, daemon=True).start()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), child, flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    sum(range(1000))
"""


def test_pyspy_thread_ids_from_inside_are_translated_and_unknown_ones_dropped() -> None:
    raw = (
        "thread (1): MainThread;<module> (train.py:6) 39\n"
        "thread (42): Thread-1;f (train.py:3) 7\n"
        "thread (77): gone;f (train.py:3) 2\n"
    )
    samples = parse_raw(raw, 1.0, 5000, lambda _pid: Role.MAIN, tids={1: 5000, 42: 5042})
    assert [(s.tid, s.is_main_thread, s.count) for s in samples] == [(5000, True, 39), (5042, False, 7)]
    # without the map (the same namespace), IDs are taken as they are: thread 1 is not PID 5000's main
    assert not any(s.is_main_thread for s in parse_raw(raw, 1.0, 5000, lambda _pid: Role.MAIN))


def _tree(tmp_path: Path) -> Path:
    """A root with a planted link: ``tmp`` -> ``/evil`` (absolute), ``up`` -> ``../../..``."""
    root = tmp_path / "root"
    (root / "evil" / "torchwatch-0").mkdir(parents=True, mode=0o700)
    (root / "evil" / "torchwatch-0").chmod(0o700)
    (root / "tmp").symlink_to("/evil")
    (root / "up").symlink_to("../../..")
    (root / "loop").symlink_to("loop")
    (root / "evil" / "last").symlink_to("torchwatch-0")
    return root


def test_paths_in_another_root_never_lead_out_of_it(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    me = (os.geteuid(),)
    fd = wire.open_dir_in(str(root), "/tmp/torchwatch-0", me, private=True)  # /evil inside the root, not ours
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(root / "evil" / "torchwatch-0"))
    finally:
        os.close(fd)
    fd = wire.open_dir_in(str(root), "/up/../../evil/torchwatch-0", me, private=True)  # '..' stops at the root
    os.close(fd)
    assert os.path.samestat(wire.stat_in(str(root), "/../../.."), os.stat(root))
    with pytest.raises(wire.Unsafe, match="symbolic link"):
        wire.open_dir_in(str(root), "/evil/last", me, private=True)  # the last component: never followed
    with pytest.raises(wire.Unsafe, match="more than 40 symbolic links"):
        wire.open_dir_in(str(root), "/loop/x", me, private=True)
    with pytest.raises(wire.Unsafe, match="relative"):
        wire.open_dir_in(str(root), "tmp/torchwatch-0", me, private=True)
    with pytest.raises(wire.Unsafe, match="belongs to uid"):
        wire.open_dir_in(str(root), "/tmp/torchwatch-0", (os.geteuid() + 1,), private=True)


def test_doctor_names_the_namespaces_and_what_works_across_them() -> None:
    host = facts.read_host()
    target = facts.read_target(os.getpid())
    same = doctor.check_target_namespaces(host, target, facts.View(None), "/tmp/torchwatch-0", "")
    assert [(f.check, f.level) for f in same] == [("pid-namespace", "ok"), ("mount-namespace", "ok")]
    assert "IDs are the same" in same[0].finding and "same files" in same[1].finding
    inside = facts.Target(
        **{**target.__dict__, "ns_pids": (4242, 1), "namespaces": {"pid": "pid:[9]", "mnt": "mnt:[8]"}}
    )
    found = doctor.check_target_namespaces(host, inside, facts.View("/proc/4242/root"), "/tmp/torchwatch-0", "x")
    text = {f.check: f.finding for f in found}
    assert "is PID 1 in its own PID namespace (pid:[9]" in text["pid-namespace"]
    assert "read through /proc/4242/root" in text["mount-namespace"]
    assert "refuses /tmp/torchwatch-0: x" in text["hook-files"]


NO_POD = refused(own_tmp=True)
needs_pods = pytest.mark.skipif(bool(NO_POD), reason=NO_POD or "ok")


@needs_pods
@pytest.mark.parametrize("mount", [False, True], ids=["pid-ns-only", "pid-and-mount-ns"])
def test_ids_inside_a_pid_namespace_are_mapped_to_ours(mount: bool) -> None:
    with pod([sys.executable, "-c", SPIN], mount=mount, stdout=subprocess.PIPE, env={**os.environ}) as p:
        pid = p.init_pid()
        assert p.proc.stdout is not None
        inner, inner_child = (int(v) for v in p.proc.stdout.readline().split())
        assert inner == 1 and container.inner_pid(pid) == 1
        tids = container.thread_map(pid)
        assert tids[1] == pid and len(tids) >= 2 and all(host != inside for inside, host in tids.items() if inside != 1)
        children = container.host_pids(pid, [inner_child, 999])
        assert list(children) == [inner_child] and container.inner_pid(children[inner_child]) == inner_child
        assert container.same_namespace(pid, "pid") is False
        assert container.same_namespace(pid, "mnt") is (not mount)


@needs_pods
@pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")
def test_pyspy_reads_the_main_thread_of_a_training_that_is_pid_1() -> None:
    """py-spy names a PID 1's main thread 1: before, every sample was dropped as not the main thread."""
    with pod([sys.executable, "-c", SPIN], stdout=subprocess.PIPE) as p:
        pid = p.init_pid()
        assert p.proc.stdout is not None
        p.proc.stdout.readline()  # it spins
        source = PySpySource(lambda _pid: Role.MAIN, lambda: True, chunk=2.0)
        samples = [s for s in source.sample(time.monotonic(), pid) if hasattr(s, "tid")]
        source.close()
        main = [s for s in samples if s.is_main_thread]  # type: ignore[attr-defined]
        assert main and all(s.tid == pid and s.pid == pid for s in main), samples  # type: ignore[attr-defined]
        assert any(not s.is_main_thread for s in samples)  # type: ignore[attr-defined]
        assert {s.tid for s in samples} <= {int(t) for t in os.listdir(f"/proc/{pid}/task")}  # type: ignore[attr-defined]


@needs_pods
def test_a_pod_with_its_own_tmp_and_root_is_read_through_its_root() -> None:
    with pod([sys.executable, "-c", "import time; time.sleep(30)"], own_tmp=True, own_root=True, net=True) as p:
        pid = p.init_pid()
        assert wire.root_of(pid) == f"/proc/{pid}/root"
        assert wire.sees_same(pid, "/tmp") is False and wire.sees_same(pid, str(Path(__file__).parent)) is True
        view = facts.read_view(pid, str(Path(__file__).resolve().parents[2]), 0)
        assert view.root is not None and view.shared_tmp is None and view.own_tmp == "/tmp" and view.package
        # doctor PID checks the container's own /dev/shm (64 MiB, as Docker's default), not torchwatch's
        assert doctor.target_shm(pid) == (f"/dev/shm of PID {pid}", 64 << 20)
        where, size = doctor.target_shm(pid) or ("", None)
        assert (
            "/dev/shm of PID" in doctor.check_shm(size, where).finding and doctor.check_shm(size, where).level == "warn"
        )
    assert doctor.target_shm(os.getpid()) is None  # torchwatch's own files: its /dev/shm is the one checked


@needs_pods
def test_the_report_gives_both_pids_of_a_training_in_a_container() -> None:
    from torchwatch.model.report import ReportTarget, decode_section
    from torchwatch.watch.observe import target_view

    assert target_view(os.getpid(), ("python",), None, False).ns_pid is None
    with pod([sys.executable, "-c", "import time; time.sleep(30)"]) as p:
        pid = p.init_pid()
        view = target_view(pid, ("python", "train.py"), None, False)
    assert (view.pid, view.ns_pid) == (pid, 1)
    written = ReportTarget(pid=pid, cmdline=("python",), exit_code=None, ns_pid=view.ns_pid)
    assert (
        decode_section(ReportTarget, {"pid": pid, "cmdline": ["python"], "exit_code": None, "ns_pid": 1}, "target")
        == written
    )


@needs_pods
@pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed")
def test_a_thread_dump_of_a_pid_1_names_its_main_thread_by_our_id() -> None:
    from torchwatch.sources.pyspy import dump_threads

    with pod([sys.executable, "-c", SPIN], stdout=subprocess.PIPE) as p:
        pid = p.init_pid()
        assert p.proc.stdout is not None
        p.proc.stdout.readline()
        threads, error, _took = dump_threads(pid, nonblocking=True)
    assert error is None and threads, error
    assert threads[0].tid == pid and threads[0].name == "MainThread", threads  # main first, by torchwatch's ID
    assert all(t.tid != 1 for t in threads)


@needs_pods
def test_a_containers_memory_limit_is_not_lost_when_its_process_has_exited() -> None:
    """A zombie's /proc/PID/cgroup names the root group: read as "no limit", the out-of-memory record
    of a container's main process killed at 400 MiB named the machine. Now there is no reading."""
    from tests.containers import Limits
    from torchwatch.sources.memory import read_limit

    limits = Limits(cpus=1.0, memory=400 << 20)
    enter = limits.make()
    try:
        proc = subprocess.Popen(["sh", "-c", f"echo $$ > {enter[1]}; read line"], stdin=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not Path(enter[1]).read_text().split():
            time.sleep(0.05)
        alive = read_limit(proc.pid)
        assert alive is not None and alive.limit == 400 << 20 and "cgroup v1" in alive.source, alive
        assert proc.stdin is not None
        proc.stdin.close()  # it exits; not reaped yet: a zombie
        while time.monotonic() < deadline and Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "Z":
            time.sleep(0.05)
        assert read_limit(proc.pid) is None
        proc.wait()
    finally:
        limits.remove()
