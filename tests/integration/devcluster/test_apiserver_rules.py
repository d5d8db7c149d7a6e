"""What the API server refuses and how it selects: schema and DRA validation rules with the real
messages, field and label selectors, pagination, deletecollection."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from .test_apiserver_client import claim_body, error_body, slice_body

JSON = dict[str, Any]


async def refused(coro: Any) -> tuple[int, JSON]:
    with pytest.raises(ApiException) as err:
        await coro
    return err.value.status, error_body(err.value)


async def test_slice_with_129_devices_is_invalid(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    code, status = await refused(r.create_resource_slice(slice_body("big", "node1", devices=129)))
    assert code == 422
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'ResourceSlice.resource.k8s.io "big" is invalid: spec.devices: Too many: 129: must have at most 128 items'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueTooMany",
            "message": "Too many: 129: must have at most 128 items",
            "field": "spec.devices",
        }
    ]
    created = await r.create_resource_slice(slice_body("full", "node1", devices=128))
    assert len(created.spec.devices) == 128


async def test_slice_with_a_bad_attribute_name_is_invalid(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    body = slice_body("bad", "node1")
    body["spec"]["devices"][1]["attributes"]["dra.net/if-name"] = {"string": "eth1"}
    code, status = await refused(r.create_resource_slice(body))
    assert code == 422
    (cause,) = status["details"]["causes"]
    assert cause["field"] == "spec.devices[1].attributes"
    assert cause["message"].startswith('Invalid value: "if-name": a valid C identifier must start with')


async def test_slice_with_an_unknown_field_is_refused(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    body = slice_body("typo", "node1")
    body["spec"]["devices"][0]["basic"] = {"attributes": {}}  # the v1beta1 shape
    code, status = await refused(r.create_resource_slice(body))
    # fieldValidation=Strict: the decoder refuses it before validation, as a 400 naming the field.
    assert code == 400
    assert status["message"] == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: strict decoding error: '
        'unknown field "spec.devices[0].basic"'
    )
    # fieldValidation=Warn (the real server's default when none is asked for): dropped, with a warning.
    resp = await r.create_resource_slice(body, field_validation="Warn", _preload_content=False)
    assert resp.status == 201
    assert resp.headers.getall("Warning") == ['299 - "unknown field \\"spec.devices[0].basic\\""']
    stored = await r.read_resource_slice("typo")
    assert stored.spec.devices[0].name == "eth0"


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda s: s["spec"].pop("driver"), "spec.driver", "Required value"),
        (lambda s: s["spec"].update(driver="Not_A.Driver"), "spec.driver", "Invalid value"),
        (
            lambda s: s["spec"]["pool"].update(resourceSliceCount=0),
            "spec.pool.resourceSliceCount",
            "must be greater",
        ),
        (lambda s: s["spec"].update(allNodes=True), "spec", "but multiple fields are set"),
        (lambda s: s["spec"].pop("nodeName"), "spec", "exactly one of `nodeName`"),
        (lambda s: s["spec"]["devices"][1].update(name="eth0"), "spec.devices[1]", 'Duplicate value: "eth0"'),
        (lambda s: s["spec"]["devices"][0].update(name="Eth0"), "spec.devices[0].name", "RFC 1123 label"),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({"dra.net/alias": {"string": "x" * 65}}),
            "spec.devices[0].attributes[dra.net/alias].string",
            "Too long: may not be more than 64 bytes",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({"dra.net/x": {"string": "a", "int": 1}}),
            "spec.devices[0].attributes[dra.net/x]",
            "exactly one value must be specified",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({f"a{i}": {"int": i} for i in range(30)}),
            "spec.devices[0]",
            "the total number of attributes and capacities must not exceed 32",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({"v": {"version": "1.2"}}),
            "spec.devices[0].attributes[v].version",
            "semver.org spec 2.0.0",
        ),
    ],
)
async def test_slice_rules(kube: client.ApiClient, mutate: Any, field: str, message: str) -> None:
    body = slice_body("s", "node1")
    mutate(body)
    code, status = await refused(client.ResourceV1Api(kube).create_resource_slice(body))
    assert code == 422, status
    causes = status["details"]["causes"]
    assert any(c["field"] == field and message in c["message"] for c in causes), causes


async def test_slice_driver_pool_and_node_are_immutable(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("s", "node1"))
    for patch, field in (
        ({"spec": {"driver": "other.example.com"}}, "spec.driver"),
        ({"spec": {"pool": {"name": "node2"}}}, "spec.pool.name"),
        ({"spec": {"nodeName": "node2"}}, "spec.nodeName"),
    ):
        code, status = await refused(
            r.patch_resource_slice("s", patch, _content_type="application/merge-patch+json")
        )
        assert code == 422
        assert any(
            c["field"] == field and "field is immutable" in c["message"] for c in status["details"]["causes"]
        )


async def test_claim_status_limits(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_namespaced_resource_claim("default", claim_body("c"))
    alloc = {
        "devices": {"results": [{"request": "nic", "driver": "dra.net", "pool": "node1", "device": "eth0"}]}
    }
    await r.patch_namespaced_resource_claim_status(
        "c", "default", {"status": {"allocation": alloc}}, _content_type="application/merge-patch+json"
    )
    cond = {"status": "True", "reason": "Ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    device = {
        "driver": "dra.net",
        "pool": "node1",
        "device": "eth0",
        "conditions": [dict(cond, type=f"T{i}") for i in range(9)],
        "networkData": {"ips": ["192.0.2.1/24", "10.0.0.01/8"], "interfaceName": "x" * 257},
    }
    code, status = await refused(
        r.patch_namespaced_resource_claim_status(
            "c", "default", {"status": {"devices": [device]}}, _content_type="application/merge-patch+json"
        )
    )
    assert code == 422
    fields = {c["field"]: c["message"] for c in status["details"]["causes"]}
    assert fields["status.devices[0].conditions"] == "Too many: 9: must have at most 8 items"
    assert fields["status.devices[0].networkData.interfaceName"] == "Too long: may not be more than 256 bytes"
    assert fields["status.devices[0].networkData.ips[1]"].startswith('Invalid value: "10.0.0.01/8"')


async def test_claim_spec_rules(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    body = claim_body("c")
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.driver =="}}
    ]
    body["spec"]["devices"]["config"] = [
        {"requests": ["missing"], "opaque": {"driver": "dra.net", "parameters": {}}}
    ]
    code, status = await refused(r.create_namespaced_resource_claim("default", body))
    assert code == 422
    fields = [c["field"] for c in status["details"]["causes"]]
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in fields
    assert "spec.devices.config[0].requests[0]" in fields


async def test_field_selectors_follow_what_each_resource_indexes(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    core = client.CoreV1Api(kube)
    await r.create_resource_slice(slice_body("a", "node1"))
    await r.create_resource_slice(slice_body("b", "node2", driver="gpu.example.com"))
    names = [
        s.metadata.name
        for s in (await r.list_resource_slice(field_selector="spec.driver=gpu.example.com")).items
    ]
    assert names == ["b"]
    names = [s.metadata.name for s in (await r.list_resource_slice(field_selector="metadata.name=a")).items]
    assert names == ["a"]
    # The real server indexes only metadata.name, spec.nodeName and spec.driver for slices.
    code, status = await refused(r.list_resource_slice(field_selector="spec.pool.name=node1"))
    assert code == 400
    assert status["message"] == (
        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool.name"
    )
    code, status = await refused(core.list_namespaced_pod("default", field_selector="spec.bogus=x"))
    assert (code, status["message"]) == (400, "field label not supported: spec.bogus")
    code, status = await refused(r.list_namespaced_resource_claim("default", field_selector="spec.x=y"))
    assert (
        status["message"]
        == '"spec.x" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )


async def test_label_selectors_equality_and_set_based(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("a", "node1", labels={"tier": "nic", "zone": "a"}))
    await r.create_resource_slice(slice_body("b", "node1", labels={"tier": "rdma", "zone": "b"}))
    await r.create_resource_slice(slice_body("c", "node1", labels={"tier": "nic"}))

    async def names(selector: str) -> list[str]:
        return [s.metadata.name for s in (await r.list_resource_slice(label_selector=selector)).items]

    assert await names("tier=nic") == ["a", "c"]
    assert await names("tier!=nic") == ["b"]
    assert await names("tier in (nic,rdma),zone") == ["a", "b"]
    assert await names("zone notin (a)") == ["b", "c"]
    assert await names("!zone") == ["c"]
    code, status = await refused(r.list_resource_slice(label_selector="tier in nic"))
    assert code == 400 and status["reason"] == "BadRequest"


async def test_limit_and_continue_give_a_consistent_snapshot(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    for i in range(5):
        await r.create_resource_slice(slice_body(f"s{i}", "node1"))
    page1 = await r.list_resource_slice(limit=2)
    assert [s.metadata.name for s in page1.items] == ["s0", "s1"]
    assert page1.metadata.remaining_item_count == 3
    # Changes after the first page do not show up in the rest of this list.
    await r.delete_resource_slice("s3")
    await r.create_resource_slice(slice_body("s5", "node1"))
    page2 = await r.list_resource_slice(limit=2, _continue=page1.metadata._continue)
    page3 = await r.list_resource_slice(limit=2, _continue=page2.metadata._continue)
    assert [s.metadata.name for s in page2.items + page3.items] == ["s2", "s3", "s4"]
    assert page3.metadata._continue is None
    assert page3.metadata.resource_version == page1.metadata.resource_version


async def test_deletecollection_with_a_label_selector(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    await r.create_resource_slice(slice_body("a", "node1", labels={"owner": "me"}))
    await r.create_resource_slice(slice_body("b", "node1", labels={"owner": "me"}))
    await r.create_resource_slice(slice_body("c", "node1", labels={"owner": "you"}))
    # The answer is the list of deleted slices (the client's model calls it a V1Status; read it raw).
    resp = await r.delete_collection_resource_slice(label_selector="owner=me", _preload_content=False)
    deleted = json.loads(await resp.read())
    assert deleted["kind"] == "ResourceSliceList"
    assert sorted(s["metadata"]["name"] for s in deleted["items"]) == ["a", "b"]
    assert [s.metadata.name for s in (await r.list_resource_slice()).items] == ["c"]


async def test_create_rules_shared_by_all_types(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    created = await r.create_resource_slice(
        {**slice_body("", "node1"), "metadata": {"generateName": "node1-dra.net-"}}
    )
    assert created.metadata.name.startswith("node1-dra.net-") and len(created.metadata.name) == 19
    assert created.metadata.uid and created.metadata.creation_timestamp and created.metadata.generation == 1
    code, status = await refused(r.create_resource_slice(slice_body(created.metadata.name, "node1")))
    assert (code, status["reason"]) == (409, "AlreadyExists")
    assert status["message"] == f'resourceslices.resource.k8s.io "{created.metadata.name}" already exists'
    code, status = await refused(r.create_namespaced_resource_claim("nowhere", claim_body("c", "nowhere")))
    assert (code, status["message"]) == (404, 'namespaces "nowhere" not found')
    bad = copy.deepcopy(slice_body("Bad_Name", "node1"))
    code, status = await refused(r.create_resource_slice(bad))
    assert code == 422 and status["details"]["causes"][0]["field"] == "metadata.name"


async def test_exact_list_at_an_older_version_shows_the_object_as_it_was(kube: client.ApiClient) -> None:
    r = client.ResourceV1Api(kube)
    before = await r.create_resource_slice(slice_body("s", "node1"))
    await r.patch_resource_slice(
        "s", {"spec": {"pool": {"generation": 2}}}, _content_type="application/merge-patch+json"
    )
    old = await r.list_resource_slice(
        resource_version=before.metadata.resource_version, resource_version_match="Exact"
    )
    (item,) = old.items
    assert item.metadata.resource_version == before.metadata.resource_version
    assert (item.spec.pool.generation, item.metadata.generation) == (1, 1)
    assert old.metadata.resource_version == before.metadata.resource_version
    now = await r.read_resource_slice("s")
    assert (now.spec.pool.generation, now.metadata.generation) == (2, 2)
