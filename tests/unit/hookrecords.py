"""Typed hook records for tests: a partial ``hook.json`` filled out and run through the wire decoder.

The hook publishes :class:`torchwatch.wire.HookRecord`; tests give only the parts they are
about (``dataloaders``, ``amp``, ``burst``), the rest is filled with neutral values, and the whole
goes through :meth:`HookRecord.decode` (the reader's strict checks), so a test never builds a
record the real reader would refuse.
"""

from __future__ import annotations

from typing import Any

from torchwatch import wire

LOADER_DEFAULTS = {"batches": 0, "wait_s": 0.0, "pin_memory": False, "persistent_workers": False}


def hook_record(pid: int = 7, **parts: Any) -> wire.HookRecord:
    """A checked record of a hook in ``pid`` holding ``parts`` (JSON values as the hook writes them)."""
    data: dict[str, Any] = {
        "schema": wire.SCHEMA,
        "pid": pid,
        "start": 1,
        "pidns": 1,
        "started": 0.0,
        "signal": 12,
        "signal_owned": True,
        **parts,
    }
    if "amp" in data:
        data["amp"] = {"autocast": False, "grad_scaler": False, **data["amp"]}
    data["dataloaders"] = [{**LOADER_DEFAULTS, **dl} for dl in data.get("dataloaders") or []]
    burst = data.get("burst")
    if burst is not None:
        data["burst"] = {"state": "idle", "count": 0, **burst}
        last = data["burst"].get("last")
        if last is not None:
            data["burst"]["last"] = {"id": 1, **last}
            data["burst"]["count"] = max(data["burst"]["count"], data["burst"]["last"]["id"])
    return wire.HookRecord.decode(data)
