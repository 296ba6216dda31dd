"""The HTTP side of the Prometheus exporter, outside the faces: a server that idle, slow or many
clients cannot blind (:mod:`.http_server`), TLS and basic auth from a Prometheus web configuration
file (:mod:`.webconfig`), and the ``/metrics`` endpoint on ``--prometheus [HOST:]PORT``
(:mod:`.listen`). The metrics themselves are a face's: :mod:`torchwatch.faces.prometheus`."""

from __future__ import annotations

from torchwatch.exposition.listen import DEFAULT_HOST, MetricsServer, parse_listen
from torchwatch.exposition.webconfig import WebConfig, load_web_config

__all__ = ["DEFAULT_HOST", "MetricsServer", "WebConfig", "load_web_config", "parse_listen"]
