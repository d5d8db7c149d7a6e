"""Amazon EC2: IMDSv2 (PUT /latest/api/token, then GETs carrying the token),
the instance identity document, and on Trainium/Inferentia instances the EFA
device-group attributes (resource.aws.com/devicegroup{1,4,8,16}_id) that let a
claim align EFA NICs with Neuron devices.

dranet takes the groups from aws-neuron's connected-device-maps library: per
instance family a table Neuron device index -> EFA PCI address. Group 1 is the
EFA's own address; group N is a hash of the sorted EFA addresses of the Neuron
devices in the same block of N. The tables below are hardware facts of those
instance types; --aws-efa-topology-file supplies one for any other type.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.inventory.cloud.base import DeviceInfo, Hint, ProviderError
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import (
    DETECT_POLICY,
    HttpClient,
    Response,
    RetryPolicy,
    TokenDance,
    probe_get,
)
from services.inventory.cloud.provider import HttpMetadataProvider
from shared.deviceattr import Attribute
from shared.netconfig import NetworkConfig

log = logging.getLogger(__name__)

DEFAULT_URL = "http://169.254.169.254"
TOKEN = TokenDance(
    path="/latest/api/token",
    ttl_header="X-aws-ec2-metadata-token-ttl-seconds",
    token_header="X-aws-ec2-metadata-token",
    # The AWS SDK goes on without a token (IMDSv1) when the PUT is refused this way.
    fallback_statuses=frozenset({403, 404, 405}),
)
IDENTITY_DOCUMENT = "/latest/dynamic/instance-identity/document"

ATTR_PREFIX = "resource.aws.com/"
GROUP_SIZES = (1, 4, 8, 16)

# Instance family -> Neuron device index -> EFA PCI address.
_TRN1 = {
    0: "0000:10:1a.0", 1: "0000:10:1a.0", 2: "0000:a0:1a.0", 3: "0000:a0:1a.0",
    4: "0000:20:19.0", 5: "0000:20:19.0", 6: "0000:90:19.0", 7: "0000:90:19.0",
    8: "0000:20:1a.0", 9: "0000:20:1a.0", 10: "0000:90:1a.0", 11: "0000:90:1a.0",
    12: "0000:10:19.0", 13: "0000:10:19.0", 14: "0000:a0:19.0", 15: "0000:a0:19.0",
}  # fmt: skip
_TRN1N = {
    0: "0000:10:17.0", 1: "0000:10:1a.0", 2: "0000:a0:17.0", 3: "0000:a0:1a.0",
    4: "0000:20:19.0", 5: "0000:20:18.0", 6: "0000:90:19.0", 7: "0000:90:18.0",
    8: "0000:20:17.0", 9: "0000:20:1a.0", 10: "0000:90:17.0", 11: "0000:90:1a.0",
    12: "0000:10:19.0", 13: "0000:10:18.0", 14: "0000:a0:19.0", 15: "0000:a0:18.0",
}  # fmt: skip
_TRN2 = {
    0: "0000:c9:00.0", 1: "0000:b4:00.0", 2: "0000:b3:00.0", 3: "0000:ca:00.0",
    4: "0000:6c:00.0", 5: "0000:57:00.0", 6: "0000:56:00.0", 7: "0000:6d:00.0",
    8: "0000:98:00.0", 9: "0000:83:00.0", 10: "0000:82:00.0", 11: "0000:99:00.0",
    12: "0000:f5:00.0", 13: "0000:e0:00.0", 14: "0000:df:00.0", 15: "0000:f6:00.0",
}  # fmt: skip
# Only these instance types carry the EFA/Neuron pairing.
_EFA_TOPOLOGY: dict[str, dict[int, str]] = {
    "trn1.32xlarge": _TRN1,
    "trn1n.32xlarge": _TRN1N,
    "trn2.48xlarge": _TRN2,
    "trn2e.48xlarge": _TRN2,
    "trn2u.48xlarge": _TRN2,
}


def is_neuron_instance(instance_type: str) -> bool:
    """Trainium or Inferentia: the letters before the first digit are trn or inf."""
    prefix = instance_type.lower()
    for i, ch in enumerate(prefix):
        if ch.isdigit():
            prefix = prefix[:i]
            break
    return prefix in ("trn", "inf")


def load_topology_file(path: str) -> dict[int, str]:
    """A {"<neuron index>": "<EFA PCI address>"} JSON file, as aws-neuron ships them."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise ProviderError(f"aws: cannot read EFA topology file {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ProviderError(f"aws: EFA topology file {path}: expected an object")
    out: dict[int, str] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(value, str)):
            raise ProviderError(f"aws: EFA topology file {path}: bad entry {key!r}: {value!r}")
        out[int(key)] = value
    return out


