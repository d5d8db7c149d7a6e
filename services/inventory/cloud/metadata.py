"""HTTP plumbing for instance metadata services and webhooks (over shared/http11.py, one
connection per attempt: these calls are rare): per-attempt
timeouts, retries with exponential backoff inside an overall deadline, token
dances (AWS IMDSv2, Alibaba), TLS with a CA file, Unix sockets, and errors that
name the provider, method, URL and what went wrong.

A metadata call can never block longer than its deadline, whatever the server
does (refuse, hang, trickle, answer garbage).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from services.inventory.cloud.base import ProviderError
from shared.http11 import CONNECTION_ERRORS, BodyTooLarge, Conn

log = logging.getLogger(__name__)

# Statuses worth another attempt: the server is there but not ready (yet).
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_MAX_BODY = 4 * 1024 * 1024  # metadata documents are small; refuse runaway bodies


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call tries. ``deadline`` bounds the whole call, retries included."""

    request_timeout: float = 2.0
    deadline: float = 10.0
    initial_backoff: float = 0.2
    max_backoff: float = 2.0
    retries: bool = True


DETECT_POLICY = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.25, max_backoff=1.0)


class MetadataError(ProviderError):
    """A metadata (or webhook) request failed. ``status`` is the HTTP status when
    the server answered; ``retryable`` says whether trying later may help."""

    def __init__(
        self,
        provider: str,
        method: str,
        url: str,
        reason: str,
        status: int | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(f"{provider}: {method} {url}: {reason}")
        self.provider = provider
        self.method = method
        self.url = url
        self.reason = reason
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TokenDance:
    """A session token fetched with PUT and sent on every request (IMDSv2 style).

    ``fallback_statuses``: PUT answers after which requests go without a token
    (the AWS SDK falls back to IMDSv1 on 403/404/405)."""

    path: str
    ttl_header: str
    token_header: str
    ttl_seconds: int = 21600
    fallback_statuses: frozenset[int] = frozenset()


@dataclass
class _TokenState:
    value: str | None = None
    expires: float = 0.0
    without_token: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def make_ssl_context(url: str, ca_file: str = "") -> ssl.SSLContext | None:
    """TLS for https URLs: the system roots, or only ``ca_file`` when given."""
    if not url.startswith("https://"):
        return None
    ctx = ssl.create_default_context(cafile=ca_file or None)
    return ctx


class HttpClient:
    """A small async HTTP client bound to one base URL (http, https or unix://path).

    ``base_url`` may carry a path prefix; request paths are appended to it.
    """

    def __init__(
        self,
        provider: str,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        policy: RetryPolicy | None = None,
        token: TokenDance | None = None,
        ca_file: str = "",
    ) -> None:
        self.provider = provider
        self.policy = policy or RetryPolicy()
        self._headers = dict(headers or {})
        self._token = token
        self._token_state = _TokenState()
        self._unix_path = ""
        if base_url.startswith("unix://"):
            self._unix_path = base_url[len("unix://") :]
            self.base_url = "http://localhost"
            self.display_url = base_url
        else:
            self.base_url = base_url.rstrip("/")
            self.display_url = self.base_url
        self._ssl = make_ssl_context(base_url, ca_file)
        url = urlsplit(self.base_url)
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._ssl else 80)
        self._netloc = url.netloc or "localhost"
        self._prefix = url.path.rstrip("/")

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def shown(self, path: str) -> str:
        """The URL as errors show it (the unix:// form for socket URLs)."""
        return f"{self.display_url}{path}"

    async def close(self) -> None:
        """Nothing is kept open between calls."""

    async def _attempt(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None,
        data: bytes | None,
        attempt_timeout: float,
    ) -> Response:
        shown = self.shown(path)
        target = self._prefix + path + (("?" + urlencode(params)) if params else "")
        body = data or b""
        sent = [("Host", self._netloc), ("Connection", "close"), *headers.items()]
        if body or method in ("POST", "PUT", "PATCH"):
            sent.append(("Content-Length", str(len(body))))
        conn: Conn | None = None
        try:
            async with asyncio.timeout(attempt_timeout):
                # No proxy from the environment: a node's HTTP(S)_PROXY must never capture
                # link-local metadata traffic.
                conn = await Conn.open(self._host, self._port, tls=self._ssl, unix_path=self._unix_path)
                status, answer_headers, answer = await conn.exchange(method, target, sent, body, _MAX_BODY)
            return Response(status, answer_headers, answer)
        except TimeoutError:
            raise MetadataError(
                self.provider, method, shown, f"timed out after {attempt_timeout:.1f}s"
            ) from None
        except BodyTooLarge:
            raise MetadataError(
                self.provider, method, shown, f"response larger than {_MAX_BODY} bytes"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise MetadataError(
                self.provider,
                method,
                shown,
                f"TLS certificate not trusted: {exc.verify_message or exc}",
                retryable=False,
            ) from None
        except ssl.SSLError as exc:
            raise MetadataError(self.provider, method, shown, f"TLS error: {exc}", retryable=False) from None
        except CONNECTION_ERRORS as exc:
            reason = str(exc) or type(exc).__name__
            raise MetadataError(self.provider, method, shown, f"unreachable: {reason}") from None
        finally:
            if conn is not None:
                conn.close()

    async def _token_headers(self, deadline: float) -> dict[str, str]:
        dance = self._token
        if dance is None:
            return {}
        state = self._token_state
        async with state.lock:
            now = time.monotonic()
            if state.without_token:
                return {}
            if state.value is None or now >= state.expires:
                remaining = max(0.05, deadline - now)
                resp = await self._attempt(
                    "PUT",
                    dance.path,
                    {**self._headers, dance.ttl_header: str(dance.ttl_seconds)},
                    None,
                    None,
                    min(self.policy.request_timeout, remaining),
                )
                if resp.status in dance.fallback_statuses:
                    log.info(
                        "metadata token not available, continuing without one",
                        extra={"provider": self.provider, "status": resp.status},
                    )
                    state.without_token = True
                    return {}
                if resp.status != 200 or not resp.text.strip():
                    raise MetadataError(
                        self.provider,
                        "PUT",
                        self.shown(dance.path),
                        f"token request answered HTTP {resp.status}",
                        status=resp.status,
                        retryable=resp.status in _RETRY_STATUSES,
                    )
                state.value = resp.text.strip()
                # Renew well before the server forgets it.
                state.expires = now + max(1.0, dance.ttl_seconds * 0.8)
            return {dance.token_header: state.value}

    def _forget_token(self) -> None:
        self._token_state.value = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        policy: RetryPolicy | None = None,
        ok_statuses: frozenset[int] = frozenset({200}),
    ) -> Response:
        """One call with retries until ``policy.deadline``. Returns the response when
        its status is in ``ok_statuses``; raises MetadataError otherwise."""
        pol = policy or self.policy
        start = time.monotonic()
        deadline = start + pol.deadline
        backoff = pol.initial_backoff
        attempt = 0
        last: MetadataError | None = None
        token_refreshed = False
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                token = await self._token_headers(deadline)
                resp = await self._attempt(
                    method,
                    path,
                    {**self._headers, **token, **(headers or {})},
                    params,
                    data,
                    min(pol.request_timeout, max(0.05, deadline - time.monotonic())),
                )
            except MetadataError as exc:
                last = exc
                if not exc.retryable or not pol.retries:
                    raise
            else:
                if resp.status in ok_statuses:
                    return resp
                if resp.status == 401 and self._token is not None and not token_refreshed:
                    # An expired session token: fetch a new one once, right away.
                    self._forget_token()
                    token_refreshed = True
                    continue
                snippet = resp.text.strip().replace("\n", " ")[:200]
                retryable = resp.status in _RETRY_STATUSES
                last = MetadataError(
                    self.provider,
                    method,
                    self.shown(path),
                    f"HTTP {resp.status}" + (f": {snippet}" if snippet else ""),
                    status=resp.status,
                    retryable=retryable,
                )
                if not retryable or not pol.retries:
                    raise last
            sleep = min(backoff, max(0.0, deadline - time.monotonic()))
            if sleep <= 0:
                break
            log.debug(
                "metadata request failed, retrying",
                extra={
                    "provider": self.provider,
                    "url": self.shown(path),
                    "attempt": attempt,
                    "error": str(last),
                },
            )
            await asyncio.sleep(sleep)
            backoff = min(backoff * 2, pol.max_backoff)
        assert last is not None
        raise MetadataError(
            self.provider,
            method,
            self.shown(path),
            f"gave up after {attempt} attempt(s) in {pol.deadline:.1f}s: {last.reason}",
            status=last.status,
            retryable=True,
        )

    async def get_text(self, path: str, **kwargs: Any) -> str:
        return (await self.request("GET", path, **kwargs)).text

    async def get_json(self, path: str, **kwargs: Any) -> Any:
        resp = await self.request("GET", path, **kwargs)
        return self.decode_json(resp, "GET", path)

    def decode_json(self, resp: Response, method: str, path: str) -> Any:
        try:
            return json.loads(resp.body)
        except (ValueError, UnicodeDecodeError) as exc:
            snippet = resp.text.strip().replace("\n", " ")[:80]
            raise MetadataError(
                self.provider,
                method,
                self.shown(path),
                f"answer is not JSON ({exc}): {snippet!r}",
                retryable=False,
            ) from None


