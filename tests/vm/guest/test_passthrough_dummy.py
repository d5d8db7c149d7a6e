"""dummy NICs as passthrough devices: published by the inventory (veth is not, by the
default filter), prepared, moved into the Pod with their config, and returned."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.vm.guest.kit import (
    Stack,
    addrs,
    in_netns,
    ip_batch,
    ipj,
    link,
    netns,
    netns_path,
    new_pod,
    pod_sandbox,
    sh,
)

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture
def dummies() -> Iterator[tuple[str, str]]:
    a, b = "dmya", "dmyb"
    ip_batch(
        [
            f"link add {a} address 02:dd:00:00:41:02 type dummy",
            f"link add {b} address 02:dd:00:00:42:02 type dummy",
            f"addr add 198.18.41.2/24 dev {a}",
            f"addr add 198.18.42.2/24 dev {b}",
            f"link set {a} up",
            f"link set {b} up",
            f"route add 198.51.100.0/24 via 198.18.42.1 dev {b}",
        ]
    )
    try:
        yield a, b
    finally:
        sh("ip", "link", "del", a, check=False)
        sh("ip", "link", "del", b, check=False)


def sysctl(ns: str, key: str) -> str:
    return in_netns(netns_path(ns), lambda: open(f"/proc/sys/{key}").read().strip())


async def test_two_dummies_move_configure_and_return(stack: Stack, dummies: tuple[str, str]) -> None:
    a, b = dummies
    await stack.inventory.scan()
    for name in (a, b):
        dev = stack.inventory.get(name)
        assert dev is not None and name in stack.inventory.published, "dummy NICs are published"
        assert dev.attributes["dra.net/type"].to_json() == {"string": "dummy"}
        assert dev.attributes["dra.net/virtual"].to_json() == {"bool": True}
        assert dev.attributes["dra.net/rdma"].to_json() == {"bool": False}

    pod = new_pod()
    full = {
        "interface": {
            "name": "net1",
            "mtu": 9000,
            "hardwareAddr": "02:00:00:00:41:01",
            "addresses": ["198.18.41.5/24", "2001:db8:41::5/64"],
            "gsoMaxSize": 32768,
            "groMaxSize": 32768,
            "forwarding": True,
            "arpIgnore": 1,
            "arpAnnounce": 2,
        },
        "routes": [
            {"destination": "203.0.113.0/24", "gateway": "198.18.41.1"},
            {"destination": "192.0.2.0/24", "gateway": "198.18.41.1", "table": 100},
        ],
        "rules": [{"priority": 1000, "source": "198.18.41.5/32", "table": 100}],
        "neighbors": [{"destination": "198.18.41.1", "hardwareAddr": "02:00:00:00:41:ff"}],
    }
    ref_a, res_a = await stack.prepare(a, full, pod)
    # No config: the device keeps its host name, addresses and routes (the host snapshot).
    ref_b, res_b = await stack.prepare(b, None, pod)
    assert not res_a.error and not res_b.error, (res_a.error, res_b.error)

    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        assert link(None, a) is None and link(None, b) is None, "both left the host"

        n1 = link(ns, "net1")
        assert n1 is not None and n1["linkinfo"]["info_kind"] == "dummy"
        assert (n1["mtu"], n1["address"]) == (9000, "02:00:00:00:41:01")
        assert (n1["gso_max_size"], n1["gro_max_size"]) == (32768, 32768)
        assert "UP" in n1["flags"] and f"dranet-{a}" in n1.get("altnames", [])
        assert addrs(ns, "net1") == {"198.18.41.5/24", "2001:db8:41::5/64"}
        assert [r["gateway"] for r in ipj(ns, "route", "show", "203.0.113.0/24")] == ["198.18.41.1"]
        assert [r["dst"] for r in ipj(ns, "route", "show", "table", "100")] == ["192.0.2.0/24"]
        rules = [r for r in ipj(ns, "rule", "show") if r.get("priority") == 1000]
        assert [(r["src"], r["table"]) for r in rules] == [("198.18.41.5", "100")]
        (neigh,) = [n for n in ipj(ns, "neigh", "show", "dev", "net1") if n["dst"] == "198.18.41.1"]
        assert neigh["lladdr"] == "02:00:00:00:41:ff" and "PERMANENT" in neigh["state"]
        assert sysctl(ns, "net/ipv4/conf/net1/forwarding") == "1"
        assert sysctl(ns, "net/ipv4/conf/net1/arp_ignore") == "1"
        assert sysctl(ns, "net/ipv4/conf/net1/arp_announce") == "2"

        nb = link(ns, b)
        assert nb is not None and "UP" in nb["flags"]
        assert addrs(ns, b) == {"198.18.42.2/24"}
        assert [r["gateway"] for r in ipj(ns, "route", "show", "198.51.100.0/24")] == ["198.18.42.1"]

        results = {r.device: r for r in (await stack.stored(pod)).results}
        assert all(r.attached for r in results.values()) and len(results) == 2
        assert sorted(r.interface_name for r in results.values()) == sorted(["net1", b])
        # No RDMA: containers get no device files.
        assert await stack.hooks.create_container(sandbox, _container()) is None

        await stack.hooks.stop_pod_sandbox(sandbox)
        assert link(ns, "net1") is None and link(ns, b) is None
        for name in (a, b):
            back = link(None, name)
            assert back is not None and "UP" in back["flags"], f"{name} is back under its host name, up"
            assert f"dranet-{name}" not in back.get("altnames", []), "the altname tag is removed"
        assert not any(r.attached for r in (await stack.stored(pod)).results)

    for ref in (ref_a, ref_b):
        assert (await stack.preparer.unprepare([ref]))[ref.uid] == ""


def _container() -> object:
    from proto.nri.v1alpha1 import nri_pb2

    return nri_pb2.Container(id="c1", name="main")


async def test_config_is_what_prepare_stored(stack: Stack, dummies: tuple[str, str]) -> None:
    """The stored DeviceConfig carries the host snapshot (what a rollback restores) and,
    without addresses in the claim, the host's addresses for the pod."""
    a, _ = dummies
    pod = new_pod()
    ref, res = await stack.prepare(a, {"interface": {"name": "net7"}}, pod)
    assert not res.error, res.error
    (cfg,) = (await stack.stored(pod)).devices
    host = json.loads(cfg.host_config_json)
    assert host["interface"]["name"] == a and host["interface"]["addresses"] == ["198.18.41.2/24"]
    assert json.loads(cfg.pod_config_json)["interface"]["addresses"] == ["198.18.41.2/24"]
    assert (await stack.preparer.unprepare([ref]))[ref.uid] == ""
