"""Alibaba Cloud ECS: the metadata service at 100.100.100.200 with its token
dance (PUT /latest/api/token with X-aliyun-ecs-metadata-token-ttl-seconds, then
X-aliyun-ecs-metadata-token on every GET), the instance type as an attribute of
every device, and ``alibaba.dra.net/erdma`` on eRDMA adapters (found by PCI
address through /sys/class/infiniband/erdma_*).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from services.inventory.cloud.base import DeviceInfo, Hint, string_attributes
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import DETECT_POLICY, HttpClient, RetryPolicy, TokenDance, probe_get
from services.inventory.cloud.provider import HttpMetadataProvider
from shared.deviceattr import Attribute
from shared.netconfig import NetworkConfig

log = logging.getLogger(__name__)

DEFAULT_URL = "http://100.100.100.200"
TOKEN = TokenDance(
    path="/latest/api/token",
    ttl_header="X-aliyun-ecs-metadata-token-ttl-seconds",
    token_header="X-aliyun-ecs-metadata-token",
)
PREFIX = "alibaba.dra.net"
ATTR_INSTANCE_TYPE = f"{PREFIX}/instanceType"
ATTR_ERDMA = f"{PREFIX}/erdma"


@dataclass(frozen=True)
class AlibabaState:
    instance_type: str
    erdma_pci_addresses: frozenset[str]


async def probe(base_url: str, policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet's OnAlibaba: a token, then meta-data/instance-id answers 200."""
    return await probe_get(
        HttpClient("alibaba", base_url, token=TOKEN, policy=policy), "/latest/meta-data/instance-id"
    )


class AlibabaProvider(HttpMetadataProvider[AlibabaState]):
    hint = Hint.ALIBABA

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        host: HostProbe | None = None,
        policy: RetryPolicy | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            HttpClient("alibaba", base_url, token=TOKEN, policy=policy), startup_timeout=startup_timeout
        )
        self.host = host or HostProbe()

    async def fetch(self) -> AlibabaState:
        instance_type = (await self.client.get_text("/latest/meta-data/instance/instance-type")).strip()
        erdma = frozenset(pci for dev, pci in self.host.rdma_devices().items() if dev.startswith("erdma"))
        log.info("alibaba instance", extra={"instance_type": instance_type, "erdma": sorted(erdma)})
        return AlibabaState(instance_type=instance_type, erdma_pci_addresses=erdma)

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None:
            return {}
        attrs = string_attributes(((ATTR_INSTANCE_TYPE, state.instance_type),))
        if device.pci_address and device.pci_address in state.erdma_pci_addresses:
            attrs[ATTR_ERDMA] = Attribute.of_bool(True)
        return attrs

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        return None
