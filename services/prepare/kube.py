"""The few Kubernetes API calls prepare makes: claims as dicts, over shared/kubeapi.py
(JSON on kept-alive connections; no model classes). Every call has a timeout.
"""

from __future__ import annotations

import logging
from typing import Any

from shared.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 for a transport error)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Kube:
    """An API client for one driver: claim reads, claim status applies, events."""

    def __init__(self, kubeconfig: str | None, field_manager: str, driver: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.field_manager = field_manager
        self.driver = driver or field_manager
        self._api: KubeApi | None = None

    async def start(self) -> None:
        self._api = KubeApi.load(
            self.kubeconfig, user_agent=f"{self.field_manager}/prepare", timeout=REQUEST_TIMEOUT_S
        )

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    @property
    def api(self) -> KubeApi:
        assert self._api is not None, "Kube.start() first"
        return self._api

    async def _call(self, what: str, method: str, path: str, **kw: Any) -> dict[str, Any] | None:
        """The JSON answer, or None for 404; every other failure is a KubeError that says
        ``what`` was being done."""
        try:
            return await self.api.request(method, path, **kw)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise KubeError(
                exc.status, f"{what}: {exc.status} {exc.message}" if exc.status else f"{what}: {exc.message}"
            ) from None

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim as a dict, or None when it does not exist."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        return await self._call(f"reading claim {namespace}/{name}", "GET", path)

    async def apply_claim_devices(self, namespace: str, name: str, devices: list[dict[str, Any]]) -> bool:
        """Make this driver's status.devices entries of the claim exactly ``devices``, keeping
        other drivers' entries. False when the claim no longer exists.

        A JSON merge patch with the claim's resourceVersion (read, modify, write; retried on a
        conflict), not server-side apply. The API server compares the immutable
        status.allocation byte for byte, opaque ``parameters`` included, against what it stored;
        apply re-encodes those parameters with sorted keys, so a claim whose config keys were not
        sorted could never get its status ("status.allocation: field is immutable", seen on a
        real 1.34 API server). A merge patch keeps the keys' order. What no JSON write can keep
        is whitespace: a claim created with non-compact JSON (Python clients send ``", "`` and
        ``": "``) stores those bytes, every JSON status write sends them compacted, and the
        server refuses it as a 422; dranet's ApplyStatus meets the same refusal. kubectl and Go
        clients send compact JSON. See docs/differences.md.
        """
        what = f"writing status of claim {namespace}/{name}"
        for _ in range(8):
            claim = await self.get_claim(namespace, name)
            if claim is None:
                return False
            current = (claim.get("status") or {}).get("devices") or []
            wanted = [d for d in current if d.get("driver") != self.driver] + devices
            if wanted == current:
                return True
            patch = {
                "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
                "status": {"devices": wanted or None},
            }
            try:
                answer = await self._call(
                    what,
                    "PATCH",
                    f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
                    query={"fieldManager": self.field_manager},
                    body=patch,
                    content_type="application/merge-patch+json",
                )
            except KubeError as exc:
                if exc.status == 409:  # changed since we read it: read again
                    continue
                raise
            return answer is not None
        raise KubeError(409, f"{what}: the claim kept changing; will retry")

    async def claim_event(self, claim: dict[str, Any], reason: str, message: str) -> None:
        """A Warning event on the claim; best effort."""
        meta = claim.get("metadata", {})
        namespace = meta.get("namespace", "default")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'claim')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager,
        }
        try:
            await self.api.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except ApiError as exc:
            log.debug("could not record event", extra={"reason": reason, "error": str(exc)})
