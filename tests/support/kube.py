"""Test helpers on the real cluster (``dev.cluster.kube.KubeCluster``): objects made through the
real API server as admin, waits on what the real scheduler, controller-manager and kubelet do,
and the Pod's network namespace read from containerd over CRI.

Every helper takes a namespace: tests isolate by namespace on the one cluster of the session.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from dev.cluster.cri import CriClient
from dev.cluster.kube import KubeCluster

DRIVER = "dra.net"
T = TypeVar("T")


def on(name: str) -> str:
    """A selector for the device whose interface is ``name``; ``has()`` first, as upstream's
    examples do: a device without ``ifName`` would otherwise fail the whole claim's CEL."""
    return f'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName == "{name}"'


ALL_DEVICES = f'device.driver == "{DRIVER}"'


def nic_name(prefix: str = "n") -> str:
    """A NIC name no other test uses (interface names are at most 15 bytes)."""
    return f"{prefix}{secrets.token_hex(3)}"


async def eventually(
    check: Callable[[], T | None] | Callable[[], Awaitable[T | None]],
    within: float = 30.0,
    what: str = "condition",
    every: float = 0.2,
) -> T:
    """Poll ``check`` (sync or async) until it returns something truthy; that value."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within:.0f}s")
        await asyncio.sleep(every)


class Kube:
    """The cluster as one test sees it, in namespace ``ns``."""

    def __init__(self, cluster: KubeCluster, ns: str) -> None:
        self.c = cluster
        self.ns = ns
        self.api = cluster.api

    # -- objects ---------------------------------------------------------------------------

    def create_namespace(self) -> None:
        self.api.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}}
        )
        # The controller-manager makes the default ServiceAccount; the admission plugin waits for it.
        deadline = time.monotonic() + 30
        while not self.api.exists(f"/api/v1/namespaces/{self.ns}/serviceaccounts/default"):
            if time.monotonic() > deadline:
                raise AssertionError(f"no default ServiceAccount in {self.ns}")
            time.sleep(0.1)

    def delete_namespace(self, within: float = 120.0) -> None:
        """Delete the namespace and wait until it is gone (its Pods stopped, devices back)."""
        self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}", ok=(200, 202, 404))
        deadline = time.monotonic() + within
        while self.api.exists(f"/api/v1/namespaces/{self.ns}"):
            if time.monotonic() > deadline:
                raise AssertionError(f"namespace {self.ns} not deleted within {within}s")
            time.sleep(0.3)

    def device_class(
        self, name: str, selector: str = ALL_DEVICES, config: dict[str, Any] | None = None
    ) -> str:
        """A DeviceClass (cluster-scoped: the name gets the namespace as suffix); its name."""
        full = f"{name}-{self.ns}"
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": selector}}]}
        if config is not None:
            spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
        self.api.create(
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": full},
                "spec": spec,
            },
        )
        return full

    def delete_device_classes(self) -> None:
        for dc in self.api.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]:
            if dc["metadata"]["name"].endswith(f"-{self.ns}"):
                self.api.call(
                    "DELETE",
                    f"/apis/resource.k8s.io/v1/deviceclasses/{dc['metadata']['name']}",
                    ok=(200, 404),
                )

    @staticmethod
    def claim_spec(
        device_class: str,
        selector: str | None = None,
        configs: Sequence[dict[str, Any]] = (),
        request: str = "nic",
    ) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": device_class}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        spec: dict[str, Any] = {"devices": {"requests": [{"name": request, "exactly": exactly}]}}
        if configs:
            spec["devices"]["config"] = [
                {
                    "requests": c.get("requests", []),
                    "opaque": {"driver": DRIVER, "parameters": c["parameters"]},
                }
                for c in configs
            ]
        return spec

    def claim(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.api.call(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
        )

    def claim_template(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.api.call(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaimtemplates",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": name},
                    "spec": {"spec": spec},
                },
            )
        )

    def pod(
        self,
        name: str,
        claims: Sequence[str] = (),
        templates: Sequence[str] = (),
        image: str = "local/pause:1",
    ) -> dict[str, Any]:
        """A Pod using the named claims (``resourceClaimName``) and claim templates."""
        refs = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
        refs += [{"name": f"t{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "resources": {"claims": [{"name": r["name"]} for r in refs]},
                    }
                ],
                "resourceClaims": refs,
                "terminationGracePeriodSeconds": 5,
            },
        }
        return dict(self.api.call("POST", f"/api/v1/namespaces/{self.ns}/pods", body))

    def claim_and_pod(
        self,
        name: str,
        device_class: str,
        selector: str | None = None,
        configs: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """A claim ``name`` and a Pod ``name`` using it; the Pod as created."""
        self.claim(name, self.claim_spec(device_class, selector, configs))
        return self.pod(name, claims=[name])

    def get_pod(self, name: str) -> dict[str, Any] | None:
        obj = self.api.call("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}", ok=(200, 404))
        return None if obj.get("kind") == "Status" else dict(obj)

    def get_claim(self, name: str) -> dict[str, Any]:
        return dict(self.api.get(f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims/{name}"))

    def delete_pod(self, name: str) -> None:
        self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}", ok=(200, 202, 404))

    def delete_claim(self, name: str) -> None:
        self.api.call(
            "DELETE",
            f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims/{name}",
            ok=(200, 202, 404),
        )

    def events(self, pod: str | None = None) -> list[dict[str, Any]]:
        items = self.api.get(f"/api/v1/namespaces/{self.ns}/events")["items"]
        return [e for e in items if pod is None or e["involvedObject"].get("name") == pod]

    # -- waits ------------------------------------------------------------------------------

    async def wait_phase(self, name: str, phase: str = "Running", within: float = 60.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            pod = self.get_pod(name)
            return pod if pod and (pod.get("status") or {}).get("phase") == phase else None

        try:
            return await eventually(check, within, f"pod {self.ns}/{name} {phase}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; events: {[e['message'] for e in self.events(name)][-5:]}") from None

    async def wait_gone(self, name: str, within: float = 60.0) -> None:
        await eventually(lambda: self.get_pod(name) is None, within, f"pod {self.ns}/{name} deleted")

    async def wait_event(self, pod: str, contains: str, within: float = 60.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            return next((e for e in self.events(pod) if contains in e.get("message", "")), None)

        return await eventually(check, within, f"an event of pod {pod} containing {contains!r}")

    async def wait_claim(
        self, name: str, pred: Callable[[dict[str, Any]], bool], within: float = 30.0
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            claim = self.get_claim(name)
            return claim if pred(claim) else None

        return await eventually(check, within, f"claim {self.ns}/{name}")

    # -- the node ----------------------------------------------------------------------------

    async def pod_netns(self, name: str) -> str:
        """The name (under /var/run/netns) of the running Pod's network namespace, from CRI."""
        pod = self.get_pod(name)
        assert pod is not None, f"pod {self.ns}/{name} does not exist"
        uid = pod["metadata"]["uid"]
        assert self.c.containerd is not None
        async with CriClient(self.c.containerd.grpc_socket) as cri:
            boxes = await cri.list_pod_sandboxes({"io.kubernetes.pod.uid": uid}, ready_only=True)
            assert boxes, f"no ready sandbox for pod {self.ns}/{name}"
            status = await cri.pod_sandbox_status(boxes[0].id)
        assert status.netns_path, f"pod {self.ns}/{name}: no network namespace in its sandbox status"
        return status.netns_path.rsplit("/", 1)[-1]

    def published(self) -> dict[str, dict[str, Any]]:
        """Device name -> device, over this node's ResourceSlices."""
        items = self.api.get(
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={self.c.node_name}"
        )["items"]
        # A slice whose last device went has "devices": null.
        return {d["name"]: d for s in items for d in (s["spec"].get("devices") or [])}

    async def wait_published(self, *devices: str, within: float = 30.0) -> dict[str, dict[str, Any]]:
        def check() -> dict[str, dict[str, Any]] | None:
            published = self.published()
            return published if set(devices) <= set(published) else None

        return await eventually(check, within, f"devices {devices} published")


def ip_json(netns: str | None, *args: str) -> Any:
    cmd = ["ip", "-j", *(["-n", netns] if netns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return json.loads(res.stdout or "[]") if res.returncode == 0 else []


def link(netns: str | None, name: str) -> dict[str, Any] | None:
    got = ip_json(netns, "link", "show", "dev", name)
    return got[0] if got else None


def addresses(netns: str | None, name: str) -> list[str]:
    return [
        f"{a['local']}/{a['prefixlen']}"
        for itf in ip_json(netns, "addr", "show", "dev", name)
        for a in itf.get("addr_info", [])
        if a.get("scope") == "global"
    ]
