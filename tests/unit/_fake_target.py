"""A stand-in for a hooked training, for tests of torchwatch's reading side (no torch: fast).

Usage: python _fake_target.py BASE [--signal N] [--catch N ...] [--log FILE]

Publishes a valid hook.json (announcing burst signal N, owned) and counters for this process
instance under BASE exactly as the hook does, catches the signals given with --catch (logging
each to FILE), prints its hook directory, then sleeps until killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from torchwatch import wire

parser = argparse.ArgumentParser()
parser.add_argument("base")
parser.add_argument("--signal", type=int, default=int(signal.SIGUSR2))
parser.add_argument("--catch", type=int, action="append", default=[])
parser.add_argument("--log")
args = parser.parse_args()


def on_signal(signum: int, frame: object) -> None:
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"{signum}\n")


for sig in args.catch:
    signal.signal(sig, on_signal)
inst = wire.self_instance()
base_fd = wire.prepare_dir(Path(args.base))
fd = wire.private_subdir(base_fd, inst.dir_name)
counters = wire.Counters(fd, inst)
counters.step(time.monotonic(), None, 0.0)
record = wire.HookRecord(inst, "3", "2.13", time.monotonic(), args.signal, True, burst=wire.BurstState())
wire.write_atomic(fd, wire.STATE_FILE, wire.encode_json(record.to_json()))
print(Path(args.base) / inst.dir_name, flush=True)
sys.stdout.close()
parent = os.getppid()
while True:
    time.sleep(0.05)
    if os.getppid() != parent:  # the test is gone (re-parented: to init, or to a subreaper above it)
        break
