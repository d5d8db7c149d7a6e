"""What the driver's Kubernetes identity may do, asked of the real API server.

The identity is a ServiceAccount bound to the chart's ClusterRole as the real Helm engine renders
it (``KubeCluster.service_identity``, the same rights the DaemonSet pod's ServiceAccount has), and
every request below is a real one made with its bearer token. Kubernetes gives a pod one
ServiceAccount, so inventory and prepare share it; attach and store hold no token at all
(tests/e2e/test_install.py looks inside the running containers).

Each request the services make must be authorized (a 404 for an object that does not exist
still means the API server let it through), and everything else must be refused with 403:
secrets, Pods, writes to Nodes, claims' spec, DeviceClasses, RBAC, minting tokens.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dev.cluster.kube import KubeCluster

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.cluster]

EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "dranet-identity-test", "namespace": "default"},
    "involvedObject": {"kind": "Node", "name": "x"},
    "reason": "Test",
    "message": "identity test",
    "type": "Normal",
}
SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "identity-test-slice"},
    "spec": {
        "driver": "dra.net",
        "nodeName": "x",
        "pool": {"name": "x", "generation": 1, "resourceSliceCount": 1},
    },
}
CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "identity-test"},
    "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "dra.net"}}]}},
}
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "identity-test"},
}
RC = "/apis/resource.k8s.io/v1"


class Identity:
    def __init__(self, kubeconfig: dict[str, Any]) -> None:
        cluster = kubeconfig["clusters"][0]["cluster"]
        self.token = kubeconfig["users"][0]["user"]["token"]
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "", url.port or 443
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def status(self, method: str, path: str, body: Any = None) -> int:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            if method == "PATCH":
                headers["Content-Type"] = "application/merge-patch+json"
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()


@pytest.fixture(scope="module")
def identity(kube_cluster: KubeCluster) -> Iterator[Identity]:
    path = kube_cluster.service_identity("identity-test")
    yield Identity(yaml.safe_load(path.read_text()))
    for kind, name in (
        ("clusterrolebinding", "dranet-identity-test"),
        ("clusterrole", "dranet-identity-test"),
        ("-n kube-system serviceaccount", "dranet-identity-test"),
        ("-n default event", "dranet-identity-test"),
        ("resourceslice", "identity-test-slice"),
    ):
        kube_cluster.kubectl(*kind.split(), name, "delete", "--ignore-not-found", check=False)


def allowed(node: str) -> list[tuple[str, str, Any, tuple[int, ...]]]:
    """What inventory and prepare do, with the statuses that mean "authorized"."""
    return [
        ("GET", f"/api/v1/nodes/{node}", None, (200,)),
        ("GET", f"{RC}/resourceslices", None, (200,)),
        ("GET", f"{RC}/resourceslices?watch=1&timeoutSeconds=1", None, (200,)),
        ("POST", f"{RC}/resourceslices", SLICE, (201,)),
        (
            "PUT",
            f"{RC}/resourceslices/identity-test-slice",
            SLICE,
            (200,),
        ),  # no resourceVersion: unconditional
        ("DELETE", f"{RC}/resourceslices/identity-test-slice", None, (200,)),
        ("GET", f"{RC}/namespaces/default/resourceclaims/nope", None, (404,)),
        ("PATCH", f"{RC}/namespaces/default/resourceclaims/nope/status", {"status": {}}, (404,)),
        ("GET", f"{RC}/deviceclasses/nope", None, (404,)),
        ("POST", "/api/v1/namespaces/default/events", EVENT, (201,)),
        # prepare's claim read-ahead lists and watches the node's Pods (no get, no write).
        ("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node}", None, (200,)),
        ("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node}&watch=1&timeoutSeconds=1", None, (200,)),
    ]


def refused(node: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", "/api/v1/namespaces/kube-system/secrets", None),
        ("GET", "/api/v1/namespaces/kube-system/secrets/anything", None),
        ("GET", "/api/v1/configmaps", None),
        ("GET", "/api/v1/namespaces/default/pods/x", None),
        ("POST", "/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod"}),
        ("DELETE", f"/api/v1/nodes/{node}", None),
        ("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {"x": "y"}}}),
        ("PATCH", f"/api/v1/nodes/{node}/status", {"status": {}}),
        ("GET", "/api/v1/nodes", None),
        ("POST", "/api/v1/namespaces/kube-system/serviceaccounts/dranet-identity-test/token", {}),
        ("GET", f"{RC}/resourceclaims", None),
        ("POST", f"{RC}/namespaces/default/resourceclaims", CLAIM),
        ("PATCH", f"{RC}/namespaces/default/resourceclaims/nope", {"spec": {}}),
        ("DELETE", f"{RC}/namespaces/default/resourceclaims/nope", None),
        ("POST", f"{RC}/deviceclasses", DEVICE_CLASS),
        ("DELETE", f"{RC}/deviceclasses/dra.net", None),
        ("GET", f"{RC}/deviceclasses", None),
        ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles", None),
        ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {}),
        ("GET", "/apis/apps/v1/daemonsets", None),
    ]


def test_the_requests_the_services_make_are_authorized(identity: Identity, kube_cluster: KubeCluster) -> None:
    bad = {}
    for method, path, body, ok in allowed(kube_cluster.node_name):
        status = identity.status(method, path, body)
        if status not in ok:
            bad[(method, path)] = status
    assert not bad, bad


def test_everything_else_is_refused_with_403(identity: Identity, kube_cluster: KubeCluster) -> None:
    got = {(m, p): identity.status(m, p, b) for m, p, b in refused(kube_cluster.node_name)}
    bad = {k: v for k, v in got.items() if v != 403}
    assert not bad, f"not refused: {bad}"


def test_a_token_that_is_not_the_identity_is_refused_with_401(
    identity: Identity, kube_cluster: KubeCluster
) -> None:
    stranger = Identity.__new__(Identity)
    stranger.__dict__.update(identity.__dict__, token=identity.token[:-4] + "AAAA")
    assert stranger.status("GET", f"/api/v1/nodes/{kube_cluster.node_name}") == 401
