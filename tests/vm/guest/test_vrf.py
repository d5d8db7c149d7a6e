"""interface.vrf on a real kernel: the device is enslaved to a VRF device created in the
Pod's netns, its routes go into the VRF's table, and traffic bound to the VRF uses it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.netconfig.validate import vrf_table_for
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
)

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture
def uplink() -> Iterator[Uplink]:
    up = make_uplink(net=51)
    try:
        yield up
    finally:
        drop_uplink(up)


def sysctl(ns: str, key: str) -> str:
    return in_netns(netns_path(ns), lambda: open(f"/proc/sys/{key}").read().strip())


async def test_vrf_with_table_routes_and_traffic(stack: Stack, uplink: Uplink) -> None:
    pod = new_pod()
    params = {
        "interface": {
            "name": "net1",
            "addresses": ["198.18.51.5/24"],
            "vrf": {"name": "blue", "table": 1100},
        },
        "routes": [{"destination": "203.0.113.0/24", "gateway": uplink.gw}],
    }
    ref, res = await stack.prepare(uplink.host, params, pod)
    assert not res.error, res.error
    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        vrf = link(ns, "blue")
        assert vrf is not None and vrf["linkinfo"]["info_kind"] == "vrf"
        assert vrf["linkinfo"]["info_data"]["table"] == 1100 and "UP" in vrf["flags"]
        dev = link(ns, "net1")
        assert dev is not None and dev["master"] == "blue"
        assert addrs(ns, "net1") == {"198.18.51.5/24"}
        table = {r["dst"]: r for r in ipj(ns, "route", "show", "table", "1100")}
        assert table["203.0.113.0/24"]["gateway"] == uplink.gw and table["203.0.113.0/24"]["dev"] == "net1"
        assert "198.18.51.0/24" in table, "the connected route moved into the VRF table too"
        assert not ipj(ns, "route", "show", "203.0.113.0/24"), "nothing of it in the main table"
        assert (
            sysctl(ns, "net/ipv4/tcp_l3mdev_accept") == "1"
            and sysctl(ns, "net/ipv4/udp_l3mdev_accept") == "1"
        )
        # Traffic bound to the VRF reaches the gateway; unbound traffic finds no route.
        assert in_netns(netns_path(ns), lambda: icmp_echo(uplink.gw, bind_dev="blue"))
        assert not in_netns(netns_path(ns), lambda: icmp_echo(uplink.gw, timeout=1.0))

        await stack.hooks.stop_pod_sandbox(sandbox)
        assert link(ns, "net1") is None
        back = link(None, uplink.host)
        assert back is not None and "master" not in back and "UP" in back["flags"]
        # The VRF device stays in the pod's netns (it dies with it), as in dranet.
        assert link(ns, "blue") is not None
    await stack.preparer.unprepare([ref])


async def test_vrf_without_a_table_gets_the_derived_one(stack: Stack, uplink: Uplink) -> None:
    pod = new_pod()
    params = {"interface": {"name": "net1", "addresses": ["198.18.51.6/24"], "vrf": {"name": "red"}}}
    ref, res = await stack.prepare(uplink.host, params, pod)
    assert not res.error, res.error
    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        vrf = link(ns, "red")
        assert vrf is not None and vrf["linkinfo"]["info_data"]["table"] == vrf_table_for("red")
        assert link(ns, "net1")["master"] == "red"  # type: ignore[index]
        await stack.hooks.stop_pod_sandbox(sandbox)
    await stack.preparer.unprepare([ref])
