"""``torchwatch serve --prometheus`` on a 1-GPU training: the device series beside the step series.

    python bench/gpu_serve.py [--seconds 60] [--scrapes 5] [--json out.json]

Starts ``demo/gpu_bound.py --device cuda`` with torchwatch's hook pre-loaded (as ``torchwatch run``
passes it on), then ``torchwatch serve --prometheus`` on a free port of 127.0.0.1 (a scan every
second, so it finds the training at once), scrapes ``/metrics`` ``--scrapes`` times 5 s apart once
the training's step series are there, and prints, per scrape, the step series (step time, steps/s,
data wait, CPU, CUDA memory, the verdict) next to the device series: NVML's as torchwatch names
them (``torchwatch_gpu_*``) and under OpenTelemetry's hardware names (``hw_gpu_*``,
``hw_power_watts``, docs/fleet.md has the table). As root with ``unshare``, the training and serve
run in a PID namespace of their own (serve watches only this training). Every process it starts
is killed at the end; the whole run is bounded by ``--seconds`` + 30 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEP = (
    "torchwatch_step_time_seconds",
    "torchwatch_steps_per_second",
    "torchwatch_data_wait_ratio",
    "torchwatch_cpu_ratio",
    "torchwatch_cuda_memory_allocated_bytes",
    "torchwatch_cuda_memory_reserved_bytes",
)
DEVICE = (
    "torchwatch_gpu_utilization_ratio",
    "torchwatch_gpu_power_watts",
    "torchwatch_gpu_memory_used_bytes",
    "torchwatch_gpu_sm_active_ratio",
    "hw_gpu_utilization_ratio",
    "hw_gpu_memory_usage_bytes",
    "hw_gpu_memory_limit_bytes",
    "hw_gpu_memory_utilization_ratio",
    "hw_power_watts",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{metric name: [(labels, value)...]}`` of an exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _one(got: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = got.get(name)
    return values[0][1] if values else None


def _show(value: float | None, name: str) -> str:
    if value is None:
        return "n/a"
    if name.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if name.endswith("_ratio"):
        return f"{100 * value:.0f} %"
    if name.endswith("_seconds"):
        return f"{1000 * value:.1f} ms"
    if name.endswith("_watts"):
        return f"{value:.0f} W"
    return f"{value:.2f}"


def run(seconds: float, scrapes: int, device: str = "cuda") -> dict[str, Any]:
    from torchwatch.analysis.rules_engine import builtin_dir
    from torchwatch.watch.lifecycle import hook_env

    if not builtin_dir().is_dir():
        raise SystemExit(
            f"torchwatch's rules are not at {builtin_dir()}: install torchwatch (pip install --no-deps .), "
            "or in a throw-away copy of the tree: ln -s ../rules torchwatch/rules"
        )

    tmp = Path(tempfile.mkdtemp(prefix="gpu_serve-"))
    env = hook_env()
    env.update(TORCHWATCH_DIR=str(tmp / "tw"), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(REPO)  # torchwatch from this tree in serve too
    demo = [sys.executable, str(REPO / "demo" / "gpu_bound.py"), "--device", device, "--seconds", str(seconds)]
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    serve = [sys.executable, "-m", "torchwatch", "serve", "--prometheus", f"127.0.0.1:{port}", "--scan", "1"]
    isolate = os.geteuid() == 0 and shutil.which("unshare") is not None
    script = tmp / "node.sh"
    script.write_text(
        f"{shlex.join(demo)} >{tmp / 'train.log'} 2>&1 &\n"
        f"env -u TORCHWATCH_HOOK {shlex.join(serve)} >{tmp / 'serve.log'} 2>&1 &\nwait\n"
    )
    cmd = ["bash", str(script)]
    if isolate:
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *cmd]
    print(f"{'isolated' if isolate else 'not isolated'}: {' '.join(cmd)}; logs in {tmp}", file=sys.stderr)
    node = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    rows: list[dict[str, Any]] = []
    ok = False
    try:
        deadline = time.monotonic() + seconds + 30
        got: dict[str, list[tuple[dict[str, str], float]]] = {}
        while time.monotonic() < deadline and _one(got, "torchwatch_step_time_seconds") is None:
            time.sleep(2)
            with contextlib.suppress(OSError):
                got = _parse(urllib.request.urlopen(url, timeout=5).read().decode())
        if _one(got, "torchwatch_step_time_seconds") is None:
            raise SystemExit(f"no step series within {seconds + 30:g} s; see {tmp}")
        for i in range(scrapes):
            if time.monotonic() >= deadline:
                break
            if i:
                time.sleep(5)
            t0 = time.perf_counter()
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            took = time.perf_counter() - t0
            got = _parse(text)
            verdict = next((labels["label"] for labels, v in got.get("torchwatch_verdict", []) if v == 1), "n/a")
            row: dict[str, Any] = {"scrape": i + 1, "scrape_ms": round(1000 * took, 1), "verdict": verdict}
            row.update({name: _one(got, name) for name in (*STEP, *DEVICE)})
            rows.append(row)
            print(f"\nscrape {i + 1} ({row['scrape_ms']} ms, {len(text)} bytes), verdict {verdict}")
            for left, right in zip(STEP + ("",) * (len(DEVICE) - len(STEP)), DEVICE, strict=True):
                lhs = f"{left:40} {_show(row.get(left), left):>10}" if left else " " * 51
                print(f"  {lhs}   {right:34} {_show(row[right], right):>10}")
        labels = {name: got[name][0][0] for name in DEVICE if got.get(name)}
        print("\nlabels of the device series:", json.dumps(labels, indent=1))
        ok = True
        return {"scrapes": rows, "device_labels": labels, "isolated": isolate, "last_scrape": text}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)  # with --kill-child: every process of the namespace
        node.wait(20)
        for log in ("serve.log", "train.log"):
            path = tmp / log
            if path.exists():
                print(f"--- {log} (tail)\n{path.read_text(errors='replace')[-1200:]}", file=sys.stderr)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)  # kept (logs, hook files) only when it failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="the training's length (the run's bound)")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--json", help="also write the scrapes to this file")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: try the script without a GPU")
    args = parser.parse_args()
    got = run(args.seconds, args.scrapes, args.device)
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=2) + "\n")


if __name__ == "__main__":
    main()
