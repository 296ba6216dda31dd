"""``torchwatch serve``: one long-running watcher per machine, for every training it finds.

Every ``--scan`` seconds it looks for trainings (:func:`torchwatch.watch.discover.find_trainings`:
the topmost Python interpreters that imported torch), starts a watch :class:`Session` on each new
one (from outside: ``/proc``, py-spy, NVML, and the hook's readings where the training carries it;
nothing is injected), at most ``--max-trainings`` of them and ``--max-per-user`` of one user
(:class:`torchwatch.watch.fleet.Fleet`), and drops the ones that ended. ``--prometheus`` serves all of them on one
``/metrics``; without it, a status line per training goes to stderr every ``STATUS_EVERY_S``.
SIGINT, SIGTERM or SIGHUP (or ``--duration``) stop every session and the server; torchwatch then
ends by that signal (128+N), as ``run`` and ``attach`` do.

On a fleet, one serve per node and one Prometheus scraping them all: every series carries the
job key the ranks share on every node and the node's name (:func:`node_name`), and the rules
in deploy/prometheus/ compare the ranks of a job across nodes (docs/fleet.md).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from torchwatch.analysis.rules_engine import load_rules
from torchwatch.exposition import MetricsServer, load_web_config
from torchwatch.faces.headless import status_line
from torchwatch.faces.prometheus import ObservationCollector
from torchwatch.model.errors import UsageError
from torchwatch.model.text import terminal_safe
from torchwatch.watch.caps import MAX_PER_USER, MAX_TRAININGS
from torchwatch.watch.discover import find_trainings
from torchwatch.watch.fleet import Fleet
from torchwatch.watch.lifecycle import StopSignals
from torchwatch.watch.target import check_proc_namespace

log = logging.getLogger(__name__)

STATUS_EVERY_S = 30.0  # without --prometheus: one status line per training this often


NODE_NAME_ENV = "TORCHWATCH_NODE_NAME"


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """The ``host`` label: :data:`NODE_NAME_ENV` when set (in a Kubernetes pod, the node's name
    from the downward API: the pod's own hostname is the pod's name), else this machine's hostname."""
    env = os.environ if environ is None else environ
    return env.get(NODE_NAME_ENV, "").strip()[:253] or socket.gethostname()


def serve_command(
    listen: tuple[str, int] | None,
    stops: StopSignals,
    *,
    scan_s: float = 5.0,
    window_s: float = 10.0,
    duration: float | None = None,
    rules_dirs: list[Path] | None = None,
    max_trainings: int = MAX_TRAININGS,
    max_per_user: int = MAX_PER_USER,
    hang_after: float | None = None,
    web_config: Path | None = None,
) -> int:
    """``torchwatch serve``: watch every training found until a stop signal or ``duration``.

    Args:
        listen: ``(host, port)`` of ``--prometheus``, or ``None`` (status lines on stderr).
        stops: the stop signals (installed by the caller).
        scan_s: seconds between two looks for trainings.
        window_s: each session's verdict window, s.
        duration: stop after this many seconds (``None``: until a signal).
        rules_dirs: ``--rules`` directories.
        max_trainings / max_per_user: the caps of :class:`~torchwatch.watch.fleet.Fleet`.
        hang_after: ``--hang-after`` seconds (``None``: each process's derived threshold).
        web_config: ``--web-config-file`` (TLS and basic auth of the metrics server), or ``None``.

    Returns:
        0 (a stop signal makes the caller end by it).

    Raises:
        TorchwatchError: ``/proc`` is another PID namespace's, bad rules, a bad web config
            (``UsageError``), or the metrics address cannot be bound.
    """
    check_proc_namespace()  # every training found would be another process
    if web_config is not None and listen is None:
        raise UsageError("--web-config-file protects --prometheus", "give --prometheus [HOST:]PORT too")
    web = load_web_config(web_config) if web_config is not None else None
    rules = load_rules(rules_dirs or [])
    fleet = Fleet(rules, window_s, max_trainings, max_per_user, hang_after)
    server = None
    if listen is not None:
        server = MetricsServer(ObservationCollector(fleet.observations, node_name(), fleet.origins), *listen, web=web)
        print(f"torchwatch serve: Prometheus metrics on {server.url}", file=sys.stderr)
    print(
        f"torchwatch serve: looking for PyTorch trainings every {scan_s:g} s (Python interpreters that imported "
        f"torch; at most {max_trainings}, {max_per_user} a user; nothing is injected)",
        file=sys.stderr,
    )
    start = time.monotonic()
    last_status: dict[int, float] = {}
    try:
        while stops.first is None and (duration is None or time.monotonic() - start < duration):
            fleet.update(find_trainings())
            if server is None:
                now = time.monotonic()
                for pid, session in fleet.sessions().items():
                    if now - last_status.get(pid, 0.0) >= STATUS_EVERY_S:
                        obs = session.latest_observation
                        elapsed = obs.elapsed_s if obs is not None else 0.0
                        print(terminal_safe(f"PID {pid}: {status_line(obs, elapsed)}"), file=sys.stderr)
                        last_status[pid] = now
            remaining = scan_s if duration is None else min(scan_s, max(0.0, duration - (time.monotonic() - start)))
            stops.wait(remaining)
    finally:
        fleet.stop()
        if server is not None:
            server.stop()
    print("torchwatch serve: stopped", file=sys.stderr)
    return 0
