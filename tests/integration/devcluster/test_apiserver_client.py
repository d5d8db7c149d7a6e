"""The API server through kubernetes-asyncio, used exactly as our services use it: ResourceV1Api and
CoreV1Api with dict bodies; list, watch (resume, bookmarks, 410), optimistic concurrency (409) and
the three ways of writing a claim's status (merge, strategic merge, server-side apply)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from services.devcluster.apiserver import ApiServer

JSON = dict[str, Any]
SSA = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def slice_body(
    name: str, node: str, devices: int = 2, driver: str = "dra.net", labels: JSON | None = None
) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"eth{i}",
                    "attributes": {
                        "dra.net/ifName": {"string": f"eth{i}"},
                        "dra.net/mtu": {"int": 1500},
                        "dra.net/rdma": {"bool": False},
                    },
                }
                for i in range(devices)
            ],
        },
    }


def claim_body(name: str, namespace: str = "default") -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet"}}]}},
    }


def allocation(devices: list[str], pool: str = "node1") -> JSON:
    return {
        "devices": {
            "results": [{"request": "nic", "driver": "dra.net", "pool": pool, "device": d} for d in devices],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
            ]
        },
    }


def ready(reason: str = "Configured", status: str = "True") -> JSON:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def error_body(exc: ApiException) -> JSON:
    body: JSON = json.loads(exc.body)
    return body


async def test_list_and_field_selector_by_node(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("n1-slice", "node1"))
    await r.create_resource_slice(slice_body("n2-slice", "node2"))
    lst = await r.list_resource_slice(field_selector="spec.nodeName=node1")
    assert [s.metadata.name for s in lst.items] == ["n1-slice"]
    assert lst.items[0].spec.devices[1].attributes["dra.net/ifName"].string == "eth1"
    assert int(lst.metadata.resource_version) >= int(lst.items[0].metadata.resource_version)
    by_driver = await r.list_resource_slice(field_selector="spec.driver=dra.net,metadata.name!=n1-slice")
    assert [s.metadata.name for s in by_driver.items] == ["n2-slice"]


async def test_watch_from_list_version_sees_changes_in_order(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("before", "node1"))
    lst = await r.list_resource_slice(field_selector="spec.nodeName=node1")
    rv = lst.metadata.resource_version

    async def writer() -> None:
        await r.create_resource_slice(slice_body("s1", "node1"))
        await r.create_resource_slice(slice_body("other-node", "node2"))
        body = slice_body("s1", "node1", devices=3)
        await r.patch_resource_slice("s1", {"spec": {"devices": body["spec"]["devices"]}})
        await r.delete_resource_slice("s1")

    task = asyncio.create_task(writer())
    seen: list[tuple[str, str, int]] = []
    async with watch.Watch() as w:
        async for ev in w.stream(
            r.list_resource_slice,
            field_selector="spec.nodeName=node1",
            resource_version=rv,
            timeout_seconds=5,
        ):
            obj = ev["object"]
            seen.append((ev["type"], obj.metadata.name, len(obj.spec.devices)))
            if ev["type"] == "DELETED":
                break
    await task
    assert seen == [("ADDED", "s1", 2), ("MODIFIED", "s1", 3), ("DELETED", "s1", 3)]


async def test_watch_resumed_from_a_version_replays_only_later_events(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    first = await r.create_resource_slice(slice_body("a", "node1"))
    await r.create_resource_slice(slice_body("b", "node1"))
    await r.delete_resource_slice("a")
    events = []
    async with watch.Watch() as w:
        async for ev in w.stream(
            r.list_resource_slice, resource_version=first.metadata.resource_version, timeout_seconds=2
        ):
            events.append((ev["type"], ev["object"].metadata.name))
            if len(events) == 2:
                break
    assert events == [("ADDED", "b"), ("DELETED", "a")]


async def test_watch_without_version_starts_with_current_state(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("x", "node1"))
    async with watch.Watch() as w:
        async for ev in w.stream(r.list_resource_slice, timeout_seconds=2):
            assert (ev["type"], ev["object"].metadata.name) == ("ADDED", "x")
            break


async def test_watch_sends_a_bookmark_before_its_timeout(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    lst = await r.list_resource_slice()
    kinds = []
    async with watch.Watch() as w:
        async for ev in w.stream(
            r.list_resource_slice,
            resource_version=lst.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=3,
        ):
            kinds.append(ev["type"])
            if ev["type"] == "BOOKMARK":
                assert ev["object"]["kind"] == "ResourceSlice"
                assert int(ev["object"]["metadata"]["resourceVersion"]) >= int(lst.metadata.resource_version)
                break
    assert kinds == ["BOOKMARK"]


@pytest.mark.parametrize("api_server", [{"history_size": 3}], indirect=True)
async def test_watch_from_a_version_older_than_the_history_is_gone(
    kube: client.ApiClient, api_server: ApiServer
) -> None:
    r = client.ResourceV1Api(kube)
    first = await r.create_resource_slice(slice_body("s0", "node1"))
    for i in range(1, 6):
        await r.create_resource_slice(slice_body(f"s{i}", "node1"))
    with pytest.raises(ApiException) as gone:
        async with watch.Watch() as w:
            async for _ in w.stream(
                r.list_resource_slice, resource_version=first.metadata.resource_version, timeout_seconds=2
            ):
                pass
    assert gone.value.status == 410
    # On the wire: HTTP 200 and one ERROR event carrying the real Status, then the stream ends.
    resp = await r.list_resource_slice(
        watch=True, resource_version=first.metadata.resource_version, _preload_content=False
    )
    assert resp.status == 200
    lines = (await resp.read()).decode().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"].startswith(f"too old resource version: {first.metadata.resource_version} (")


async def test_stale_update_is_a_409_conflict(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("s", "node1"))
    current = await r.list_resource_slice(_preload_content=False)
    body = json.loads(await current.read())["items"][0]
    body["apiVersion"], body["kind"] = "resource.k8s.io/v1", "ResourceSlice"
    body["spec"]["pool"]["generation"] = 2
    updated = await r.replace_resource_slice("s", body)
    assert updated.metadata.generation == 2  # a spec change bumps metadata.generation
    body["spec"]["pool"]["generation"] = 3  # still carries the old resourceVersion
    with pytest.raises(ApiException) as conflict:
        await r.replace_resource_slice("s", body)
    assert conflict.value.status == 409
    status = error_body(conflict.value)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert status["details"] == {"name": "s", "group": "resource.k8s.io", "kind": "resourceslices"}


async def test_identical_update_keeps_the_resource_version(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    created = await r.create_resource_slice(slice_body("s", "node1"))
    again = await r.patch_resource_slice("s", {"metadata": {"labels": None}})
    assert again.metadata.resource_version == created.metadata.resource_version


async def test_claim_status_through_merge_strategic_and_server_side_apply(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    created = await r.create_namespaced_resource_claim("default", claim_body("c1"))
    # Status sent on create is dropped, as the real strategy does.
    assert created.status is None or created.status.allocation is None

    # The scheduler's part, as a merge patch on the status subresource.
    allocated = await r.patch_namespaced_resource_claim_status(
        "c1",
        "default",
        {"status": {"allocation": allocation(["eth1", "eth2"])}},
        _content_type=MERGE,
    )
    assert [d.device for d in allocated.status.allocation.devices.results] == ["eth1", "eth2"]

    # reservedFor is merged by uid in a strategic merge patch (the library's default for dicts).
    pod_a = {"resource": "pods", "name": "a", "uid": "11111111-1111-1111-1111-111111111111", "apiGroup": ""}
    pod_b = {"resource": "pods", "name": "b", "uid": "22222222-2222-2222-2222-222222222222", "apiGroup": ""}
    await r.patch_namespaced_resource_claim_status("c1", "default", {"status": {"reservedFor": [pod_a]}})
    both = await r.patch_namespaced_resource_claim_status(
        "c1", "default", {"status": {"reservedFor": [pod_b]}}
    )
    assert [c.name for c in both.status.reserved_for] == ["a", "b"]

    # The driver's status, by server-side apply exactly as dranet writes it.
    def applied(devices: list[JSON]) -> JSON:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "default"},
            "status": {"devices": devices},
        }

    eth1 = {
        "driver": "dra.net",
        "pool": "node1",
        "device": "eth1",
        "conditions": [ready()],
        "networkData": {
            "interfaceName": "eth1",
            "ips": ["192.0.2.5/24"],
            "hardwareAddress": "02:00:00:00:00:01",
        },
    }
    eth2 = {"driver": "dra.net", "pool": "node1", "device": "eth2", "conditions": [ready()]}
    out = await r.patch_namespaced_resource_claim_status(
        "c1", "default", applied([eth1, eth2]), field_manager="dra.net", force=True, _content_type=SSA
    )
    assert [d.device for d in out.status.devices] == ["eth1", "eth2"]
    assert out.status.devices[0].network_data.ips == ["192.0.2.5/24"]
    managers = {(m.manager, m.operation, m.subresource) for m in out.metadata.managed_fields}
    assert ("dra.net", "Apply", "status") in managers

    # Another manager adds its own entry; dra.net then stops applying eth2: only eth2 goes.
    other = {"driver": "other.example.com", "pool": "node1", "device": "eth1", "conditions": [ready()]}
    with pytest.raises(ApiException) as not_allocated:
        await r.patch_namespaced_resource_claim_status(
            "c1", "default", applied([other]), field_manager="other", force=True, _content_type=SSA
        )
    assert not_allocated.value.status == 422
    assert "must be an allocated device in the claim" in error_body(not_allocated.value)["message"]

    out = await r.patch_namespaced_resource_claim_status(
        "c1", "default", applied([eth1]), field_manager="dra.net", force=True, _content_type=SSA
    )
    assert [d.device for d in out.status.devices] == ["eth1"]
    assert out.status.allocation is not None and len(out.status.reserved_for) == 2

    # A different manager setting dra.net's condition differently conflicts unless forced.
    changed = dict(eth1, conditions=[ready("Broken", "False")])
    with pytest.raises(ApiException) as conflict:
        await r.patch_namespaced_resource_claim_status(
            "c1", "default", applied([changed]), field_manager="intruder", _content_type=SSA
        )
    assert conflict.value.status == 409
    status = error_body(conflict.value)
    assert status["reason"] == "Conflict"
    assert status["message"].startswith(
        'Apply failed with 2 conflicts: conflicts with "dra.net" using resource.k8s.io/v1:\n'
        '- .status.devices[device="eth1",driver="dra.net",pool="node1"].conditions[type="Ready"].reason'
    )
    assert any(c["reason"] == "FieldManagerConflict" for c in status["details"]["causes"])
    forced = await r.patch_namespaced_resource_claim_status(
        "c1", "default", applied([changed]), field_manager="intruder", force=True, _content_type=SSA
    )
    assert forced.status.devices[0].conditions[0].reason == "Broken"


async def test_status_and_spec_are_written_only_through_their_own_endpoints(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_namespaced_resource_claim("default", claim_body("c1"))
    # Through the main resource, a status change is ignored (and the claim spec is immutable).
    out = await r.patch_namespaced_resource_claim(
        "c1", "default", {"status": {"allocation": allocation(["eth1"])}}, _content_type=MERGE
    )
    assert out.status is None or out.status.allocation is None
    with pytest.raises(ApiException) as immutable:
        await r.patch_namespaced_resource_claim(
            "c1",
            "default",
            {"spec": {"devices": {"requests": [{"name": "other", "exactly": {"deviceClassName": "x"}}]}}},
            _content_type=MERGE,
        )
    assert immutable.value.status == 422
    assert error_body(immutable.value)["details"]["causes"][0]["field"] == "spec"
    # Through the status subresource, a spec change is ignored.
    out = await r.patch_namespaced_resource_claim_status(
        "c1",
        "default",
        {"spec": {"devices": {"requests": []}}, "status": {"allocation": allocation(["eth1"])}},
        _content_type=MERGE,
    )
    assert out.spec.devices.requests[0].name == "nic"
    assert out.status.allocation.devices.results[0].device == "eth1"
    # An allocation, once set, cannot be changed.
    with pytest.raises(ApiException) as fixed:
        await r.patch_namespaced_resource_claim_status(
            "c1", "default", {"status": {"allocation": allocation(["eth9"])}}, _content_type=MERGE
        )
    assert fixed.value.status == 422
    assert error_body(fixed.value)["details"]["causes"][0]["field"] == "status.allocation"


async def test_watch_with_initial_events_ends_them_with_a_bookmark(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("a", "node1"))
    await r.create_resource_slice(slice_body("b", "node1"))
    seen: list[tuple[str, Any]] = []
    async with watch.Watch() as w:
        async for ev in w.stream(
            r.list_resource_slice,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        ):
            if ev["type"] == "BOOKMARK":
                seen.append(("BOOKMARK", ev["object"]["metadata"].get("annotations")))
                break
            seen.append((ev["type"], ev["object"].metadata.name))
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", {"k8s.io/initial-events-end": "true"})]


@pytest.mark.parametrize("api_server", [{"bookmark_interval": 0.2}], indirect=True)
async def test_periodic_bookmarks_interleave_with_events(
    kube: client.ApiClient, api_server: ApiServer
) -> None:
    r = client.ResourceV1Api(kube)
    lst = await r.list_resource_slice()

    async def writer() -> None:
        for i in range(20):
            await r.create_resource_slice(slice_body(f"s{i}", "node1"))
            await asyncio.sleep(0.05)

    task = asyncio.create_task(writer())
    added, bookmarks = [], 0
    async with watch.Watch() as w:
        async for ev in w.stream(
            r.list_resource_slice,
            resource_version=lst.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=10,
        ):
            if ev["type"] == "BOOKMARK":
                bookmarks += 1
            else:
                added.append(ev["object"].metadata.name)
            if len(added) == 20 and bookmarks >= 2:
                break
    await task
    assert added == [f"s{i}" for i in range(20)]
    assert bookmarks >= 2