def json_str(obj: Mapping[str, Any], key: str) -> str:
    """``obj[key]`` when it is a string, else "" (metadata documents leave fields out)."""
    value = obj.get(key)
    return value if isinstance(value, str) else ""


async def probe_get(
    client: HttpClient,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    ok_statuses: frozenset[int] = frozenset({200}),
    accept: Callable[[Response], bool] | None = None,
) -> bool:
    """Cloud detection: whether GET ``path`` answers with a status in ``ok_statuses``
    (and ``accept`` takes the answer). Any MetadataError means no. Closes ``client``."""
    try:
        resp = await client.request("GET", path, params=params, ok_statuses=ok_statuses)
        return accept is None or accept(resp)
    except MetadataError:
        return False
    finally:
        await client.close()


async def first_true(
    probes: Mapping[str, Callable[[], Coroutine[Any, Any, bool]]], order: list[str], deadline: float
) -> str | None:
    """Run all probes at once and return the first key in ``order`` whose probe
    said True, waiting for earlier keys to finish, all within ``deadline`` seconds.

    Running them concurrently bounds detection by the slowest single probe (and
    ``deadline``) instead of the sum, which on a non-cloud machine can be long.
    """
    tasks: dict[str, asyncio.Task[bool]] = {
        key: asyncio.create_task(probe()) for key, probe in probes.items()
    }
    try:
        async with asyncio.timeout(deadline):
            for key in order:
                task = tasks.get(key)
                if task is None:
                    continue
                try:
                    if await task:
                        return key
                except Exception as exc:
                    log.debug("cloud probe failed", extra={"probe": key, "error": str(exc)})
    except TimeoutError:
        # Probes still running could not confirm their cloud in time; among the
        # finished ones the priority order still decides.
        log.info("cloud detection deadline reached", extra={"timeout_s": deadline})
        for key in order:
            task = tasks.get(key)
            if task is not None and task.done() and not task.cancelled() and task.exception() is None:
                if task.result():
                    return key
        return None
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    return None
