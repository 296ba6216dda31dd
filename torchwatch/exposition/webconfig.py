"""``--web-config-file``: TLS and basic auth for ``/metrics``, in the Prometheus exporter-toolkit's format.

The file every Prometheus exporter (node_exporter, the exporter-toolkit's ``web-config.yml``,
prometheus.io/docs/prometheus/latest/configuration/https/) reads, so one file and one scrape
config serve them all. What torchwatch reads of it:

```yaml
tls_server_config:
  cert_file: /etc/torchwatch/tls.crt      # PEM; both or neither
  key_file: /etc/torchwatch/tls.key
  client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
  client_ca_file: /etc/torchwatch/ca.crt  # needed by the two that verify
  min_version: TLS12                      # TLS10..TLS13 (default TLS12)
basic_auth_users:
  prometheus: $2y$10$...                  # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')
```

Any other key (``http_server_config``, ``cipher_suites``, ...) is refused with one line rather than
silently ignored: a protection the file asks for and the server does not give must not pass unseen.
"""

from __future__ import annotations

import os
import ssl
import threading
from base64 import b64decode
from binascii import Error as B64Error
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchwatch.model.errors import UsageError

__all__ = ["MAX_CONFIG_BYTES", "WebConfig", "load_web_config"]

MAX_CONFIG_BYTES = 1 << 20  # a web config is a few hundred bytes
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_HINT = "see docs/security.md (the Prometheus exporter-toolkit's web config: tls_server_config, basic_auth_users)"


@dataclass
class WebConfig:
    """What ``--web-config-file`` asks for.

    Attributes:
        tls: the server-side TLS context, ``None`` for plain HTTP.
        users: ``{user name: bcrypt hash}`` of basic auth; empty: no authentication.
    """

    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    _ok: set[tuple[str, str]] = field(default_factory=set, repr=False)  # checked pairs (bcrypt costs ~50 ms)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def authorize(self) -> Any:
        """``Authorization`` header value (``None`` when absent) -> whether it names a user with the
        right password; ``None`` when no users are configured (every request may)."""
        return self._check if self.users else None

    def _check(self, header: str | None) -> bool:
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (B64Error, UnicodeDecodeError, ValueError):
            return False
        hashed = self.users.get(user)
        if not sep or hashed is None:
            return False
        with self._lock:
            if (user, password) in self._ok:
                return True
        import bcrypt

        try:
            ok = bool(bcrypt.checkpw(password.encode("utf-8"), hashed))
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._ok) < 64:
                    self._ok.add((user, password))
        return ok


def _file(section: Mapping[str, Any], key: str, base: Path) -> Path:
    value = section.get(key)
    if not isinstance(value, str) or not value:
        raise UsageError(f"--web-config-file: tls_server_config.{key} must be a file path", _HINT)
    path = Path(value) if os.path.isabs(value) else base / value
    if not path.is_file():
        raise UsageError(f"--web-config-file: tls_server_config.{key}: no such file: {path}", _HINT)
    return path


def _tls(section: Any, base: Path) -> ssl.SSLContext:
    if not isinstance(section, Mapping):
        raise UsageError("--web-config-file: tls_server_config must be a mapping", _HINT)
    unknown = sorted(set(section) - _TLS_KEYS)
    if unknown:
        raise UsageError(f"--web-config-file: tls_server_config.{unknown[0]} is not supported by torchwatch", _HINT)
    cert, key = _file(section, "cert_file", base), _file(section, "key_file", base)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = section.get("min_version", "TLS12")
    if version not in _VERSIONS:
        raise UsageError(f"--web-config-file: min_version {version!r} is not one of {', '.join(_VERSIONS)}", _HINT)
    ctx.minimum_version = _VERSIONS[version]
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(f"--web-config-file: cannot load {cert} / {key}: {exc}", _HINT) from None
    mode = section.get("client_auth_type", "NoClientCert")
    if mode not in _CLIENT_AUTH:
        raise UsageError(f"--web-config-file: client_auth_type {mode!r} is not one of {', '.join(_CLIENT_AUTH)}", _HINT)
    ctx.verify_mode = _CLIENT_AUTH[mode]
    if mode != "NoClientCert":
        ca = _file(section, "client_ca_file", base)
        try:
            ctx.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"--web-config-file: cannot load client_ca_file {ca}: {exc}", _HINT) from None
    return ctx


def _users(section: Any) -> dict[str, bytes]:
    pairs = section.items() if isinstance(section, Mapping) else ()
    if not isinstance(section, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise UsageError("--web-config-file: basic_auth_users must map user names to bcrypt hashes", _HINT)
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise UsageError(
            "--web-config-file: basic_auth_users needs the bcrypt package", "pip install 'torchwatch[web]'"
        ) from None
    users = {}
    for user, hashed in section.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
            raise UsageError(f"--web-config-file: basic_auth_users.{user} is not a bcrypt hash", _HINT)
        users[user] = hashed.encode("ascii")
    if not users:
        raise UsageError("--web-config-file: basic_auth_users is empty", _HINT)
    return users


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read ``--web-config-file`` (YAML, the exporter-toolkit's keys; see the module docstring).

    Relative certificate paths are relative to the file's directory, as in the exporter-toolkit.

    Raises:
        UsageError: unreadable, over :data:`MAX_CONFIG_BYTES`, not YAML, an unknown key, a missing
            or unloadable certificate or key, a password that is not a bcrypt hash, or bcrypt not
            installed (one line with the fix).
    """
    import yaml

    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--web-config-file {p}: {exc.strerror or exc}", _HINT) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"--web-config-file {p}: over {MAX_CONFIG_BYTES} bytes", _HINT)
    try:
        data = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"--web-config-file {p}: not YAML: {str(exc).splitlines()[0]}", _HINT) from None
    if not isinstance(data, Mapping):
        raise UsageError(f"--web-config-file {p}: must be a YAML mapping", _HINT)
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise UsageError(f"--web-config-file {p}: {unknown[0]} is not supported by torchwatch", _HINT)
    base = p.resolve().parent
    tls = _tls(data["tls_server_config"], base) if data.get("tls_server_config") is not None else None
    users = _users(data["basic_auth_users"]) if data.get("basic_auth_users") is not None else {}
    return WebConfig(tls, users)
