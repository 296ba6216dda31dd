"""Record NVML + GPM readings of a running training into the fixture format of tests/fixtures/gpu/.

Runs unchanged on a GPU machine (needs nvidia-ml-py and psutil, both torchwatch dependencies). It
reads the GPUs exactly as torchwatch does, through ``torchwatch.sources.nvml.NvmlSource``, but hands
that source a recording wrapper around ``pynvml``: every value NVML returns (or the error it raises)
is written per sample and device, keyed by the NVML function, in the format ``tests/unit/nvml_replay.py``
replays (``torchwatch.nvml-recording/1``). tests/fixtures/gpu_recorded/ holds recordings made
with it on an H200 (gzipped, with the system's versions in ``system``). Standard library plus
torchwatch's own dependencies.

    # launch a training and record a minute of it after 15 s of warm-up
    python bench/record_gpu.py --seconds 60 --warmup 15 --out rec.json \\
        -- python demo/gpu_bound.py --device cuda --seconds 90

    # or record a training that is already running (its process tree's PIDs)
    python bench/record_gpu.py --seconds 60 --pid 12345 --out /tmp/rec.json

It prints one line per sample (util, GPM SM activity, the training's SM %) and, at the end, the means.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torchwatch.sources.nvml import NvmlSource

FORMAT = "torchwatch.nvml-recording/1"
# Calls whose extra argument selects the reading: recorded as "name:arg".
_KEYED_BY_ARG = {"nvmlDeviceGetClockInfo", "nvmlDeviceGetPcieThroughput"}
# Calls that change nothing to record (buffers, lifecycle) or are answered by the replay itself.
_NOT_RECORDED = {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlGpmSampleAlloc"}
_NOT_RECORDED |= {"nvmlGpmSampleFree"}


def plain(value: Any) -> Any:
    """A pynvml result as JSON: structures as dicts of their fields, arrays as lists, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple, ctypes.Array)):
        return [plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_ if not name.startswith("_")}
    if isinstance(value, ctypes._SimpleCData):
        return value.value
    if hasattr(value, "__dict__"):  # a plain attribute object (what a fake pynvml returns)
        return {k: plain(v) for k, v in vars(value).items()}
    return repr(value)


