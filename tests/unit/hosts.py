"""Injection-check test helpers: a Host with given facts."""

from __future__ import annotations

import dataclasses

from torchwatch.inject.facts import Host


def host(**kw: object) -> Host:
    base = Host(
        pid=100,
        uids=(1000, 1000, 1000),
        gids=(1000, 1000, 1000),
        cap_eff=0,
        ptrace_scope=0,
        namespaces={"pid": "pid:[1]", "mnt": "mnt:[2]", "user": "user:[3]"},
        python=(3, 11),
        free_threaded=False,
        remote_debug_enabled=False,
        package_root="/opt/tw",
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]
