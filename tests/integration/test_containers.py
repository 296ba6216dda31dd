"""Trainings in containers (tests/containers.py: real PID, mount and network namespaces, an own
/tmp and root, cgroup v1 limits, made with unshare as root): ``attach`` from the host injects,
reads the hook through the container's root and py-spy's stacks through the PID namespace;
``doctor PID`` says which namespaces the training is in and what works across them; ``run``
inside a container works as on the host; and two containers cannot write each other's hook
channel."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.containers import Limits, Pod, pod, refused
from tests.integration.conftest import DEMO, REPO, others_hold_cpus, torchwatch
from torchwatch import wire
from torchwatch.sources.hook import HookReader, instance_of
from torchwatch.watch.lifecycle import hook_env

pytestmark = pytest.mark.integration

SMALL = REPO / "tests" / "integration" / "_small_train.py"
WATCH_S = 12  # cpu_bound's label holds from ~6 s on the host (conftest.DEMO_SECONDS); +2 s for the injection

CASES: dict[str, dict[str, Any]] = {
    "pid-ns": {"mount": False},
    "pid-mount-ns": {"mount": True},
    "own-root-tmp-net": {"mount": True, "own_tmp": True, "own_root": True, "net": True},
    "cgroup-limits": {"mount": True},  # + Limits(1 CPU, 2 GiB), made per test
}
NO_POD = refused(own_tmp=True, own_root=True, net=True)
needs_pods = pytest.mark.skipif(bool(NO_POD), reason=NO_POD or "ok")


def _cpu_demo(case: str, seconds: int = 45) -> contextlib.AbstractContextManager[Pod]:
    kinds = dict(CASES[case])
    if case == "cgroup-limits":
        kinds["limits"] = Limits(cpus=1.0, memory=2 << 30)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return pod(
        [sys.executable, str(DEMO / "cpu_bound.py"), "--device", "cpu", "--seconds", str(seconds)], env=env, **kinds
    )


def _doctor(pid: int) -> dict[str, dict[str, Any]]:
    done = torchwatch("doctor", "--json", str(pid), timeout=60)
    return {c["check"]: c for c in json.loads(done.stdout)["checks"]}


def _label_or_busy(report: dict[str, Any], quota: bool = False) -> None:
    """cpu_bound's label on the host is cpu-bound; on a machine others keep busy, the contention
    is named first (tests/integration/test_demos.py's rule). In a quota of 1 CPU the quota is named;
    which finding leads there is not settled (twice in CI loader-cpu-in-main-thread led at 0.30,
    the sample work being 22 % of the step): another label is accepted only below 0.5."""
    rules = [f["rule"] for f in report["findings"]]
    if others_hold_cpus(report):
        assert rules[:1] == ["cpu-contention"], (rules, report["features"])
    elif quota:
        assert "cpu-quota-throttled" in rules, (report["verdict"], rules)
        verdict = report["verdict"]
        assert verdict["label"] == "cpu-bound" or verdict["confidence"] < 0.5, (verdict, rules)
    else:
        assert report["verdict"]["label"] == "cpu-bound", (report["verdict"], rules)


@needs_pods
@pytest.mark.quiet
@pytest.mark.parametrize("case", list(CASES))
def test_attach_from_the_host_to_a_training_in_a_container(case: str, tmp_path: Path) -> None:
    with _cpu_demo(case) as p:
        pid = p.init_pid()
        p.wait_stderr(": step ")  # stepping: an injection during torch's import waits for its lock
        checks = _doctor(pid)
        assert checks["pid-namespace"]["finding"].startswith(f"PID {pid} is PID 1 in its own PID namespace")
        mount = checks["mount-namespace"]["finding"]
        if case == "pid-ns":
            assert "sees the same files as torchwatch" in mount and "inject/mount-namespace" not in checks
        else:
            assert f"read through /proc/{pid}/root" in mount, mount
            inject = checks["inject/mount-namespace"]
            assert inject["level"] == "ok", inject
            placed = "placed there through" if case == "own-root-tmp-net" else "as torchwatch does"
            assert placed in inject["finding"], inject
        out = tmp_path / "attach.json"
        watched = torchwatch(
            "attach", "--headless", "--duration", str(WATCH_S), "--json", str(out), str(pid), json_path=out
        )
    assert watched.code == 0 and watched.report is not None, watched.stderr[-3000:]
    report = watched.report
    assert report["target"]["pid"] == pid and report["target"]["ns_pid"] == 1
    assert report["injection"]["injected"], report["injection"]
    assert report["sources"]["py-spy"]["status"] == "ok", report["sources"]
    assert (report["features"]["stack_samples"] or 0) > 0, report["features"]  # 0 before: every sample dropped
    assert report["hook"] is not None and report["hook"]["steps"] > 0, report["hook"]
    if case == "cgroup-limits":
        assert report["features"]["usable_cpus"] == 1.0, report["features"]
        assert "cgroup v1 memory limit" in report["memory"]["limit_source"], report["memory"]
        assert report["memory"]["limit_bytes"] == 2 << 30
    _label_or_busy(report, quota=case == "cgroup-limits")


@needs_pods
@pytest.mark.quiet
def test_run_inside_a_container_with_its_own_root_and_tmp() -> None:
    out_dir = Path(tempfile.mkdtemp(prefix="torchwatch-pod-out-", dir="/var/tmp"))  # the pod sees it: not in /tmp
    try:
        out = out_dir / "run.json"
        argv = [
            sys.executable, "-m", "torchwatch", "run", "--headless", "--duration", "20",
            "--json", str(out), "--", sys.executable, str(DEMO / "cpu_bound.py"), "--device", "cpu", "--seconds", "40",
        ]  # fmt: skip
        with pod(argv, own_tmp=True, own_root=True, net=True) as p:
            p.proc.wait(timeout=120)
            err = "".join(p.lines)
        assert p.proc.returncode == 0 and out.exists(), err[-3000:]
        report = json.loads(out.read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert report["target"].get("ns_pid") is None  # torchwatch and the training share the pod's namespace
    # py-spy read the loop; its last chunk may end after --duration stopped the training ("gone")
    assert report["sources"]["py-spy"]["status"] in ("ok", "gone") and (report["features"]["stack_samples"] or 0) > 0
    assert report["hook"] is not None and report["hook"]["steps"] > 0, report["hook"]
    _label_or_busy(report)


def _hooked_pod(tmp: Path) -> contextlib.AbstractContextManager[Pod]:
    """A hooked small training (as ``torchwatch run`` starts one) in a pod of its own /tmp and root,
    as root, publishing in its default directory (``/tmp/torchwatch-0`` in its own view)."""
    env = {k: v for k, v in hook_env().items() if k not in ("TORCHWATCH_DIR", "TMPDIR")}
    env["TORCHWATCH_TRACE_DIR"] = str(tmp)
    return pod([sys.executable, str(SMALL), "--seconds", "40"], own_tmp=True, own_root=True, env=env)


def _read_hook(pid: int, timeout: float = 60.0) -> wire.HookRecord:
    reader = HookReader(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = reader.record()
        if rec is not None and reader.counters() is not None:
            return rec
        time.sleep(0.2)
    raise AssertionError(f"no hook read in PID {pid}: {reader.reason}")


FORGE = r"""
import os, sys
theirs = os.path.join("/tmp/torchwatch-0", sys.argv[1])  # pod B's directory, by its name
for name in ("request.json", "hook.json", "counters"):
    path = os.path.join(theirs, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        print("refused", name, exc.errno)
        continue
    os.close(fd)
    print("WROTE", path)
print("mine:", sorted(os.listdir("/tmp/torchwatch-0")))
"""


@needs_pods
def test_two_pods_cannot_write_each_others_hook_channel(tmp_path: Path) -> None:
    """Each pod's hook publishes in its own /tmp (its mount namespace's); torchwatch reads both
    through /proc/PID/root. From inside pod A, as root, pod B's hook directory (named after B's
    instance, the same PID 1) cannot be reached to plant a request or a hook.json."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with _hooked_pod(tmp_path / "a") as a, _hooked_pod(tmp_path / "b") as b:
        pid_a, pid_b = a.init_pid(), b.init_pid()
        rec_a, rec_b = _read_hook(pid_a), _read_hook(pid_b)
        assert rec_a.instance == instance_of(pid_a) and rec_b.instance == instance_of(pid_b)
        assert rec_a.instance.pid == rec_b.instance.pid == 1
        forged = subprocess.run(
            ["nsenter", "-t", str(pid_a), "-m", "-p", "-r", "-w", sys.executable, "-c", FORGE, rec_b.instance.dir_name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert forged.returncode == 0, forged.stderr[-2000:]
        assert "WROTE" not in forged.stdout and forged.stdout.count(" 2\n") == 3, forged.stdout  # ENOENT: not there
        assert f"mine: ['{rec_a.instance.dir_name}']" in forged.stdout, forged.stdout
        # B's channel is as B left it: its hook.json still names B, and no request waits in it
        assert _read_hook(pid_b).instance == rec_b.instance
        fd = wire.open_dir_in(wire.root_of(pid_b), HookReader(pid_b).dir or "", (0,), private=True)
        try:
            assert wire.REQUEST_FILE not in os.listdir(fd)
        finally:
            os.close(fd)


GROW = """
import time
time.sleep(4)
chunks = []
while True:  # 8 MiB a step, every page touched, until the container's limit kills it
    chunks.append(bytearray(8 << 20))
    for i in range(0, len(chunks[-1]), 4096):
        chunks[-1][i] = 1
    time.sleep(0.05)
"""


@needs_pods
def test_an_out_of_memory_kill_at_the_containers_limit_is_recorded_with_that_limit(tmp_path: Path) -> None:
    """Watched from the host: the kill (the kernel log names the host PID) and the container's 400
    MiB limit, not the machine's (a killed process's cgroup reads as the root group)."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel log is not readable here")
    with pod([sys.executable, "-c", GROW], limits=Limits(cpus=1.0, memory=400 << 20)) as p:
        pid = p.init_pid()
        out = tmp_path / "oom.json"
        watched = torchwatch(
            "attach", "--headless", "--no-inject", "--duration", "20", "--json", str(out), str(pid), json_path=out
        )
    assert watched.report is not None, watched.stderr[-3000:]
    memory = watched.report["memory"]
    kills = [r for r in memory["records"] if r["pid"] == pid]
    assert kills and "Killed process" in kills[0]["how"], memory
    assert kills[0]["limit_bytes"] == 400 << 20 and "cgroup v1 memory limit" in kills[0]["limit_source"], kills[0]
