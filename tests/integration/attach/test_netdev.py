"""The attach engine against real network namespaces: a veth end stands in for the NIC
(its peer sits in a "peer" netns with the gateway address), the pod is a netns made
with ``ip netns add``. Every check reads the kernel with ``ip -n <ns> -j`` or
/proc/sys through ``ip netns exec``.

What runs for real here: passthrough move+rename with MTU/MAC, sysctls, addresses,
link up, routes (main and a table), rules, permanent neighbors, ethtool features,
eBPF detach (tc bpf filters and TCX programs/links), the altname tag, rollback with
host address/route restore, converge and return, renamed devices, a deleted netns.
IPvlan, VRF and RDMA netlink are missing from this kernel: their tests check that the
engine fails cleanly and rolls back here, and run the real thing where the kernel
has it (the VM route).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from proto.dranet.store.v1 import store_pb2
from services.attach import netdev, netdev_ebpf
from services.attach.engine import Attached, AttachFailed, Location
from services.attach.netdev import NetdevEngine
from services.attach.netdev_nl import NlSocket
from shared.attachplan import CreateChild, ReturnState
from shared.netns import open_netns, setns

pytestmark = [pytest.mark.root, pytest.mark.netns]

T = TypeVar("T")


def sh(*args: str, check: bool = True) -> str:
    res = subprocess.run(args, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def ipj(ns: str | None, *args: str) -> Any:
    """``ip -j`` output, in netns ``ns`` (None: the host)."""
    base = ["ip", "-n", ns] if ns else ["ip"]
    out = sh(*base, "-j", *args)
    return json.loads(out) if out.strip() else []


def link(ns: str | None, name: str) -> dict[str, Any] | None:
    for entry in ipj(ns, "-d", "link", "show"):
        if entry["ifname"] == name or name in entry.get("altnames", []):
            return dict(entry)
    return None


def addrs(ns: str | None, name: str) -> set[str]:
    out = set()
    for entry in ipj(ns, "addr", "show", "dev", name):
        for a in entry.get("addr_info", []):
            if a.get("scope") == "global":
                out.add(f"{a['local']}/{a['prefixlen']}")
    return out


def exists(path: str) -> bool:
    return os.path.exists(path)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def sysctl(ns: str, key: str) -> str:
    return sh("ip", "netns", "exec", ns, "cat", f"/proc/sys/{key}").strip()


PING = r"""
import os, socket, struct, sys, time
dst = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(0.2)
ident = os.getpid() & 0xFFFF
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xFFFF)
    return ~(t + (t >> 16)) & 0xFFFF
deadline, seq = time.monotonic() + 5, 0
while time.monotonic() < deadline:
    seq += 1
    pkt = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"dranet"
    s.sendto(pkt[:2] + struct.pack("!H", csum(pkt)) + pkt[4:], (dst, 0))
    try:
        while True:
            data, addr = s.recvfrom(1500)
            ihl = (data[0] & 0xF) * 4
            kind, _, _, rid, _ = struct.unpack("!BBHHH", data[ihl : ihl + 8])
            if kind == 0 and rid == ident and addr[0] == dst:
                sys.exit(0)
    except socket.timeout:
        pass
sys.exit(1)
"""


def ping(ns: str, dst: str) -> bool:
    """An ICMP echo from inside ``ns`` (raw socket; there is no ping binary here)."""
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PING, dst], capture_output=True)
    return res.returncode == 0


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread that entered the netns at ``path``."""
    box: dict[str, Any] = {}

    def body() -> None:
        fd = open_netns(path)
        try:
            setns(fd)
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@dataclass
class Nic:
    """A veth "NIC" on the host with its peer (the gateway) in a peer netns."""

    host: str  # host-side name of the NIC
    peer_ns: str
    pod_ns: str
    net: int  # third octet of 198.18.<net>.0/24 (link) and 198.19.<net>.0/24 (routed)
    mac: str

    @property
    def pod_path(self) -> str:
        return f"/var/run/netns/{self.pod_ns}"

    @property
    def host_ip(self) -> str:
        return f"198.18.{self.net}.2/24"

    @property
    def gw(self) -> str:
        return f"198.18.{self.net}.1"

    @property
    def routed(self) -> str:
        return f"198.19.{self.net}.0/24"

    def config(self, pod: dict[str, Any] | None = None, **kw: Any) -> store_pb2.DeviceConfig:
        """A DeviceConfig as prepare stores it (host snapshot merged into the pod config)."""
        host = {
            "interface": {
                "name": self.host,
                "mtu": 1500,
                "hardwareAddr": self.mac,
                "addresses": [self.host_ip],
            },
            "routes": [{"destination": self.routed, "gateway": self.gw}],
        }
        cfg = store_pb2.DeviceConfig(
            device=f"nic-{self.host}",
            pod=store_pb2.PodRef(uid=f"uid-{self.host}", namespace="default", name="p"),
            host_ifname=self.host,
            pod_config_json=json.dumps(pod if pod is not None else {}),
            host_config_json=json.dumps(host),
            **kw,
        )
        return cfg


