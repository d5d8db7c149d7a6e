"""The inventory as a real process in a real network namespace, asked over its socket."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dev.cluster.procs import REPO
from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from shared.rpc import channel
from tests.integration.inventory.helpers import StartInventory, ip, values, wait_devices

pytestmark = [pytest.mark.netns, pytest.mark.root]


def fill(ns: str) -> None:
    """A veth with everything prepare copies, and things it must not copy."""
    ip(ns, "link", "add", "a1", "type", "veth", "peer", "name", "b1")
    ip(ns, "link", "set", "a1", "mtu", "9000", "up")
    ip(ns, "link", "set", "b1", "up")
    ip(ns, "addr", "add", "10.1.0.1/24", "dev", "a1")
    ip(ns, "addr", "add", "10.1.1.1/24", "dev", "a1")
    ip(ns, "addr", "add", "127.1.0.1/8", "dev", "a1", "scope", "host")
    ip(ns, "addr", "add", "fd00:1::1/64", "dev", "a1", "nodad")
    ip(ns, "route", "add", "10.9.0.0/16", "via", "10.1.0.2", "dev", "a1", "table", "100")
    ip(ns, "route", "add", "default", "via", "10.1.0.254", "dev", "a1", "table", "200")
    ip(ns, "route", "add", "10.8.0.0/16", "via", "10.1.0.3", "dev", "a1", "src", "10.1.0.1")
    ip(ns, "-6", "route", "add", "fd00:9::/64", "via", "fd00:1::2", "dev", "a1", "table", "100")
    ip(ns, "rule", "add", "from", "10.1.0.1", "table", "100", "pref", "1000")
    ip(ns, "rule", "add", "to", "10.50.0.0/16", "table", "200", "pref", "1100")
    ip(ns, "rule", "add", "from", "10.7.0.0/16", "table", "300", "pref", "1200")  # not a1's table
    ip(ns, "-6", "rule", "add", "from", "fd00:1::1", "table", "100", "pref", "1000")
    ip(ns, "neigh", "add", "10.1.0.7", "lladdr", "02:00:00:00:00:07", "dev", "a1", "nud", "permanent")
    ip(ns, "neigh", "add", "fd00:1::7", "lladdr", "02:00:00:00:00:08", "dev", "a1", "nud", "permanent")
    ip(ns, "neigh", "add", "10.1.0.8", "lladdr", "02:00:00:00:00:09", "dev", "a1", "nud", "reachable")
    ip(ns, "link", "add", "mv0", "link", "a1", "type", "macvlan", "mode", "bridge")
    ip(ns, "link", "set", "mv0", "mtu", "1400")


async def test_host_snapshot_of_a_veth(netns: str, start_inventory: StartInventory) -> None:
    fill(netns)
    proc = start_inventory(netns, "--filter", "")
    async with channel(proc.socket) as ch:
        stub = inventory_pb2_grpc.InventoryStub(ch)
        dev = await stub.GetDevice(pb.GetDeviceRequest(name="a1", with_snapshot=True))
        s = dev.snapshot
        assert [(a.cidr, a.scope) for a in s.addresses] == [
            ("10.1.0.1/24", 0),
            ("10.1.1.1/24", 0),
            ("fd00:1::1/64", 0),
        ]
        routes = {(r.destination, r.gateway, r.source, r.table, r.scope) for r in s.routes}
        assert routes == {
            ("10.9.0.0/16", "10.1.0.2", "", 100, 0),
            ("0.0.0.0/0", "10.1.0.254", "", 200, 0),
            ("10.8.0.0/16", "10.1.0.3", "10.1.0.1", 254, 0),
            ("10.1.0.0/24", "", "10.1.0.1", 254, 253),
            ("10.1.1.0/24", "", "10.1.1.1", 254, 253),
            # The kernel's route for the host-scope address: dranet copies IPv4 kernel routes.
            ("127.0.0.0/8", "", "127.1.0.1", 254, 253),
            ("fd00:9::/64", "fd00:1::2", "", 100, 0),
        }
        assert [(r.priority, r.source, r.destination, r.table) for r in s.rules] == [
            (1000, "10.1.0.1/32", "", 100),
            (1000, "fd00:1::1/128", "", 100),
            (1100, "", "10.50.0.0/16", 200),
        ]
        assert sorted((n.destination, n.hardware_addr) for n in s.neighbors) == [
            ("10.1.0.7", "02:00:00:00:00:07"),
            ("fd00:1::7", "02:00:00:00:00:08"),
        ]
        assert (s.mtu, s.state, s.pf_ifname, s.rdma_device, len(s.rdma_dev_chars)) == (9000, "up", "", "", 0)
        assert s.hardware_addr == values(dev)["dra.net/mac"] and s.ifindex == dev.ifindex > 0
        assert dev.published and dev.type == "veth" and not dev.rdma_only

        mv = await stub.GetDevice(pb.GetDeviceRequest(name="mv0", with_snapshot=True))
        assert (mv.snapshot.link_ifname, mv.snapshot.link_mtu, mv.snapshot.mtu) == ("a1", 9000, 1400)
        assert values(mv)["dra.net/type"] == "macvlan"

        info = await stub.GetNodeInfo(pb.GetNodeInfoRequest())
        assert (info.node_name, info.rdma_netns_mode, info.cloud_provider, info.has_profile_provider) == (
            "node-a",
            "shared",
            "none",
            False,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ResolveProfile(pb.ResolveProfileRequest(device="a1", claim_uid="c1", profile="p"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "no profile provider" in str(
            err.value.details()
        )
        await stub.ReleaseProfile(pb.ReleaseProfileRequest(device="a1", claim_uid="c1", profile="p"))

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetDevice(pb.GetDeviceRequest(name="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in str(err.value.details())

        admin = admin_pb2_grpc.AdminStub(ch)
        health = await admin.Health(admin_pb2.HealthRequest())
        assert health.ready and health.service == "inventory"
        level = await admin.SetLogLevel(admin_pb2.SetLogLevelRequest(level="warning"))
        assert level.level == "WARNING"


async def test_devices_follow_link_add_delete_rename(netns: str, start_inventory: StartInventory) -> None:
    ip(netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    proc = start_inventory(netns, "--max-poll-interval", "1h")  # only link events can refresh it
    async with channel(proc.socket) as ch:
        stub = inventory_pb2_grpc.InventoryStub(ch)
        got = await wait_devices(stub, lambda d: "v0" in d)
        assert not got["v0"].published  # the default filter hides veth
        ip(netns, "link", "add", "br0", "type", "bridge")
        ip(netns, "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789", "dev", "v0")
        got = await wait_devices(stub, lambda d: "br0" in d and "vx0" in d)
        assert got["br0"].published and got["vx0"].published
        assert (
            values(got["vx0"])["dra.net/type"] == "vxlan" and values(got["br0"])["dra.net/type"] == "bridge"
        )
        ip(netns, "link", "set", "br0", "name", "br-renamed")
        await wait_devices(stub, lambda d: "br0" not in d and "br-renamed" in d)
        ip(netns, "link", "del", "vx0")
        got = await wait_devices(stub, lambda d: "vx0" not in d)
        # The host's own PCI NICs show up too (their netdevs live in another namespace).
        assert sorted(n for n in got if not n.startswith("pci-")) == ["br-renamed", "v0", "v1"]
        # Address changes are picked up too.
        ip(netns, "addr", "add", "192.0.2.9/24", "dev", "br-renamed")
        await wait_devices(stub, lambda d: values(d["br-renamed"]).get("dra.net/ipv4") == "192.0.2.9/24")


async def test_a_new_link_is_found_by_lookup_at_once(netns: str, start_inventory: StartInventory) -> None:
    proc = start_inventory(
        netns, "--max-poll-interval", "1h", "--min-poll-interval", "1h", "--poll-burst", "1"
    )
    async with channel(proc.socket) as ch:
        stub = inventory_pb2_grpc.InventoryStub(ch)
        await wait_devices(stub, lambda d: True)
        ip(netns, "link", "add", "late0", "type", "bridge")
        # The rate limiter holds the loop for an hour; a lookup miss rescans by itself.
        dev = await stub.GetDevice(pb.GetDeviceRequest(name="late0"))
        assert dev.ifname == "late0"


async def test_ebpf_programs_are_reported(netns: str, start_inventory: StartInventory) -> None:
    ip(netns, "link", "add", "e0", "type", "veth", "peer", "name", "e1")
    helper = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "tests.integration.inventory.bpfprog", "e0"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert helper.stdout is not None and helper.stdout.readline().strip() == "ready"
        proc = start_inventory(netns, "--filter", "")
        async with channel(proc.socket) as ch:
            stub = inventory_pb2_grpc.InventoryStub(ch)
            got = await wait_devices(stub, lambda d: "e0" in d and "e1" in d)
            e0, e1 = values(got["e0"]), values(got["e1"])
            assert (e0["dra.net/ebpf"], e0["dra.net/tcFilterNames"], e0["dra.net/tcxProgramNames"]) == (
                True,
                "dranet_cls",
                "dranet_tcx",
            )
            assert e1["dra.net/ebpf"] is False and "dra.net/tcFilterNames" not in e1
    finally:
        assert helper.stdin is not None
        helper.stdin.close()
        helper.wait(10)


def test_a_bad_filter_stops_start_up(netns: str, workdir: Path) -> None:
    res = subprocess.run(
        [
            "ip", "netns", "exec", netns, sys.executable, "-m", "services.inventory",
            "--no-publish", "--run-dir", str(workdir), "--filter", 'attributes["dra.net/type"].StringValue ==',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--filter" in res.stderr and "syntax error" in res.stderr
    assert not (workdir / "inventory.sock").exists()
