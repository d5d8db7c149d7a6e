"""End to end on the development control plane: API server double, allocator, kubelet emulator
(through kubernetes-asyncio) and the real containerd, with a fake DRA plugin standing in for the
driver. A pod with a claim from a template is allocated and bound, its claim prepared, its sandbox
run in a real network namespace, its status written; a delete runs it all backwards."""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from services.devcluster.allocator import AllocatorController
from services.devcluster.containerd import Containerd
from services.devcluster.cri import CriClient
from services.devcluster.kubelet import POD_UID_LABEL, Kubelet
from services.devcluster.kubelet_api import KubeApi
from tests.fixtures_runtime import FakeDraPlugin, exists, is_netns_mount
from tests.integration.devcluster.helpers import eventually

pytestmark = [pytest.mark.containerd, pytest.mark.root]

REPO = Path(__file__).resolve().parents[3]
NS = "default"
NODE = "node-1"
MakeKubelet = Callable[..., Awaitable[Kubelet]]
MakePlugin = Callable[..., Awaitable[FakeDraPlugin]]


class Cluster:
    """Raw API calls, as a user (or the driver) would make them."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.res: Any = client.ResourceV1Api(api)

    async def setup(self) -> None:
        await self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        await self.res.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "dranet"},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "dra.net"'}}]},
            }
        )
        await self.res.create_namespaced_resource_claim_template(
            NS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "nic"},
                "spec": {
                    "spec": {
                        "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet"}}]}
                    }
                },
            },
        )

    async def publish(self, *devices: str) -> None:
        """What the driver's inventory does: one ResourceSlice for the node."""
        await self.res.create_resource_slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{NODE}-dra.net"},
                "spec": {
                    "driver": "dra.net",
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": d, "attributes": {"dra.net/ifName": {"string": d}}} for d in devices
                    ],
                },
            }
        )

    async def slices(self) -> list[str]:
        lst = await self.res.list_resource_slice()
        return [s.metadata.name for s in lst.items]

    async def create_pod(self, name: str) -> dict[str, Any]:
        pod = await self.core.create_namespaced_pod(
            NS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/app:1",
                            "resources": {"claims": [{"name": "net"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "nic"}],
                },
            },
        )
        return {"name": pod.metadata.name, "uid": pod.metadata.uid}

    async def pod(self, name: str) -> Any:
        try:
            return await self.core.read_namespaced_pod(name, NS)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def claims(self) -> list[Any]:
        return list((await self.res.list_namespaced_resource_claim(NS)).items)

    async def events(self, name: str) -> list[tuple[str, str]]:
        items = (await self.core.list_namespaced_event(NS)).items
        return [(e.reason, e.message) for e in items if e.involved_object.name == name]


@pytest.fixture
async def cluster(kube: client.ApiClient) -> Cluster:
    c = Cluster(kube)
    await c.setup()
    return c


@pytest.fixture
async def kubelet(
    api_server: Any, make_kubelet: MakeKubelet, cri_client: CriClient, cluster: Cluster
) -> AsyncIterator[Kubelet]:
    api = await KubeApi.from_kubeconfig(api_server.kubeconfig_path)
    try:
        yield await make_kubelet(cri_client, api=api, node_name=NODE, backoff_initial=0.1, backoff_max=1.0)
    finally:
        await api.close()


async def running(cluster: Cluster, name: str) -> Any:
    p = await cluster.pod(name)
    return p if p is not None and p.status.phase == "Running" else None


