"""The metrics server: ``/metrics`` over HTTP that idle, slow or many clients cannot blind.

One thread waits on every socket at once (``selectors``: the listening socket and each connection,
non-blocking); one more renders the answers (``prometheus_client``'s WSGI application, called once
per request with the request's method, path, query and ``Accept``/``Accept-Encoding`` headers). A
connection holds no thread while it is idle, sends its request or reads its answer: it costs a
file descriptor and a buffer of at most :data:`MAX_HEADER_BYTES`, and

- it must send its whole request within :data:`HEADER_TIMEOUT_S` of being accepted (Prometheus
  sends it at once), and be done within :data:`REQUEST_TIMEOUT_S` (its answer read), or it is cut;
- at most :data:`MAX_OPEN` connections are open: a new one beyond closes one of the address holding
  the most connections still sending their request, the oldest that has sent nothing yet (else the
  oldest), never the new one. A scrape from another address than the clients that fill the server
  always gets in; one from the same address (a local user on the node that Prometheus also scrapes
  from) gets in once its first bytes have reached the server, and unless :data:`MAX_OPEN` newer
  connections come between its connect and its first bytes, which Prometheus writes at once;
- at most :data:`MAX_REQUESTS_PER_CLIENT` requests of one address are rendered or written at once:
  another is answered ``503`` at once.

``prometheus_client``'s own ``start_http_server`` (0.26) gives every connection a thread that blocks
in ``readline`` with no timeout: N idle clients hold N threads forever, and once the process runs out
of file descriptors ``accept`` fails in a loop and no scrape gets in.

Each answer closes its connection (``Connection: close``), as the WSGI reference server did: there
is no idle keep-alive connection of the scraper's own for a flood to push out.

TLS (``tls``: an :class:`ssl.SSLContext`, client certificates if it asks for them) is negotiated on
the same loop, within the same deadlines; ``authorize`` checks each request's ``Authorization``
header (HTTP basic auth, :mod:`torchwatch.exposition.webconfig`) on the render thread.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

log = logging.getLogger(__name__)

__all__ = [
    "BACKLOG",
    "HEADER_TIMEOUT_S",
    "MAX_HEADER_BYTES",
    "MAX_OPEN",
    "MAX_REQUESTS_PER_CLIENT",
    "REQUEST_TIMEOUT_S",
    "HttpServer",
]

# A request must be whole this long after its connection was accepted. Prometheus writes it right
# after the TCP (and TLS) handshake, within a millisecond on a LAN; 5 s leaves a loaded node room.
HEADER_TIMEOUT_S = 5.0
# A connection not answered and closed this long after it was accepted is cut: Prometheus' own
# default scrape_timeout is 10 s, after which it has given up on the scrape anyway.
REQUEST_TIMEOUT_S = 10.0
# Connections open at once: each is a file descriptor and at most MAX_HEADER_BYTES of buffer, so
# 512 is ~8 MiB at worst, and under systemd's and most containers' 1024-descriptor soft limit with
# room for the sessions' own files.
MAX_OPEN = 512
# Requests of one client address being rendered or written at once (one scrape, and one of an HA
# partner behind the same address).
MAX_REQUESTS_PER_CLIENT = 2
# A request's line and headers; a scrape's are ~300 bytes.
MAX_HEADER_BYTES = 16 * 1024
# Connections the kernel queues until they are accepted (the loop accepts as soon as they come).
BACKLOG = 128
_TICK_S = 0.25  # how often the loop checks deadlines when nothing happens

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Authorize = Callable[[str | None], bool]

_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _plain(code: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 answer with a text body that closes the connection."""
    body = (text + "\n").encode()
    head = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}", "Content-Type: text/plain; charset=utf-8"]
    head += [f"{k}: {v}" for k, v in extra]
    head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


@dataclass(eq=False)
class _Conn:
    """One accepted connection and where it is: ``handshake`` (TLS), ``head`` (reading the
    request), ``render`` (queued for the render thread), ``write`` (sending the answer)."""

    sock: socket.socket
    client: str  # the peer's address (no port): what the per-client bounds count
    accepted: float  # monotonic s
    state: str = "head"
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    counted: bool = False  # holds one of its client's MAX_REQUESTS_PER_CLIENT places
    events: int = 0  # the selector events it is registered for (0: not registered)


