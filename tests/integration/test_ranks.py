"""Distributed trainings get the hook in every rank (torchrun and torch.multiprocessing.spawn),
never in DataLoader workers; ranks publish who they are and how long they wait on each other;
a burst asked of every rank for the same steps lands in one folder that HTA reads as one
multi-rank trace. Each test reads a real 2-rank gloo DDP training on the CPU (the identity and
slow-peer tests share one per launcher)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchwatch import wire
from torchwatch.sources.hook import HookReader
from torchwatch.watch.lifecycle import hook_env

pytest.importorskip("torch.distributed", reason="the ranks need torch")
# one xdist worker runs the module: its two trainings are shared by the module
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ranks")]

HERE = Path(__file__).parent
REPO = HERE.parents[1]
TRAIN = HERE / "_ddp_train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp_path: Path) -> dict[str, str]:
    env = hook_env()
    env["TORCHWATCH_DIR"] = str(tmp_path / "tw")
    env["TORCHWATCH_TRACE_DIR"] = str(tmp_path / "traces")
    env["TORCHWATCH_BURST_COOLDOWN_S"] = "0"
    return env


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def _train(tmp_path: Path, launcher: str, *args: str, seconds: float = 4.0) -> tuple[dict[int, Any], Path]:
    out = tmp_path / "out"
    out.mkdir()
    train = [str(TRAIN), "--out", str(out), "--seconds", str(seconds), *args]
    if launcher == "torchrun":
        cmd = _torchrun(*train)
    else:
        cmd = [sys.executable, *train, "--spawn", "--port", str(_free_port())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=_env(tmp_path), check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    ranks = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)}
    return ranks, out


SLEEP_MS = 40.0  # rank 1 sleeps this long before each forward: rank 0 waits for it in the all-reduce


@pytest.fixture(scope="module", params=["mp.spawn", "torchrun"])
def trained(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[int, Any], Path]:
    """One training per launcher, shared by the tests below (each start costs ~20 s of imports on
    2 cores): 2 spawned DataLoader workers per rank, rank 1 sleeping :data:`SLEEP_MS` per step."""
    launcher: str = request.param
    ranks, out = _train(
        tmp_path_factory.mktemp(launcher), launcher, "--workers", "2", "--rank1-sleep-ms", str(SLEEP_MS)
    )
    return launcher, ranks, out


def test_ranks_are_hooked_with_their_identity_and_their_workers_are_not(
    trained: tuple[str, dict[int, Any], Path],
) -> None:
    launcher, ranks, out = trained
    for r, view in ranks.items():
        assert view["hooked"], view
        st = view["state"]
        assert st is not None and st["errors"] == [], view
        ident = st["rank"]
        assert (ident["rank"], ident["world_size"], ident["local_rank"], ident["backend"]) == (r, 2, r, "gloo")
        assert view["steps"] > 5 and view["step_source"] == "optimizer"
        if launcher == "torchrun":
            assert set(ident["sources"].values()) == {"env", "torch.distributed"}  # backend: torch.distributed
            assert ident["sources"]["rank"] == "env" and ident["spawned_by"] is None
        else:
            assert ident["sources"]["rank"] == "torch.distributed"
            assert ident["sources"]["local_rank"] == "mp.spawn index"
            assert ident["spawned_by"] is not None
        assert ident["job"] == ranks[0]["state"]["rank"]["job"]  # one job key for all ranks
        print(f"{launcher} rank {r}: pid {view['pid']} identity {ident} steps {view['steps']}")  # pytest -s
    workers = [json.loads(p.read_text()) for p in out.glob("worker-*.json")]
    assert len(workers) == 4  # 2 ranks x 2 spawned workers
    assert all(w == {"hooked": False, "mark": None, "preload": None} for w in workers), workers
    print(f"{launcher}: {len(workers)} DataLoader workers, hooked: {[w['hooked'] for w in workers]}")
    if launcher == "mp.spawn":
        launcher_view = json.loads((out / "launcher.json").read_text())
        assert launcher_view["hooked"]
        assert sorted(launcher_view["spawned_ranks"]) == sorted(v["pid"] for v in ranks.values())


def test_the_rank_that_waits_on_a_slow_peer_shows_it_blocked_in_backward(
    trained: tuple[str, dict[int, Any], Path],
) -> None:
    launcher, ranks, _ = trained
    sleep_ms = SLEEP_MS
    medians = {r: v["median"] for r, v in ranks.items()}
    fast, slow = medians[0], medians[1]
    # Synchronous DDP: both steps last as long; rank 0 waits in the reducer's all-reduce for
    # rank 1's sleep, rank 1 finds rank 0 ready. Blocked time is time without CPU, so a busy
    # shared machine adds to both alike; the sleep is what tells them apart.
    assert fast["duration"] == pytest.approx(slow["duration"], rel=0.25)
    assert fast["backward_blocked"] > 0.6 * sleep_ms / 1000, fast
    assert fast["backward_blocked"] - slow["backward_blocked"] > 0.5 * sleep_ms / 1000, (fast, slow)
    # what each does before the collective: rank 1 its sleep and forward, rank 0 its forward
    before = {r: m["duration"] - m["data_wait"] - m["backward"] - m["collective"] for r, m in medians.items()}
    for r, m in medians.items():  # the figures, shown with pytest -s
        ms = {k: round(1000 * m[k], 1) for k in ("duration", "backward", "backward_blocked", "collective")}
        print(f"{launcher} rank {r} (rank 1 sleeps {sleep_ms:g} ms): {ms}, before collective {1000 * before[r]:.1f}")
    assert before[1] - before[0] > 0.5 * sleep_ms / 1000, before


# -- a burst on every rank, for the same steps ---------------------------------------------------
def _rank_readers(launcher_pid: int, n: int, deadline: float) -> list[HookReader]:
    """The hooked ranks below the launcher, once each has made a few steps."""
    while time.monotonic() < deadline:
        found = []
        for child in psutil.Process(launcher_pid).children(recursive=True):
            reader = HookReader(child.pid)
            info = reader.info()
            snap = reader.counters() if info is not None else None
            if info is not None and info.get("rank") is not None and snap is not None and snap.steps >= 5:
                found.append(reader)
        if len(found) == n:
            return sorted(found, key=lambda r: (r.info() or {})["rank"]["rank"])
        time.sleep(0.3)
    raise AssertionError("the ranks did not start")


def _wait_burst(reader: HookReader, deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        burst = (reader.info() or {}).get("burst") or {}
        if burst.get("state") == "idle" and (burst.get("last") or {}).get("id") == 1:
            return dict(burst["last"])
        time.sleep(0.3)
    raise AssertionError(f"no burst result from PID {reader.pid}")


def test_a_burst_on_every_rank_profiles_the_same_steps_into_one_folder_hta_reads(tmp_path: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is in the test extra")
    out = tmp_path / "out"
    out.mkdir()
    cmd = _torchrun(str(TRAIN), "--out", str(out), "--seconds", "60", "--rank1-sleep-ms", "5")
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        readers = _rank_readers(proc.pid, 2, time.monotonic() + 120)
        steps = [r.counters().steps for r in readers]  # type: ignore[union-attr]
        start = max(steps) + 10  # what torchwatch will ask: past every rank, with a margin
        group = f"burst-test-{os.getpid()}"
        for reader in readers:
            sent, message = reader.request_burst(wire.BurstRequest(start_step=start, group=group, warmup=1, steps=3))
            assert sent, message
        results = [_wait_burst(r, time.monotonic() + 120) for r in readers]
    finally:
        proc.terminate()
        proc.wait(60)
    for rank, res in enumerate(results):
        assert res.get("error") is None, res
        assert (res["start_step"], res["first_step"], res["group"], res["rank"]) == (start, start, group, rank)
        assert res["breakdown_share"]["communication"] > 0, res["breakdown_share"]
        share = res["breakdown_share"]["communication"]
        print(f"burst rank {rank}: from step {res['first_step']}, communication share {share:.3f}")  # pytest -s
    folder = tmp_path / "traces" / group
    assert {Path(r["trace_dir"]) for r in results} == {folder}
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and all(f".rank{r}.1.pt.trace.json.gz" in n for r, n in enumerate(names)), names
    for rank in (0, 1):  # summaries beside the folder, never in it (HTA reads every .json there)
        assert len(list((tmp_path / "traces").glob(f"{group}.*.rank{rank}.1.summary.json"))) == 1
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    assert sorted(analysis.t.traces) == [0, 1]  # two ranks found
    print(f"burst folder {folder.name}: {names}; HTA ranks {sorted(analysis.t.traces)}")
    profiled = {start + 1, start + 2, start + 3}  # step `start` is the warmup
    iterations = []
    for rank, name in enumerate(names):
        with gzip.open(folder / name, "rt") as f:
            trace = json.load(f)
        assert trace["distributedInfo"]["rank"] == rank  # written by kineto: torch.distributed is up
        marks = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert marks == {f"ProfilerStep#{i}" for i in profiled}, marks  # numbered as the hook counts steps
        df = analysis.t.get_trace(rank)
        iterations.append({int(i) for i in df["iteration"] if i >= 0})
    assert iterations[0] == iterations[1] and iterations[0] <= profiled, iterations  # HTA lines them up
