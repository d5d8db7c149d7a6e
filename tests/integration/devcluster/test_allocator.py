"""The allocator controller against the API server double: claims allocated from CEL selectors
over dra.net attributes, pods bound, unsatisfiable pods left pending with an event and retried,
claims made from templates, reservations released and claims deallocated or deleted with the pod."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from services.devcluster.allocation import FINALIZER, POD_CLAIM_NAME_ANNOTATION
from services.devcluster.allocator import AllocatorController, _call
from tests.integration.devcluster.helpers import eventually

NS = "default"
RDMA_CLASS = 'device.driver == "dra.net" && device.attributes["dra.net"].rdma == true'


class Cluster:
    """Thin helpers over raw API calls, so the test sees exactly what a client sees."""

    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.res = client.ResourceV1Api(api)

    async def node(self, name: str, **labels: str) -> None:
        await _call(
            self.core.create_node,
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}},
        )

    async def slice(self, node: str, devices: list[dict[str, Any]], *, generation: int = 1) -> None:
        await _call(
            self.res.create_resource_slice,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-dra.net-{generation}"},
                "spec": {
                    "driver": "dra.net",
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )

    async def device_class(
        self, name: str, expression: str, config: list[dict[str, Any]] | None = None
    ) -> None:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
        if config:
            spec["config"] = config
        await _call(
            self.res.create_device_class,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    async def claim(self, name: str, device_class: str, **extra: Any) -> dict[str, Any]:
        return await _call(
            self.res.create_namespaced_resource_claim,
            NS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "nic", "exactly": {"deviceClassName": device_class}}],
                        **extra,
                    }
                },
            },
        )

    async def template(self, name: str, device_class: str) -> None:
        await _call(
            self.res.create_namespaced_resource_claim_template,
            NS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": {
                    "metadata": {"labels": {"app": "net"}},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "nic", "exactly": {"deviceClassName": device_class}}]
                        }
                    },
                },
            },
        )

    async def pod(self, name: str, claims: list[dict[str, str]], **spec: Any) -> dict[str, Any]:
        return await _call(
            self.core.create_namespaced_pod,
            NS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "pause"}], "resourceClaims": claims, **spec},
            },
        )

    async def get_pod(self, name: str) -> dict[str, Any]:
        return await _call(self.core.read_namespaced_pod, name, NS)

    async def get_claim(self, name: str) -> dict[str, Any] | None:
        items = (await _call(self.res.list_namespaced_resource_claim, NS))["items"]
        return next((c for c in items if c["metadata"]["name"] == name), None)

    async def claims(self) -> list[dict[str, Any]]:
        return (await _call(self.res.list_namespaced_resource_claim, NS))["items"]

    async def events(self, pod: str) -> list[tuple[str, str]]:
        items = (await _call(self.core.list_namespaced_event, NS))["items"]
        return [(e["reason"], e["message"]) for e in items if e["involvedObject"]["name"] == pod]

    async def delete_pod(self, name: str) -> None:
        await _call(self.core.delete_namespaced_pod, name, NS, body={"gracePeriodSeconds": 0})


def nic(name: str, *, rdma: bool, numa: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "dra.net/ifName": {"string": name},
            "dra.net/rdma": {"bool": rdma},
            "dra.net/numaNode": {"int": numa},
        },
    }


@pytest.fixture
async def cluster(kube: client.ApiClient) -> Cluster:
    return Cluster(kube)


async def bound_node(cluster: Cluster, pod: str) -> str | None:
    return (await cluster.get_pod(pod))["spec"].get("nodeName")


async def test_claim_allocated_by_cel_selector_over_dranet_attributes(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth0", rdma=False), nic("eth1", rdma=True)])
    params = {"interface": {"mtu": 9000}}
    await cluster.device_class(
        "rdma", RDMA_CLASS, config=[{"opaque": {"driver": "dra.net", "parameters": params}}]
    )
    await cluster.claim(
        "fast",
        "rdma",
        config=[{"requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": {"routes": []}}}],
    )
    pod = await cluster.pod("p1", [{"name": "net", "resourceClaimName": "fast"}])

    assert await eventually(lambda: bound_node(cluster, "p1"), "p1 bound") == "n1"
    claim = await cluster.get_claim("fast")
    assert claim is not None
    assert claim["status"]["allocation"] == {
        "devices": {
            "results": [{"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth1"}],
            "config": [
                {"source": "FromClass", "opaque": {"driver": "dra.net", "parameters": params}},
                {"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"routes": []}}},
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "p1", "uid": pod["metadata"]["uid"]}
    ]
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert ("Scheduled", "Successfully assigned default/p1 to n1") in await cluster.events("p1")


async def test_unsatisfiable_claim_stays_pending_with_event_then_retries(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth0", rdma=False)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.claim("fast", "rdma")
    await cluster.pod("p1", [{"name": "net", "resourceClaimName": "fast"}])

    async def failed() -> list[str]:
        return [m for r, m in await cluster.events("p1") if r == "FailedScheduling"]

    (message,) = await eventually(failed, "a FailedScheduling event")
    assert message == (
        "0/1 nodes are available: n1: claim default/fast, request nic: needs 1 device(s) of class rdma; "
        "0 of 1 device(s) on node n1 match the class and request selectors, 0 of them already allocated or tainted"
    )
    assert await bound_node(cluster, "p1") is None
    claim = await cluster.get_claim("fast")
    assert claim is not None and "allocation" not in (claim.get("status") or {})

    # A new node with a matching device: the pending pod is retried and lands there.
    await cluster.node("n2")
    await cluster.slice("n2", [nic("eth3", rdma=True)])
    assert await eventually(lambda: bound_node(cluster, "p1"), "p1 bound after the slice appeared") == "n2"
    claim = await cluster.get_claim("fast")
    assert claim is not None
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "eth3"
    # a reason is reported once, not again on every retry
    reasons = await failed()
    assert reasons[0] == message and len(reasons) == len(set(reasons))


async def test_cel_runtime_error_is_reported_as_failed_scheduling(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth0", rdma=False)])
    await cluster.device_class("sriov", 'device.attributes["dra.net"].sriov == true')
    await cluster.claim("c", "sriov")
    await cluster.pod("p1", [{"name": "net", "resourceClaimName": "c"}])

    async def failed() -> list[str]:
        return [m for r, m in await cluster.events("p1") if r == "FailedScheduling"]

    (message,) = await eventually(failed, "a FailedScheduling event")
    assert (
        message == "class sriov: selector #0 on device dra.net/n1/eth0: CEL runtime error: no such key: sriov"
    )


async def test_template_claim_created_allocated_and_deleted_with_the_pod(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth1", rdma=True)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.template("nic", "rdma")
    pod = await cluster.pod("web", [{"name": "net", "resourceClaimTemplateName": "nic"}])

    assert await eventually(lambda: bound_node(cluster, "web"), "web bound") == "n1"
    pod = await cluster.get_pod("web")
    (status,) = pod["status"]["resourceClaimStatuses"]
    assert status["name"] == "net"
    claim = await cluster.get_claim(status["resourceClaimName"])
    assert claim is not None
    meta = claim["metadata"]
    assert meta["generateName"] == "web-net-" and meta["name"].startswith("web-net-")
    assert meta["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "net"}
    assert meta["labels"] == {"app": "net"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "web",
            "uid": pod["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "eth1"

    await cluster.delete_pod("web")

    async def gone() -> bool:
        return not await cluster.claims()

    await eventually(gone, "the generated claim deleted")

    # The device is free again for the next pod.
    await cluster.pod("next", [{"name": "net", "resourceClaimTemplateName": "nic"}])
    assert await eventually(lambda: bound_node(cluster, "next"), "next bound") == "n1"


async def test_user_claim_released_and_deallocated_on_pod_delete(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth1", rdma=True)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.claim("shared", "rdma")
    first = await cluster.pod("a", [{"name": "net", "resourceClaimName": "shared"}])
    assert await eventually(lambda: bound_node(cluster, "a"), "a bound") == "n1"
    # A second pod may share the allocated claim: it is reserved for both and lands on the same node.
    second = await cluster.pod("b", [{"name": "net", "resourceClaimName": "shared"}])
    assert await eventually(lambda: bound_node(cluster, "b"), "b bound") == "n1"
    claim = await cluster.get_claim("shared")
    assert claim is not None
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [
        first["metadata"]["uid"],
        second["metadata"]["uid"],
    ]

    await cluster.delete_pod("a")

    async def reserved_for_b_only() -> bool:
        c = await cluster.get_claim("shared")
        return c is not None and [r["name"] for r in c["status"].get("reservedFor") or []] == ["b"]

    await eventually(reserved_for_b_only, "a removed from reservedFor")
    claim = await cluster.get_claim("shared")
    assert claim is not None and "allocation" in claim["status"]

    await cluster.delete_pod("b")

    async def deallocated() -> dict[str, Any] | None:
        c = await cluster.get_claim("shared")
        if (
            c is not None
            and not (c.get("status") or {}).get("allocation")
            and not c["metadata"].get("finalizers")
        ):
            return c
        return None

    # Kubernetes' claim controller deallocates a claim when its last consumer goes; the user's claim stays.
    claim = await eventually(deallocated, "the user's claim deallocated and kept")
    assert "reservedFor" not in (claim.get("status") or {})


async def test_pods_compete_for_one_device_and_follow_node_selectors(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1", zone="a")
    await cluster.node("n2", zone="b")
    await cluster.slice("n1", [nic("eth1", rdma=True)])
    await cluster.slice("n2", [nic("eth1", rdma=True)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.template("nic", "rdma")
    await cluster.pod(
        "in-b", [{"name": "net", "resourceClaimTemplateName": "nic"}], nodeSelector={"zone": "b"}
    )
    assert await eventually(lambda: bound_node(cluster, "in-b"), "in-b bound") == "n2"
    await cluster.pod(
        "second-b", [{"name": "net", "resourceClaimTemplateName": "nic"}], nodeSelector={"zone": "b"}
    )

    async def failed() -> list[str]:
        return [m for r, m in await cluster.events("second-b") if r == "FailedScheduling"]

    (message,) = await eventually(failed, "second-b pending")
    assert "n2: claim default/second-b-net-" in message and "1 of them already allocated" in message
    assert "n1: node does not match the pod's nodeSelector zone=b" in message
    await cluster.pod("anywhere", [{"name": "net", "resourceClaimTemplateName": "nic"}])
    assert await eventually(lambda: bound_node(cluster, "anywhere"), "anywhere bound") == "n1"


async def test_preassigned_pod_gets_its_claims_on_its_node(
    cluster: Cluster, allocator: AllocatorController
) -> None:
    await cluster.node("n1")
    await cluster.node("n2")
    await cluster.slice("n1", [nic("eth1", rdma=True)])
    await cluster.slice("n2", [nic("eth2", rdma=True)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.claim("c", "rdma")
    await cluster.pod("pinned", [{"name": "net", "resourceClaimName": "c"}], nodeName="n2")

    async def allocated() -> str | None:
        c = await cluster.get_claim("c")
        results = (((c or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
        return results[0]["device"] if results else None

    assert await eventually(allocated, "claim allocated for the pinned pod") == "eth2"


async def test_reservation_retries_on_conflict(cluster: Cluster, api_server: Any) -> None:
    # A controller that is not running: only its write path is exercised, nothing else reacts.
    controller = await AllocatorController.from_kubeconfig(api_server.kubeconfig_path)
    await cluster.node("n1")
    await cluster.device_class("rdma", RDMA_CLASS)
    stale = await cluster.claim("c", "rdma")
    # Someone else changes the claim after we read it: our write with the old resourceVersion gets 409.
    await _call(
        cluster.res.patch_namespaced_resource_claim,
        "c",
        NS,
        {"metadata": {"labels": {"touched": "yes"}}},
        _content_type="application/merge-patch+json",
    )
    pod = {"metadata": {"name": "p", "namespace": NS, "uid": "0c9a4c1e-0000-4000-8000-000000000001"}}
    result = {
        "devices": {"results": [{"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth1"}]}
    }
    try:
        await controller._reserve(stale, pod, result)
    finally:
        await controller.stop()
    claim = await cluster.get_claim("c")
    assert claim is not None
    assert claim["metadata"]["labels"] == {"touched": "yes"}
    assert claim["status"]["allocation"] == result
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}
    ]


async def test_pod_without_claims_is_scheduled_too(cluster: Cluster, allocator: AllocatorController) -> None:
    # This control plane has no other scheduler: plain pods are bound to a fitting node as well.
    await cluster.node("n1", zone="a")
    await cluster.node("n2", zone="b")
    await cluster.pod("plain", [], nodeSelector={"zone": "b"})
    assert await eventually(lambda: bound_node(cluster, "plain"), "plain bound") == "n2"
    await cluster.pod("nowhere", [], nodeSelector={"zone": "c"})

    async def failed() -> list[str]:
        return [m for r, m in await cluster.events("nowhere") if r == "FailedScheduling"]

    (message,) = await eventually(failed, "nowhere pending")
    assert message == (
        "0/2 nodes are available: n1: node does not match the pod's nodeSelector zone=c; "
        "n2: node does not match the pod's nodeSelector zone=c"
    )


async def test_pod_deleted_while_controller_down_is_released_after_restart(
    cluster: Cluster, api_server: Any
) -> None:
    await cluster.node("n1")
    await cluster.slice("n1", [nic("eth1", rdma=True)])
    await cluster.device_class("rdma", RDMA_CLASS)
    await cluster.claim("c", "rdma")
    await cluster.pod("p", [{"name": "net", "resourceClaimName": "c"}])
    first = await AllocatorController.from_kubeconfig(api_server.kubeconfig_path)
    async with first:
        assert await eventually(lambda: bound_node(cluster, "p"), "p bound") == "n1"
    await cluster.delete_pod("p")
    second = await AllocatorController.from_kubeconfig(api_server.kubeconfig_path)
    async with second:

        async def released() -> bool:
            c = await cluster.get_claim("c")
            return c is not None and not (c.get("status") or {}).get("reservedFor")

        await eventually(released, "reservation of the deleted pod released by the restarted controller")
