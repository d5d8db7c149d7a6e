"""CoreWeave CKS provider: Node labels read with shared/kubeapi.py from a local
API server that answers GET /api/v1/nodes/<name> like the real one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from services.inventory.cloud import coreweave
from services.inventory.cloud.base import DeviceInfo
from services.inventory.cloud.host import HostProbe
from shared import kubeapi
from shared.deviceattr import Attribute
from tests.integration.inventory.cloud.fakes import CKS_LABELS, KubeApi
from tests.integration.inventory.cloud.support import FakeHost


@pytest.fixture
async def api(serve) -> AsyncIterator[tuple[KubeApi, Callable[[str], coreweave.NodeLabels]]]:
    server = await serve(
        KubeApi(nodes={"g1234": dict(CKS_LABELS), "plain": {"kubernetes.io/hostname": "plain"}})
    )
    client = kubeapi.KubeApi(kubeapi.KubeConfig(server=server.url))
    try:
        yield server, lambda node: coreweave.kube_node_labels(client, node, request_timeout=5.0)
    finally:
        await client.close()


async def test_probe_by_cluster_label(api) -> None:
    server, labels_of = api
    assert await coreweave.probe(labels_of("g1234"))
    assert not await coreweave.probe(labels_of("plain"))
    assert not await coreweave.probe(labels_of("missing"))
    assert not await coreweave.probe(None)
    assert server.paths() == ["/api/v1/nodes/g1234", "/api/v1/nodes/plain", "/api/v1/nodes/missing"]


async def test_topology_attributes_and_leaf_switch(api, fake_host: FakeHost) -> None:
    _, labels_of = api
    fake_host.rdma("ibp0", "0000:18:00.0", link_layer="InfiniBand")
    fake_host.rdma("mlx5_9", "0000:9a:00.0")
    provider = coreweave.CksProvider(
        labels_of("g1234"), "g1234", host=HostProbe(sysfs_root=str(fake_host.sys))
    )
    await provider.start()
    try:
        assert provider.ready, provider.last_error
        node_level = {
            "coreweave.dra.net/fabricFlavor": Attribute.of_string("infiniband"),
            "coreweave.dra.net/fabric": Attribute.of_string("US-EAST-15A-FAB66"),
            "coreweave.dra.net/superpod": Attribute.of_string("2"),
            "coreweave.dra.net/leafgroup": Attribute.of_string("856886992745"),
            "coreweave.dra.net/leafgroupName": Attribute.of_string("90.1-DH1"),
            "coreweave.dra.net/rack": Attribute.of_string("82"),
            "coreweave.dra.net/speedCurrent": Attribute.of_string("3200G"),
            "coreweave.dra.net/speedExpected": Attribute.of_string("3200G"),
            "coreweave.dra.net/instanceType": Attribute.of_string("b200-8x"),
        }
        hca = DeviceInfo(name="pci-0000-18-00-0", pci_address="0000:18:00.0", rdma=True, rdma_device="ibp0")
        assert await provider.device_attributes(hca) == {
            **node_level,
            "coreweave.dra.net/leafSwitch": Attribute.of_string("L90.1.3"),
        }
        # An internal RDMA device without a neighbor label has no leaf switch.
        internal = DeviceInfo(name="pci-0000-9a-00-0", pci_address="0000:9a:00.0", rdma=True)
        assert await provider.device_attributes(internal) == node_level
        assert await provider.provider_config(hca) is None
    finally:
        await provider.close()


async def test_non_cks_node_is_not_loaded(api) -> None:
    _, labels_of = api
    provider = coreweave.CksProvider(labels_of("plain"), "plain", startup_timeout=0.5)
    await provider.start()
    try:
        assert not provider.ready
        assert "cks.coreweave.com/cluster" in provider.last_error
        assert await provider.device_attributes(DeviceInfo(name="x")) == {}
    finally:
        await provider.close()