def make_nic(pod_ns: str | None = None) -> Nic:
    sfx = uuid.uuid4().hex[:5]
    nic = Nic(
        host=f"dn{sfx}h",
        peer_ns=f"dn{sfx}peer",
        pod_ns=pod_ns or f"dn{sfx}pod",
        net=random.randint(1, 250),
        mac=f"02:dd:{sfx[:2]}:{sfx[2:4]}:0{sfx[4]}:01",
    )
    sh("ip", "netns", "add", nic.peer_ns)
    if pod_ns is None:
        sh("ip", "netns", "add", nic.pod_ns)
    sh("ip", "link", "add", nic.host, "address", nic.mac, "type", "veth", "peer", "name", f"dn{sfx}p")
    sh("ip", "link", "set", f"dn{sfx}p", "netns", nic.peer_ns, "name", "gw0")
    sh("ip", "-n", nic.peer_ns, "addr", "add", f"{nic.gw}/24", "dev", "gw0")
    sh("ip", "-n", nic.peer_ns, "link", "set", "gw0", "up")
    sh("ip", "addr", "add", nic.host_ip, "dev", nic.host)
    sh("ip", "link", "set", nic.host, "up")
    sh("ip", "route", "add", nic.routed, "via", nic.gw, "dev", nic.host)
    return nic


def drop_nic(nic: Nic) -> None:
    for ns in (nic.pod_ns, nic.peer_ns):
        sh("ip", "netns", "del", ns, check=False)
    for name in (nic.host, f"dranet-{nic.host}"):
        sh("ip", "link", "del", name, check=False)


@pytest.fixture
def nic() -> Iterator[Nic]:
    n = make_nic()
    try:
        yield n
    finally:
        drop_nic(n)


@pytest.fixture
async def engine() -> Any:
    e = NetdevEngine()
    yield e
    e.close()


def full_config(nic: Nic) -> dict[str, Any]:
    """Name, MTU, MAC, two addresses, routes (main and table 100), a rule, a neighbor, sysctls."""
    return {
        "interface": {
            "name": "net1",
            "mtu": 1400,
            "hardwareAddr": "02:00:00:00:77:01",
            "addresses": [f"198.18.{nic.net}.5/24", f"fd00:dd:{nic.net:x}::5/64"],
            "forwarding": True,
            "arpIgnore": 1,
            "arpAnnounce": 2,
            "gsoMaxSize": 32768,
            "groMaxSize": 32000,
            "gsoIPv4MaxSize": 31000,
            "groIPv4MaxSize": 30000,
        },
        "routes": [
            {"destination": nic.routed, "gateway": nic.gw},
            {"destination": "203.0.113.0/24", "gateway": nic.gw, "table": 100},
        ],
        "rules": [{"priority": 1000, "source": f"198.18.{nic.net}.5/32", "table": 100}],
        "neighbors": [{"destination": f"198.18.{nic.net}.9", "hardwareAddr": "02:00:00:00:00:09"}],
    }


def assert_back_on_host(nic: Nic, *, with_addresses: bool) -> None:
    back = link(None, nic.host)
    assert back is not None, f"{nic.host} is not on the host"
    assert back["ifname"] == nic.host
    assert "UP" in back["flags"]
    assert f"dranet-{nic.host}" not in back.get("altnames", [])
    if with_addresses:
        assert nic.host_ip in addrs(None, nic.host)
        routes = ipj(None, "route", "show", nic.routed)
        assert routes and routes[0]["gateway"] == nic.gw and routes[0]["dev"] == nic.host


