"""shared/kubeapi.py: the kubeconfig and in-cluster config, and requests and watches against
a local HTTP/1.1 server written on raw asyncio streams (so framing, chunked bodies,
keep-alive and broken connections are the real thing, not a mock of the client).
The real API server is met by the cluster tests (inventory publishes, prepare reads claims
and writes status through this client)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from email.utils import formatdate
from pathlib import Path

import pytest

from shared.kubeapi import RETRY_AFTER_MAX_S, ApiError, KubeApi, KubeConfig, KubeConfigError, retry_after_s

Handler = Callable[[str, str, dict[str, str], bytes, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """Answers each request with ``handler``; counts connections and keeps the requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    k, v = h.decode().split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((method, target, headers, body))
                await self.handler(method, target, headers, body, writer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return


def reply(
    writer: asyncio.StreamWriter, status: int, obj: object, close: bool = False, retry_after: str = ""
) -> None:
    body = json.dumps(obj).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    if close:
        head += "Connection: close\r\n"
    if retry_after:
        head += f"Retry-After: {retry_after}\r\n"
    writer.write(head.encode() + b"\r\n" + body)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Server, KubeApi]]]]:
    made: list[tuple[Server, KubeApi]] = []

    async def make(handler: Handler) -> tuple[Server, KubeApi]:
        server = Server(handler)
        url = await server.start()
        api = KubeApi(KubeConfig(server=url, token="t0k"), timeout=2.0)
        made.append((server, api))
        return server, api

    yield make
    for server, api in made:
        await api.close()
        await server.stop()


