"""What the next Kubernetes version's control plane shows (``DRANET_KUBE_VERSION=v1.37.2``, the
KUBE_VERSION_NEXT of dev/versions.env): ResourceSlice attributes with list values (KEP 5491,
feature gate ``DRAListTypeAttributes``, alpha in 1.36 and 1.37, which the harness turns on in
kube-apiserver and kube-scheduler where the version has it).

- the real API server accepts a slice whose devices carry ``ints``, ``bools``, ``strings`` and
  ``versions`` attributes, keeps them as sent, and refuses an invalid list naming the field;
- the real scheduler allocates claims whose CEL selects on list attributes (``includes()``,
  ``exists()``), and ``matchAttribute`` on a list attribute picks the only pair of devices whose
  lists intersect.

Control plane only: the devices belong to a Node object made here for the test (no kubelet
serves it, so nothing prepares the claims) and the Pods are bound to it by the scheduler, then
force-deleted. On a version without the gate (the default v1.34.4) every test here is skipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dev.cluster.kube import ClusterError, KubeCluster, control_plane_gates, selected_kube_version
from tests.support.kube import Kube, eventually

GATE = "DRAListTypeAttributes"
DRIVER = "list.dranet.test"  # no plugin serves it: the claims are allocated, never prepared

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(
        GATE not in control_plane_gates(selected_kube_version()),
        reason=f"Kubernetes {selected_kube_version()} has no {GATE} gate (1.36+): list-valued "
        "attributes are tested on the next version, DRANET_KUBE_VERSION=v1.37.2 (make test-next)",
    ),
]

ALLOCATED_WITHIN = 90.0

# Three devices; which of them a selector or constraint can pick is worked out in each test.
DEVICES: dict[str, dict[str, Any]] = {
    "d0": {
        "vlans": {"ints": [10]},
        "names": {"strings": ["uplink0", "mgmt"]},
        "networks": {"strings": ["red", "blue"]},
        "offloads": {"bools": [True, False]},
        "firmware": {"versions": ["1.2.3", "2.0.0"]},
        "model": {"string": "nic-a"},
    },
    "d1": {
        "vlans": {"ints": [10, 20]},
        "names": {"strings": ["data1"]},
        "networks": {"strings": ["blue", "green"]},
        "offloads": {"bools": [True]},
        "firmware": {"versions": ["2.1.0"]},
        "model": {"string": "nic-b"},
    },
    "d2": {
        "vlans": {"ints": [20, 30]},
        "names": {"strings": ["data2"]},
        "networks": {"strings": ["yellow"]},
        "offloads": {"bools": [False]},
        "firmware": {"versions": ["3.0.0"]},
        "model": {"string": "nic-b"},
    },
}


def attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


@dataclass
class FakeNode:
    """A Node object without a kubelet and the slice of devices it has."""

    name: str
    slice_name: str


def node_body(name: str) -> dict[str, Any]:
    res = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Test", "message": "made by the test"}
            ],
        },
    }


def slice_body(name: str, node: str, devices: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d, "attributes": a} for d, a in devices.items()],
        },
    }


@pytest.fixture
def fake_node(kube_cluster: KubeCluster) -> Iterator[FakeNode]:
    assert kube_cluster.feature_gates.get(GATE), (kube_cluster.kube_version, kube_cluster.feature_gates)
    api = kube_cluster.api
    n = FakeNode(f"lt-{secrets.token_hex(3)}", "")
    api.call("POST", "/api/v1/nodes", node_body(n.name))
    try:
        n.slice_name = f"{n.name}-{DRIVER}"
        api.call("POST", "/apis/resource.k8s.io/v1/resourceslices", slice_body(n.slice_name, n.name, DEVICES))
        yield n
    finally:
        api.call("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{n.slice_name}", ok=(200, 404))
        api.call("DELETE", f"/api/v1/nodes/{n.name}", ok=(200, 404))


@pytest.fixture
def lkube(kube: Kube) -> Iterator[Kube]:
    """``kube`` whose Pods (bound to a Node without a kubelet) are force-deleted at the end."""
    try:
        yield kube
    finally:
        for pod in kube.api.get(f"/api/v1/namespaces/{kube.ns}/pods")["items"]:
            kube.api.call(
                "DELETE",
                f"/api/v1/namespaces/{kube.ns}/pods/{pod['metadata']['name']}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                ok=(200, 202, 404),
            )


def device_class(k: Kube) -> str:
    return k.device_class("lt", f'device.driver == "{DRIVER}"')


def claim(k: Kube, name: str, dc: str, requests: dict[str, str], constraints: list[dict[str, Any]]) -> None:
    reqs = [
        {"name": r, "exactly": {"deviceClassName": dc, "selectors": [{"cel": {"expression": sel}}]}}
        for r, sel in requests.items()
    ]
    spec: dict[str, Any] = {"devices": {"requests": reqs}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    k.claim(name, spec)


def pod_on(k: Kube, name: str, node: str, claim_name: str) -> None:
    k.api.call(
        "POST",
        f"/api/v1/namespaces/{k.ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "app",
                        "image": "local/pause:1",
                        "imagePullPolicy": "Never",
                        "resources": {"claims": [{"name": "c"}]},
                    }
                ],
                "resourceClaims": [{"name": "c", "resourceClaimName": claim_name}],
            },
        },
    )


async def allocated(k: Kube, name: str) -> dict[str, str]:
    """Request -> device of the claim once the scheduler allocated it."""

    def is_allocated(c: dict[str, Any]) -> bool:
        return bool((c.get("status") or {}).get("allocation"))

    try:
        c = await k.wait_claim(name, is_allocated, ALLOCATED_WITHIN)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; pod events: {[e['message'] for e in k.events()][-5:]}") from None
    results = c["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {DRIVER}, results
    return {r["request"]: r["device"] for r in results}


# --- the API server ----------------------------------------------------------------------------


def test_api_server_keeps_list_attributes_as_sent(kube_cluster: KubeCluster, fake_node: FakeNode) -> None:
    got = kube_cluster.api.get(f"/apis/resource.k8s.io/v1/resourceslices/{fake_node.slice_name}")
    devices = {d["name"]: d["attributes"] for d in got["spec"]["devices"]}
    assert devices == DEVICES, devices


def test_api_server_refuses_an_invalid_list_naming_the_field(kube_cluster: KubeCluster) -> None:
    name = f"lt-bad-{secrets.token_hex(3)}"
    bad = {"d0": {"names": {"strings": ["x" * 65]}}}
    with pytest.raises(ClusterError) as err:
        kube_cluster.api.call(
            "POST", "/apis/resource.k8s.io/v1/resourceslices", slice_body(name, "no-such-node", bad)
        )
    msg = str(err.value)
    assert "HTTP 422" in msg and "strings" in msg, msg
    kube_cluster.api.call("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}", ok=(200, 404))


# --- the scheduler ------------------------------------------------------------------------------


async def test_scheduler_selects_on_list_attributes(lkube: Kube, fake_node: FakeNode) -> None:
    dc = device_class(lkube)
    requests = {
        "thirty": f"{attr('vlans')}.includes(30)",  # only d2
        "uplink": f'{attr("names")}.exists(n, n.startsWith("uplink"))',  # only d0
    }
    claim(lkube, "sel", dc, requests, [])
    pod_on(lkube, "sel", fake_node.name, "sel")
    assert await allocated(lkube, "sel") == {"thirty": "d2", "uplink": "d0"}
    bound = await eventually(
        lambda: (lkube.get_pod("sel") or {}).get("spec", {}).get("nodeName"), 30, "pod sel bound"
    )
    assert bound == fake_node.name


async def test_scheduler_match_attribute_on_a_list_needs_an_intersection(
    lkube: Kube, fake_node: FakeNode
) -> None:
    dc = device_class(lkube)
    # x: d1 or d2; y: d0 or d1. Their networks intersect only for x=d1, y=d0 ("blue").
    requests = {"x": f"{attr('vlans')}.includes(20)", "y": f"{attr('vlans')}.includes(10)"}
    constraints = [{"requests": ["x", "y"], "matchAttribute": f"{DRIVER}/networks"}]
    claim(lkube, "match", dc, requests, constraints)
    pod_on(lkube, "match", fake_node.name, "match")
    assert await allocated(lkube, "match") == {"x": "d1", "y": "d0"}