async def test_passthrough_configures_everything_and_returns(nic: Nic, engine: NetdevEngine) -> None:
    cfg = nic.config(full_config(nic))
    out = await engine.attach_outcome(cfg, nic.pod_path)
    assert out.ok, out.error
    assert (out.interface_name, out.hardware_address, out.attached) == ("net1", "02:00:00:00:77:01", True)
    assert out.ips == (f"198.18.{nic.net}.5/24", f"fd00:dd:{nic.net:x}::5/64")
    assert [(c.type, c.reason) for c in out.conditions] == [
        ("Ready", "NetworkDeviceReady"),
        ("NetworkReady", "NetworkReady"),
    ]

    assert link(None, nic.host) is None, "the NIC is still on the host"
    pod = link(nic.pod_ns, "net1")
    assert pod is not None
    assert (pod["mtu"], pod["address"]) == (1400, "02:00:00:00:77:01")
    assert (pod["gso_max_size"], pod["gro_max_size"]) == (32768, 32000)
    # iproute2 6.1 does not print the IPv4 sizes; read them with the engine's decoder.
    seen = in_netns(nic.pod_path, lambda: NlSocket().get_link(name="net1"))
    assert seen is not None and (seen.gso_ipv4_max_size, seen.gro_ipv4_max_size) == (31000, 30000)
    assert "UP" in pod["flags"] and f"dranet-{nic.host}" in pod["altnames"]
    assert out.ifindex == pod["ifindex"]
    assert addrs(nic.pod_ns, "net1") == {f"198.18.{nic.net}.5/24", f"fd00:dd:{nic.net:x}::5/64"}
    main = ipj(nic.pod_ns, "route", "show", nic.routed)
    assert main and main[0]["gateway"] == nic.gw and main[0]["dev"] == "net1"
    table = ipj(nic.pod_ns, "route", "show", "table", "100")
    assert [(r["dst"], r["gateway"], r["dev"]) for r in table] == [("203.0.113.0/24", nic.gw, "net1")]
    rules = [r for r in ipj(nic.pod_ns, "rule", "show") if r.get("priority") == 1000]
    assert rules and rules[0]["src"] == f"198.18.{nic.net}.5" and rules[0]["table"] == "100"
    neigh = ipj(nic.pod_ns, "neigh", "show", "dev", "net1")
    assert {(n["dst"], n["lladdr"]) for n in neigh if "PERMANENT" in n["state"]} == {
        (f"198.18.{nic.net}.9", "02:00:00:00:00:09")
    }
    assert sysctl(nic.pod_ns, "net/ipv4/conf/net1/forwarding") == "1"
    assert sysctl(nic.pod_ns, "net/ipv6/conf/net1/forwarding") == "1"
    assert sysctl(nic.pod_ns, "net/ipv4/conf/net1/arp_ignore") == "1"
    assert sysctl(nic.pod_ns, "net/ipv4/conf/net1/arp_announce") == "2"
    assert ping(nic.pod_ns, nic.gw), "the pod cannot reach its peer"

    back = await engine.detach_outcome(cfg, nic.pod_path, mac=out.hardware_address)
    assert back.ok and back.state == ReturnState.RETURNED, back
    assert link(nic.pod_ns, "net1") is None
    # Back under its host name and up; host addresses are not restored (as dranet).
    assert_back_on_host(nic, with_addresses=False)
    assert addrs(None, nic.host) == set()


async def test_attach_and_return_are_idempotent(nic: Nic, engine: NetdevEngine) -> None:
    cfg = nic.config(full_config(nic))
    never = await engine.detach_outcome(cfg, nic.pod_path)
    assert never.ok and never.state == ReturnState.ALREADY_ON_HOST
    assert nic.host_ip in addrs(None, nic.host), "a return of a never-attached device touched it"

    first = await engine.attach_outcome(cfg, nic.pod_path)
    again = await engine.attach_outcome(cfg, nic.pod_path)
    assert first.ok and again.ok, (first.error, again.error)
    assert again.converged and not first.converged
    assert (again.interface_name, again.hardware_address, again.ips) == (
        first.interface_name,
        first.hardware_address,
        first.ips,
    )
    assert any("(already so)" in s for s in again.steps)
    assert len([r for r in ipj(nic.pod_ns, "rule", "show") if r.get("priority") == 1000]) == 1
    assert await engine.locate(cfg, nic.pod_path) == Location.POD

    one = await engine.detach_outcome(cfg, nic.pod_path)
    two = await engine.detach_outcome(cfg, nic.pod_path)
    assert (one.state, two.state) == (ReturnState.RETURNED, ReturnState.ALREADY_ON_HOST)
    assert one.ok and two.ok
    assert_back_on_host(nic, with_addresses=False)
    assert await engine.locate(cfg, nic.pod_path) == Location.HOST