async def test_pod_with_a_template_claim_runs_and_is_removed(
    containerd: Containerd,
    cri_client: CriClient,
    cluster: Cluster,
    allocator: AllocatorController,
    kubelet: Kubelet,
    fake_dra_plugin: MakePlugin,
) -> None:
    plugin = await fake_dra_plugin(pool=NODE)
    await kubelet.plugins.wait_for_plugin("dra.net", within=5)
    await cluster.publish("eth1", "eth2")

    t0 = time.monotonic()
    pod = await cluster.create_pod("web")
    p = await eventually(lambda: running(cluster, "web"), "pod web Running")
    elapsed = time.monotonic() - t0
    assert p.spec.node_name == NODE
    assert ipaddress.ip_address(p.status.pod_ip) in containerd.cni_subnet
    assert {c.type: c.status for c in p.status.conditions}["Ready"] == "True"
    (cs,) = p.status.container_statuses
    assert cs.name == "app" and cs.ready and cs.state.running is not None
    assert cs.container_id == f"containerd://{kubelet.pods[pod['uid']].containers['app']}"

    (claim,) = await cluster.claims()
    assert claim.status.allocation.devices.results[0].device in ("eth1", "eth2")
    (prep,) = plugin.calls_of("NodePrepareResources")
    assert prep.version == "v1" and prep.claims == ((NS, claim.metadata.name, claim.metadata.uid),)
    netns = kubelet.netns_path(pod["uid"])
    assert netns and is_netns_mount(netns)
    sandboxes = await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: pod["uid"]})
    assert [s.id for s in sandboxes] == [kubelet.sandbox_id(pod["uid"])]
    print(f"\ncreate pod -> Running through allocator, kubelet and containerd: {elapsed:.3f}s")

    # A user's delete: the API server marks the pod (grace period 30 s), the kubelet stops it,
    # unprepares the claim and deletes the object for good.
    await cluster.core.delete_namespaced_pod("web", NS)
    await eventually(lambda: _gone(cluster, "web"), "pod web deleted")
    assert not exists(netns)
    assert await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: pod["uid"]}) == []
    (unprep,) = plugin.calls_of("NodeUnprepareResources")
    assert unprep.claims == prep.claims
    # The allocator deletes the claim it made from the template once the pod is gone.
    await eventually(lambda: _no_claims(cluster), "generated claim deleted")


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.pod(name) is None


async def _no_claims(cluster: Cluster) -> bool:
    return await cluster.claims() == []


async def test_prepare_failure_is_an_event_and_the_pod_starts_once_it_succeeds(
    cri_client: CriClient,
    cluster: Cluster,
    allocator: AllocatorController,
    kubelet: Kubelet,
    fake_dra_plugin: MakePlugin,
) -> None:
    plugin = await fake_dra_plugin(pool=NODE, versions=["v1beta1.DRAPlugin"], serve=["v1beta1"])
    await kubelet.plugins.wait_for_plugin("dra.net", within=5)
    await cluster.publish("eth1")
    plugin.prepare_error_all = "eth1 is down"
    pod = await cluster.create_pod("db")

    async def failed_prepare() -> list[str]:
        return [m for r, m in await cluster.events("db") if r == "FailedPrepareDynamicResources"]

    message = (await eventually(failed_prepare, "a FailedPrepareDynamicResources event"))[0]
    assert (
        message.startswith("NodePrepareResources failed for ResourceClaim default/db-net-")
        and "eth1 is down" in message
    )
    assert kubelet.last_prepare_error(pod["uid"]) == message
    assert (await cluster.pod("db")).status.phase == "Pending"
    assert await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: pod["uid"]}) == []

    plugin.prepare_error_all = ""
    await eventually(lambda: running(cluster, "db"), "pod db Running after the error cleared")
    assert {c.version for c in plugin.calls} == {"v1beta1"}


async def test_kubelet_start_wipes_the_node_slices(
    api_server: Any, make_kubelet: MakeKubelet, cri_client: CriClient, cluster: Cluster
) -> None:
    await cluster.publish("eth1")
    assert await cluster.slices() == [f"{NODE}-dra.net"]
    api = await KubeApi.from_kubeconfig(api_server.kubeconfig_path)
    try:
        await make_kubelet(cri_client, api=api, node_name=NODE)
        assert await cluster.slices() == []
    finally:
        await api.close()


async def test_kubelet_as_a_process(
    api_server: Any, containerd: Containerd, cluster: Cluster, kubelet_root: Path
) -> None:
    """``python -m services.devcluster.kubelet`` (what the local run starts) runs and removes a pod."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.devcluster.kubelet",
        "--node-name",
        NODE,
        "--root-dir",
        str(kubelet_root),
        "--kubeconfig",
        api_server.kubeconfig_path,
        "--runtime-endpoint",
        str(containerd.grpc_socket),
        cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        pod = await cluster.core.create_namespaced_pod(
            NS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "plain"},
                "spec": {
                    "nodeName": NODE,
                    "containers": [{"name": "app", "image": "registry.example/app:1"}],
                },
            },
        )
        p = await eventually(lambda: running(cluster, "plain"), "pod plain Running")
        assert ipaddress.ip_address(p.status.pod_ip) in containerd.cni_subnet
        await cluster.core.delete_namespaced_pod("plain", NS)
        await eventually(lambda: _gone(cluster, "plain"), "pod plain deleted")
        async with CriClient(containerd.grpc_socket) as cl:
            assert await cl.list_pod_sandboxes(labels={POD_UID_LABEL: pod.metadata.uid}) == []
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b'"msg": "kubelet emulator running"' in err
