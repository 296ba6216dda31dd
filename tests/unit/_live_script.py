"""A tiny training that installs and takes out the live hook in itself: ``_live_script.py MODE DIR``.

Modes: ``cycle`` (install, train, detach, train, install again, detach), ``burst`` (detach
while a burst records), ``unusable`` (the hook directory cannot be used), ``wrapped`` (someone
wraps DataLoader iteration and takes SIGUSR2 after the install), ``at-start`` (the hook was
installed the ordinary way). Prints one JSON object with what it saw.
"""

import json
import os
import signal
import sys

import torch
import torch.optim.optimizer as optim_mod
import torch.utils.data.dataloader as dl
from torch.utils.data import DataLoader, TensorDataset

mode, directory = sys.argv[1], sys.argv[2]
os.environ["TORCHWATCH_DIR"] = directory
ds = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
loader = DataLoader(ds, batch_size=16, drop_last=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = iter(loader)  # made before the install


def step() -> None:
    x, y = next(it)
    (model(x) - y).square().mean().backward()
    opt.step()
    opt.zero_grad()


for _ in range(3):
    step()
originals = {
    "next": dl._BaseDataLoaderIter.__dict__["__next__"],
    "get": dl.DataLoader.__dict__["_get_iterator"],
    "hooks": len(optim_mod._global_optimizer_post_hooks),
}


def unpatched() -> bool:
    return (
        dl._BaseDataLoaderIter.__dict__["__next__"] is originals["next"]
        and dl.DataLoader.__dict__["_get_iterator"] is originals["get"]
        and len(optim_mod._global_optimizer_post_hooks) == originals["hooks"]
    )


from torchwatch.hook import live, runtime  # noqa: E402

out = {}
if mode == "at-start":
    import torchwatch.hook

    torchwatch.hook.install(directory=directory)
    out["install"] = live.install()
    out["detach"] = live.detach()
    print(json.dumps(out))
    sys.exit(0)
if mode == "unusable":
    with open(directory, "w") as f:  # TORCHWATCH_DIR names a file: the hook cannot publish
        f.write("")
    out["install"] = live.install()
    out["unpatched"] = unpatched()
    out["sigusr2_default"] = signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    out["hook_gone"] = runtime.current() is None
    print(json.dumps(out, default=str))
    sys.exit(0)
out["prepare"] = live.prepare()
out["install"] = live.install()
out["again"] = live.install()
hook = runtime.current()
out["state_after_install"] = hook.state()
for _ in range(5):
    step()
out["state"] = hook.state()
out["files"] = sorted(os.listdir(hook.dir))
if mode == "burst":
    import time

    os.kill(os.getpid(), signal.SIGUSR2)  # what torchwatch burst sends: a burst is armed
    for _ in range(3):
        step()
    out["burst_state"] = hook.burster.state
    t0 = time.monotonic()
    out["detach"] = live.detach()
    out["detach_s"] = time.monotonic() - t0
    out["profiler_on"] = bool(torch.autograd._profiler_enabled())
    for _ in range(3):
        step()
    out["unpatched"] = unpatched()
    print(json.dumps(out, default=str))
    sys.exit(0)
if mode == "wrapped":
    mine = dl._BaseDataLoaderIter.__next__

    def theirs(self):  # another tool wraps DataLoader iteration over ours
        return mine(self)

    dl._BaseDataLoaderIter.__next__ = theirs
    signal.signal(signal.SIGUSR2, lambda s, f: None)  # and the training takes SIGUSR2 itself
    out["detach"] = live.detach()
    out["next_is_theirs"] = dl._BaseDataLoaderIter.__dict__["__next__"] is theirs
    out["get_restored"] = dl.DataLoader.__dict__["_get_iterator"] is originals["get"]
    out["sigusr2_kept"] = signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None)
    print(json.dumps(out, default=str))
    sys.exit(0)
out["detach"] = live.detach()
out["unpatched"] = unpatched()
out["sigusr2_default"] = signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
out["hook_gone"] = runtime.current() is None
out["dir_gone"] = not os.path.lexists(directory)
for _ in range(3):
    step()
out["detach_again"] = live.detach()
out["reinstall"] = live.install()
step()
out["reinstall_state"] = runtime.current().state()
out["detach_last"] = live.detach()
out["unpatched_last"] = unpatched()
print(json.dumps(out, default=str))
