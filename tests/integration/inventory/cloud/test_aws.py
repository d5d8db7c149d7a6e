"""AWS provider against a local IMDSv2 server (token PUT, token-carrying GETs)."""

from __future__ import annotations

import hashlib

from services.inventory.cloud import aws
from services.inventory.cloud.base import DeviceInfo
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import HttpClient, RetryPolicy
from shared.deviceattr import Attribute
from tests.integration.inventory.cloud.fakes import AwsImds, AzureImds, GceMetadata
from tests.integration.inventory.cloud.support import FakeHost

ALL_TRN1_EFAS = [
    f"0000:{bdf}"
    for bdf in ("10:1a.0", "a0:1a.0", "20:19.0", "90:19.0", "20:1a.0", "90:1a.0", "10:19.0", "a0:19.0")
]
FAST = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.05)


def group_hash(*bdfs: str) -> str:
    return hashlib.sha256(",".join(sorted(set(bdfs))).encode()).hexdigest()[:16]


async def test_probe_does_the_token_dance(serve) -> None:
    server = await serve(AwsImds())
    assert await aws.probe(server.url)
    put = [r for r in server.requests if r.method == "PUT"]
    assert put and put[0].path == "/latest/api/token"
    assert put[0].headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    doc = [r for r in server.requests if r.path == "/latest/dynamic/instance-identity/document"]
    assert doc[-1].headers["X-aws-ec2-metadata-token"] in server.tokens
    # Other clouds' metadata servers are not mistaken for EC2.
    assert not await aws.probe((await serve(GceMetadata())).url)
    assert not await aws.probe((await serve(AzureImds())).url)


async def test_expired_token_is_renewed_once(serve) -> None:
    server = await serve(AwsImds())
    client = HttpClient("aws", server.url, token=aws.TOKEN, policy=FAST)
    try:
        assert (await client.get_json(aws.IDENTITY_DOCUMENT))["instanceType"] == "trn1.32xlarge"
        server.expire_tokens()
        assert (await client.get_json(aws.IDENTITY_DOCUMENT))["region"] == "us-west-2"
    finally:
        await client.close()
    assert len([r for r in server.requests if r.method == "PUT"]) == 2


async def test_imdsv1_fallback(serve) -> None:
    server = await serve(AwsImds(imdsv1_only=True, instance_type="p5.48xlarge"))
    assert await aws.probe(server.url)
    gets = [r for r in server.requests if r.method == "GET"]
    assert gets and "X-aws-ec2-metadata-token" not in gets[0].headers


async def test_efa_device_groups_on_trainium(serve, fake_host: FakeHost) -> None:
    server = await serve(AwsImds(instance_type="trn1.32xlarge"))
    fake_host.driver("0000:10:1a.0", "efa")
    fake_host.driver("0000:a0:19.0", "efa")
    fake_host.driver("0000:00:05.0", "ena")
    host = HostProbe(sysfs_root=str(fake_host.sys))
    provider = aws.AwsProvider(server.url, host=host, policy=FAST, startup_timeout=5.0)
    await provider.start()
    try:
        assert provider.ready
        efa0 = await provider.device_attributes(
            DeviceInfo(name="pci-0000-10-1a-0", pci_address="0000:10:1a.0")
        )
        assert efa0 == {
            "resource.aws.com/devicegroup1_id": Attribute.of_string("0000:10:1a.0"),
            # Neuron devices 0-3 use the EFAs 10:1a.0 and a0:1a.0.
            "resource.aws.com/devicegroup4_id": Attribute.of_string(
                group_hash("0000:10:1a.0", "0000:a0:1a.0")
            ),
            "resource.aws.com/devicegroup8_id": Attribute.of_string(
                group_hash("0000:10:1a.0", "0000:a0:1a.0", "0000:20:19.0", "0000:90:19.0")
            ),
            "resource.aws.com/devicegroup16_id": Attribute.of_string(group_hash(*ALL_TRN1_EFAS)),
        }
        efa7 = await provider.device_attributes(DeviceInfo(name="x", pci_address="0000:a0:19.0"))
        assert efa7["resource.aws.com/devicegroup16_id"] == efa0["resource.aws.com/devicegroup16_id"]
        assert efa7["resource.aws.com/devicegroup4_id"] != efa0["resource.aws.com/devicegroup4_id"]
        # The ENA primary NIC is not an EFA: no groups.
        assert await provider.device_attributes(DeviceInfo(name="ens5", pci_address="0000:00:05.0")) == {}
        assert await provider.provider_config(DeviceInfo(name="x", pci_address="0000:10:1a.0")) is None
    finally:
        await provider.close()


async def test_gpu_instance_has_no_groups(serve, fake_host: FakeHost) -> None:
    server = await serve(AwsImds(instance_type="p5.48xlarge"))
    fake_host.driver("0000:10:1a.0", "efa")
    provider = aws.AwsProvider(server.url, host=HostProbe(sysfs_root=str(fake_host.sys)), policy=FAST)
    await provider.start()
    try:
        assert provider.state is not None and not provider.state.neuron
        assert await provider.device_attributes(DeviceInfo(name="x", pci_address="0000:10:1a.0")) == {}
    finally:
        await provider.close()
