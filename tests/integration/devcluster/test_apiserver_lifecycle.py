"""Object lifecycles a kubelet and controllers rely on: pod binding and graceful deletion (a pod on a
node goes Terminating until the kubelet deletes it with grace 0), delete preconditions, finalizers,
owner references (garbage collection) and namespace deletion."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.integration.devcluster.helpers import eventually

from .test_apiserver_client import claim_body, error_body, slice_body

JSON = dict[str, Any]


def pod_body(name: str, namespace: str = "default", claims: list[JSON] | None = None) -> JSON:
    spec: JSON = {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    if claims:
        spec["resourceClaims"] = claims
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def exists(call: Awaitable[Any]) -> bool:
    try:
        await call
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


async def test_pod_defaults_binding_and_graceful_deletion(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    pod = await core.create_namespaced_pod("default", pod_body("p"))
    assert pod.status.phase == "Pending"
    assert pod.spec.termination_grace_period_seconds == 30
    assert pod.spec.restart_policy == "Always" and pod.spec.scheduler_name == "default-scheduler"

    # The answer is a Status (Success, 201), which the client's V1Binding model cannot hold: read it raw.
    resp = await core.create_namespaced_binding(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p"},
            "target": {"kind": "Node", "name": "node1"},
        },
        _preload_content=False,
    )
    assert (resp.status, json.loads(await resp.read())["status"]) == (201, "Success")
    bound = await core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "node1"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as again:
        await core.create_namespaced_pod_binding(
            "p", "default", {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node2"}}
        )
    assert again.value.status == 409
    # Only the binding sets spec.nodeName; an update may not.
    with pytest.raises(ApiException) as forbidden:
        await core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "node2"}})
    assert forbidden.value.status == 422
    assert "pod updates may not change fields other than" in error_body(forbidden.value)["message"]

    rv = bound.metadata.resource_version
    events: list[tuple[str, bool]] = []

    async def watch_pod() -> None:
        async with watch.Watch() as w:
            async for ev in w.stream(
                core.list_namespaced_pod,
                "default",
                field_selector="spec.nodeName=node1",
                resource_version=rv,
                timeout_seconds=5,
            ):
                events.append((ev["type"], ev["object"].metadata.deletion_timestamp is not None))
                if ev["type"] == "DELETED":
                    return

    watcher = asyncio.create_task(watch_pod())
    # A scheduled pod is deleted gracefully: it stays, Terminating, with deletionTimestamp = now + grace.
    terminating = await core.delete_namespaced_pod("p", "default")
    assert terminating.metadata.deletion_grace_period_seconds == 30
    assert terminating.metadata.deletion_timestamp is not None
    remaining = terminating.metadata.deletion_timestamp.timestamp() - time.time()
    assert 25 < remaining <= 31
    still = await core.read_namespaced_pod("p", "default")
    assert still.metadata.deletion_timestamp is not None
    # Deleting again without a shorter grace changes nothing.
    repeat = await core.delete_namespaced_pod("p", "default")
    assert repeat.metadata.resource_version == still.metadata.resource_version
    # The kubelet, once the containers are stopped, deletes with grace 0 and a uid precondition.
    with pytest.raises(ApiException) as wrong_uid:
        await core.delete_namespaced_pod(
            "p", "default", body={"gracePeriodSeconds": 0, "preconditions": {"uid": "not-the-uid"}}
        )
    assert wrong_uid.value.status == 409
    assert "Precondition failed: UID in precondition: not-the-uid" in error_body(wrong_uid.value)["message"]
    final = await core.delete_namespaced_pod(
        "p", "default", body={"gracePeriodSeconds": 0, "preconditions": {"uid": pod.metadata.uid}}
    )
    assert final.metadata.name == "p"
    assert not await exists(core.read_namespaced_pod("p", "default"))
    await asyncio.wait_for(watcher, 5)
    assert events == [("MODIFIED", True), ("DELETED", True)]


async def test_unscheduled_pod_is_deleted_at_once(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod("default", pod_body("p"))
    await core.delete_namespaced_pod("p", "default")
    assert not await exists(core.read_namespaced_pod("p", "default"))


async def test_finalizers_hold_an_object_until_removed(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    body = claim_body("c")
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    await r.create_namespaced_resource_claim("default", body)
    held = await r.delete_namespaced_resource_claim("c", "default")
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as no_new:
        await r.patch_namespaced_resource_claim(
            "c",
            "default",
            {"metadata": {"finalizers": ["a.example.com/x"]}},
            _content_type="application/merge-patch+json",
        )
    assert no_new.value.status == 422
    await r.patch_namespaced_resource_claim(
        "c", "default", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    assert not await exists(r.read_namespaced_resource_claim("c", "default"))


async def test_delete_with_a_stale_resource_version_precondition(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    created = await r.create_resource_slice(slice_body("s", "node1"))
    await r.patch_resource_slice("s", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as stale:
        await r.delete_resource_slice(
            "s", body={"preconditions": {"resourceVersion": created.metadata.resource_version}}
        )
    assert stale.value.status == 409
    deleted = await r.delete_resource_slice("s")
    assert deleted.metadata.name == "s"  # resource.k8s.io types answer with the deleted object


async def test_garbage_collector_deletes_dependents_of_a_deleted_owner(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    r = client.ResourceV1Api(kube)
    node = await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}})
    owned = slice_body("owned", "node1")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": node.metadata.uid, "controller": True}
    ]
    await r.create_resource_slice(owned)
    assert await exists(r.read_resource_slice("owned"))
    resp = await core.delete_node("node1", _preload_content=False)
    status = json.loads(await resp.read())
    assert (status["kind"], status["status"], status["details"]["kind"]) == ("Status", "Success", "nodes")

    async def slice_gone() -> bool:
        return not await exists(r.read_resource_slice("owned"))

    await eventually(slice_gone, "the garbage collector to delete the node's slice")


async def test_orphan_propagation_keeps_dependents(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    r = client.ResourceV1Api(kube)
    node = await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}})
    owned = slice_body("owned", "node1")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": node.metadata.uid}
    ]
    await r.create_resource_slice(owned)
    await core.delete_node("node1", propagation_policy="Orphan")

    async def node_gone() -> bool:
        return not await exists(core.read_node("node1"))

    await eventually(node_gone, "the orphaning delete to finish")
    kept = await r.read_resource_slice("owned")
    assert kept.metadata.owner_references is None


async def test_deleting_a_namespace_deletes_its_content(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    r = client.ResourceV1Api(kube)
    ns = await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    assert ns.status.phase == "Active" and ns.spec.finalizers == ["kubernetes"]
    await r.create_namespaced_resource_claim("team", claim_body("c", "team"))
    # The answer is the Namespace, Terminating (the client's model says V1Status; read it raw).
    resp = await core.delete_namespace("team", _preload_content=False)
    terminating = json.loads(await resp.read())
    assert (terminating["kind"], terminating["status"]["phase"]) == ("Namespace", "Terminating")

    async def ns_gone() -> bool:
        return not await exists(core.read_namespace("team"))

    await eventually(ns_gone, "the namespace to go")
    assert not await exists(r.read_namespaced_resource_claim("c", "team"))
    with pytest.raises(ApiException) as protected:
        await core.delete_namespace("default")
    assert protected.value.status == 403


async def test_events_and_nodes(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    node = await core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node1", "labels": {"kubernetes.io/hostname": "node1"}},
        }
    )
    patched = await core.patch_node_status(
        "node1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    assert patched.status.conditions[0].type == "Ready"
    assert patched.metadata.resource_version != node.metadata.resource_version
    ev = await core.create_namespaced_event(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "claim-c.", "namespace": "default"},
            "involvedObject": {"kind": "ResourceClaim", "name": "c", "namespace": "default"},
            "reason": "FailedAllocation",
            "message": "cannot allocate all claims",
            "type": "Warning",
        },
    )
    found = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=c,reason=FailedAllocation"
    )
    assert [e.metadata.name for e in found.items] == [ev.metadata.name]