def device_groups(topology: Mapping[int, str], efa_pci: str) -> dict[str, str]:
    """The device-group attributes of one EFA NIC; empty when it is not in the table."""
    neuron_ids = sorted(i for i, bdf in topology.items() if bdf == efa_pci)
    if not neuron_ids:
        return {}
    # On trn1 two Neuron devices share one EFA; they are 2k and 2k+1, never split by a
    # block of 4, 8 or 16, so either gives the same groups.
    neuron = neuron_ids[0]
    groups = {f"{ATTR_PREFIX}devicegroup1_id": efa_pci}
    for size in GROUP_SIZES[1:]:
        first = neuron // size * size
        bdfs = sorted({topology[i] for i in range(first, first + size) if i in topology})
        digest = hashlib.sha256(",".join(bdfs).encode()).hexdigest()[:16] if bdfs else ""
        groups[f"{ATTR_PREFIX}devicegroup{size}_id"] = digest
    return groups


@dataclass(frozen=True)
class AwsState:
    instance_type: str
    region: str
    neuron: bool
    topology: Mapping[int, str] = field(default_factory=dict)


async def probe(base_url: str, policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet's OnAWS: the identity document can be read through IMDS."""
    client = HttpClient("aws", base_url, token=TOKEN, policy=policy)

    def has_instance_type(resp: Response) -> bool:
        doc = client.decode_json(resp, "GET", IDENTITY_DOCUMENT)
        return isinstance(doc, dict) and isinstance(doc.get("instanceType"), str)

    return await probe_get(client, IDENTITY_DOCUMENT, accept=has_instance_type)


class AwsProvider(HttpMetadataProvider[AwsState]):
    hint = Hint.AWS

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        host: HostProbe | None = None,
        policy: RetryPolicy | None = None,
        startup_timeout: float = 10.0,
        topology_file: str = "",
    ) -> None:
        super().__init__(
            HttpClient("aws", base_url, token=TOKEN, policy=policy), startup_timeout=startup_timeout
        )
        self.host = host or HostProbe()
        self.topology_file = topology_file

    async def fetch(self) -> AwsState:
        doc = await self.client.get_json(IDENTITY_DOCUMENT)
        if not isinstance(doc, dict) or not isinstance(doc.get("instanceType"), str):
            raise ProviderError(
                f"aws: {self.client.shown(IDENTITY_DOCUMENT)}: no instanceType in {doc!r:.200}"
            )
        instance_type = doc["instanceType"]
        region = doc.get("region") if isinstance(doc.get("region"), str) else ""
        neuron = is_neuron_instance(instance_type)
        topology: Mapping[int, str] = {}
        if neuron:
            topology = (
                load_topology_file(self.topology_file)
                if self.topology_file
                else _EFA_TOPOLOGY.get(instance_type, {})
            )
            if not topology:
                log.warning(
                    "no EFA/Neuron topology known for this instance type",
                    extra={"instance_type": instance_type},
                )
        log.info("aws instance", extra={"instance_type": instance_type, "region": region, "neuron": neuron})
        return AwsState(instance_type=instance_type, region=str(region), neuron=neuron, topology=topology)

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None or not state.neuron or not device.pci_address:
            return {}
        if self.host.pci_driver(device.pci_address) != "efa":
            return {}
        return {
            k: Attribute.of_string(v) for k, v in device_groups(state.topology, device.pci_address).items()
        }

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        return None
