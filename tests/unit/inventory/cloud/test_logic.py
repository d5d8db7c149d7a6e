"""Pure logic of the cloud providers, table-driven: hints, attribute rules, the
address arithmetic of the GCE and OKE profiles, Azure routing, AWS groups, IPAM."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path

import pytest

from services.inventory.cloud import aws, azure, gce, oke
from services.inventory.cloud.base import Hint, advertised_profiles, strip_advertised_profile
from services.inventory.cloud.base import ProviderError as PE
from services.inventory.cloud.ipam import IPAMError, LeaseStore, range_from_cidr
from services.inventory.cloud.metadata import first_true
from shared.deviceattr import Attribute, AttrKind, attribute_problem
from shared.netconfig import InterfaceConfig, InterfaceType, NetworkConfig


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("", None),
        ("GCE", Hint.GCE),
        ("AWS", Hint.AWS),
        ("AZURE", Hint.AZURE),
        ("OKE", Hint.OKE),
        ("ALIBABA", Hint.ALIBABA),
        ("CKS", Hint.CKS),
        ("webhook", Hint.WEBHOOK),
        ("NONE", Hint.NONE),
        ("none", Hint.NONE),
    ],
)
def test_hint_parse(value: str, want: Hint | None) -> None:
    assert Hint.parse(value) is want


@pytest.mark.parametrize("value", ["gce", "Azure", "WEBHOOK", "coreweave"])
def test_hint_parse_rejects(value: str) -> None:
    with pytest.raises(ValueError, match=repr(value)):
        Hint.parse(value)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({"string": "python"}, Attribute.of_string("python")),
        ({"int": 7}, Attribute.of_int(7)),
        ({"bool": False}, Attribute.of_bool(False)),
        ({"version": "1.2.3"}, Attribute.of_version("1.2.3")),
    ],
)
def test_attribute_from_json(raw: dict[str, object], want: Attribute) -> None:
    assert Attribute.from_json(raw) == want
    assert want.to_json() == raw


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"int": True}, "wrong type"),
        ({"bool": 1}, "wrong type"),
        ({"string": 5}, "wrong type"),
        ({"float": 1.5}, "unknown attribute type"),
        ({"string": "a", "int": 1}, "exactly one"),
        ("python", "exactly one"),
    ],
)
def test_attribute_from_json_rejects(raw: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Attribute.from_json(raw)


@pytest.mark.parametrize(
    ("name", "attr", "problem"),
    [
        ("gce.dra.net/networkName", Attribute.of_string("default"), None),
        ("resource.aws.com/devicegroup16_id", Attribute.of_string("0123456789abcdef"), None),
        ("networkName", Attribute.of_string("x"), "needs a domain prefix"),
        ("Bad Domain/x", Attribute.of_string("x"), "not a DNS subdomain"),
        ("example.com/has-dash", Attribute.of_string("x"), "not a C identifier"),
        ("example.com/" + "a" * 33, Attribute.of_string("x"), "at most 32"),
        ("example.com/long", Attribute.of_string("x" * 65), "longer than 64"),
        ("example.com/fw", Attribute.of_version("v1"), "not a semantic version"),
        ("example.com/fw", Attribute.of_version("1.0.0-rc.1+build.5"), None),
    ],
)
def test_attribute_problem(name: str, attr: Attribute, problem: str | None) -> None:
    got = attribute_problem(name, attr)
    assert (got is None) if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    ("cfg", "has_provider", "want"),
    [
        (None, False, None),
        (NetworkConfig(profile="gce-managed"), True, NetworkConfig(profile="gce-managed")),
        (NetworkConfig(profile="gce-managed"), False, None),
        (
            NetworkConfig(profile="oke-rdma", interface=InterfaceConfig(type=InterfaceType.IPVLAN)),
            False,
            NetworkConfig(interface=InterfaceConfig(type=InterfaceType.IPVLAN)),
        ),
    ],
)
def test_strip_advertised_profile(
    cfg: NetworkConfig | None, has_provider: bool, want: NetworkConfig | None
) -> None:
    assert strip_advertised_profile(cfg, has_provider) == want
    assert advertised_profiles(cfg) == ((cfg.profile,) if cfg and cfg.profile else ())


# --- GCE -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "want"),
    [
        ("2600:1900:4000:318:0:6:0:0/96", "2600:1900:4000:318:0:6:c0de:0/112"),
        ("2600:1900:4000:318::/64", "2600:1900:4000:318:c0de::/80"),
        ("fd20:1::/72", "fd20:1:0:0:0:c0de::/96"),
    ],
)
def test_gce_ipv6_child_range(base: str, want: str) -> None:
    assert ipaddress.ip_network(gce.ipv6_child_range(base)) == ipaddress.ip_network(want)


@pytest.mark.parametrize("base", ["2600::/112", "10.0.0.0/8", "garbage"])
def test_gce_ipv6_child_range_rejects(base: str) -> None:
    with pytest.raises(ValueError):
        gce.ipv6_child_range(base)


def test_gce_parse_nics_names_bad_fields() -> None:
    with pytest.raises(PE, match=r"network-interfaces\[0\]\.mtu"):
        gce.parse_nics([{"mac": "42:01:0a:80:00:46", "mtu": "1460"}])
    with pytest.raises(PE, match=r"network-interfaces\[1\]\.ipAliases"):
        gce.parse_nics([{}, {"ipAliases": "10.0.0.0/24"}])
    (nic,) = gce.parse_nics([{"mac": "42:01:0A:80:00:46", "unknown": {"x": 1}}])
    assert nic.mac == "42:01:0a:80:00:46"


def test_gce_source_routing_per_family() -> None:
    nic = gce.GceNic(mac="42:01:0a:80:00:46", gateway="10.128.0.1", gateway_ipv6="fe80::1")
    cfg = NetworkConfig(interface=InterfaceConfig(type=InterfaceType.IPVLAN))
    out = gce.source_routing(nic, cfg, ("10.24.3.9/32", "2600::5/128"))
    assert [r.destination for r in out.routes] == ["10.128.0.1/32", "0.0.0.0/0", "fe80::1/128", "::/0"]
    assert [r.source for r in out.rules] == ["10.24.3.9/32", "2600::5/128"]
    assert {r.table for r in out.routes} == {r.table for r in out.rules} == {out.rules[0].table}
    assert 1000 <= out.rules[0].table < 2000
    # No gateway for a family: the address comes without routing for it.
    assert gce.source_routing(gce.GceNic(mac="m"), cfg, ("10.24.3.9/32",)).routes == ()


# --- AWS -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "neuron"),
    [
        ("trn1.32xlarge", True),
        ("trn2.48xlarge", True),
        ("inf2.48xlarge", True),
        ("p5.48xlarge", False),
        ("m5.xlarge", False),
        ("c6i.large", False),
        ("", False),
    ],
)
def test_aws_is_neuron(instance_type: str, neuron: bool) -> None:
    assert aws.is_neuron_instance(instance_type) is neuron


def test_aws_device_groups_trn2() -> None:
    topo = {0: "0000:c9:00.0", 1: "0000:b4:00.0", 2: "0000:b3:00.0", 3: "0000:ca:00.0", 4: "0000:6c:00.0"}
    groups = aws.device_groups(topo, "0000:b4:00.0")
    assert groups["resource.aws.com/devicegroup1_id"] == "0000:b4:00.0"
    assert (
        groups["resource.aws.com/devicegroup4_id"]
        == aws.device_groups(topo, "0000:ca:00.0")["resource.aws.com/devicegroup4_id"]
    )
    assert (
        groups["resource.aws.com/devicegroup4_id"]
        != aws.device_groups(topo, "0000:6c:00.0")["resource.aws.com/devicegroup4_id"]
    )
    assert aws.device_groups(topo, "0000:00:05.0") == {}


def test_aws_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "trn3.json"
    path.write_text(json.dumps({"0": "0000:01:00.0", "1": "0000:02:00.0"}))
    assert aws.load_topology_file(str(path)) == {0: "0000:01:00.0", 1: "0000:02:00.0"}
    path.write_text(json.dumps({"zero": "0000:01:00.0"}))
    with pytest.raises(PE, match="bad entry 'zero'"):
        aws.load_topology_file(str(path))


# --- Azure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mac", "want"),
    [
        ("00:11:22:33:44:55", "001122334455"),
        ("00-11-22-33-44-55", "001122334455"),
        ("AABBCCDDEEFF", "aabbccddeeff"),
    ],
)
def test_azure_normalize_mac(mac: str, want: str) -> None:
    assert azure.normalize_mac(mac) == want


@pytest.mark.parametrize(
    ("addr", "prefix", "want"),
    [
        ("10.9.255.0", "24", "10.9.255.1"),
        ("10.144.133.128", "26", "10.144.133.129"),
        ("10.0.2.0", "23", "10.0.2.1"),
        ("10.0.0.32", "27", "10.0.0.33"),
        ("255.255.255.255", "32", None),
        ("10.4.5.6", "32", None),
        ("10.0.0.255", "24", None),
        ("::1", "128", None),
        ("", "24", None),
        ("10.0.0.0", "bad", None),
    ],
)
def test_azure_subnet_first_address(addr: str, prefix: str, want: str | None) -> None:
    if want is None:
        with pytest.raises(ValueError):
            azure.subnet_first_address(addr, prefix)
    else:
        assert azure.subnet_first_address(addr, prefix) == want


# --- OKE -----------------------------------------------------------------------------

_OCID_TAIL = "aaaaaaaa2mvjha24vj6evyafdqtis6nzqibhrnxxhzt65zkc3upy4xlrz5za"


@pytest.mark.parametrize(
    ("ocid", "want"),
    [
        (f"ocid1.hpcisland.oc1.test-region-1.{_OCID_TAIL}", _OCID_TAIL),
        (f"ocid1.hpcisland.oc1.test-region-1.x{_OCID_TAIL}", _OCID_TAIL),
        ("", ""),
    ],
)
def test_oke_ocid_suffix(ocid: str, want: str) -> None:
    assert oke.ocid_suffix(ocid) == want


@pytest.mark.parametrize("ocid", ["fakehexhash", "some.dotted.value", "ocid1-hpcisland-no-dots"])
def test_oke_ocid_suffix_rejects(ocid: str) -> None:
    with pytest.raises(ValueError):
        oke.ocid_suffix(ocid)


VNIC = oke.PrimaryVnic(ip=ipaddress.IPv4Address("10.0.0.25"), subnet=ipaddress.IPv4Network("10.0.0.0/16"))
OCA = ipaddress.IPv4Network("10.224.0.0/12")


@pytest.mark.parametrize(
    ("index", "parent", "child"),
    [
        (0, "10.224.0.25", "10.208.0.25"),
        (1, "10.225.0.25", "10.209.0.25"),
        (15, "10.239.0.25", "10.223.0.25"),
    ],
)
def test_oke_classic_addresses(index: int, parent: str, child: str) -> None:
    assert oke.derive_addresses(VNIC, index, OCA) == (
        ipaddress.IPv4Address(parent),
        ipaddress.IPv4Address(child),
    )
    assert oke.index_from_address(VNIC, ipaddress.IPv4Address(parent), OCA) == index


@pytest.mark.parametrize(
    ("vnic", "index", "needle"),
    [
        (VNIC, 16, "above the largest supported index 15"),
        (
            oke.PrimaryVnic(ipaddress.IPv4Address("10.0.0.25"), ipaddress.IPv4Network("10.0.0.0/11")),
            1,
            "outside the OCA",
        ),
        (
            oke.PrimaryVnic(ipaddress.IPv4Address("10.224.0.9"), ipaddress.IPv4Network("10.224.0.0/24")),
            0,
            "overlaps",
        ),
        (
            oke.PrimaryVnic(ipaddress.IPv4Address("10.210.0.9"), ipaddress.IPv4Network("10.210.0.0/24")),
            0,
            "child range",
        ),
        (
            oke.PrimaryVnic(ipaddress.IPv4Address("10.1.0.9"), ipaddress.IPv4Network("10.0.0.0/24")),
            0,
            "outside its subnet",
        ),
    ],
)
def test_oke_derivation_refuses(vnic: oke.PrimaryVnic, index: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        oke.derive_addresses(vnic, index, OCA)


def test_oke_index_from_foreign_address() -> None:
    with pytest.raises(ValueError, match="does not match the primary VNIC position 25"):
        oke.index_from_address(VNIC, ipaddress.IPv4Address("10.225.0.99"), OCA)


def test_oke_parse_primary_vnic_and_host() -> None:
    assert oke.parse_primary_vnic([{"privateIp": "10.0.0.25", "subnetCidrBlock": "10.0.0.0/16"}]) == VNIC
    assert oke.parse_primary_vnic([{"privateIp": "", "subnetCidrBlock": "10.0.0.0/16"}]) is None
    with pytest.raises(PE, match="non-empty list"):
        oke.parse_primary_vnic([])
    state = oke.parse_host(
        {"rackId": "r1", "rdmaFabricData": {"ipv6": True}, "rdmaTopologyData": {"customerHPCIslandId": "bad"}}
    )
    assert state.rack_id == "r1" and state.fabric is None and state.hpc_island_id == ""


@pytest.mark.parametrize(
    ("files", "parent", "mode"),
    [
        ({}, "10.224.0.0/12", ""),
        (
            {
                "rdma_network.json": {
                    "rdma-network": [{"default-settings": {"rdma_network": "10.240.0.0/12"}}]
                }
            },
            "10.240.0.0/12",
            "",
        ),
        ({"rdma_network.json": {"rdma-network": []}}, "10.224.0.0/12", ""),
        ({"rdma_features_enable.json": {"ipv4_topology_based_rdma_ips": True}}, "10.224.0.0/12", "topology"),
        ({"rdma_features_enable.json": {}}, "10.224.0.0/12", "classic"),
    ],
)
def test_oke_oca_config(tmp_path: Path, files: dict[str, object], parent: str, mode: str) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    cfg = oke.load_oca_config(str(tmp_path))
    assert cfg.parent_range == ipaddress.IPv4Network(parent) and cfg.mode == mode


# --- IPAM ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cidr", "start", "end", "first", "last"),
    [
        ("10.0.0.0/24", 0, 0, "10.0.0.1", "10.0.0.254"),
        ("192.168.1.0/28", 2, 1, "192.168.1.3", "192.168.1.13"),
        ("10.0.0.5/24", 0, 0, "10.0.0.1", "10.0.0.254"),
        ("2001:db8::/126", 0, 0, "2001:db8::1", "2001:db8::2"),
    ],
)
def test_range_from_cidr(cidr: str, start: int, end: int, first: str, last: str) -> None:
    rng = range_from_cidr(cidr, start, end)
    assert (str(rng.start), str(rng.end)) == (first, last)


@pytest.mark.parametrize(
    ("cidr", "start", "end"),
    [("10.0.0.0/31", 0, 0), ("10.0.0.0/30", 1, 1), ("x", 0, 0), ("10.0.0.0/24", -1, 0)],
)
def test_range_from_cidr_rejects(cidr: str, start: int, end: int) -> None:
    with pytest.raises(IPAMError):
        range_from_cidr(cidr, start, end)


async def test_lease_store_in_memory() -> None:
    store = LeaseStore()
    small = [range_from_cidr("10.0.0.0/30")]  # two usable addresses
    a = await store.allocate("d/a", small)
    assert await store.allocate("d/a", small) == a
    b = await store.allocate("d/b", small)
    assert {a, b} == {("10.0.0.1/32",), ("10.0.0.2/32",)}
    with pytest.raises(IPAMError, match="no free address"):
        await store.allocate("d/c", small)
    with pytest.raises(IPAMError, match=r"10\.0\.0\.1"):
        await store.reserve("d/c", ["10.0.0.1/30"])
    assert await store.release("d/a") == a
    assert await store.release("d/a") == ()
    assert await store.allocate("d/c", small) == a


async def test_first_true_keeps_priority_order() -> None:
    async def answer(value: bool, after: float) -> bool:
        await asyncio.sleep(after)
        return value

    probes = {
        "a": lambda: answer(False, 0.05),
        "b": lambda: answer(True, 0.1),
        "c": lambda: answer(True, 0.0),
    }
    assert await first_true(probes, ["a", "b", "c"], 2.0) == "b"
    # A higher-priority probe still running at the deadline is not waited for further.
    slow = {"a": lambda: answer(True, 10.0), "b": lambda: answer(True, 0.0)}
    assert await first_true(slow, ["a", "b"], 0.2) == "b"
    assert await first_true({"a": lambda: answer(False, 0.0)}, ["a"], 1.0) is None


def test_attr_kind_names_match_the_proto_oneof() -> None:
    from proto.dranet.inventory.v1 import inventory_pb2

    oneof = {f.name for f in inventory_pb2.Attribute.DESCRIPTOR.oneofs_by_name["value"].fields}
    assert oneof == {k.value for k in AttrKind}
