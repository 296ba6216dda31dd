"""The hook's record of a CUDA out-of-memory error (torchwatch.hook.oom), with a fake allocator.

Simulated: these tests run without a GPU. The real error on a device is checked by
bench/gpu_oom.py (docs/memory.md gives its figures)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from torchwatch import wire
from torchwatch.hook import oom as hook_oom

GIB = 1 << 30


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch.cuda"


def fake_torch(stats_fail: bool = False, with_observer: bool = True):
    observers = []
    snapshot = {
        "segments": [
            {"device": 0, "total_size": 4 * GIB, "blocks": [
                {"size": 3 * GIB, "state": "active_allocated"},
                {"size": 512 << 20, "state": "inactive"},
                {"size": 256 << 20, "state": "active_allocated"},
            ]},
            {"device": 1, "total_size": GIB, "blocks": [{"size": GIB, "state": "inactive"}]},
        ]
    }  # fmt: skip

    def memory_stats(dev):
        if stats_fail:
            raise RuntimeError("allocator gone")
        return {
            "allocated_bytes.all.current": 3 * GIB + (256 << 20),
            "reserved_bytes.all.current": 4 * GIB,
            "allocated_bytes.all.peak": 4 * GIB,
            "active_bytes.all.current": 3 * GIB,
            "inactive_split_bytes.all.current": 512 << 20,
            "num_alloc_retries": 2,
            "num_ooms": 1,
        }

    cuda = types.SimpleNamespace(
        memory_stats=memory_stats,
        memory=types.SimpleNamespace(_snapshot=lambda dev=None: snapshot),
        current_device=lambda: 0,
    )
    c = types.SimpleNamespace()
    if with_observer:
        c._cuda_attach_out_of_memory_observer = observers.append
    return types.SimpleNamespace(cuda=cuda, _C=c), observers


def user_allocates(observers):
    """What the allocator does: call every observer, then raise."""
    for obs in observers:
        obs(0, 2 * GIB, 80 * GIB, 100 << 20)
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")


def test_the_observer_records_the_allocator_and_the_line_that_asked_and_never_changes_the_error():
    torch, observers = fake_torch()
    published = []
    watch = hook_oom.OomWatch(published.append, lambda: (41, [0.1, 0.12]))
    assert watch.attach(torch) and len(observers) == 1
    assert watch.attach(torch) and len(observers) == 1  # once per process
    with pytest.raises(OutOfMemoryError):
        user_allocates(observers)
    rec = watch.record
    assert rec is not None and published == [rec]
    assert (rec.device, rec.requested_bytes, rec.device_total_bytes, rec.device_free_bytes) == (
        0,
        2 * GIB,
        80 * GIB,
        100 << 20,
    )
    assert (rec.reserved_bytes, rec.peak_bytes, rec.alloc_retries, rec.ooms) == (4 * GIB, 4 * GIB, 2, 1)
    assert rec.segments == 1 and rec.largest_free_bytes == 512 << 20  # device 1's segment is not counted
    assert rec.largest_active == (3 * GIB, 256 << 20)
    assert rec.snapshot_ms is not None and rec.snapshot_ms >= 0
    assert rec.step == 41 and rec.step_ms == (100.0, 120.0)
    assert any("user_allocates" in f for f in rec.stack) and not any("torchwatch/hook/oom.py" in f for f in rec.stack)
    # through hook.json and back
    again = wire.OomRecord.decode(json.loads(json.dumps(rec.to_json())), "oom")
    assert again == rec


def test_a_failing_reader_or_callback_never_raises_into_the_allocator():
    torch, observers = fake_torch(stats_fail=True)

    def bad_publish(rec):
        raise OSError("disk full")

    watch = hook_oom.OomWatch(bad_publish, lambda: (_ for _ in ()).throw(RuntimeError("no counters")))
    watch.attach(torch)
    with pytest.raises(OutOfMemoryError):  # the training's error, not ours
        user_allocates(observers)
    assert watch.record is not None and watch.record.reserved_bytes is None and watch.record.step is None


def test_after_close_the_observer_does_nothing():
    torch, observers = fake_torch()
    watch = hook_oom.OomWatch(lambda r: None, lambda: (0, []))
    watch.attach(torch)
    watch.close()
    with pytest.raises(OutOfMemoryError):
        user_allocates(observers)
    assert watch.record is None


def test_a_torch_without_observers_is_said_once_and_the_exit_still_records_the_error():
    torch, _ = fake_torch(with_observer=False)
    watch = hook_oom.OomWatch(lambda r: None, lambda: (7, []))
    assert not watch.attach(torch) and watch.error and "no out-of-memory observer" in watch.error
    try:
        user_allocates([])
    except OutOfMemoryError as exc:
        err = exc
    rec = watch.at_exit(err, torch)
    assert rec is not None and rec.requested_bytes == 2 * GIB and rec.snapshot_ms is None
    assert any("user_allocates" in f for f in rec.stack)
    assert watch.at_exit(err, torch) is None  # one record
    assert hook_oom.OomWatch(lambda r: None, lambda: (0, [])).at_exit(RuntimeError("x"), torch) is None


def test_is_cuda_oom_and_message_parsing():
    assert hook_oom.is_cuda_oom(OutOfMemoryError("x"))
    assert not hook_oom.is_cuda_oom(MemoryError("host"))
    assert hook_oom.requested_from_message("Tried to allocate 20.00 MiB") == 20 << 20
    assert hook_oom.requested_from_message("nothing") == 0


def test_hook_json_refuses_a_malformed_oom_record():
    with pytest.raises(wire.WireError, match=r"oom\.requested_bytes"):
        wire.OomRecord.decode({"t": 1.0, "count": 1, "device": 0, "requested_bytes": -5}, "oom")
    with pytest.raises(wire.WireError, match="stack"):
        wire.OomRecord.decode({"t": 1.0, "count": 1, "device": 0, "requested_bytes": 5, "stack": ["x"] * 99}, "oom")


assert sys.version_info >= (3, 10)
