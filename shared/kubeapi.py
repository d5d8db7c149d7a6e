"""The Kubernetes API as JSON over HTTP/1.1, for the two services that talk to it
(inventory, prepare): requests on a small pool of kept-alive connections, and watches.

Why not kubernetes-asyncio: importing any part of its client loads every API model, about
65 MiB per process (packages.md), and both services already sent and read raw JSON
through it. Why not aiohttp: another 9 MiB per process. h11 (the HTTP/1.1 state machine
uvicorn is built on) does the protocol: framing, chunked bodies, keep-alive. This module
owns only the sockets (asyncio streams, TLS from ``ssl``), the credentials (a kubeconfig or
the in-cluster ServiceAccount) and the JSON.

Every request has a deadline; an error is an ``ApiError`` with the HTTP status (0 when
there was no answer) and the server's message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from shared.http11 import CONNECTION_ERRORS, Conn

Json = dict[str, Any]

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A bound ServiceAccount token is rotated by the kubelet; read it again this often.
TOKEN_REREAD_S = 60.0
# A kept-alive connection idle longer than this is closed rather than reused: the server
# may have dropped it, and a request that dies on a dead connection is not retried.
IDLE_MAX_S = 30.0
POOL_SIZE = 4


class ApiError(Exception):
    """The API server answered ``status`` (0: no answer at all) with ``message``;
    ``retry_after`` is its Retry-After in seconds (0 when it sent none), as with a 429
    from API Priority and Fairness, which refused the request without acting on it."""

    def __init__(self, status: int, message: str, retry_after: float = 0.0) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


# A Retry-After longer than this is taken as this (a client must not sleep for an hour
# because of one header).
RETRY_AFTER_MAX_S = 60.0


def retry_after_s(headers: Mapping[str, str]) -> float:
    """The Retry-After header (h11 names are lower case) in seconds: delta-seconds, the
    form the API server sends, or an HTTP date; 0 when absent or unreadable."""
    value = headers.get("retry-after", "").strip()
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


class KubeConfigError(Exception):
    """The kubeconfig or in-cluster config cannot be used; the message names the field."""


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and who we are to it."""

    server: str
    ca_file: str = ""
    ca_data: str = ""  # PEM
    cert_file: str = ""
    key_file: str = ""
    cert_data: bytes = b""  # PEM
    key_data: bytes = b""  # PEM
    token: str = ""
    token_file: str = ""
    insecure: bool = False
    tls_server_name: str = ""

    @classmethod
    def load(cls, kubeconfig: str | os.PathLike[str] | None) -> KubeConfig:
        """``kubeconfig`` when given, else the in-cluster config."""
        return cls.from_kubeconfig(kubeconfig) if kubeconfig else cls.in_cluster()

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeConfigError("in-cluster config: KUBERNETES_SERVICE_HOST is not set (not in a Pod?)")
        token = SA_DIR / "token"
        if not token.exists():
            raise KubeConfigError(f"in-cluster config: {token} does not exist")
        host = f"[{host}]" if ":" in host else host
        return cls(server=f"https://{host}:{port}", ca_file=str(SA_DIR / "ca.crt"), token_file=str(token))

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str = "") -> KubeConfig:
        import yaml  # only here: the in-cluster config needs no YAML

        where = Path(path)
        try:
            doc = yaml.safe_load(where.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise KubeConfigError(f"kubeconfig {where}: {exc}") from None
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {where}: not a mapping")
        name = context or doc.get("current-context") or ""
        ctx = _named(doc, "contexts", name, "context", where) if name else None
        if ctx is None:
            if len(doc.get("contexts") or []) != 1:
                raise KubeConfigError(f"kubeconfig {where}: current-context is not set")
            ctx = (doc["contexts"][0] or {}).get("context") or {}
        cluster = _named(doc, "clusters", ctx.get("cluster", ""), "cluster", where)
        user = _named(doc, "users", ctx.get("user", ""), "user", where) if ctx.get("user") else {}
        base = where.parent

        def file(value: str) -> str:
            return str(base / value) if value and not os.path.isabs(value) else value

        def data(block: Mapping[str, Any], key: str, field: str) -> bytes:
            raw = block.get(key) or ""
            try:
                return base64.b64decode(raw, validate=True) if raw else b""
            except ValueError:
                raise KubeConfigError(f"kubeconfig {where}: {field}.{key} is not base64") from None

        for unsupported in ("exec", "auth-provider", "username"):
            if user.get(unsupported):
                raise KubeConfigError(
                    f"kubeconfig {where}: users[{ctx.get('user')}].user.{unsupported} is not supported "
                    "(use a client certificate or a token)"
                )
        server = str(cluster.get("server") or "")
        if not server.startswith(("https://", "http://")):
            raise KubeConfigError(
                f"kubeconfig {where}: clusters[{ctx.get('cluster')}].cluster.server {server!r}"
            )
        return cls(
            server=server.rstrip("/"),
            ca_file=file(cluster.get("certificate-authority", "")),
            ca_data=data(cluster, "certificate-authority-data", "cluster").decode(),
            cert_file=file(user.get("client-certificate", "")),
            key_file=file(user.get("client-key", "")),
            cert_data=data(user, "client-certificate-data", "user"),
            key_data=data(user, "client-key-data", "user"),
            token=str(user.get("token") or ""),
            token_file=file(user.get("tokenFile", "")),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            tls_server_name=str(cluster.get("tls-server-name") or ""),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``server`` (None for plain http)."""
        if self.server.startswith("http://"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file or None, cadata=self.ca_data or None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file or None)
        elif self.cert_data:
            # load_cert_chain reads files only: a private temporary one, gone at once.
            with tempfile.NamedTemporaryFile(prefix="kubeapi-", suffix=".pem") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(self.cert_data + b"\n" + self.key_data)
                f.flush()
                ctx.load_cert_chain(f.name)
        return ctx


def _named(doc: Mapping[str, Any], section: str, name: str, key: str, where: Path) -> Json:
    for entry in doc.get(section) or []:
        if (entry or {}).get("name") == name:
            value = entry.get(key)
            return value if isinstance(value, dict) else {}
    raise KubeConfigError(f"kubeconfig {where}: {section} has no entry named {name!r}")


def error_message(body: bytes) -> str:
    """The ``message`` of a Status body, else the body's text."""
    text = body.decode(errors="replace")
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return text.strip()
    return str(message) if message else text.strip()


class KubeApi:
    """Requests and watches to one API server as one identity. Use from one event loop."""

    def __init__(self, config: KubeConfig, user_agent: str = "dranet-py", timeout: float = 10.0) -> None:
        self.config = config
        self.timeout = timeout
        self.user_agent = user_agent
        url = urlsplit(config.server)
        self._tls = config.ssl_context()
        self._host = url.hostname or ""
        self._port = url.port or (443 if self._tls else 80)
        self._netloc = url.netloc
        self._prefix = url.path.rstrip("/")
        self._idle: list[Conn] = []
        self._token = config.token
        self._token_read = 0.0
        self._closed = False

    @classmethod
    def load(cls, kubeconfig: str | os.PathLike[str] | None, **kw: Any) -> KubeApi:
        return cls(KubeConfig.load(kubeconfig), **kw)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    def _bearer(self) -> str:
        if self.config.token_file and time.monotonic() - self._token_read > TOKEN_REREAD_S:
            try:
                self._token = Path(self.config.token_file).read_text().strip()
                self._token_read = time.monotonic()
            except OSError as exc:
                raise ApiError(0, f"reading the token {self.config.token_file}: {exc}") from None
        return self._token

    def _headers(self, body: bytes, content_type: str) -> list[tuple[str, str]]:
        headers = [
            ("Host", self._netloc),
            ("User-Agent", self.user_agent),
            ("Accept", "application/json"),
        ]
        token = self._bearer()
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        if body:
            headers += [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        return headers

    async def _connect(self) -> Conn:
        return await Conn.open(
            self._host, self._port, tls=self._tls, server_hostname=self.config.tls_server_name or self._host
        )

    def _take(self) -> Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.stale(IDLE_MAX_S):
                return conn
            conn.close()
        return None

    def target(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return self._prefix + path + (("?" + urlencode(q)) if q else "")

    async def request_raw(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        deadline: float | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ApiError(0) when there was no answer in time."""
        status, _, answer = await self._exchange(
            method, path, query=query, body=body, content_type=content_type, deadline=deadline
        )
        return status, answer

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
        deadline: float | None,
    ) -> tuple[int, dict[str, str], bytes]:
        if self._closed:
            raise ApiError(0, "the API client is closed")
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        target = self.target(path, query)
        headers = self._headers(data, content_type)
        idempotent = method in ("GET", "HEAD", "PUT", "DELETE")
        for attempt in (0, 1):
            conn = self._take()
            reused = conn is not None
            try:
                async with asyncio.timeout(deadline or self.timeout):
                    if conn is None:
                        conn = await self._connect()
                    status, answer_headers, answer = await conn.exchange(method, target, headers, data)
            except TimeoutError:
                if conn is not None:
                    conn.close()
                raise ApiError(0, f"{method} {path}: no answer from {self.config.server} in time") from None
            except CONNECTION_ERRORS as exc:
                if conn is not None:
                    conn.close()
                # A kept-alive connection the server had closed: once more on a new one.
                if reused and idempotent and attempt == 0:
                    continue
                raise ApiError(
                    0, f"{method} {path}: API server {self.config.server} unreachable: {exc!r}"
                ) from None
            if conn.reusable() and len(self._idle) < POOL_SIZE and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
            return status, answer_headers, answer
        raise AssertionError("unreachable")

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        deadline: float | None = None,
    ) -> Json:
        """The JSON answer of a 2xx; ApiError with the server's message otherwise."""
        status, headers, answer = await self._exchange(
            method, path, query=query, body=body, content_type=content_type, deadline=deadline
        )
        if not 200 <= status <= 299:
            raise ApiError(status, error_message(answer), retry_after_s(headers))
        data = json.loads(answer) if answer else {}
        return data if isinstance(data, dict) else {}

    async def get(
        self, path: str, query: Mapping[str, Any] | None = None, deadline: float | None = None
    ) -> Json | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            return await self.request("GET", path, query=query, deadline=deadline)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def watch(
        self, path: str, query: Mapping[str, Any] | None = None, connect_timeout: float | None = None
    ) -> AsyncGenerator[tuple[str, Json], None]:
        """(type, object) for each event of a watch on the collection ``path``, until the
        server ends it (``timeoutSeconds`` in ``query`` bounds that). A watch ERROR event is
        raised as ApiError with its code (410: the resourceVersion is too old)."""
        q = dict(query or {})
        q["watch"] = "true"
        try:
            async with asyncio.timeout(connect_timeout or self.timeout):
                conn = await self._connect()
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise ApiError(0, f"watch {path}: API server {self.config.server} unreachable: {exc!r}") from None
        try:
            try:
                async with asyncio.timeout(connect_timeout or self.timeout):
                    await conn.send("GET", self.target(path, q), self._headers(b"", ""), b"")
                    status, headers = await conn.response()
                    if not 200 <= status <= 299:
                        raise ApiError(status, error_message(await conn.body()), retry_after_s(headers))
            except TimeoutError:
                raise ApiError(0, f"watch {path}: no answer from {self.config.server} in time") from None
            pending = b""
            while True:
                try:
                    data = await conn.chunk()
                except CONNECTION_ERRORS as exc:
                    raise ApiError(0, f"watch {path}: the connection broke: {exc!r}") from None
                if data is None:  # the server ended the watch
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    kind, obj = str(ev.get("type", "")), ev.get("object") or {}
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code") or 0), str(obj.get("message") or obj))
                    yield kind, obj
        finally:
            conn.close()