async def test_requests_reuse_one_connection_and_send_token_and_body(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        reply(w, 200, {"method": method, "target": target, "body": body.decode()})

    server, api = await serve(handler)
    got = await api.request("GET", "/api/v1/nodes/n1", query={"limit": 1, "continue": ""})
    assert got == {"method": "GET", "target": "/api/v1/nodes/n1?limit=1", "body": ""}
    got = await api.request("PATCH", "/x", body={"a": 1}, content_type="application/merge-patch+json")
    assert got["body"] == '{"a":1}'
    assert server.connections == 1
    _, _, headers, _ = server.requests[1]
    assert headers["authorization"] == "Bearer t0k"
    assert headers["content-type"] == "application/merge-patch+json"


async def test_error_status_carries_the_servers_message_and_404_is_none(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        if target.endswith("/gone"):
            reply(w, 404, {"kind": "Status", "message": 'nodes "gone" not found'})
        else:
            reply(w, 422, {"kind": "Status", "message": "spec.devices: Too many: 129"})

    _, api = await serve(handler)
    assert await api.get("/api/v1/nodes/gone") is None
    with pytest.raises(ApiError) as err:
        await api.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={})
    assert err.value.status == 422
    assert "spec.devices: Too many: 129" in str(err.value)


async def test_a_connection_the_server_closed_is_replaced_for_a_get(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        reply(w, 200, {"n": len(server.requests)})
        if len(server.requests) == 1:
            await w.drain()
            w.close()  # gone after the answer, without saying so

    server, api = await serve(handler)
    assert await api.request("GET", "/a") == {"n": 1}
    await asyncio.sleep(0.05)
    assert await api.request("GET", "/b") == {"n": 2}
    assert server.connections == 2


async def test_connection_close_answers_are_not_reused(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        reply(w, 200, {}, close=True)
        await w.drain()
        w.close()

    server, api = await serve(handler)
    for _ in range(3):
        await api.request("GET", "/a")
    assert server.connections == 3


async def test_a_server_that_never_answers_is_an_error_in_time(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        await asyncio.sleep(30)

    _, api = await serve(handler)
    with pytest.raises(ApiError) as err:
        await api.request("GET", "/slow", deadline=0.3)
    assert err.value.status == 0
    assert "no answer" in str(err.value)


async def test_nothing_listening_is_status_0_naming_the_server() -> None:
    api = KubeApi(KubeConfig(server="http://127.0.0.1:9"), timeout=1.0)
    with pytest.raises(ApiError) as err:
        await api.request("GET", "/")
    assert err.value.status == 0
    assert "http://127.0.0.1:9" in str(err.value)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_watch_events_split_across_chunks_then_410(serve) -> None:
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": "s1"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}},
    ]

    async def handler(method, target, headers, body, w) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        for i in range(0, len(stream), 7):  # lines cut anywhere
            w.write(chunk(stream[i : i + 7]))
            await w.drain()
        w.write(b"0\r\n\r\n")

    server, api = await serve(handler)
    seen = []
    with pytest.raises(ApiError) as err:
        async for kind, obj in api.watch("/apis/resource.k8s.io/v1/resourceslices", {"resourceVersion": "5"}):
            seen.append((kind, obj["metadata"]))
    assert seen == [("ADDED", {"name": "s1"}), ("BOOKMARK", {"resourceVersion": "7"})]
    assert err.value.status == 410
    assert "watch=true" in server.requests[0][1] and "resourceVersion=5" in server.requests[0][1]


async def test_watch_ends_when_the_server_ends_it(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        w.write(chunk(b'{"type":"DELETED","object":{"metadata":{"name":"s2"}}}\n'))
        w.write(b"0\r\n\r\n")

    _, api = await serve(handler)
    seen = [kind async for kind, _ in api.watch("/x")]
    assert seen == ["DELETED"]


async def test_watch_refused_is_an_error_with_the_status(serve) -> None:
    async def handler(method, target, headers, body, w) -> None:
        reply(w, 403, {"kind": "Status", "message": 'resourceslices is forbidden: User "x"'})

    _, api = await serve(handler)
    with pytest.raises(ApiError) as err:
        async for _ in api.watch("/x"):
            pass
    assert err.value.status == 403
    assert "forbidden" in str(err.value)


async def test_a_429_carries_the_servers_retry_after_for_requests_and_watches(serve) -> None:
    """API Priority and Fairness answers 429 with Retry-After in seconds."""

    async def handler(method, target, headers, body, w) -> None:
        after = "3" if "watch=true" in target else ("" if target.endswith("/none") else "1")
        reply(
            w,
            429,
            {"kind": "Status", "message": "Too many requests, please try again later."},
            retry_after=after,
        )

    _, api = await serve(handler)
    with pytest.raises(ApiError) as err:
        await api.request("PUT", "/apis/resource.k8s.io/v1/resourceslices/s")
    assert (err.value.status, err.value.retry_after) == (429, 1.0)
    assert "Too many requests" in str(err.value)
    with pytest.raises(ApiError) as err:
        await api.request("GET", "/none")
    assert (err.value.status, err.value.retry_after) == (429, 0.0)
    with pytest.raises(ApiError) as err:
        async for _ in api.watch("/x"):
            pass
    assert (err.value.status, err.value.retry_after) == (429, 3.0)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("", 0.0), ("2", 2.0), ("0", 0.0), ("-5", 0.0), ("soon", 0.0), ("7200", RETRY_AFTER_MAX_S)],
)
def test_retry_after_forms(value: str, seconds: float) -> None:
    assert retry_after_s({"retry-after": value} if value else {}) == seconds


def test_retry_after_as_an_http_date() -> None:
    when = formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s({"retry-after": when}) <= 30


# -- configuration ---------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kubeconfig"
    p.write_text(text)
    return p


def test_kubeconfig_current_context_with_relative_files_and_data(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        f"""
apiVersion: v1
kind: Config
current-context: b
contexts:
- name: a
  context: {{cluster: c1, user: u1}}
- name: b
  context: {{cluster: c2, user: u2}}
clusters:
- name: c1
  cluster: {{server: "https://10.0.0.1:6443"}}
- name: c2
  cluster:
    server: https://10.0.0.2:6443/
    certificate-authority-data: {b64(b"CA PEM")}
    tls-server-name: kubernetes
users:
- name: u1
  user: {{token: one}}
- name: u2
  user:
    client-certificate: certs/me.crt
    client-key-data: {b64(b"KEY PEM")}
""",
    )
    cfg = KubeConfig.from_kubeconfig(p)
    assert cfg.server == "https://10.0.0.2:6443"
    assert cfg.ca_data == "CA PEM"
    assert cfg.cert_file == str(tmp_path / "certs/me.crt")
    assert cfg.key_data == b"KEY PEM"
    assert cfg.tls_server_name == "kubernetes"
    assert cfg.token == ""
    assert KubeConfig.from_kubeconfig(p, context="a").token == "one"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("current-context: x\ncontexts: []\n", "contexts has no entry named 'x'"),
        (
            "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
            "users: [{name: u, user: {exec: {command: aws}}}]\n",
            "users[u].user.exec is not supported",
        ),
        (
            "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: 'h:6443'}}]\n",
            "clusters[c].cluster.server 'h:6443'",
        ),
        (
            "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: '%%%'}}]\n",
            "cluster.certificate-authority-data is not base64",
        ),
        ("[1, 2", "kubeconfig"),
    ],
)
def test_kubeconfig_errors_name_the_field(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(KubeConfigError) as err:
        KubeConfig.from_kubeconfig(write(tmp_path, text))
    assert names in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_in_cluster_needs_the_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubeConfig.in_cluster()


def test_in_cluster_reads_the_rotated_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import shared.kubeapi as kubeapi

    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setattr(kubeapi, "SA_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = KubeConfig.in_cluster()
    assert cfg.server == "https://[fd00::1]:443"
    api = KubeApi(KubeConfig(server="http://127.0.0.1:9", token_file=cfg.token_file))
    assert api._bearer() == "first"
    (tmp_path / "token").write_text("second\n")
    monkeypatch.setattr(kubeapi, "TOKEN_REREAD_S", 0.0)
    assert api._bearer() == "second"