class RecordingNvml:
    """``pynvml`` with every device call's result (or error code) written into the current frame."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._index: dict[int, int] = {}  # handle address -> device index
        self._gpm_device: int | None = None  # device of the last nvmlGpmSampleGet (nvmlGpmMetricsGet has none)
        self.static: dict[str, dict[str, Any]] = {}
        self.frame: dict[str, dict[str, Any]] = self.static  # the init calls go to "static"

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._nvml, name)
        if name == "nvmlDeviceGetHandleByIndex":
            return self._handle_by_index
        if not name.startswith("nvml") or not callable(real) or name in _NOT_RECORDED:
            return real
        return lambda *args: self._recorded(name, real, args)

    def _handle_by_index(self, index: int) -> Any:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        self._index[int(ctypes.cast(handle, ctypes.c_void_p).value or 0)] = index
        return handle

    def _device_of(self, args: tuple[Any, ...]) -> int | None:
        if not args:
            return None
        try:
            return self._index.get(int(ctypes.cast(args[0], ctypes.c_void_p).value or 0))
        except (TypeError, ctypes.ArgumentError):
            return None

    def _recorded(self, name: str, real: Any, args: tuple[Any, ...]) -> Any:
        device = self._device_of(args)
        if name == "nvmlGpmSampleGet":
            self._gpm_device = device
        if name == "nvmlGpmMetricsGet":
            device = self._gpm_device
        key = f"{name}:{args[1]}" if name in _KEYED_BY_ARG else name
        slot = self.frame.setdefault(str(device), {})
        try:
            result = real(*args)
        except self._nvml.NVMLError as err:
            slot[key] = {"nvml_error": int(err.value)}
            raise
        if name == "nvmlGpmMetricsGet":
            slot[key] = [
                {"metricId": int(m.metricId), "nvmlReturn": int(m.nvmlReturn), "value": float(m.value)}
                for m in result.metrics[: result.numMetrics]
            ]
        elif name != "nvmlGpmSampleGet":  # the sample buffer is opaque: only its errors are kept
            slot[key] = plain(result)
        return result


def record(nvml: Any, times: list[float], tree: set[int]) -> dict[str, Any]:
    """Sample ``nvml`` through NvmlSource at each of ``times`` (no sleeping); the recording without provenance."""
    recorder = RecordingNvml(nvml)
    source = NvmlSource(lambda: tree, nvml=recorder)
    samples = []
    for t in times:
        recorder.frame = {}
        source.sample(t)
        samples.append({"t": t, "devices": recorder.frame})
    source.close()
    return {"format": FORMAT, "tree_pids": sorted(tree), "static": recorder.static, "samples": samples}


def system_versions(nvml: Any) -> dict[str, Any]:
    """The driver's, CUDA driver API's and NVML's versions and the kernel release, for a recording's
    provenance (``None`` where NVML cannot say); NVML must be initialised."""

    def ask(name: str) -> Any:
        try:
            return plain(getattr(nvml, name)())
        except Exception:  # an old driver or binding: the version is simply not known
            return None

    cuda = ask("nvmlSystemGetCudaDriverVersion")  # e.g. 13000 for 13.0
    return {
        "driver": ask("nvmlSystemGetDriverVersion"),
        "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        "nvml": ask("nvmlSystemGetNVMLVersion"),
        "kernel": os.uname().release,
    }


def tree_pids(root: int) -> set[int]:
    try:
        proc = psutil.Process(root)
        return {root, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds to record (default 60)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds to wait before recording (default 15)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--pid", type=int, help="record this running training instead of launching one")
    parser.add_argument("--out", required=True, help="the recording to write (JSON)")
    parser.add_argument("--what", default="", help="a line saying what was recorded (default: the command)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the training to launch")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if (args.pid is None) == (not command):
        parser.error("give either --pid PID or -- COMMAND")
    import pynvml  # type: ignore[import-untyped]

    target = {"root": args.pid or 0}
    recorder = RecordingNvml(pynvml)
    source = NvmlSource(lambda: tree_pids(target["root"]), interval=args.interval, nvml=recorder)
    if source.status.reason:  # before launching anything: a machine without a usable GPU records nothing
        print(f"record_gpu.py: NVML unavailable: {source.status.reason}", file=sys.stderr)
        return 1
    versions = system_versions(pynvml)  # NVML is initialised by the source until it closes
    child = subprocess.Popen(command) if command else None
    root = target["root"] = child.pid if child else int(args.pid)
    samples: list[dict[str, Any]] = []
    seen: set[int] = set()
    try:
        time.sleep(args.warmup)
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            now = time.monotonic()
            recorder.frame = {}
            seen |= tree_pids(root)
            for g in source.sample(now - t0):
                print(
                    f"t={now - t0:5.1f}s GPU {g.index}: util {g.util_pct}% SM active {g.sm_active_pct} "
                    f"tensor {g.tensor_active_pct} training SM {g.proc_sm_pct}% "
                    f"{'(' + g.gpm_reason + ')' if g.gpm_reason else ''}",
                    flush=True,
                )
            samples.append({"t": round(now - t0, 3), "devices": recorder.frame})
            time.sleep(max(0.0, args.interval - (time.monotonic() - now)))
    finally:
        source.close()
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
    recording = {
        "format": FORMAT,
        "provenance": f"recorded by bench/record_gpu.py on {time.strftime('%Y-%m-%d')}",
        "system": versions,
        "what": args.what or " ".join(command) or f"PID {root}",
        "interval_s": args.interval,
        "tree_pids": sorted(seen) or [root],
        "static": recorder.static,
        "samples": samples,
    }
    Path(args.out).write_text(json.dumps(recording, separators=(",", ":")) + "\n")
    print(f"record_gpu.py: {len(samples)} samples written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
