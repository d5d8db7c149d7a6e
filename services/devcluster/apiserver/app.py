"""The HTTP surface: Kubernetes REST paths, discovery, OpenAPI, content negotiation, watch streams.

One catch-all route parses the Kubernetes URL grammar itself
(``/api/v1/namespaces/{ns}/pods/{name}/status``, ``/apis/{group}/{version}/{resource}``,
the legacy ``/watch/`` prefix) because the real grammar is ambiguous for FastAPI's router
(``/api/v1/namespaces/{name}/status`` is the namespace's status, ``/api/v1/namespaces/{ns}/pods``
a collection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from . import errors, openapi
from .errors import ApiError, bad_request
from .registry import Registry, WriteContext
from .resources import BY_PATH, GROUP_VERSIONS, RESOURCES, Resource, selectable_fields
from .selectors import check_supported, parse_fields, parse_labels
from .store import Event, Storage, Watcher

JSON = dict[str, Any]
log = logging.getLogger(__name__)

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_BODY_TYPES = ("application/json", "application/yaml")
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@dataclass(frozen=True)
class ServerConfig:
    kube_version: str
    schema_version: str
    bookmark_interval: float = 60.0
    default_field_validation: str = "Strict"
    address: str = "127.0.0.1"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json(obj: Any, code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(obj), status_code=code, media_type="application/json", headers=headers)


def _bool(params: Any, name: str, default: bool = False) -> bool:
    value = params.get(name)
    if value is None or value == "":
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def _int(params: Any, name: str) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None


def _wants_table(accept: str) -> bool:
    for part in accept.split(","):
        params = {
            kv.split("=", 1)[0].strip(): kv.split("=", 1)[1].strip()
            for kv in part.split(";")[1:]
            if "=" in kv
        }
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            return True
    return False


@dataclass
class Target:
    """A parsed resource URL."""

    res: Resource
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str
    subresource: str
    watch_prefix: bool


class ApiApp:
    def __init__(self, registry: Registry, storage: Storage, config: ServerConfig) -> None:
        self.registry = registry
        self.storage = storage
        self.config = config
        self.app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        self.app.add_api_route("/{path:path}", self.handle, methods=_ALL_METHODS, include_in_schema=False)

    # -- dispatch ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        started = time.monotonic()
        try:
            response = await self._dispatch(request)
        except ApiError as e:
            response = _json(e.status(), e.code, e.headers or None)
        except Exception as e:
            log.exception("request failed", extra={"method": request.method, "path": request.url.path})
            err = errors.internal(str(e))
            response = _json(err.status(), err.code)
        log.debug(
            "request",
            extra={
                "method": request.method,
                "path": request.url.path,
                "query": str(request.url.query),
                "code": response.status_code,
                "ms": round((time.monotonic() - started) * 1000, 2),
            },
        )
        return response

    async def _dispatch(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        method = request.method
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(b"ok", media_type="text/plain")
        if path == "/version":
            return _json(self._version())
        if parts[:2] == ["openapi", "v3"]:
            return self._openapi(request, parts[2:])
        if path == "/api":
            return _json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.config.address}
                    ],
                }
            )
        if path == "/apis":
            return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()})
        if len(parts) == 2 and parts[0] == "apis":
            group = next((g for g in self._groups() if g["name"] == parts[1]), None)
            if group is None:
                raise errors.path_not_found()
            return _json({"kind": "APIGroup", "apiVersion": "v1", **group})
        if parts == ["api", "v1"]:
            return _json(self._resource_list("", "v1"))
        if len(parts) == 3 and parts[0] == "apis" and (parts[1], parts[2]) in GROUP_VERSIONS:
            return _json(self._resource_list(parts[1], parts[2]))
        target = self._parse(parts)
        if target is None:
            raise errors.path_not_found()
        return await self._resource(request, method, target)

    def _parse(self, parts: list[str]) -> Target | None:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        watch_prefix = False
        if rest[:1] == ["watch"]:
            watch_prefix, rest = True, rest[1:]
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        res = BY_PATH.get((group, version, rest[0]))
        if res is None:
            return None
        if namespace is not None and not res.namespaced:
            return None
        if len(rest) > 3:
            return None
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if sub and sub not in res.subresources:
            return None
        if res.namespaced and name and namespace is None:
            return None
        return Target(res, namespace, name, sub, watch_prefix)

    # -- discovery --------------------------------------------------------------------------

    def _version(self) -> JSON:
        core = self.config.kube_version.lstrip("v").split("+")[0].split("-")[0]
        major, minor = core.split(".")[:2]
        return {
            "major": major,
            "minor": minor,
            "emulationMajor": major,
            "emulationMinor": minor,
            "minCompatibilityMajor": major,
            "minCompatibilityMinor": str(int(minor) - 1),
            "gitVersion": self.config.kube_version,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-08-27T00:00:00Z",
            "goVersion": "go1.24.6",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _groups(self) -> list[JSON]:
        groups: dict[str, list[str]] = {}
        for g, v in GROUP_VERSIONS:
            if g:
                groups.setdefault(g, []).append(v)
        out = []
        for g, versions in groups.items():
            gvs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
            out.append({"name": g, "versions": gvs, "preferredVersion": gvs[0]})
        return out

    def _resource_list(self, group: str, version: str) -> JSON:
        resources: list[JSON] = []
        for res in RESOURCES:
            if (res.group, res.version) == (group, version):
                resources.extend(res.discovery())
        resources.sort(key=lambda r: r["name"])
        body: JSON = {"kind": "APIResourceList"}
        if group:
            body["apiVersion"] = "v1"
        body["groupVersion"] = f"{group}/{version}" if group else version
        body["resources"] = resources
        return body

    def _openapi(self, request: Request, rest: list[str]) -> Response:
        docs = {
            openapi.gv_key(g, v): openapi.document(g, v, self.config.kube_version, self.config.schema_version)
            for g, v in GROUP_VERSIONS
        }
        if not rest:
            paths = {
                key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={openapi.digest(doc)}"}
                for key, doc in docs.items()
            }
            return _json({"paths": paths})
        doc = docs.get("/".join(rest))
        if doc is None:
            raise errors.path_not_found()
        digest = openapi.digest(doc)
        immutable = request.query_params.get("hash") == digest
        headers = {
            "Etag": f'"{digest}"',
            "Cache-Control": "public, immutable" if immutable else "no-cache, private",
        }
        return Response(doc, media_type="application/json", headers=headers)

    # -- resources --------------------------------------------------------------------------

    def _context(self, request: Request) -> WriteContext:
        q = request.query_params
        manager = q.get("fieldManager")
        if manager is None:
            manager = request.headers.get("user-agent", "").split("/", 1)[0]
        if len(manager) > 128:
            raise bad_request("fieldManager: Too long: must have at most 128 bytes")
        dry = q.getlist("dryRun")
        for d in dry:
            if d != "All":
                raise bad_request(f'dryRun: Unsupported value: "{d}": supported values: "All"')
        validation = q.get("fieldValidation") or self.config.default_field_validation
        if validation not in ("Ignore", "Warn", "Strict"):
            raise bad_request(
                f'fieldValidation: Unsupported value: "{validation}": supported values: "Ignore", "Strict", "Warn"'
            )
        return WriteContext(manager=manager, dry_run=bool(dry), field_validation=validation)

    async def _body(self, request: Request) -> Any:
        raw = await request.body()
        if not raw:
            return None
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        if ctype not in _BODY_TYPES:
            # Protobuf bodies (kubectl's typed clients: create namespace, run) are not implemented.
            raise errors.unsupported_media_type(ctype, list(_BODY_TYPES))
        try:
            if ctype in ("application/yaml", "application/apply-patch+yaml"):
                import yaml  # type: ignore[import-untyped, unused-ignore]

                return yaml.safe_load(raw)
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"the body of the request was in an unknown format: {e}") from None

    def _respond(
        self, request: Request, res: Resource, obj: JSON, code: int, ctx: WriteContext | None = None
    ) -> Response:
        if obj.get("kind") != "Status" and _wants_table(request.headers.get("accept", "")):
            response = _json(
                self._table(request, res, [obj], obj["metadata"].get("resourceVersion", "")), code
            )
        else:
            response = _json(obj, code)
        for w in ctx.warnings if ctx is not None else ():
            # One header per warning: code 299, agent "-", the text as an HTTP quoted-string.
            quoted = w.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.append("Warning", f'299 - "{quoted}"')
        return response

    async def _resource(self, request: Request, method: str, t: Target) -> Response:
        res, q = t.res, request.query_params
        ns = t.namespace or ""
        if not self._allowed(method, t, q):
            raise errors.method_not_allowed()
        if res.plural == "bindings":
            ctx = self._context(request)
            body = await self._body(request)
            name = ((body or {}).get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
            return _json(self.registry.bind(ns, name, body, ctx), 201)
        if method == "GET":
            watch = t.watch_prefix or _bool(q, "watch")
            if t.name and not watch:
                obj = self.registry.get(res, ns, t.name)
                return self._respond(request, res, obj, 200)
            labels = parse_labels(q.get("labelSelector"))
            fields = parse_fields(q.get("fieldSelector"))
            if t.name:
                fields = parse_fields(
                    ",".join(filter(None, [q.get("fieldSelector"), f"metadata.name={t.name}"]))
                )
            if watch:
                return await self._watch(request, t, labels, fields)
            limit = _int(q, "limit") or 0
            if limit < 0:
                raise bad_request("limit must be a non-negative integer")
            result = await self.registry.list_collection(
                res,
                t.namespace,
                labels,
                fields,
                limit=limit,
                continue_token=q.get("continue", ""),
                resource_version=q.get("resourceVersion", ""),
                rv_match=q.get("resourceVersionMatch", ""),
            )
            if _wants_table(request.headers.get("accept", "")):
                table = self._table(request, res, result["items"], result["metadata"]["resourceVersion"])
                for k in ("continue", "remainingItemCount"):
                    if k in result["metadata"]:
                        table["metadata"][k] = result["metadata"][k]
                return _json(table)
            return _json(result)
        if t.watch_prefix:
            raise errors.method_not_allowed()
        if method == "POST":
            if t.subresource == "binding" and t.name:
                ctx = self._context(request)
                return _json(self.registry.bind(ns, t.name, await self._body(request), ctx), 201)
            if t.name:
                raise errors.method_not_allowed()
            ctx = self._context(request)
            body = await self._body(request)
            obj = self.registry.create(res, ns, body, ctx)
            return self._respond(request, res, obj, 201, ctx)
        if method == "PUT":
            if not t.name:
                raise errors.method_not_allowed()
            ctx = self._context(request)
            body = await self._body(request)
            if t.subresource == "finalize":
                return _json(self.registry.finalize_namespace(t.name, body, ctx))
            obj, created = self.registry.update(res, ns, t.name, body, ctx, t.subresource)
            return self._respond(request, res, obj, 201 if created else 200, ctx)
        if method == "PATCH":
            if not t.name or t.subresource in ("binding", "finalize"):
                raise errors.method_not_allowed()
            ctx = self._context(request)
            ctype = request.headers.get("content-type", "").split(";")[0].strip()
            obj, created = self.registry.patch(
                res, ns, t.name, ctype, await request.body(), ctx, t.subresource, force=_bool(q, "force")
            )
            return self._respond(request, res, obj, 201 if created else 200, ctx)
        if method == "DELETE":
            if t.subresource:
                raise errors.method_not_allowed()
            ctx = self._context(request)
            options = await self._delete_options(request)
            if t.name:
                code, obj = self.registry.delete(res, ns, t.name, options, ctx)
                return self._respond(request, res, obj, code, ctx)
            labels = parse_labels(q.get("labelSelector"))
            fields = parse_fields(q.get("fieldSelector"))
            return _json(self.registry.delete_collection(res, t.namespace, labels, fields, options, ctx))
        raise errors.method_not_allowed()

    @staticmethod
    def _allowed(method: str, t: Target, q: Any) -> bool:
        if t.subresource:
            allowed = {"status": ("GET", "PUT", "PATCH"), "binding": ("POST",), "finalize": ("PUT",)}
            return method in allowed.get(t.subresource, ()) and not (t.watch_prefix or _bool(q, "watch"))
        if method == "GET":
            verb = "watch" if t.watch_prefix or _bool(q, "watch") else ("get" if t.name else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if t.name else "deletecollection"
        else:
            return False
        return verb in t.res.verbs

    async def _delete_options(self, request: Request) -> JSON:
        body = await self._body(request)
        options: JSON = dict(body) if isinstance(body, dict) else {}
        q = request.query_params
        grace = _int(q, "gracePeriodSeconds")
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        if q.get("propagationPolicy"):
            options["propagationPolicy"] = q["propagationPolicy"]
        if q.get("orphanDependents"):
            options["orphanDependents"] = _bool(q, "orphanDependents")
        return options

    # -- tables -----------------------------------------------------------------------------

    def _table(
        self, request: Request, res: Resource, items: list[JSON], rv: str, columns: bool = True
    ) -> JSON:
        include = request.query_params.get("includeObject", "Metadata")
        rows = []
        for obj in items:
            full = {"kind": res.kind, "apiVersion": res.api_version, **obj}
            row: JSON = {"cells": res.strategy.row(full)}
            if include == "Object":
                row["object"] = full
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": full.get("metadata", {}),
                }
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "columnDefinitions": [c.definition() for c in res.strategy.columns] if columns else None,
            "rows": rows,
        }

    # -- watch ------------------------------------------------------------------------------

    async def _watch(self, request: Request, t: Target, labels: Any, fields: Any) -> Response:
        res, q = t.res, request.query_params
        check_supported(fields, res.strategy.field_labels, res.strategy.field_error)
        rv_text = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents")
        bookmarks = _bool(q, "allowWatchBookmarks")
        initial_events_end = False
        if send_initial is not None:
            if _bool(q, "sendInitialEvents"):
                if q.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks:
                    raise errors.invalid_object(
                        "ListOptions",
                        "meta.k8s.io",
                        "",
                        [
                            errors.forbidden(
                                "sendInitialEvents",
                                "sendInitialEvents is forbidden for watch unless the "
                                "resourceVersionMatch is NotOlderThan and allowWatchBookmarks is true",
                            )
                        ],
                    )
                initial_events_end = True
        timeout = _int(q, "timeoutSeconds")
        if timeout is None:
            timeout = random.randint(1800, 3600)  # --min-request-timeout 1800, randomized up to 2x
        table = _wants_table(request.headers.get("accept", ""))
        start_rv: int | None = None
        if rv_text not in ("", "0") and not initial_events_end:
            try:
                start_rv = int(rv_text)
            except ValueError:
                raise bad_request(f'invalid resource version "{rv_text}"') from None
            await self.registry.wait_for_rv(start_rv)

        w = Watcher(
            t.namespace if res.namespaced else None, labels, fields, lambda o: selectable_fields(res, o)
        )
        self.storage.add_watcher(res.plural, w)
        initial: list[tuple[str, JSON]] = []
        expired: ApiError | None = None
        try:
            if start_rv is None:
                for _, obj in self.storage.items(res.plural, w.namespace):
                    if w.matches(obj):
                        initial.append(("ADDED", obj))
            else:
                for ev in self.storage.events_since(res.plural, start_rv):
                    kind = w.translate(ev)
                    if kind is not None:
                        initial.append((kind, ev.obj))
                # Those events are in `initial`; drop what the queue got meanwhile (nothing, same tick).
        except ApiError as e:
            expired = e
        if expired is not None:
            self.storage.remove_watcher(res.plural, w)
            line = _dumps({"type": "ERROR", "object": expired.status()}) + b"\n"

            async def one() -> AsyncIterator[bytes]:
                yield line

            return StreamingResponse(one(), media_type="application/json")
        gen = self._stream(res, w, initial, float(timeout), bookmarks, initial_events_end, table, request)
        return StreamingResponse(gen, media_type="application/json")

    async def _stream(
        self,
        res: Resource,
        w: Watcher,
        initial: list[tuple[str, JSON]],
        duration: float,
        bookmarks: bool,
        initial_events_end: bool,
        table: bool,
        request: Request,
    ) -> AsyncIterator[bytes]:
        first = True

        def encode(kind: str, obj: JSON, ev: Event | None = None) -> bytes:
            nonlocal first
            if table:
                rv = obj.get("metadata", {}).get("resourceVersion", "")
                body = self._table(request, res, [obj], rv, columns=first)
                first = False
                return _dumps({"type": kind, "object": body}) + b"\n"
            if ev is not None:
                return ev.encoded(kind)
            return _dumps({"type": kind, "object": obj}) + b"\n"

        def bookmark(annotations: JSON | None = None) -> bytes:
            meta: JSON = {"resourceVersion": str(self.storage.rv)}
            if annotations:
                meta["annotations"] = annotations
            return (
                _dumps(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta},
                    }
                )
                + b"\n"
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration
        interval = self.config.bookmark_interval
        try:
            for kind, obj in initial:
                yield encode(kind, obj)
            if initial_events_end:
                yield bookmark({"k8s.io/initial-events-end": "true"})
            # Bookmarks (cacheWatcher.nextBookmarkTime): every `interval`, and once 2 s before the
            # deadline; only while the watcher is caught up (its queue empty).
            next_bookmark = loop.time() + interval
            pre_timeout = deadline - 2.0
            pre_timeout_done = pre_timeout <= loop.time()
            while True:
                now = loop.time()
                if now >= deadline:
                    return
                if w.queue.empty():
                    due = next_bookmark if pre_timeout_done else min(next_bookmark, pre_timeout)
                    if bookmarks and now >= due:
                        yield bookmark()
                        next_bookmark = now + interval
                        pre_timeout_done = pre_timeout_done or now >= pre_timeout
                        continue
                    wake = min(deadline, due) if bookmarks else deadline
                    try:
                        item = await asyncio.wait_for(w.queue.get(), max(0.001, wake - now))
                    except TimeoutError:
                        continue
                else:
                    item = w.queue.get_nowait()
                if item is None:
                    return
                kind, ev = item
                yield encode(kind, ev.obj, ev)
        finally:
            self.storage.remove_watcher(res.plural, w)