async def test_unreachable_gateway_rolls_back_and_a_later_attach_works(
    nic: Nic, engine: NetdevEngine
) -> None:
    bad = full_config(nic)
    bad["routes"].append({"destination": "203.0.114.0/24", "gateway": "192.0.2.77"})
    cfg = nic.config(bad)
    out = await engine.attach_outcome(cfg, nic.pod_path)
    assert not out.ok and not out.attached
    assert out.failed_step == "add route 203.0.114.0/24 via 192.0.2.77 dev net1 in pod netns"
    for part in (
        f"device nic-{nic.host}",
        f"host {nic.host}",
        "pod net1",
        f"netns {nic.pod_path}",
        "ENETUNREACH",
    ):
        assert part in out.error, (part, out.error)
    assert "rolled back (device back on the host)" in out.error
    assert out.rollback_errors == ()

    assert link(nic.pod_ns, "net1") is None
    assert [r for r in ipj(nic.pod_ns, "rule", "show") if r.get("priority") == 1000] == []
    assert_back_on_host(nic, with_addresses=True)
    host = link(None, nic.host)
    assert host is not None and (host["mtu"], host["address"]) == (1500, nic.mac)
    # The pod's per-interface sysctls did not come back with it: the host defaults apply.
    default = read("/proc/sys/net/ipv4/conf/default/arp_ignore")
    assert read(f"/proc/sys/net/ipv4/conf/{nic.host}/arp_ignore") == default

    good = await engine.attach_outcome(nic.config(full_config(nic)), nic.pod_path)
    assert good.ok, good.error
    assert ping(nic.pod_ns, nic.gw)


async def test_the_hooks_interface_raises_what_the_outcome_says(nic: Nic, engine: NetdevEngine) -> None:
    """attach/detach/locate as the hooks call them (engine.DeviceEngine): the same work as
    attach_outcome/detach_outcome, a failure as AttachFailed with the outcome's message."""
    bad = full_config(nic)
    bad["routes"].append({"destination": "203.0.114.0/24", "gateway": "192.0.2.77"})
    with pytest.raises(AttachFailed) as failed:
        await engine.attach(nic.config(bad), nic.pod_path)
    assert "ENETUNREACH" in str(failed.value) and "rolled back (device back on the host)" in str(failed.value)
    assert_back_on_host(nic, with_addresses=True)

    cfg = nic.config(full_config(nic))
    done = await engine.attach(cfg, nic.pod_path)
    assert isinstance(done, Attached) and not done.converged
    assert (done.interface_name, done.hardware_address) == ("net1", "02:00:00:00:77:01")
    assert (await engine.attach(cfg, nic.pod_path)).converged
    assert await engine.locate(cfg, nic.pod_path, done.hardware_address) == Location.POD
    assert await engine.detach(cfg, nic.pod_path, done.hardware_address) == ReturnState.RETURNED
    assert await engine.detach(cfg, "") == ReturnState.ALREADY_ON_HOST
    assert await engine.locate(cfg, "") == Location.HOST


async def test_name_taken_in_the_pod_fails_before_touching_the_device(nic: Nic, engine: NetdevEngine) -> None:
    sh("ip", "-n", nic.pod_ns, "link", "add", "net1", "type", "veth", "peer", "name", "other")
    out = await engine.attach_outcome(nic.config(full_config(nic)), nic.pod_path)
    assert not out.ok and out.failed_step == "plan"
    assert "already has an interface named net1" in out.error
    host = link(None, nic.host)
    assert host is not None and f"dranet-{nic.host}" not in host.get("altnames", [])
    assert nic.host_ip in addrs(None, nic.host)


