"""interface.dhcp on the host kernel against a real DHCP server (dnsmasq in a peer netns
over a veth pair; the client end sits in a netns standing in for the node, as in the dev
harness where prepare runs outside the node's netns).

- the DHCP step itself (``services.prepare.dhcp.DhcpClient``): the lease's address and
  routes from option 121 (on-link ones as scope link) or, without 121, option 3; the
  host interface set up and left unaddressed; no server: a bounded failure;
- prepare's pipeline (``Preparer``, a real store process; the claim and the inventory's
  device answer are fakes) storing the lease, then attach's engine (``NetdevEngine``)
  applying that stored config into a Pod netns made with ``ip netns add``: the Pod has
  the leased address and the routes and reaches the server; no server: the claim fails
  within the timeout naming claim and device, and nothing is stored; a second Prepare of
  a prepared claim takes no second lease; no DHCPRELEASE is sent, as dranet.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from services.attach.netdev import NetdevEngine
from services.prepare.dhcp import DhcpClient, DhcpError, DhcpLease
from services.prepare.pipeline import ClaimRef, Preparer
from shared.netconfig import RouteConfig
from shared.storeclient import StoreClient
from tests.integration.attach import attach_env
from tests.integration.dhcp.dhcp_env import DhcpNet, addrs, dhcp_net, ipj, routes

pytestmark = [pytest.mark.root, pytest.mark.netns]

DRIVER = "dra.net"
NODE = "node-dhcp"
# RFC 3442 test routes: one via a gateway on the leased subnet, one on-link.
VIA = "192.0.2.0/24"
ONLINK = "198.51.100.0/24"


@pytest.fixture
def net(tmp_path: Path) -> Iterator[DhcpNet]:
    with dhcp_net(tmp_path) as n:
        yield n


def option121(n: DhcpNet) -> str:
    return f"121,{VIA},{n.prefix}.254,{ONLINK},0.0.0.0"


# --- the DHCP step ---------------------------------------------------------------------------


async def test_lease_takes_address_and_classless_routes_and_ignores_option_3(tmp_path: Path) -> None:
    with dhcp_net(tmp_path, nic_up=False) as n:
        n.serve([f"3,{n.server_ip}", option121(n)], lease="10m")
        lease = await DhcpClient(n.node_path).lease(n.nic)
        ip, _, plen = lease.address.partition("/")
        assert plen == "24" and ip.startswith(f"{n.prefix}.") and 100 <= int(ip.rsplit(".", 1)[1]) <= 150
        # Option 121 present: option 3 is not used (RFC 3442; dranet takes only 121).
        assert lease.routes == (
            RouteConfig(destination=VIA, gateway=f"{n.prefix}.254"),
            RouteConfig(destination=ONLINK, scope=253),
        )
        assert lease.server_id == n.server_ip and lease.lease_time_s == 600
        # Set up as dranet does, and never addressed on the host side.
        (link,) = ipj(n.node_ns, "link", "show", "dev", n.nic)
        assert "UP" in link["flags"]
        assert addrs(n.node_ns, n.nic) == []
        assert n.leases() == [ip]


async def test_without_option_121_the_router_becomes_the_default_route(net: DhcpNet) -> None:
    net.serve([f"3,{net.server_ip},{net.prefix}.2"])
    lease = await DhcpClient(net.node_path).lease(net.nic)
    assert lease.routes == (RouteConfig(destination="0.0.0.0/0", gateway=net.server_ip),)


async def test_no_server_fails_within_the_timeout_without_blocking_the_loop(net: DhcpNet) -> None:
    client = DhcpClient(net.node_path, timeout_s=1.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    tick = asyncio.create_task(ticker())
    t0 = time.monotonic()
    with pytest.raises(DhcpError, match=rf"no DHCP lease on {net.nic} \(netns {net.node_path}\) within 1.5s"):
        await client.lease(net.nic)
    took = time.monotonic() - t0
    tick.cancel()
    assert 1.4 <= took < 3.0, took
    # The exchange ran in its own thread: the event loop kept running meanwhile.
    assert ticks >= 20, ticks


async def test_unknown_interface_or_netns_is_a_clear_error(net: DhcpNet) -> None:
    with pytest.raises(DhcpError, match=r"nope0 \(netns .*\): no such interface"):
        await DhcpClient(net.node_path).lease("nope0")
    with pytest.raises(DhcpError, match=r"network namespace /var/run/netns/dh-missing does not exist"):
        await DhcpClient("/var/run/netns/dh-missing").lease(net.nic)


# --- prepare (pipeline + real store) then attach (engine) --------------------------------------


class FakeKube:
    """The API server's answer for the claims prepare reads."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))