def _bytes_pending(conn: _Conn) -> bool:
    """Whether the kernel holds bytes of ``conn``'s request not read yet (a peek, never blocking).
    A peer that closed (end of stream), a broken connection and a TLS connection (whose bytes are
    records, not the request) count as none."""
    if isinstance(conn.sock, ssl.SSLSocket):
        return False
    try:
        return bool(conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError: nothing there; any other: a broken connection
        return False


class HttpServer:
    """Serve ``app`` on ``host:port`` (see the module docstring for the bounds), in two daemon threads.

    Args:
        app: a WSGI application (``prometheus_client``'s ``make_wsgi_app``).
        family / address / port: where to listen (``port`` 0: a free one, see :attr:`port`).
        tls: wrap every connection in TLS with this server-side context; ``None``: plain HTTP.
        authorize: ``Authorization`` header value (``None`` when absent) -> whether the request may
            be answered; ``None``: every request may. A refused one is answered ``401``.
        header_timeout_s / request_timeout_s / max_open / max_requests_per_client: the bounds
            (:data:`HEADER_TIMEOUT_S`, :data:`REQUEST_TIMEOUT_S`, :data:`MAX_OPEN`,
            :data:`MAX_REQUESTS_PER_CLIENT`).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        app: App,
        family: socket.AddressFamily,
        address: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        authorize: Authorize | None = None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_open: int = MAX_OPEN,
        max_requests_per_client: int = MAX_REQUESTS_PER_CLIENT,
    ) -> None:
        self._app, self._tls, self._authorize = app, tls, authorize
        self.header_timeout_s, self.request_timeout_s = header_timeout_s, request_timeout_s
        self.max_open = max_open
        self.max_requests_per_client = max_requests_per_client
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            listener.bind((address, port))
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[socket.socket, _Conn] = {}
        self._requests: collections.Counter[str] = collections.Counter()
        self._render_q: collections.deque[tuple[_Conn, dict[str, Any], str | None]] = collections.deque()
        self._render_cv = threading.Condition()
        self._done: collections.deque[tuple[_Conn, bytes]] = collections.deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the counters below, read from other threads
        self.accepted = 0  # connections accepted so far
        self.answered = 0  # requests answered (any status)
        self.evicted = 0  # connections closed to make room for a newer one
        self.timed_out = 0  # connections cut at a deadline
        self.busy = 0  # requests answered 503 (their client had MAX_REQUESTS_PER_CLIENT in flight)
        self._loop = threading.Thread(target=self._run, name="torchwatch-metrics", daemon=True)
        self._renderer = threading.Thread(target=self._render_loop, name="torchwatch-metrics-render", daemon=True)
        self._loop.start()
        self._renderer.start()

    # -- what tests and the soak read ----------------------------------------------------------------
    @property
    def open_connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._conns)

    def stop(self) -> None:
        """Stop serving, close every connection and the listening socket (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        with self._render_cv:
            self._render_cv.notify_all()
        self._loop.join(timeout=5)
        self._renderer.join(timeout=5)

    # -- the loop ------------------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                timeout = self._next_deadline(now)
                for key, events in self._sel.select(timeout):
                    sock = key.fileobj
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        conn = self._conns.get(sock)  # type: ignore[call-overload]
                        if conn is not None:
                            self._step(conn, events)
                self._take_rendered()
                self._cut_late(time.monotonic())
        except Exception:  # never expected; logged, and the server closes
            log.exception("the metrics server's loop failed")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            for sock in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError, KeyError, ValueError):
                    self._sel.unregister(sock)
                sock.close()
            self._sel.close()

    def _next_deadline(self, now: float) -> float:
        """How long the next ``select`` may wait: deadlines are checked every :data:`_TICK_S`."""
        return _TICK_S if self._conns else 1.0

    def _accept(self) -> None:
        for _ in range(64):  # then the other sockets get a turn
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: free the oldest connection still sending its request, so
                    # the next accept succeeds instead of the listening socket staying readable
                    if not self._evict(None):
                        time.sleep(0.05)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            client = str(peer[0]) if isinstance(peer, tuple) else ""
            sock.setblocking(False)
            if len(self._conns) >= self.max_open:
                self._evict(None)
            conn = _Conn(sock, client, time.monotonic())
            if self._tls is not None:
                try:
                    conn.sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    sock.close()
                    continue
                conn.state = "handshake"
            with self._lock:
                self._conns[conn.sock] = conn
                self.accepted += 1
            self._want(conn, selectors.EVENT_READ)
            if conn.state == "head":
                self._step(conn, selectors.EVENT_READ)  # a scrape's request is often there already

    def _evict(self, client: str | None) -> bool:
        """Close a connection still sending its request of ``client`` (``None``: of the address
        holding the most such connections): the oldest that has sent nothing yet (or whose peer has
        closed), else the oldest. A connection whose request has begun to arrive, in its buffer or
        still in the kernel's, is not the one pushed out while an idle one is there. False when there
        is none."""
        waiting = [c for c in self._conns.values() if c.state in ("handshake", "head")]
        if client is None and waiting:
            client = collections.Counter(c.client for c in waiting).most_common(1)[0][0]
        waiting = sorted((c for c in waiting if c.client == client), key=lambda c: c.accepted)
        if not waiting:
            return False
        victim = next((c for c in waiting if not c.inbuf and not _bytes_pending(c)), waiting[0])
        self._close(victim)
        with self._lock:
            self.evicted += 1
        return True

    def _want(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, None)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, None)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if self._conns.pop(conn.sock, None) is None:
                return
        if conn.counted:
            conn.counted = False
            self._requests[conn.client] -= 1
            if self._requests[conn.client] <= 0:
                del self._requests[conn.client]
        if conn.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
            conn.events = 0
        conn.state = "closed"
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _cut_late(self, now: float) -> None:
        for conn in list(self._conns.values()):
            limit = self.header_timeout_s if conn.state in ("handshake", "head") else self.request_timeout_s
            if now - conn.accepted >= limit:
                with self._lock:
                    self.timed_out += 1
                if conn.state == "head" and conn.inbuf:
                    self._answer_now(conn, _plain(408, "request not received in time"))
                self._close(conn)

    def _step(self, conn: _Conn, events: int) -> None:
        try:
            if conn.state == "handshake":
                self._handshake(conn)
            elif conn.state == "head":
                self._read(conn)
            elif conn.state == "write":
                self._write(conn)
            elif conn.state == "render" and events & selectors.EVENT_READ:
                self._close(conn)  # not registered while rendering; a stray event
        except (OSError, ValueError):
            self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._want(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake from %s failed: %s", conn.client, exc)
            self._close(conn)
            return
        conn.state = "head"
        self._want(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        while True:
            try:
                data = conn.sock.recv(MAX_HEADER_BYTES + 1 - len(conn.inbuf))
            except (BlockingIOError, ssl.SSLWantReadError, InterruptedError):
                return
            except ssl.SSLWantWriteError:
                self._want(conn, selectors.EVENT_WRITE)
                return
            if not data:
                self._close(conn)  # the client went away before asking
                return
            conn.inbuf += data
            end = conn.inbuf.find(b"\r\n\r\n")
            if end >= 0:
                self._request(conn, bytes(conn.inbuf[:end]))
                return
            if len(conn.inbuf) > MAX_HEADER_BYTES:
                self._answer_now(conn, _plain(431, f"request header over {MAX_HEADER_BYTES} bytes"))
                return

    def _request(self, conn: _Conn, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._answer_now(conn, _plain(400, "not an HTTP/1 request line"))
            return
        method, target, _version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self._answer_now(conn, _plain(400, "malformed header line"))
                return
            headers[name.strip().lower()] = value.strip()
        if self._requests[conn.client] >= self.max_requests_per_client:
            with self._lock:
                self.busy += 1
            self._answer_now(conn, _plain(503, "busy: this client has requests in flight", (("Retry-After", "1"),)))
            return
        self._requests[conn.client] += 1
        conn.counted = True
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "PATH_INFO": unquote(path, "latin-1"),
            "QUERY_STRING": query,
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "https" if self._tls is not None else "http",
        }
        for name in ("accept", "accept-encoding"):
            if name in headers:
                environ["HTTP_" + name.upper().replace("-", "_")] = headers[name]
        conn.state = "render"
        conn.inbuf.clear()
        self._want(conn, 0)
        with self._render_cv:
            self._render_q.append((conn, environ, headers.get("authorization")))
            self._render_cv.notify()

    def _answer_now(self, conn: _Conn, answer: bytes) -> None:
        """Send a short answer without waiting (what does not fit is dropped) and close."""
        with contextlib.suppress(OSError, ValueError):
            conn.sock.send(answer)
        with self._lock:
            self.answered += 1
        self._close(conn)

    def _take_rendered(self) -> None:
        while self._done:
            conn, answer = self._done.popleft()
            if conn.state != "render":
                continue  # cut at its deadline meanwhile
            conn.state = "write"
            conn.out = memoryview(answer)
            self._want(conn, selectors.EVENT_WRITE)
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        out = conn.out
        while out is not None and len(out):
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, ssl.SSLWantWriteError, InterruptedError):
                self._want(conn, selectors.EVENT_WRITE)
                conn.out = out
                return
            except ssl.SSLWantReadError:
                self._want(conn, selectors.EVENT_READ)
                conn.out = out
                return
            out = out[sent:]
        conn.out = None
        with self._lock:
            self.answered += 1
        with contextlib.suppress(OSError):
            if not isinstance(conn.sock, ssl.SSLSocket):
                conn.sock.shutdown(socket.SHUT_WR)
        self._close(conn)

    # -- the render thread -----------------------------------------------------------------------
    def _render_loop(self) -> None:
        while not self._stop.is_set():
            with self._render_cv:
                while not self._render_q and not self._stop.is_set():
                    self._render_cv.wait()
                if self._stop.is_set():
                    return
                conn, environ, auth = self._render_q.popleft()
            try:
                answer = self._render(environ, auth)
            except Exception:
                log.exception("rendering the metrics failed")
                answer = _plain(500, "rendering the metrics failed (torchwatch's log has why)")
            self._done.append((conn, answer))
            self._wake()

    def _render(self, environ: dict[str, Any], auth: str | None) -> bytes:
        if self._authorize is not None and not self._authorize(auth):
            return _plain(401, "unauthorized", (("WWW-Authenticate", 'Basic realm="torchwatch"'),))
        got: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            got[:] = [status, headers]

        body = b"".join(self._app(environ, start_response))
        status, headers = got
        head = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers]
        head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        return "\r\n".join(head).encode("latin-1") + body
