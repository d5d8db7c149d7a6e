"""CoreWeave Kubernetes Service (CKS): no instance metadata service; CKS writes a
node's fabric topology as labels on its Node object. dranet reads the Node from
the API server, detects CKS by the ``cks.coreweave.com/cluster`` label, and
publishes the topology under coreweave.dra.net, plus the leaf switch of each
backend HCA from the per-device ``backend.coreweave.cloud/neighbors.expected.<rdma>.device``
label (the RDMA device found through /sys/class/infiniband/<rdma>/device).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from services.inventory.cloud.base import DeviceInfo, Hint, ProviderError
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.provider import MetadataProvider
from shared.deviceattr import ATTRIBUTE_MAX_VALUE_LENGTH, Attribute
from shared.kubeapi import ApiError, KubeApi
from shared.netconfig import NetworkConfig

log = logging.getLogger(__name__)

PREFIX = "coreweave.dra.net"
ATTR_FABRIC_FLAVOR = f"{PREFIX}/fabricFlavor"
ATTR_FABRIC = f"{PREFIX}/fabric"
ATTR_SUPERPOD = f"{PREFIX}/superpod"
ATTR_LEAFGROUP = f"{PREFIX}/leafgroup"
ATTR_LEAFGROUP_NAME = f"{PREFIX}/leafgroupName"
ATTR_RACK = f"{PREFIX}/rack"
ATTR_SPEED_CURRENT = f"{PREFIX}/speedCurrent"
ATTR_SPEED_EXPECTED = f"{PREFIX}/speedExpected"
ATTR_INSTANCE_TYPE = f"{PREFIX}/instanceType"
ATTR_LEAF_SWITCH = f"{PREFIX}/leafSwitch"

LABEL_CKS_CLUSTER = "cks.coreweave.com/cluster"
NODE_ATTRIBUTE_LABELS = {
    ATTR_FABRIC_FLAVOR: "backend.coreweave.cloud/flavor",
    ATTR_FABRIC: "backend.coreweave.cloud/fabric",
    ATTR_SUPERPOD: "backend.coreweave.cloud/superpod",
    ATTR_LEAFGROUP: "backend.coreweave.cloud/leafgroup",
    ATTR_LEAFGROUP_NAME: "backend.coreweave.cloud/leafgroup-name",
    ATTR_RACK: "node.coreweave.cloud/rack",
    ATTR_SPEED_CURRENT: "backend.coreweave.cloud/speed.current",
    ATTR_SPEED_EXPECTED: "backend.coreweave.cloud/speed.expected",
    ATTR_INSTANCE_TYPE: "node.kubernetes.io/instance-type",
}
NEIGHBOR_LABEL_PREFIX = "backend.coreweave.cloud/neighbors.expected."
NEIGHBOR_LABEL_SUFFIX = ".device"

# Returns the node's labels; None when the Node does not exist. Raises on API errors.
NodeLabels = Callable[[], Awaitable[Mapping[str, str] | None]]


def kube_node_labels(api: KubeApi, node_name: str, request_timeout: float = 10.0) -> NodeLabels:
    """A NodeLabels reading ``node_name`` through a shared/kubeapi.py KubeApi."""

    async def read() -> Mapping[str, str] | None:
        try:
            node = await api.get(f"/api/v1/nodes/{node_name}", deadline=request_timeout)
        except ApiError as exc:
            raise ProviderError(f"cks: reading Node {node_name}: HTTP {exc}") from None
        if node is None:
            return None
        return dict((node.get("metadata") or {}).get("labels") or {})

    return read


def normalize_pci(address: str) -> str:
    return address.lower().removeprefix("0000:")


async def probe(node_labels: NodeLabels | None) -> bool:
    """dranet's OnCKS: the Node carries the CKS cluster label."""
    if node_labels is None:
        return False
    try:
        labels = await node_labels()
    except ProviderError as exc:
        log.debug("cks probe failed", extra={"error": str(exc)})
        return False
    return bool(labels and labels.get(LABEL_CKS_CLUSTER))


@dataclass(frozen=True)
class CksState:
    labels: Mapping[str, str]
    rdma_by_pci: Mapping[str, str]


class CksProvider(MetadataProvider[CksState]):
    hint = Hint.CKS

    def __init__(
        self,
        node_labels: NodeLabels,
        node_name: str,
        *,
        host: HostProbe | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.node_labels = node_labels
        self.node_name = node_name
        self.host = host or HostProbe()

    @property
    def name(self) -> str:
        return "cks"

    async def fetch(self) -> CksState:
        labels = await self.node_labels()
        if labels is None:
            raise ProviderError(f"cks: Node {self.node_name} not found")
        if not labels.get(LABEL_CKS_CLUSTER):
            raise ProviderError(f"cks: Node {self.node_name} does not have the {LABEL_CKS_CLUSTER!r} label")
        rdma_by_pci: dict[str, str] = {}
        for dev, pci in self.host.rdma_devices().items():
            rdma_by_pci.setdefault(normalize_pci(pci), dev)
        log.info(
            "cks node",
            extra={
                "node": self.node_name,
                "fabric_flavor": labels.get(NODE_ATTRIBUTE_LABELS[ATTR_FABRIC_FLAVOR], ""),
                "fabric": labels.get(NODE_ATTRIBUTE_LABELS[ATTR_FABRIC], ""),
            },
        )
        return CksState(labels=dict(labels), rdma_by_pci=rdma_by_pci)

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None:
            return {}
        attrs: dict[str, Attribute] = {}

        def add(name: str, value: str) -> None:
            if not value:
                return
            if len(value) > ATTRIBUTE_MAX_VALUE_LENGTH:
                log.warning("ignoring cks attribute longer than the API allows", extra={"attribute": name})
                return
            attrs[name] = Attribute.of_string(value)

        for attr, label in NODE_ATTRIBUTE_LABELS.items():
            add(attr, state.labels.get(label, ""))
        rdma = state.rdma_by_pci.get(normalize_pci(device.pci_address), "") if device.pci_address else ""
        rdma = rdma or device.rdma_device
        if not rdma and device.ifname.startswith("ibp"):
            # CKS names IPoIB netdevs after their HCA (ibpN), so the name is the key.
            rdma = device.ifname
        if rdma:
            add(
                ATTR_LEAF_SWITCH,
                state.labels.get(f"{NEIGHBOR_LABEL_PREFIX}{rdma}{NEIGHBOR_LABEL_SUFFIX}", ""),
            )
        return attrs

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        # CKS labels carry topology only, no addressing contract.
        return None