class FakeInventory:
    """The inventory's answer for the veth NIC (the real one runs in the node netns)."""

    def __init__(self, devices: dict[str, inv.Device]) -> None:
        self.devices = devices

    async def get_device(self, name: str) -> inv.Device | None:
        return self.devices.get(name)

    async def node_info(self) -> inv.NodeInfo:
        return inv.NodeInfo(node_name=NODE, rdma_netns_mode="shared", cloud_provider="none")


class CountingDhcp(DhcpClient):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.calls = 0

    async def lease(self, interface: str) -> DhcpLease:
        self.calls += 1
        return await super().lease(interface)


@dataclass
class Stack:
    net: DhcpNet
    kube: FakeKube
    store: StoreClient
    dhcp: CountingDhcp
    preparer: Preparer

    def claim(self, device: str, parameters: dict[str, Any]) -> tuple[ClaimRef, st.PodRef]:
        name = f"c-{uuid.uuid4().hex[:6]}"
        ref = ClaimRef(namespace="default", name=name, uid=str(uuid.uuid4()))
        pod = st.PodRef(uid=str(uuid.uuid4()), namespace="default", name=f"{name}-pod")
        self.kube.claims[("default", name)] = {
            "metadata": {"name": name, "namespace": "default", "uid": ref.uid},
            "status": {
                "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
                "allocation": {
                    "devices": {
                        "results": [{"driver": DRIVER, "pool": NODE, "device": device, "request": "nic"}],
                        "config": [
                            {
                                "source": "FromClaim",
                                "requests": ["nic"],
                                "opaque": {"driver": DRIVER, "parameters": parameters},
                            }
                        ],
                    }
                },
            },
        }
        return ref, pod


@pytest.fixture
async def stack(tmp_path: Path, net: DhcpNet) -> AsyncIterator[Stack]:
    # A host route through the NIC, as the inventory's snapshot reports it: dranet copies
    # host routes too, after the DHCP ones.
    device = inv.Device(
        name=net.nic,
        ifname=net.nic,
        mtu=1500,
        snapshot=inv.HostSnapshot(
            mtu=1500,
            routes=[inv.Route(destination="203.0.113.0/24", gateway=f"{net.prefix}.1", source="10.9.9.9")],
        ),
    )
    store_proc = attach_env.store_process(tmp_path / "store")
    (tmp_path / "store" / "run").mkdir(parents=True)
    store_proc.start()
    store = StoreClient(store_proc.socket)
    kube = FakeKube()
    dhcp = CountingDhcp(net.node_path, timeout_s=2.0)
    preparer = Preparer(
        DRIVER,
        NODE,
        kube,  # type: ignore[arg-type]
        FakeInventory({net.nic: device}),  # type: ignore[arg-type]
        store,
        require_attach=False,
        dhcp=dhcp,
    )
    try:
        yield Stack(net, kube, store, dhcp, preparer)
    finally:
        await store.close()
        store_proc.stop()


