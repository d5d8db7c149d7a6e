"""interface.dhcp through the real cluster (tests/fixtures_cluster.py): the real scheduler
allocates a veth NIC of the node, the real kubelet calls prepare, which takes a lease
from a real dnsmasq on the NIC's far end (a server netns) while the NIC is still in the
node's netns (prepare runs in the host's netns: ``--device-netns``, set by
dev/cluster/driver.py), and attach puts the leased address and routes in the Pod's netns.
Without a server, the kubelet reports prepare's error naming claim and device and the
store holds nothing for the claim.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from shared.storeclient import StoreClient
from tests.e2e.conftest import start_driver, stop_driver
from tests.integration.dhcp.dhcp_env import Dnsmasq, addrs, routes, server_netns, sh
from tests.support.kube import Kube, eventually, link, nic_name, on

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.cluster, pytest.mark.slow]

RUN_WITHIN = 180.0
GONE_WITHIN = 120.0
VIA = "192.0.2.0/24"
ONLINK = "198.51.100.0/24"


@pytest.fixture(scope="module")
def driver(kube_cluster: KubeCluster) -> Iterator[Driver]:
    d = start_driver(kube_cluster)
    try:
        yield d
    except BaseException:
        print(d.logs())
        raise
    finally:
        stop_driver(kube_cluster, d)


class ServedNic:
    """A NIC in the node's netns whose veth peer sits in a server netns of its own, where
    dnsmasq may run."""

    def __init__(self, cluster: KubeCluster, workdir: Path) -> None:
        self.c = cluster
        self.name = nic_name("d")
        self.srv_ns = f"dcs{secrets.token_hex(3)}"
        self.prefix = f"10.234.{secrets.randbelow(250) + 1}"
        sh("ip", "netns", "add", self.srv_ns)
        peer = cluster.net.add_nic(self.name)
        sh("ip", "link", "set", peer, "netns", self.srv_ns, "name", "srv0")
        server_netns(self.srv_ns, "srv0", self.prefix)
        self.dnsmasq = Dnsmasq(self.srv_ns, "srv0", self.prefix, workdir)

    def on_node(self) -> dict[str, object] | None:
        return link(self.c.netns, self.name)

    def cleanup(self) -> None:
        self.dnsmasq.stop()
        # Deleting the server netns destroys the pair wherever the NIC end is.
        sh("ip", "netns", "del", self.srv_ns, check=False)
        sh("ip", "-n", self.c.netns, "link", "del", self.name, check=False)


@pytest.fixture
def nic(kube: Kube, kube_cluster: KubeCluster, driver: Driver, tmp_path: Path) -> Iterator[ServedNic]:
    n = ServedNic(kube_cluster, tmp_path)
    try:
        yield n
    finally:
        # The Pods go first (their NICs come back while attach runs), then the server.
        kube.delete_namespace()
        n.cleanup()


async def stored(d: Driver, claim_uid: str) -> list[object]:
    async with StoreClient(d.run_dir / "store.sock") as store:
        return list((await store.list(claim_uid=claim_uid)).devices)


async def test_pod_gets_the_leased_address_and_routes(kube: Kube, driver: Driver, nic: ServedNic) -> None:
    p = nic.prefix
    nic.dnsmasq.serve([f"121,{VIA},{p}.254,{ONLINK},0.0.0.0"])
    await kube.wait_published(nic.name, within=60)
    dc = kube.device_class("nic")
    config = {"parameters": {"interface": {"name": "net1", "dhcp": True}}}
    claim = kube.claim("dh", kube.claim_spec(dc, on(nic.name), [config]))
    kube.pod("dh", claims=["dh"])
    await kube.wait_phase("dh", within=RUN_WITHIN)

    (leased,) = nic.dnsmasq.leases()
    netns = await kube.pod_netns("dh")
    assert addrs(netns, "net1") == [f"{leased}/24"]
    assert {(VIA, f"{p}.254", "global"), (ONLINK, "", "link")} <= routes(netns, "net1")
    assert nic.on_node() is None
    (dc_stored,) = await stored(driver, claim["metadata"]["uid"])
    cfg = json.loads(dc_stored.pod_config_json)  # type: ignore[attr-defined]
    assert cfg["interface"]["addresses"] == [f"{leased}/24"]
    assert nic.dnsmasq.count("DHCPACK") == 1

    kube.delete_pod("dh")
    await kube.wait_gone("dh", within=GONE_WITHIN)
    back = await eventually(nic.on_node, 60, f"{nic.name} back on the node")
    assert "UP" in back["flags"]  # type: ignore[operator]
    assert nic.dnsmasq.count("DHCPRELEASE") == 0  # as dranet: the lease is left to expire


async def test_without_a_server_prepare_fails_naming_claim_and_device(
    kube: Kube, driver: Driver, nic: ServedNic
) -> None:
    await kube.wait_published(nic.name, within=60)
    dc = kube.device_class("nic")
    config = {"parameters": {"interface": {"dhcp": True}}}
    claim = kube.claim("nodhcp", kube.claim_spec(dc, on(nic.name), [config]))
    kube.pod("nodhcp", claims=["nodhcp"])
    event = await kube.wait_event("nodhcp", "no DHCP lease", within=RUN_WITHIN)
    assert f"claim {kube.ns}/nodhcp: request nic device {nic.name}: interface.dhcp:" in event["message"]
    assert (kube.get_pod("nodhcp") or {}).get("status", {}).get("phase") != "Running"
    assert await stored(driver, claim["metadata"]["uid"]) == []
    assert nic.on_node() is not None
