"""The kubelet emulator's view of the Kubernetes API, through kubernetes-asyncio.

Objects travel as plain JSON dicts (``_preload_content=False``), as the API server sends them; the
client's models would drop fields they do not know and cost time on every watch event.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0


async def _json(resp: Any) -> Any:
    """The decoded body of a ``_preload_content=False`` response. The client does
    not raise for error statuses in that mode, so raise ApiException here."""
    try:
        data = await resp.read() if hasattr(resp, "read") else resp.data
    finally:
        if hasattr(resp, "release"):
            resp.release()
    status = getattr(resp, "status", 200)
    if not 200 <= status <= 299:
        reason = getattr(resp, "reason", "") or ""
        try:
            reason = json.loads(data).get("message") or reason
        except (ValueError, AttributeError):
            pass
        raise ApiException(status=status, reason=reason)
    return json.loads(data)


class KubeApi:
    """The calls the kubelet makes: pods (list, watch, status, delete), claims, events, slices."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        # Typed Any: the calls pass plain dicts and private options the generated signatures omit.
        self.core: Any = client.CoreV1Api(api_client)
        self.resource: Any = client.ResourceV1Api(api_client)

    @classmethod
    async def from_kubeconfig(cls, path: str | os.PathLike[str]) -> KubeApi:
        api_client = await config.new_client_from_config(config_file=os.fspath(path))
        return cls(api_client)

    async def close(self) -> None:
        await self.api_client.close()

    async def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        """Pods bound to ``node`` and the list's resourceVersion."""
        resp = await self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        data = await _json(resp)
        return list(data.get("items") or []), str(data["metadata"].get("resourceVersion", ""))

    async def watch_pods(self, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, pod) events from ``resource_version``; ends when the server closes the watch.

        ApiException(410) means the version is too old: list again.
        """
        w = watch.Watch(return_type="object")
        try:
            async for ev in w.stream(
                self.core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={node}",
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
            ):
                yield ev["type"], ev["raw_object"]
        finally:
            await w.close()

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = await self.resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            claim: dict[str, Any] = await _json(resp)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return claim

    async def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        resp = await self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {"status": status},
            _content_type="application/merge-patch+json",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        await _json(resp)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete with grace period 0 and a UID precondition; a pod already gone is fine."""
        try:
            resp = await self.core.delete_namespaced_pod(
                name,
                namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                grace_period_seconds=0,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            await _json(resp)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        resp = await self.core.create_namespaced_event(
            namespace, event, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        await _json(resp)

    async def delete_slices(self, field_selector: str) -> None:
        resp = await self.resource.delete_collection_resource_slice(
            field_selector=field_selector, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        await _json(resp)