async def test_eexist_after_the_move_is_rolled_back(
    nic: Nic, engine: NetdevEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name appears in the pod after the engine looked: the kernel moves the link,
    then refuses the name (EEXIST), leaving it in the pod under its old name."""
    sh("ip", "-n", nic.pod_ns, "link", "add", "net1", "type", "veth", "peer", "name", "other")
    observe = netdev._observe_attach

    def blind(run: Any, spec: Any) -> Any:
        return replace(observe(run, spec), pod_name_taken=None)

    monkeypatch.setattr(netdev, "_observe_attach", blind)
    out = await engine.attach_outcome(nic.config(full_config(nic)), nic.pod_path)
    assert not out.ok and "EEXIST" in out.error and out.failed_step.startswith(f"move {nic.host}")
    assert out.rollback_errors == (), out.rollback_errors
    assert link(nic.pod_ns, nic.host) is None, "left in the pod under its old name"
    assert_back_on_host(nic, with_addresses=True)
    host = link(None, nic.host)
    assert host is not None and (host["mtu"], host["address"]) == (1500, nic.mac), "MTU/MAC not set back"


async def test_netns_deleted_before_return(nic: Nic, engine: NetdevEngine) -> None:
    cfg = nic.config(full_config(nic))
    assert (await engine.attach_outcome(cfg, nic.pod_path)).ok
    sh("ip", "netns", "del", nic.pod_ns)
    # A veth dies with its netns (and takes its peer along).
    wait_for("the veth to die with the netns", lambda: link(nic.peer_ns, "gw0") is None)
    out = await engine.detach_outcome(cfg, nic.pod_path)
    assert out.ok and out.state == ReturnState.GONE
    assert "veth" in out.note and "physical NIC" in out.note
    assert await engine.locate(cfg, nic.pod_path) == Location.MISSING
    assert not exists(nic.pod_path), "the engine re-created the netns"


async def test_device_the_kernel_gave_back_is_renamed_and_set_up(nic: Nic, engine: NetdevEngine) -> None:
    """What a physical NIC does when its netns dies: it comes back to the host netns by
    itself under its pod-side name, down. Done by hand here (a veth would die)."""
    cfg = nic.config(full_config(nic))
    assert (await engine.attach_outcome(cfg, nic.pod_path)).ok
    sh("ip", "-n", nic.pod_ns, "link", "set", "net1", "netns", "1")
    sh("ip", "netns", "del", nic.pod_ns)
    assert link(None, "net1") is not None
    assert await engine.locate(cfg, nic.pod_path) == Location.HOST
    out = await engine.detach_outcome(cfg, "")
    assert out.ok and out.state == ReturnState.RECLAIMED, out
    assert link(None, "net1") is None
    assert_back_on_host(nic, with_addresses=False)


async def test_device_renamed_in_the_pod_is_found_by_altname_or_mac(nic: Nic, engine: NetdevEngine) -> None:
    cfg = nic.config(full_config(nic))
    out = await engine.attach_outcome(cfg, nic.pod_path)
    sh("ip", "-n", nic.pod_ns, "link", "set", "net1", "down")
    sh("ip", "-n", nic.pod_ns, "link", "set", "net1", "name", "renamed0")
    back = await engine.detach_outcome(cfg, nic.pod_path)
    assert back.ok and back.state == ReturnState.RETURNED
    assert_back_on_host(nic, with_addresses=False)

    assert (await engine.attach_outcome(cfg, nic.pod_path)).ok
    sh("ip", "-n", nic.pod_ns, "link", "set", "net1", "down")
    sh("ip", "-n", nic.pod_ns, "link", "set", "net1", "name", "renamed1")
    sh("ip", "-n", nic.pod_ns, "link", "property", "del", "dev", "renamed1", "altname", f"dranet-{nic.host}")
    # Without the tag only the MAC it had in the pod (AttachResult.hardware_address) finds it.
    result = store_pb2.AttachResult(
        device=cfg.device, host_ifname=nic.host, interface_name="net1", hardware_address=out.hardware_address
    )
    back = await engine.detach_outcome(result, nic.pod_path)
    assert back.ok and back.state == ReturnState.RETURNED, back
    assert link(None, nic.host) is not None


async def test_ethtool_features_are_set_in_the_pod_and_private_flags_fail_cleanly(
    nic: Nic, engine: NetdevEngine
) -> None:
    from pyroute2 import Ethtool

    def feature(name: str) -> bool:
        with Ethtool() as et:
            return bool(et.get_features("net1").features[name].enable)

    pod = full_config(nic)
    pod["ethtool"] = {"features": {"tx-checksum-ip-generic": False, "tso": False}}
    out = await engine.attach_outcome(nic.config(pod), nic.pod_path)
    assert out.ok, out.error
    assert in_netns(nic.pod_path, lambda: feature("tx-checksum-ip-generic")) is False
    assert in_netns(nic.pod_path, lambda: feature("tx-tcp-segmentation")) is False  # "tso" expanded
    assert (await engine.detach_outcome(nic.config(pod), nic.pod_path)).ok

    pod["ethtool"] = {"privateFlags": {"some-flag": True}}
    out = await engine.attach_outcome(nic.config(pod), nic.pod_path)
    assert not out.ok and "private flag(s) some-flag not supported (interface has: none)" in out.error
    assert_back_on_host(nic, with_addresses=True)


def load_sched_cls() -> int:
    """A trivial SCHED_CLS program (r0 = 0; exit); returns its fd."""
    import ctypes
    import struct

    insns = ctypes.create_string_buffer(struct.pack("<BBhiBBhi", 0xB7, 0, 0, 0, 0x95, 0, 0, 0))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQ", 3, 2, ctypes.addressof(insns), ctypes.addressof(lic))
    return netdev_ebpf.bpf(5, attr)  # BPF_PROG_LOAD


def tcx_programs(ifname: str) -> list[tuple[int, int]]:
    import socket

    idx = socket.if_nametoindex(ifname)
    return netdev_ebpf.tcx_query(idx, netdev_ebpf.BPF_TCX_INGRESS) + netdev_ebpf.tcx_query(
        idx, netdev_ebpf.BPF_TCX_EGRESS
    )


def attach_tcx(ifname: str) -> list[int]:
    """A TCX ingress program (BPF_PROG_ATTACH) and a TCX egress link (BPF_LINK_CREATE);
    returns the fds to keep (a link dies with its last fd)."""
    import socket
    import struct

    idx = socket.if_nametoindex(ifname)
    prog = load_sched_cls()
    netdev_ebpf.bpf(8, struct.pack("=IIII", idx, prog, netdev_ebpf.BPF_TCX_INGRESS, 0))
    prog2 = load_sched_cls()
    link_fd = netdev_ebpf.bpf(28, struct.pack("=IIII", prog2, idx, netdev_ebpf.BPF_TCX_EGRESS, 0))
    return [prog, prog2, link_fd]


def add_tc_bpf(ns: str | None, dev: str) -> None:
    base = ["ip", "netns", "exec", ns] if ns else []
    sh(*base, "tc", "qdisc", "add", "dev", dev, "clsact")
    sh(*base, "tc", "filter", "add", "dev", dev, "ingress", "bpf", "bytecode", "1,6 0 0 4294967295,")
    sh(*base, "tc", "filter", "add", "dev", dev, "egress", "bpf", "bytecode", "1,6 0 0 4294967295,")


def tc_bpf_filters(ns: str, dev: str) -> list[Any]:
    out = []
    for hook in ("ingress", "egress"):
        res = subprocess.run(
            ["tc", "-n", ns, "-j", "filter", "show", "dev", dev, hook], capture_output=True, text=True
        )
        if res.returncode == 0 and res.stdout.strip():
            out += [f for f in json.loads(res.stdout) if f.get("kind") == "bpf" and "options" in f]
    return out


async def test_ebpf_programs_are_detached(nic: Nic, engine: NetdevEngine) -> None:
    fds = attach_tcx(nic.host)
    add_tc_bpf(None, nic.host)
    try:
        assert len(tcx_programs(nic.host)) == 2
        pod = full_config(nic)
        pod["interface"]["disableEbpfPrograms"] = True
        cfg = nic.config(pod)
        out = await engine.attach_outcome(cfg, nic.pod_path)
        assert out.ok, out.error
        # The move already dropped the qdisc (and its tc filters); TCX survived it
        # and was detached in the pod: the program and the link.
        assert any(s.startswith("detach eBPF programs") and "(already so)" not in s for s in out.steps)
        assert in_netns(nic.pod_path, lambda: tcx_programs("net1")) == []
        assert tc_bpf_filters(nic.pod_ns, "net1") == []

        # tc filters and TCX added inside the pod: a converging attach removes them.
        add_tc_bpf(nic.pod_ns, "net1")
        fds += in_netns(nic.pod_path, lambda: attach_tcx("net1"))
        assert len(tc_bpf_filters(nic.pod_ns, "net1")) == 2
        again = await engine.attach_outcome(cfg, nic.pod_path)
        assert again.ok and again.converged, again.error
        assert tc_bpf_filters(nic.pod_ns, "net1") == []
        assert in_netns(nic.pod_path, lambda: tcx_programs("net1")) == []
    finally:
        for fd in fds:
            os.close(fd)


def kernel_has(kind: str) -> bool:
    ns = f"dnprobe{uuid.uuid4().hex[:5]}"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        extra = ["table", "10"] if kind == "vrf" else []
        parent = ["link", "p0"] if kind == "ipvlan" else []
        res = subprocess.run(
            ["ip", "-n", ns, "link", "add", *parent, "x0", "type", kind, *extra], capture_output=True
        )
        return res.returncode == 0
    finally:
        sh("ip", "netns", "del", ns, check=False)


async def test_vrf(nic: Nic, engine: NetdevEngine) -> None:
    pod = full_config(nic)
    pod["interface"]["vrf"] = {"name": "blue", "table": 1100}
    del pod["rules"]
    out = await engine.attach_outcome(nic.config(pod), nic.pod_path)
    if kernel_has("vrf"):
        assert out.ok, out.error
        vrf = link(nic.pod_ns, "blue")
        assert vrf is not None and vrf["linkinfo"]["info_data"]["table"] == 1100
        assert link(nic.pod_ns, "net1")["master"] == "blue"  # type: ignore[index]
        assert [r["dst"] for r in ipj(nic.pod_ns, "route", "show", "table", "1100") if "gateway" in r]
        return
    # This kernel has no vrf: the step fails, the device goes back with its addresses.
    assert not out.ok and out.failed_step == "create VRF blue table 1100 in pod netns", out.error
    assert link(nic.pod_ns, "blue") is None
    assert_back_on_host(nic, with_addresses=True)


async def test_ipvlan_child(nic: Nic, engine: NetdevEngine) -> None:
    pod = {"interface": {"type": "IPVLAN", "name": "net1", "addresses": [f"198.18.{nic.net}.6/24"]}}
    cfg = nic.config(pod)
    out = await engine.attach_outcome(cfg, nic.pod_path)
    if kernel_has("ipvlan"):
        assert out.ok, out.error
        child = link(nic.pod_ns, "net1")
        assert child is not None and child["linkinfo"]["info_kind"] == "ipvlan"
        assert child["address"] == nic.mac and link(None, nic.host) is not None
        assert (await engine.detach_outcome(cfg, nic.pod_path)).state == ReturnState.RETURNED
        assert link(nic.pod_ns, "net1") is None
        return
    assert not out.ok and out.failed_step.startswith(f"create ipvlan child net1 of host {nic.host}")
    assert link(nic.pod_ns, "net1") is None
    assert nic.host_ip in addrs(None, nic.host), "the parent lost its address"


async def test_child_creation_path_with_macvlan(
    nic: Nic, engine: NetdevEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The IPvlan code path (create on the host parent directly in the pod netns, then
    addresses, up, routes; delete on return) with the one kind this kernel has."""
    plan_attach = netdev.plan_attach

    def as_macvlan(spec: Any, ns: str, seen: Any) -> Any:
        plan = plan_attach(spec, ns, seen)
        steps = tuple(
            replace(s, action=replace(s.action, kind="macvlan", mode="bridge"))
            if isinstance(s.action, CreateChild)
            else s
            for s in plan.steps
        )
        return replace(plan, steps=steps)

    monkeypatch.setattr(netdev, "plan_attach", as_macvlan)
    pod = {
        "interface": {"type": "IPVLAN", "name": "net1", "addresses": [f"198.18.{nic.net}.6/24"], "mtu": 1400},
        "routes": [{"destination": "203.0.113.0/24", "gateway": nic.gw}],
    }
    cfg = nic.config(pod)
    out = await engine.attach_outcome(cfg, nic.pod_path)
    assert out.ok, out.error
    child = link(nic.pod_ns, "net1")
    assert child is not None and child["linkinfo"]["info_kind"] == "macvlan" and child["mtu"] == 1400
    assert addrs(nic.pod_ns, "net1") == {f"198.18.{nic.net}.6/24"}
    assert ipj(nic.pod_ns, "route", "show", "203.0.113.0/24")
    assert ping(nic.pod_ns, nic.gw)
    assert link(None, nic.host) is not None and nic.host_ip in addrs(None, nic.host), "the parent moved"
    again = await engine.attach_outcome(cfg, nic.pod_path)
    assert again.ok and again.converged, again.error
    back = await engine.detach_outcome(cfg, nic.pod_path)
    assert back.ok and back.state == ReturnState.RETURNED, back
    assert link(nic.pod_ns, "net1") is None
    assert (await engine.detach_outcome(cfg, nic.pod_path)).state == ReturnState.ALREADY_ON_HOST


async def test_rdma_exclusive_without_rdma_netlink_rolls_back(nic: Nic, engine: NetdevEngine) -> None:
    cfg = nic.config(full_config(nic), rdma_netns_mode="exclusive")
    cfg.rdma.link_dev = "mlx5_dn0"
    out = await engine.attach_outcome(cfg, nic.pod_path)
    assert not out.ok and out.failed_step == "move RDMA device mlx5_dn0 from host netns to pod netns"
    assert "RDMA" in out.error
    assert_back_on_host(nic, with_addresses=True)


async def test_two_devices_into_one_pod_concurrently(engine: NetdevEngine) -> None:
    a = make_nic()
    b = make_nic(pod_ns=a.pod_ns)
    try:
        cfg_a = a.config({"interface": {"name": "net1", "addresses": [f"198.18.{a.net}.5/24"]}})
        cfg_b = b.config({"interface": {"name": "net2", "addresses": [f"198.18.{b.net}.5/24"]}})
        outs = await asyncio.gather(
            engine.attach_outcome(cfg_a, a.pod_path), engine.attach_outcome(cfg_b, a.pod_path)
        )
        assert all(o.ok for o in outs), [o.error for o in outs]
        assert link(a.pod_ns, "net1") is not None and link(a.pod_ns, "net2") is not None
        backs = await asyncio.gather(
            engine.detach_outcome(cfg_a, a.pod_path), engine.detach_outcome(cfg_b, a.pod_path)
        )
        assert [r.state for r in backs] == [ReturnState.RETURNED, ReturnState.RETURNED]
        assert link(None, a.host) is not None and link(None, b.host) is not None
    finally:
        drop_nic(b)
        drop_nic(a)


async def test_bad_netns_paths_are_refused_and_never_created(nic: Nic, engine: NetdevEngine) -> None:
    missing = f"/var/run/netns/dn-missing-{uuid.uuid4().hex[:6]}"
    out = await engine.attach_outcome(nic.config({}), missing)
    assert not out.ok and "does not exist" in out.error and missing in out.error
    assert not exists(missing)
    out = await engine.attach_outcome(nic.config({}), "/proc/self/ns/net")
    assert not out.ok and "host network namespace" in out.error
    out = await engine.attach_outcome(nic.config({}), "/etc/hostname")
    assert not out.ok and "not a namespace" in out.error
    assert nic.host_ip in addrs(None, nic.host)


def rdma_netlink() -> bool:
    import socket

    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 20).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize(("mode", "ok"), [("shared", True), ("exclusive", False)])
