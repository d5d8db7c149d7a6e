"""The API server through the machine's kubectl (v1.32 client): discovery, OpenAPI v3, client-side and
server-side apply, server-side printing, deletion with --wait, and kubectl's own error messages."""

from __future__ import annotations

import json

from kubernetes_asyncio import client

from .conftest import KubectlFn
from .test_apiserver_client import slice_body

DEVICE_CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: dranet
spec:
  selectors:
  - cel:
      expression: device.driver == "dra.net"
"""

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: nic
  namespace: default
  labels: {app: demo}
spec:
  devices:
    requests:
    - name: nic
      exactly:
        deviceClassName: dranet
"""


async def test_get_resourceslices_prints_the_server_side_columns(
    kubectl: KubectlFn, kube: client.ApiClient
) -> None:
    empty = await kubectl("get", "resourceslices")
    assert empty.code == 0, empty.err
    assert "No resources found" in empty.err
    await client.ResourceV1Api(kube).create_resource_slice(slice_body("node1-dra.net-x", "node1"))
    out = await kubectl("get", "resourceslices")
    assert out.code == 0, out.err
    header, row = out.out.splitlines()
    assert header.split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert row.split()[:4] == ["node1-dra.net-x", "node1", "dra.net", "node1"]


async def test_apply_get_yaml_reapply_and_delete(kubectl: KubectlFn) -> None:
    created = await kubectl("apply", "-f", "-", stdin=DEVICE_CLASS + "---" + CLAIM)
    assert created.code == 0, created.err
    assert created.out.splitlines() == [
        "deviceclass.resource.k8s.io/dranet created",
        "resourceclaim.resource.k8s.io/nic created",
    ]
    # kubectl 1.32 does not know resource.k8s.io/v1, so it sends a JSON merge patch; the live
    # request list carries server defaults (allocationMode, count), so kubectl sends the list again
    # and says "configured", as against a real cluster. The server re-defaults it: nothing changes.
    before = json.loads((await kubectl("get", "resourceclaim", "nic", "-o", "json")).out)
    again = await kubectl("apply", "-f", "-", stdin=CLAIM)
    assert again.out.strip() == "resourceclaim.resource.k8s.io/nic configured", again.err
    after = json.loads((await kubectl("get", "resourceclaim", "nic", "-o", "json")).out)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    relabeled = await kubectl("apply", "-f", "-", stdin=CLAIM.replace("app: demo", "app: demo2"))
    assert relabeled.out.strip() == "resourceclaim.resource.k8s.io/nic configured", relabeled.err

    got = await kubectl("get", "resourceclaim", "nic", "-o", "json")
    assert got.code == 0, got.err
    claim = json.loads(got.out)
    assert claim["metadata"]["labels"] == {"app": "demo2"}
    assert claim["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "dranet",
        "allocationMode": "ExactCount",
        "count": 1,
    }
    as_yaml = await kubectl("get", "resourceclaim", "nic", "-o", "yaml")
    assert "kind: ResourceClaim" in as_yaml.out and "managedFields" not in as_yaml.out

    table = await kubectl("get", "resourceclaims")
    assert table.out.split()[:4] == ["NAME", "STATE", "AGE", "nic"]
    assert table.out.split()[4] == "pending"

    deleted = await kubectl("delete", "resourceclaim", "nic")
    assert deleted.code == 0, deleted.err
    assert deleted.out.strip() == 'resourceclaim.resource.k8s.io "nic" deleted'
    gone = await kubectl("get", "resourceclaim", "nic")
    assert gone.code == 1
    assert gone.err.strip() == 'Error from server (NotFound): resourceclaims.resource.k8s.io "nic" not found'


async def test_server_side_apply(kubectl: KubectlFn) -> None:
    out = await kubectl("apply", "--server-side", "-f", "-", stdin=DEVICE_CLASS)
    assert out.code == 0, out.err
    assert out.out.strip() == "deviceclass.resource.k8s.io/dranet serverside-applied"
    got = json.loads(
        (await kubectl("get", "deviceclass", "dranet", "-o", "json", "--show-managed-fields")).out
    )
    assert [(m["manager"], m["operation"]) for m in got["metadata"]["managedFields"]] == [
        ("kubectl", "Apply")
    ]


async def test_get_pods_and_missing_objects(kubectl: KubectlFn) -> None:
    pods = await kubectl("get", "pods")
    assert pods.code == 0, pods.err
    assert pods.err.strip() == "No resources found in default namespace."
    missing = await kubectl("get", "pod", "nope")
    assert missing.code == 1
    assert missing.err.strip() == 'Error from server (NotFound): pods "nope" not found'
    missing_ns = await kubectl("get", "pods", "-n", "nowhere")
    assert missing_ns.err.strip() == "No resources found in nowhere namespace."
    create_in_missing = await kubectl(
        "apply", "-n", "nowhere", "-f", "-", stdin=CLAIM.replace("namespace: default", "")
    )
    assert create_in_missing.code == 1
    assert 'namespaces "nowhere" not found' in create_in_missing.err


async def test_invalid_objects_are_reported_by_kubectl(kubectl: KubectlFn) -> None:
    body = slice_body("bad", "node1")
    body["spec"]["devices"][0]["attributes"]["bad name"] = {"string": "x"}
    out = await kubectl("create", "-f", "-", stdin=json.dumps(body))
    assert out.code == 1
    assert out.err.startswith(
        'The ResourceSlice "bad" is invalid: spec.devices[0].attributes: Invalid value: "bad name"'
    )
    body = slice_body("unknown", "node1")
    body["spec"]["devices"][0]["basic"] = {}
    out = await kubectl("create", "-f", "-", stdin=json.dumps(body))
    assert out.code == 1
    assert 'strict decoding error: unknown field "spec.devices[0].basic"' in out.err
