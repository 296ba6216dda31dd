"""A training with a hook that takes the burst signal for itself during a live trial and stops
stepping: ``TORCHWATCH_DIR=DIR _signal_taken_script.py MAX_S``. Prints one JSON object: the trial's
threads until they came back (seconds after the trial started, ``null``: never in 3 x MAX_S), the
trial's end as published, and whether the training's own handler ran (it must not: nobody sent it)."""

import json
import os
import signal
import sys
import time

import torch

import torchwatch.hook

torchwatch.hook.install()
max_s = float(sys.argv[1])
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 16)


def step() -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.005)


from torchwatch import wire  # noqa: E402
from torchwatch.hook import runtime  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402

for _ in range(30):
    step()
hook = runtime.current()
req = wire.TrialRequest(7, "threads", "2", block_steps=1000, warmup=0, max_s=max_s)
sent, why = HookReader(os.getpid()).request_trial(req)
assert sent, why
started = time.monotonic()
while hook.trials.state is None or hook.trials.state.state != "running":
    step()
theirs = []
signal.signal(signal.SIGUSR2, lambda s, f: theirs.append(s))  # the training takes the signal ...
back = None
while time.monotonic() - started < 3 * max_s:  # ... and stops stepping (its main thread still runs Python)
    time.sleep(0.05)
    if torch.get_num_threads() == 1:
        back = round(time.monotonic() - started, 2)
        break
st = hook.trials.state
print(
    json.dumps(
        {
            "back_after_s": back,
            "state": st.state,
            "restored": st.restored,
            "reason": st.reason,
            "their_handler_ran": bool(theirs),
        }
    )
)