async def test_rdma_only_device(engine: NetdevEngine, mode: str, ok: bool) -> None:
    ns = f"dn{uuid.uuid4().hex[:5]}pod"
    sh("ip", "netns", "add", ns)
    try:
        cfg = store_pb2.DeviceConfig(device="mlx5-dn0", host_ifname="", rdma_netns_mode=mode)
        cfg.rdma.link_dev = "mlx5_dn0"
        out = await engine.attach_outcome(cfg, f"/var/run/netns/{ns}")
        if ok:
            # Shared mode: nothing moves; the device files are the whole attach.
            assert out.ok and out.steps == () and out.interface_name == ""
            assert [(c.type, c.reason) for c in out.conditions] == [("Ready", "RDMAOnlyDeviceReady")]
            back = await engine.detach_outcome(cfg, f"/var/run/netns/{ns}")
            assert back.ok and back.state == ReturnState.NOTHING
        else:
            # Exclusive mode moves the RDMA link: there is no such device (and this
            # machine's kernel has no RDMA netlink at all).
            why = "not found in the host or pod netns" if rdma_netlink() else "RDMA netlink is not available"
            assert not out.ok and why in out.error, out.error
            assert out.failed_step == "move RDMA device mlx5_dn0 from host netns to pod netns"
    finally:
        sh("ip", "netns", "del", ns, check=False)
