"""A CPU training that does what ordinary trainings do and injection must survive (issue 36).

    python tests/integration/_harm_target.py --steps 400 [--timer-hz 100] [--fork-every-step]
        [--workers 2] [--gil-hold-s 15] [--threads 8]

- ``--timer-hz``: an interval timer (``setitimer(ITIMER_REAL)``) with a SIGALRM handler, as timeout
  and heartbeat libraries install, ticking this often;
- ``--fork-every-step``: a short child (``os.fork`` + ``_exit``) started and reaped every step;
- ``--workers``: a DataLoader with that many worker processes, non-persistent (they start and
  end every epoch of 20 batches; PyTorch's SIGCHLD handler is installed);
- ``--gil-hold-s``: a side thread that holds the GIL in one C call for that long, every 2 s
  (``time.sleep`` in a ctypes call made with ``ctypes.PyDLL``, which keeps the GIL);
- ``--threads``: extra idle threads.

It prints ``step N`` lines to stdout (flushed) and, at the end, ``checksum X ticks T``: the
parameters' sum after a seeded, fixed number of steps, which injection must leave unchanged
(the timer's tick count is printed but is not part of it).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

# The conditions the stress test and bench/inject_harm.py put injection through, by name.
CONDITIONS = {
    "timer-100Hz": ["--timer-hz", "100"],
    "timer-2kHz": ["--timer-hz", "2000"],
    "fork-every-step": ["--fork-every-step"],
    "dataloader-workers": ["--workers", "2"],
    "all-at-once": ["--timer-hz", "2000", "--fork-every-step", "--workers", "2", "--threads", "16"],
    "gil-held-in-c": ["--gil-hold-s", "1.5"],
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--timer-hz", type=float, default=0.0)
    parser.add_argument("--fork-every-step", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--gil-hold-s", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--step-sleep-s", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ticks = [0]
    if args.timer_hz:

        def tick(signum: int, frame: object) -> None:
            ticks[0] += 1

        signal.signal(signal.SIGALRM, tick)
        signal.setitimer(signal.ITIMER_REAL, 1.0 / args.timer_hz, 1.0 / args.timer_hz)
    stop = threading.Event()
    if args.gil_hold_s:
        libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
        libc.usleep.argtypes = [ctypes.c_uint]

        def hold_once() -> None:
            while not stop.wait(2.0):
                libc.usleep(int(args.gil_hold_s * 1e6))  # one C call, the GIL held throughout

        threading.Thread(target=hold_once, name="gil-holder", daemon=True).start()
    for i in range(args.threads):
        threading.Thread(target=stop.wait, name=f"idle-{i}", daemon=True).start()

    x = torch.randn(640, 32, generator=torch.Generator().manual_seed(1))
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, num_workers=args.workers, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.fork_every_step:
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            step += 1
            print(f"step {step}", flush=True)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
            if step >= args.steps:
                break
    stop.set()
    if args.timer_hz:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"checksum {checksum:.12f} ticks {ticks[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
