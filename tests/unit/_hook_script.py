"""A tiny training run with the hook installed, for tests/unit/test_hook_runtime.py.

Usage: python _hook_script.py MODE DIR  (prints one JSON object on its last stdout line)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

MODE, DIR = sys.argv[1], sys.argv[2]
os.environ.setdefault("TORCHWATCH_BURST_COOLDOWN_S", "0")

import torchwatch.hook  # noqa: E402
from torchwatch.hook import runtime  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402

installed = torchwatch.hook.install(directory=DIR)
torch_before = "torch" in sys.modules

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def worker_probe(worker_id: int) -> None:
    """Runs in each DataLoader worker: does it carry an active hook?"""
    from torchwatch.hook import patches
    from torchwatch.hook import runtime as rt

    handler = signal.getsignal(signal.SIGUSR2)
    with open(os.path.join(DIR, f"worker-{os.getpid()}.json"), "w") as f:
        json.dump(
            {
                "active": patches._active,
                "current": rt.current() is not None,
                "default_handler": handler == signal.SIG_DFL,
            },
            f,
        )


def _fake_cuda(calls: list[str], initialised: bool) -> None:
    """A recorded-shape ``torch.cuda`` surface (FABRICATED: no GPU here) that logs each call.

    Two devices: the training allocates on device 0 only (80 GiB, the capacity of an H100 SXM);
    ``memory_stats_as_nested_dict`` returns the keys ``torch.cuda.memory_stats`` documents (nested),
    allocated moving by 1 GiB a call so that the hook has something to republish.
    """
    gib = 1 << 30
    reads = [0]

    def log(name: str, value: object) -> object:
        calls.append(name)
        return value

    def memory_stats(device: int = 0) -> dict:
        calls.append("memory_stats")
        if device != 0:
            return {"allocated_bytes": {"all": {"current": 0, "peak": 0}}, "reserved_bytes": {"all": {"current": 0}}}
        reads[0] += 1
        return {
            "allocated_bytes": {"all": {"current": (2 + reads[0] % 4) * gib, "peak": 9 * gib}},
            "reserved_bytes": {"all": {"current": 12 * gib, "peak": 12 * gib}},
            "num_alloc_retries": 0,
        }

    class Props:
        total_memory = 80 * gib

    torch.cuda.is_initialized = lambda: initialised  # type: ignore[assignment]
    torch.cuda.memory_stats_as_nested_dict = memory_stats  # type: ignore[assignment]
    torch.cuda.current_device = lambda: log("current_device", 0)  # type: ignore[assignment]
    torch.cuda.device_count = lambda: log("device_count", 2)  # type: ignore[assignment]
    torch.cuda.get_device_properties = lambda d=0: log("get_device_properties", Props())  # type: ignore[assignment]


def state() -> dict:
    hook = runtime.current()
    assert hook is not None
    return HookReader(os.getpid(), hook.dir).info() or {}


def main() -> None:
    out: dict = {"installed": installed, "torch_imported_by_install": torch_before, "pid": os.getpid()}
    hook = runtime.current()
    ds = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
    kw: dict = {"batch_size": 8, "pin_memory": True}
    if MODE in ("fork", "spawn"):
        kw.update(num_workers=2, worker_init_fn=worker_probe, multiprocessing_context=MODE, persistent_workers=False)
    loader = DataLoader(ds, **kw)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        time.sleep(0.002)

    def train(seconds: float, until=None) -> int:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            for x, y in loader:
                step(x, y)
                n += 1
                if until is not None and until():
                    return n
                if time.monotonic() > end:
                    break
        return n

    cuda_calls: list[str] = []
    if MODE == "fake_cuda":
        _fake_cuda(cuda_calls, initialised=os.environ.get("FAKE_CUDA_INIT") == "1")
        torch.set_float32_matmul_precision("high")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    train(0.5)
    if MODE == "burst":
        os.kill(os.getpid(), hook.signum if hook else signal.SIGUSR2)
        train(30.0, until=lambda: (state().get("burst") or {}).get("last") is not None)
    elif MODE == "user_profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            os.kill(os.getpid(), signal.SIGUSR2)
            out["steps_during"] = train(1.0)
    elif MODE == "bursts20":
        rss = []
        for i in range(int(os.environ.get("BURSTS", "20"))):
            os.kill(os.getpid(), signal.SIGUSR2)
            train(
                30.0,
                until=lambda i=i: (
                    ((state().get("burst") or {}).get("last") or {}).get("id") == i + 1
                    and (state().get("burst") or {}).get("state") == "idle"
                ),
            )
            last = (state().get("burst") or {}).get("last") or {}
            rss.append(
                [
                    last.get("rss_before_bytes"),
                    last.get("rss_after_bytes"),
                    last.get("error"),
                    (state().get("burst") or {}).get("last_refusal"),
                    time.monotonic(),
                ]
            )
        out["rss"] = rss
    elif MODE == "window":
        os.kill(os.getpid(), signal.SIGUSR2)  # no step in flight: a time-window burst
        end = time.monotonic() + 20
        while time.monotonic() < end and (state().get("burst") or {}).get("last") is None:
            x = torch.randn(64, 64)
            for _ in range(20):
                x = torch.tanh(x @ x.T / 64)
            time.sleep(0.01)
    elif MODE == "big_trace":
        from torchwatch import wire
        from torchwatch.hook import summary

        calls = []
        real_load = summary.load_trace
        summary.load_trace = lambda path: calls.append(path) or real_load(path)  # type: ignore[assignment]
        fd = wire.open_dir(hook.dir, (os.geteuid(),), private=True)
        wire.write_atomic(fd, "request.json", b'{"steps": 20, "max_bytes": 1}')  # 1 MB after clamping
        os.close(fd)
        os.kill(os.getpid(), signal.SIGUSR2)

        def many_ops(x: torch.Tensor, y: torch.Tensor) -> None:
            step(x, y)
            z = x
            for _ in range(300):  # many small operators: a trace of several MB in 20 steps
                z = z + 1

        end = time.monotonic() + 60
        while time.monotonic() < end and (state().get("burst") or {}).get("last") is None:
            for x, y in loader:
                many_ops(x, y)
        out["load_trace_calls"] = len(calls)
    elif MODE == "signals":
        train(0.5)
        out["handlers"] = {
            name: "default" if signal.getsignal(getattr(signal, name)) in (signal.SIG_DFL, signal.default_int_handler)
            else "handled"
            for name in ("SIGKILL", "SIGTERM", "SIGINT")
        }  # fmt: skip
    elif MODE == "epoch_end":
        for x, y in loader:  # to the end of the epoch: the last __next__ raises StopIteration
            step(x, y)
        time.sleep(0.5)  # a pause after the epoch (validation, checkpoint) is not a data wait
        after = HookReader(os.getpid(), hook.dir).counters() if hook else None
        out["in_next_since_after_epoch"] = None if after is None else after.in_next_since
    else:
        train(1.0)
    out["cuda_calls"] = sorted(set(cuda_calls))
    snap = HookReader(os.getpid(), hook.dir).counters() if hook else None
    out["state"] = state() if hook else None
    out["counters"] = (
        None
        if snap is None
        else {
            "steps": snap.steps,
            "batches": snap.batches,
            "data_wait_s": snap.data_wait_s,
            "entries": len(snap.entries),
        }
    )
    out["dir"] = str(hook.dir) if hook else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
