"""A training for live trials (``torchwatch trial``): an MLP fed by a DataLoader whose samples cost
CPU time to make, with the settings a trial changes given on the command line.

    --threads N        torch.set_num_threads(N) at the start (8 on 2 CPUs oversubscribes them)
    --workers N        DataLoader num_workers (0: the samples are made in the main thread)
    --sample-ms MS     CPU time to make one sample (a busy loop in __getitem__)
    --batches N        batches per epoch (an epoch is one DataLoader iterator)
    --steps N          stop after N steps (else --seconds)
    --loss-file PATH   one line per step: "step loss" (the loss trajectory, compared across runs)
    --settings-file P  at the end: every distinct (threads, gc threshold, gc frozen, cudnn.benchmark,
                       loader num_workers/pin_memory/prefetch_factor) seen at a step, as JSON lines,
                       and the values at the end: what the training saw of the trials, from inside
    --device cuda      train on the GPU (batches copied with non_blocking=True)
    --image C,H,W      samples are images (uint8 made float, cheap) and the model a small conv net
    --pin-memory 1     DataLoader pin_memory=True; --cudnn-benchmark 1: torch.backends.cudnn.benchmark

The final line is ``trial_train: done, STEPS steps in SECONDS s, RATE steps/s`` (the separate-run
A/B reads it). SIGTERM and SIGINT end the loop cleanly (the final line is still printed).
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

_stop = False


def _on_stop(signum: int, frame: object) -> None:
    global _stop
    _stop = True


class Samples(Dataset):  # type: ignore[type-arg]
    """``n`` samples of 256 features (or ``image``-shaped images), each costing ``cost_s`` of CPU
    to make (deterministic)."""

    def __init__(self, n: int, cost_s: float, image: tuple[int, ...] = ()) -> None:
        self.n, self.cost_s, self.image = n, cost_s, image
        self.pool = (
            torch.randint(0, 256, (16, *image), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
            if image
            else None
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.thread_time() + self.cost_s
        x = 0
        while time.thread_time() < end:
            x += 1
        if self.pool is not None:
            return self.pool[i % 16].float().div_(255), i % 10
        g = torch.Generator().manual_seed(i)
        return torch.randn(256, generator=g), i % 10


def settings(loader: DataLoader) -> tuple[object, ...]:  # type: ignore[type-arg]
    """What a trial may change, as the training sees it."""
    return (
        torch.get_num_threads(),
        tuple(gc.get_threshold()),
        gc.get_freeze_count() > 0,
        bool(torch.backends.cudnn.benchmark),
        loader.num_workers,
        loader.pin_memory,
        loader.prefetch_factor,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--sample-ms", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--loss-file", default="")
    p.add_argument("--settings-file", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--image", default="")
    p.add_argument("--pin-memory", type=int, default=0)
    p.add_argument("--cudnn-benchmark", type=int, default=0)
    a = p.parse_args()
    device = torch.device(a.device)
    image = tuple(int(v) for v in a.image.split(",")) if a.image else ()
    torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, _on_stop)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    h = a.hidden
    if image:
        c = image[0]
        model = torch.nn.Sequential(
            torch.nn.Conv2d(c, 64, 7, stride=2, padding=3), torch.nn.ReLU(), torch.nn.Conv2d(64, 128, 3, padding=1),
            torch.nn.ReLU(), torch.nn.Conv2d(128, 128, 5, padding=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10),
        )  # fmt: skip
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 10)
        )
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(a.batch * a.batches, a.sample_ms / 1000, image)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers, pin_memory=bool(a.pin_memory),
                        generator=torch.Generator().manual_seed(a.seed))  # fmt: skip
    losses = open(a.loss_file, "w") if a.loss_file else None  # noqa: SIM115
    seen: list[tuple[object, ...]] = []
    steps, t0 = 0, time.monotonic()
    mark: tuple[int, float] | None = None
    print(f"trial_train: pid {__import__('os').getpid()} threads {torch.get_num_threads()}", flush=True)
    while not _stop:
        for x, y in loader:
            s = settings(loader)
            if not seen or seen[-1] != s:
                seen.append(s)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if not mark and time.monotonic() - t0 >= a.seconds / 3:
                mark = (steps, time.monotonic())  # the steady rate is counted from here (warm-up, autotuning before)
            if losses is not None:
                losses.write(f"{steps} {loss.item():.9g}\n")
            if _stop or (a.steps and steps >= a.steps) or (not a.steps and time.monotonic() - t0 >= a.seconds):
                break
        if (a.steps and steps >= a.steps) or (not a.steps and time.monotonic() - t0 >= a.seconds):
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    if losses is not None:
        losses.close()
    if a.settings_file:
        with open(a.settings_file, "w") as f:
            for s in seen:
                f.write(json.dumps({"seen": list(s)}) + "\n")
            f.write(json.dumps({"end": list(settings(loader))}) + "\n")
    if mark is not None and steps > mark[0]:
        print(f"trial_train: steady {(steps - mark[0]) / (t0 + elapsed - mark[1]):.3f} steps/s", flush=True)
    print(f"trial_train: done, {steps} steps in {elapsed:.2f} s, {steps / elapsed:.3f} steps/s", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
