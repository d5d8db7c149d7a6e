"""Alibaba provider against a local ECS metadata server with its token dance."""

from __future__ import annotations

from services.inventory.cloud import alibaba
from services.inventory.cloud.base import DeviceInfo
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import RetryPolicy
from shared.deviceattr import Attribute
from tests.integration.inventory.cloud.fakes import AlibabaMetadata, AwsImds
from tests.integration.inventory.cloud.support import FakeHost

FAST = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.05)


async def test_probe_token_dance(serve) -> None:
    server = await serve(AlibabaMetadata())
    assert await alibaba.probe(server.url)
    put = next(r for r in server.requests if r.method == "PUT")
    assert put.path == "/latest/api/token"
    assert put.headers["X-aliyun-ecs-metadata-token-ttl-seconds"] == "21600"
    get = next(r for r in server.requests if r.path == "/latest/meta-data/instance-id")
    assert get.headers["X-aliyun-ecs-metadata-token"] in server.tokens
    # EC2's IMDS answers its own token path but not with Alibaba's token header.
    assert not await alibaba.probe((await serve(AwsImds())).url)


async def test_instance_type_and_erdma(serve, fake_host: FakeHost) -> None:
    server = await serve(AlibabaMetadata())
    fake_host.rdma("erdma_0", "0000:00:0b.0")
    fake_host.rdma("mlx5_0", "0000:00:0c.0")
    provider = alibaba.AlibabaProvider(server.url, host=HostProbe(sysfs_root=str(fake_host.sys)), policy=FAST)
    await provider.start()
    try:
        erdma = DeviceInfo(
            name="pci-0000-00-0b-0", pci_address="0000:00:0b.0", rdma=True, rdma_device="erdma_0"
        )
        assert await provider.device_attributes(erdma) == {
            "alibaba.dra.net/instanceType": Attribute.of_string("ecs.gn8is-2x.8xlarge"),
            "alibaba.dra.net/erdma": Attribute.of_bool(True),
        }
        other = await provider.device_attributes(DeviceInfo(name="eth1", pci_address="0000:00:0c.0"))
        assert other == {"alibaba.dra.net/instanceType": Attribute.of_string("ecs.gn8is-2x.8xlarge")}
        assert await provider.provider_config(erdma) is None
    finally:
        await provider.close()
