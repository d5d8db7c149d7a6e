"""IPvlan children on a real kernel, through prepare (real inventory and store) and the
attach service's NRI hooks with the netlink engine.

The parent is a veth whose peer (the gateway) sits in its own netns, so traffic from the
child really leaves through the parent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from proto.dranet.store.v1 import store_pb2 as st
from tests.vm.guest.kit import (
    Stack,
    Uplink,
    addrs,
    drop_uplink,
    icmp_echo,
    in_netns,
    ipj,
    link,
    make_uplink,
    netns,
    netns_path,
    new_pod,
    pod_sandbox,
    sh,
)

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture
def uplink() -> Iterator[Uplink]:
    up = make_uplink(net=31)
    try:
        yield up
    finally:
        drop_uplink(up)


async def test_child_with_addresses_mtu_routes_then_deleted_on_stop(stack: Stack, uplink: Uplink) -> None:
    pod = new_pod()
    params = {
        "interface": {"type": "IPVLAN", "name": "net1", "addresses": ["198.18.31.6/24"], "mtu": 1400},
        "routes": [{"destination": "203.0.113.0/24", "gateway": uplink.gw}],
    }
    ref, res = await stack.prepare(uplink.host, params, pod)
    assert not res.error, res.error
    (cfg,) = (await stack.stored(pod)).devices
    assert cfg.host_ifname == uplink.host and json.loads(cfg.pod_config_json)["interface"]["type"] == "IPVLAN"

    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        child = link(ns, "net1")
        parent = link(None, uplink.host)
        assert child is not None and parent is not None, "the child is in the pod, the parent on the host"
        assert child["linkinfo"]["info_kind"] == "ipvlan"
        assert child["linkinfo"]["info_data"]["mode"] == "l2"
        assert child["link_index"] == parent["ifindex"] and "link_netnsid" in child  # its parent: on the host
        assert child["mtu"] == 1400 <= parent["mtu"]
        assert child["address"] == uplink.mac  # ipvlan children share the parent's MAC
        assert "UP" in child["flags"]
        assert addrs(ns, "net1") == {"198.18.31.6/24"}
        assert [r["gateway"] for r in ipj(ns, "route", "show", "203.0.113.0/24")] == [uplink.gw]
        assert addrs(None, uplink.host) == {uplink.host_ip}, "the parent keeps its address"
        # Real traffic: the child reaches the gateway through its parent.
        assert in_netns(netns_path(ns), lambda: icmp_echo(uplink.gw)), "no ICMP reply through the child"

        (result,) = (await stack.stored(pod)).results
        assert result.attached and result.interface_name == "net1" and list(result.ips) == ["198.18.31.6/24"]

        # A retried RunPodSandbox for the same sandbox changes nothing.
        await stack.hooks.run_pod_sandbox(sandbox)
        assert link(ns, "net1")["ifindex"] == child["ifindex"]  # type: ignore[index]

        await stack.hooks.stop_pod_sandbox(sandbox)
        assert link(ns, "net1") is None, "the child is deleted on Pod stop"
        assert link(None, uplink.host) is not None and addrs(None, uplink.host) == {uplink.host_ip}
        (result,) = (await stack.stored(pod)).results
        assert not result.attached

    assert (await stack.preparer.unprepare([ref]))[ref.uid] == ""
    assert not (await stack.stored(pod)).devices


async def test_unnumbered_child_and_default_mtu(stack: Stack, uplink: Uplink) -> None:
    pod = new_pod()
    params = {
        "interface": {"type": "IPVLAN", "name": "net1", "addressing": "Unnumbered"},
        "routes": [{"destination": "203.0.113.0/24", "scope": 253}],
    }
    ref, res = await stack.prepare(uplink.host, params, pod)
    assert not res.error, res.error
    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        child = link(ns, "net1")
        assert child is not None and child["linkinfo"]["info_kind"] == "ipvlan"
        assert addrs(ns, "net1") == set(), "Unnumbered: no address of its own"
        assert child["mtu"] == link(None, uplink.host)["mtu"]  # type: ignore[index]
        (route,) = ipj(ns, "route", "show", "203.0.113.0/24")
        assert route["dev"] == "net1" and route.get("scope") == "link"
        await stack.hooks.stop_pod_sandbox(sandbox)
        assert link(ns, "net1") is None
    await stack.preparer.unprepare([ref])


async def test_mtu_above_the_parent_is_refused_at_prepare(stack: Stack, uplink: Uplink) -> None:
    pod = new_pod()
    params = {"interface": {"type": "IPVLAN", "name": "net1", "addresses": ["198.18.31.7/24"], "mtu": 9000}}
    _, res = await stack.prepare(uplink.host, params, pod)
    assert f"interface.mtu 9000 exceeds parent {uplink.host} MTU 1500" in res.error, res.error
    assert not (await stack.stored(pod)).devices, "a refused claim stores nothing"


async def test_the_engine_refuses_it_too_though_the_kernel_would_not(stack: Stack, uplink: Uplink) -> None:
    """A config that skipped prepare's check (an old record) is refused by the attach
    engine's plan before anything changes. The check is needed: the kernel itself gives an
    ipvlan child any MTU up to 65535 whatever its parent's (measured below)."""
    pod = new_pod()
    cfg = st.DeviceConfig(
        device=f"dev-{uplink.host}",
        pod=pod,
        host_ifname=uplink.host,
        pod_config_json=json.dumps({"interface": {"type": "IPVLAN", "name": "net1", "mtu": 9000}}),
        rdma_netns_mode="shared",
    )
    with netns() as ns:
        out = await stack.engine.attach_outcome(cfg, netns_path(ns))
        assert not out.ok and out.failed_step == "plan"
        assert "interface.mtu 9000 exceeds the parent's MTU 1500" in out.error and uplink.host in out.error
        assert link(ns, "net1") is None and addrs(None, uplink.host) == {uplink.host_ip}

        sh(
            "ip",
            "link",
            "add",
            "link",
            uplink.host,
            "name",
            "iv9",
            "netns",
            ns,
            "mtu",
            "9000",
            "type",
            "ipvlan",
        )
        assert link(ns, "iv9")["mtu"] == 9000 > link(None, uplink.host)["mtu"]  # type: ignore[index]
