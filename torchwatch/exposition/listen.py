"""Where ``/metrics`` is served: ``--prometheus [HOST:]PORT`` parsed, and :class:`MetricsServer`,
``prometheus_client``'s WSGI application over :class:`~torchwatch.exposition.http_server.HttpServer`
with the TLS and basic auth of ``--web-config-file`` (:mod:`torchwatch.exposition.webconfig`).
What a scrape renders is the face's (:class:`torchwatch.faces.prometheus.ObservationCollector`)."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket

from prometheus_client.registry import Collector, CollectorRegistry

from torchwatch.exposition.http_server import HEADER_TIMEOUT_S, REQUEST_TIMEOUT_S, HttpServer
from torchwatch.exposition.webconfig import WebConfig
from torchwatch.model.errors import TorchwatchError, UsageError

DEFAULT_HOST = "127.0.0.1"  # only this machine can scrape unless a host is given


def parse_listen(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` of ``--prometheus``: ``9400``, ``0.0.0.0:9400``, ``[::1]:9400``, ``node1:9400``.

    Returns:
        ``(host, port)``; the host is :data:`DEFAULT_HOST` when not given.

    Raises:
        UsageError: not a port 1-65535, or an empty host.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = DEFAULT_HOST
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    hint = "give --prometheus a port, or HOST:PORT, e.g. --prometheus 9400 or --prometheus 0.0.0.0:9400"
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--prometheus takes [HOST:]PORT, not {text!r}", hint) from None
    if not 1 <= port <= 65535 or not host:
        raise UsageError(f"--prometheus takes [HOST:]PORT with a port 1-65535, not {text!r}", hint)
    return host, port


def _family(host: str) -> socket.AddressFamily:
    with contextlib.suppress(ValueError):
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    return socket.AF_INET


class MetricsServer:
    """``/metrics`` over HTTP(S) on ``host:port``, in daemon threads: ``prometheus_client``'s WSGI
    application behind :class:`~torchwatch.exposition.http_server.HttpServer` (no thread per
    connection, a header deadline, bounds per client address and in all: idle clients cannot keep
    a scrape out; that module's docstring has the numbers and why).

    Args:
        collector: what a scrape renders.
        host / port: where to listen (see :func:`parse_listen`).
        web: TLS and basic auth (:class:`~torchwatch.exposition.webconfig.WebConfig`, from
            ``--web-config-file``); ``None``: plain HTTP, no authentication.
        header_timeout_s / request_timeout_s: the deadlines of
            :class:`~torchwatch.exposition.http_server.HttpServer`.

    Raises:
        TorchwatchError: the port is in use, or the address cannot be bound (one line with the fix).
    """

    def __init__(
        self,
        collector: Collector,
        host: str,
        port: int,
        *,
        web: WebConfig | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        from prometheus_client.exposition import make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        self.host, self.port = host, port
        self.tls = web is not None and web.tls is not None
        try:
            family, address = _best_family(host, port)
            self._server = HttpServer(
                make_wsgi_app(registry),
                family,
                address,
                port,
                tls=None if web is None else web.tls,
                authorize=None if web is None else web.authorize,
                header_timeout_s=header_timeout_s,
                request_timeout_s=request_timeout_s,
            )
        except OSError as exc:
            raise _bind_error(exc, host, port) from None

    @property
    def url(self) -> str:
        """``http[s]://HOST:PORT/metrics``."""
        host = f"[{self.host}]" if _family(self.host) == socket.AF_INET6 else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/metrics"

    @property
    def server(self) -> HttpServer:
        """The HTTP server (its counters: ``accepted``, ``evicted``, ``timed_out``, ``open_connections``)."""
        return self._server

    def stop(self) -> None:
        """Stop serving, close the connections still open and the socket (idempotent)."""
        self._server.stop()


def _best_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and address to bind for ``host`` (a name is resolved), as
    ``prometheus_client``'s own server picks them.

    Raises:
        OSError: the name does not resolve (``socket.gaierror``).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


def _bind_error(exc: OSError, host: str, port: int) -> TorchwatchError:
    """One line for a failed bind, with the fix."""
    if exc.errno == errno.EADDRINUSE:
        return TorchwatchError(
            f"--prometheus {host}:{port}: port {port} is already in use",
            f"choose another port, or find what holds it: ss -ltnp 'sport = :{port}'",
        )
    if exc.errno == errno.EACCES:
        return TorchwatchError(
            f"--prometheus {host}:{port}: permission denied", "use a port above 1023, or run as root"
        )
    return TorchwatchError(
        f"--prometheus {host}:{port}: cannot listen there: {exc.strerror or exc}",
        "give an address of this machine (127.0.0.1, 0.0.0.0, ::) and a free port",
    )