async def test_prepare_stores_the_lease_and_attach_applies_it(stack: Stack) -> None:
    n = stack.net
    n.serve([option121(n)])
    ref, pod = stack.claim(n.nic, {"interface": {"name": "net1", "dhcp": True}})
    res = (await stack.preparer.prepare([ref]))[ref.uid]
    assert not res.error and [d.device for d in res.devices] == [n.nic]

    stored = await stack.store.get_device(pod.uid, n.nic)
    assert stored is not None and not stored.provisional
    cfg = json.loads(stored.pod_config_json)
    (leased,) = cfg["interface"]["addresses"]
    assert cfg["interface"]["dhcp"] is True and leased.startswith(f"{n.prefix}.") and leased.endswith("/24")
    assert cfg["routes"] == [
        {"destination": VIA, "gateway": f"{n.prefix}.254"},
        {"destination": ONLINK, "scope": 253},
        # The host route copied after them; its source is not the Pod's address: dropped.
        {"destination": "203.0.113.0/24", "gateway": f"{n.prefix}.1"},
    ]
    assert n.count("DHCPACK") == 1

    # RunPodSandbox: attach (in the node netns, like the service) applies the stored config.
    pod_ns = n.pod_ns()
    pod_path = f"/var/run/netns/{pod_ns}"
    engine = NetdevEngine(host_netns=n.node_path)
    try:
        out = await engine.attach_outcome(stored, pod_path)
        assert out.ok, (out.error, out.failed_step, out.steps)
        assert out.ips == (leased,)
        assert addrs(pod_ns, "net1") == [leased]
        assert {
            (VIA, f"{n.prefix}.254", "global"),
            (ONLINK, "", "link"),
            ("203.0.113.0/24", f"{n.prefix}.1", "global"),
        } <= routes(pod_ns, "net1")
        assert attach_env.ping(pod_path, n.server_ip)
        back = await engine.detach_outcome(stored, pod_path)
        assert not back.error
    finally:
        engine.close()

    # Idempotent: the same claim again reuses what is stored, with no second exchange.
    again = (await stack.preparer.prepare([ref]))[ref.uid]
    assert not again.error and stack.dhcp.calls == 1
    assert (await stack.store.get_device(pod.uid, n.nic)) == stored
    assert n.count("DHCPDISCOVER") == 1

    # Unprepare forgets the claim; as dranet, no DHCPRELEASE: the lease runs out on the server.
    assert (await stack.preparer.unprepare([ref])) == {ref.uid: ""}
    assert await stack.store.get_device(pod.uid, n.nic) is None
    assert n.count("DHCPRELEASE") == 0 and n.leases() == [leased.split("/")[0]]


async def test_prepare_with_option_3_only_gives_the_pod_a_default_route(stack: Stack) -> None:
    n = stack.net
    n.serve([f"3,{n.server_ip}"])
    ref, pod = stack.claim(n.nic, {"interface": {"dhcp": True}})
    assert not (await stack.preparer.prepare([ref]))[ref.uid].error
    stored = await stack.store.get_device(pod.uid, n.nic)
    assert stored is not None
    pod_ns = n.pod_ns()
    engine = NetdevEngine(host_netns=n.node_path)
    try:
        out = await engine.attach_outcome(stored, f"/var/run/netns/{pod_ns}")
        assert out.ok, (out.error, out.failed_step)
        # No name configured: the interface keeps its host name in the Pod.
        assert ("default", n.server_ip, "global") in routes(pod_ns, n.nic)
        # Reached through the default route: an address off the leased subnet.
        attach_env.ip("-n", n.srv_ns, "addr", "add", "192.0.2.77/32", "dev", n.srv_if)
        assert attach_env.ping(f"/var/run/netns/{pod_ns}", "192.0.2.77")
        assert not (await engine.detach_outcome(stored, f"/var/run/netns/{pod_ns}")).error
    finally:
        engine.close()


async def test_no_server_fails_the_claim_in_bounded_time_and_stores_nothing(stack: Stack) -> None:
    n = stack.net
    ref, pod = stack.claim(n.nic, {"interface": {"dhcp": True}})
    t0 = time.monotonic()
    res = (await stack.preparer.prepare([ref]))[ref.uid]
    took = time.monotonic() - t0
    assert took < 2.0 + 2.0, took  # the exchange's 2 s bound, plus the store round trips
    assert res.error.startswith(f"claim default/{ref.name}: request nic device {n.nic}: interface.dhcp: ")
    assert "no DHCP lease" in res.error and "within 2s" in res.error
    assert not res.devices
    assert await stack.store.get_device(pod.uid, n.nic) is None
    assert not (await stack.store.list(claim_uid=ref.uid)).devices

    # The kubelet retries; with a server now, the retry takes the lease.
    n.serve()
    again = (await stack.preparer.prepare([ref]))[ref.uid]
    assert not again.error
    stored = await stack.store.get_device(pod.uid, n.nic)
    assert stored is not None and json.loads(stored.pod_config_json)["interface"]["addresses"]
