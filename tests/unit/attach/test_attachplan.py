"""Attach, rollback and return plans as data (shared/attachplan.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proto.dranet.store.v1 import store_pb2
from shared.attachplan import (
    AddAddress,
    AddAltname,
    AddNeighbor,
    AddRoute,
    AddRule,
    ApplyEthtool,
    AttachObservation,
    Condition,
    CreateChild,
    CreateVrf,
    DelAltname,
    DeleteLink,
    DelRule,
    DetachEbpf,
    DeviceKind,
    DeviceNode,
    DeviceSpec,
    LinkAttrs,
    LinkLocator,
    LinkState,
    MoveLink,
    MoveRdmaLink,
    Ns,
    PlanError,
    RenameLink,
    ReturnObservation,
    ReturnState,
    ReturnTarget,
    SetLink,
    SetLinkState,
    SetMaster,
    Step,
    WriteSysctl,
    altname_for,
    container_devices,
    plan_attach,
    plan_return,
    plan_rollback,
)

NETNS = "/var/run/netns/cni-1"
HOST_ETH1 = LinkState(name="eth1", index=7, mac="02:00:00:00:00:01", mtu=1500, up=True, gso_max_size=65536)
TAG = "dranet-eth1"
POD_HOST = Ns.POD, Ns.HOST


def config(
    pod: dict[str, Any] | None = None,
    host: dict[str, Any] | None = None,
    *,
    host_ifname: str = "eth1",
    rdma_link: str = "",
    mode: str = "shared",
    dev_chars: tuple[tuple[str, int, int], ...] = (),
) -> store_pb2.DeviceConfig:
    cfg = store_pb2.DeviceConfig(
        device="nic-eth1",
        pod=store_pb2.PodRef(uid="uid-1", namespace="default", name="p"),
        host_ifname=host_ifname,
        pod_config_json=json.dumps(pod or {}),
        host_config_json=json.dumps(host) if host is not None else "",
        rdma_netns_mode=mode,
    )
    cfg.rdma.link_dev = rdma_link
    for path, major, minor in dev_chars:
        cfg.rdma.dev_chars.add(path=path, type="c", major=major, minor=minor, file_mode=0o666)
    return cfg


def spec(pod: dict[str, Any] | None = None, host: dict[str, Any] | None = None, **kw: Any) -> DeviceSpec:
    return DeviceSpec.from_proto(config(pod, host, **kw))


def actions(steps: Any) -> list[Step]:
    return [s.action for s in steps]


TWO_ADDR_TWO_ROUTES = {
    "interface": {"name": "net1", "addresses": ["192.0.2.5/24", "2001:db8::5/64"]},
    "routes": [
        {"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100},
        {"destination": "192.0.2.0/24", "scope": 253},
    ],
}


def test_passthrough_two_addresses_two_routes() -> None:
    plan = plan_attach(spec(TWO_ADDR_TWO_ROUTES), NETNS, AttachObservation(on_host=HOST_ETH1))
    assert actions(plan.steps) == [
        AddAltname(Ns.HOST, "eth1", TAG),
        MoveLink(Ns.HOST, Ns.POD, LinkLocator(("eth1",), TAG), "net1"),
        AddAddress(Ns.POD, "net1", "192.0.2.5/24"),
        AddAddress(Ns.POD, "net1", "2001:db8::5/64"),
        SetLinkState(Ns.POD, "net1", up=True),
        # Link-scope routes first: a gateway may be reachable only through one of them.
        AddRoute(Ns.POD, "net1", "192.0.2.0/24", scope=253, table=254),
        AddRoute(Ns.POD, "net1", "10.0.0.0/8", gateway="192.0.2.1", table=100),
    ]
    assert plan.ips == ("192.0.2.5/24", "2001:db8::5/64")
    assert plan.mac == HOST_ETH1.mac
    assert plan.conditions == (
        Condition("Ready", "True", "NetworkDeviceReady"),
        Condition("NetworkReady", "True", "NetworkReady"),
    )
    assert plan.describe()[1] == "move eth1 (or altname dranet-eth1) from host netns to pod netns as net1"


def test_steps_name_the_config_field_they_come_from() -> None:
    """A kernel refusal of a step names the claim's field: routes keep their config index
    although link-scope routes are applied first; link attributes are named as in the config."""
    plan = plan_attach(spec(TWO_ADDR_TWO_ROUTES), NETNS, AttachObservation(on_host=HOST_ETH1))
    origins = {type(ps.action).__name__ + " " + ps.origin for ps in plan.steps if ps.origin}
    routes = [ps for ps in plan.steps if isinstance(ps.action, AddRoute)]
    by_dest = {ps.action.destination: ps.origin for ps in routes}  # type: ignore[attr-defined]
    assert by_dest == {"10.0.0.0/8": "routes[0]", "192.0.2.0/24": "routes[1]"}, by_dest
    assert "AddAddress interface.addresses" in origins
    assert (
        LinkAttrs(mtu=1400, gso_max_size=65536).describe() == "interface.mtu 1400, interface.gsoMaxSize 65536"
    )


def test_passthrough_link_attrs_and_sysctls_go_with_the_move_and_before_addresses() -> None:
    pod = {
        "interface": {
            "mtu": 9000,
            "hardwareAddr": "02:00:00:00:00:99",
            "gsoMaxSize": 65536,
            "groMaxSize": 65536,
            "gsoIPv4MaxSize": 65536,
            "groIPv4MaxSize": 65536,
            "forwarding": True,
            "arpIgnore": 1,
            "arpAnnounce": 2,
            "addresses": ["192.0.2.5/24"],
        }
    }
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    steps = actions(plan.steps)
    attrs = LinkAttrs(9000, "02:00:00:00:00:99", 65536, 65536, 65536, 65536)
    assert steps[1] == MoveLink(Ns.HOST, Ns.POD, LinkLocator(("eth1",), TAG), "eth1", attrs)
    assert steps[2:7] == [
        WriteSysctl(Ns.POD, "net/ipv4/conf/eth1/forwarding", "1"),
        WriteSysctl(Ns.POD, "net/ipv6/conf/eth1/forwarding", "1", missing_ok=True),
        WriteSysctl(Ns.POD, "net/ipv4/conf/eth1/arp_ignore", "1"),
        WriteSysctl(Ns.POD, "net/ipv4/conf/eth1/arp_announce", "2"),
        AddAddress(Ns.POD, "eth1", "192.0.2.5/24"),
    ]
    assert plan.mac == "02:00:00:00:00:99"
    # The undo of the move sets back what was there (gso from the observed link).
    assert plan.steps[1].undo == (
        MoveLink(
            Ns.POD,
            Ns.HOST,
            LinkLocator(("eth1", "eth1"), TAG, "02:00:00:00:00:99"),
            "eth1",
            LinkAttrs(mtu=1500, mac=HOST_ETH1.mac, gso_max_size=65536),
        ),
        SetLinkState(Ns.HOST, "eth1", up=True),
    )


def test_rules_neighbors_ethtool_and_ebpf() -> None:
    pod = {
        "interface": {"addresses": ["192.0.2.5/24"], "disableEbpfPrograms": True},
        "rules": [{"priority": 100, "source": "192.0.2.5/32", "table": 100}],
        "neighbors": [{"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:0a"}],
        "ethtool": {"features": {"rx-gro": False}, "privateFlags": {"flag-a": True}},
    }
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    steps = plan.steps
    tail = actions(steps[4:])
    assert tail == [
        ApplyEthtool(Ns.POD, "eth1", (("rx-gro", False),), (("flag-a", True),)),
        DetachEbpf(Ns.POD, "eth1"),
        AddRule(Ns.POD, 100, "192.0.2.5/32", "", 100),
        AddNeighbor(Ns.POD, "eth1", "192.0.2.1", "02:00:00:00:00:0a"),
    ]
    assert steps[6].undo == (DelRule(Ns.POD, 100, "192.0.2.5/32", "", 100),)


def test_vrf_gets_its_table_and_no_rules() -> None:
    pod = {
        "interface": {"name": "net1", "addresses": ["192.0.2.5/24"], "vrf": {"name": "blue", "table": 1100}},
        "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100}],
    }
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    assert actions(plan.steps)[4:] == [
        CreateVrf(Ns.POD, "blue", 1100),
        SetLinkState(Ns.POD, "blue", up=True),
        SetMaster(Ns.POD, "net1", "blue"),
        WriteSysctl(Ns.POD, "net/ipv4/tcp_l3mdev_accept", "1"),
        WriteSysctl(Ns.POD, "net/ipv4/udp_l3mdev_accept", "1"),
        AddRoute(Ns.POD, "net1", "10.0.0.0/8", gateway="192.0.2.1", table=1100),
    ]
    assert plan.steps[4].undo == (DeleteLink(Ns.POD, "blue"),)


def test_vrf_without_table_uses_dranets_derived_table() -> None:
    pod = {"interface": {"addresses": ["192.0.2.5/24"], "vrf": {"name": "blue"}}}
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    vrf = next(a for a in actions(plan.steps) if isinstance(a, CreateVrf))
    assert 1000 <= vrf.table < 2000


def test_unnumbered_gets_no_addresses() -> None:
    pod = {
        "interface": {"addressing": "Unnumbered"},
        "routes": [{"destination": "10.0.0.0/8", "scope": 253}],
    }
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    assert not [a for a in actions(plan.steps) if isinstance(a, AddAddress)]
    assert plan.ips == ()
    assert AddRoute(Ns.POD, "eth1", "10.0.0.0/8", scope=253) in actions(plan.steps)


def test_dhcp_applies_the_lease_prepare_stored() -> None:
    """Prepare stores the lease as the address and its option 121/3 routes (an on-link one
    as scope link): attach plans them like configured ones, link-scope routes first."""
    pod = {
        "interface": {"dhcp": True, "addresses": ["198.51.100.7/24"]},
        "routes": [
            {"destination": "203.0.113.0/24", "gateway": "198.51.100.9"},
            {"destination": "198.51.100.9/32", "scope": 253},
            {"destination": "0.0.0.0/0", "gateway": "198.51.100.1"},
        ],
    }
    leased = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    steps = actions(leased.steps)
    assert AddAddress(Ns.POD, "eth1", "198.51.100.7/24") in steps
    assert leased.ips == ("198.51.100.7/24",)
    routes = [a for a in steps if isinstance(a, AddRoute)]
    assert routes == [
        AddRoute(Ns.POD, "eth1", "198.51.100.9/32", scope=253),
        AddRoute(Ns.POD, "eth1", "203.0.113.0/24", "198.51.100.9"),
        AddRoute(Ns.POD, "eth1", "0.0.0.0/0", "198.51.100.1"),
    ]
    assert steps.index(AddAddress(Ns.POD, "eth1", "198.51.100.7/24")) < steps.index(routes[0])


def test_dhcp_without_a_stored_lease_is_refused() -> None:
    """A record that says dhcp but holds no lease was not prepared by prepare (which fails
    the claim when no lease comes): the Pod must not start unaddressed."""
    with pytest.raises(
        PlanError, match=r"nic-eth1: interface.dhcp is set but the stored config holds no leased"
    ):
        plan_attach(spec({"interface": {"dhcp": True}}), NETNS, AttachObservation(on_host=HOST_ETH1))


def test_already_tagged_device_gets_no_second_altname() -> None:
    tagged = LinkState(name="eth1", index=7, altnames=(TAG,), up=True)
    plan = plan_attach(spec({}), NETNS, AttachObservation(on_host=tagged))
    assert not isinstance(plan.steps[0].action, AddAltname)


def test_device_back_from_a_dead_netns_under_its_pod_name_is_found_by_tag() -> None:
    back = LinkState(name="net1", index=9, altnames=(TAG,))
    plan = plan_attach(spec({"interface": {"name": "net1"}}), NETNS, AttachObservation(on_host=back))
    move = plan.steps[0]
    assert move.action == MoveLink(Ns.HOST, Ns.POD, LinkLocator(("net1",), TAG), "net1")
    # Undo puts it back under the host name.
    assert isinstance(move.undo[0], MoveLink) and move.undo[0].new_name == "eth1"


def test_converge_when_already_in_the_pod() -> None:
    here = LinkState(name="net1", index=3, mac="02:00:00:00:00:01", altnames=(TAG,), up=True)
    pod = {"interface": {"name": "net1", "mtu": 9000, "addresses": ["192.0.2.5/24"]}}
    host = {"interface": {"name": "eth1", "mtu": 1500, "addresses": ["192.0.2.5/24"]}}
    plan = plan_attach(spec(pod, host), NETNS, AttachObservation(in_pod=here))
    assert plan.converging
    assert actions(plan.steps) == [
        SetLink(Ns.POD, "net1", LinkAttrs(mtu=9000)),
        AddAddress(Ns.POD, "net1", "192.0.2.5/24"),
        SetLinkState(Ns.POD, "net1", up=True),
    ]
    # Even a converging attach gives the device back if it fails.
    assert plan_rollback(plan, []) == (
        MoveLink(Ns.POD, Ns.HOST, LinkLocator(("net1", "net1"), TAG, here.mac), "eth1", LinkAttrs(mtu=1500)),
        SetLinkState(Ns.HOST, "eth1", up=True),
        DelAltname(Ns.HOST, "eth1", TAG),
        AddAddress(Ns.HOST, "eth1", "192.0.2.5/24"),
    )


def test_converge_renames_a_device_someone_renamed_in_the_pod() -> None:
    here = LinkState(name="foo", index=3, altnames=(TAG,))
    plan = plan_attach(spec({"interface": {"name": "net1"}}), NETNS, AttachObservation(in_pod=here))
    assert plan.steps[0].action == RenameLink(Ns.POD, "foo", "net1")


@pytest.mark.parametrize(
    ("seen", "message"),
    [
        (AttachObservation(), r"not found in the host netns nor in the pod netns"),
        (
            AttachObservation(on_host=HOST_ETH1, pod_name_taken=LinkState(name="eth1", index=2)),
            r"pod netns already has an interface named eth1",
        ),
    ],
    ids=["missing", "name-taken"],
)
def test_passthrough_plan_errors_name_device_interfaces_and_netns(
    seen: AttachObservation, message: str
) -> None:
    with pytest.raises(PlanError, match=message) as err:
        plan_attach(spec({}), NETNS, seen)
    assert f"device nic-eth1 (host eth1, pod eth1, netns {NETNS})" in str(err.value)


IPVLAN_PARENT = LinkState(name="rdma0", index=4, mac="02:00:00:00:00:04", mtu=9000, up=True)


def ipvlan_spec(itf: dict[str, Any], **kw: Any) -> DeviceSpec:
    host = {"interface": {"name": "rdma0", "addresses": ["10.224.0.25/12"]}}
    return spec({"interface": {"type": "IPVLAN", "name": "net1", **itf}}, host, host_ifname="rdma0", **kw)


def test_ipvlan_child_is_created_in_the_pod_with_config_addresses() -> None:
    s = ipvlan_spec({"addresses": ["10.208.0.25/12"], "mtu": 8900})
    assert s.kind == DeviceKind.IPVLAN
    plan = plan_attach(s, NETNS, AttachObservation(on_host=IPVLAN_PARENT))
    assert actions(plan.steps) == [
        CreateChild(Ns.POD, "rdma0", "net1", "ipvlan", "l2", 8900),
        AddAddress(Ns.POD, "net1", "10.208.0.25/12"),
        SetLinkState(Ns.POD, "net1", up=True),
    ]
    assert plan.steps[0].undo == (DeleteLink(Ns.POD, "net1"),)
    assert plan.mac == IPVLAN_PARENT.mac
    # No host restore: the parent never left.
    assert plan_rollback(plan, [0, 1, 2]) == (DeleteLink(Ns.POD, "net1"),)


def test_ipvlan_unnumbered_and_converge() -> None:
    child = LinkState(name="net1", index=3, kind="ipvlan", link=4, mac=IPVLAN_PARENT.mac)
    plan = plan_attach(
        ipvlan_spec({"addressing": "Unnumbered"}),
        NETNS,
        AttachObservation(on_host=IPVLAN_PARENT, in_pod=child),
    )
    assert actions(plan.steps) == [SetLinkState(Ns.POD, "net1", up=True)]
    assert plan.converging and plan.base_undo == (DeleteLink(Ns.POD, "net1"),)


@pytest.mark.parametrize(
    ("itf", "kw", "seen", "message"),
    [
        ({"addresses": ["10.208.0.25/12"], "mtu": 9001}, {}, None, r"mtu 9001 exceeds the parent's MTU 9000"),
        ({"addresses": ["10.224.0.25/12"]}, {}, None, r"address 10.224.0.25/12 is the parent's own"),
        (
            {"addresses": ["10.208.0.25/12"]},
            {"rdma_link": "mlx5_0", "mode": "exclusive"},
            None,
            r"RDMA exclusive",
        ),
        ({"addresses": ["10.208.0.25/12"]}, {}, AttachObservation(), r"parent interface rdma0 not found"),
    ],
    ids=["mtu", "parent-address", "exclusive", "no-parent"],
)
def test_ipvlan_plan_errors(
    itf: dict[str, Any], kw: dict[str, Any], seen: AttachObservation | None, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        plan_attach(ipvlan_spec(itf, **kw), NETNS, seen or AttachObservation(on_host=IPVLAN_PARENT))


def test_rdma_exclusive_moves_the_link_after_the_netdev() -> None:
    s = spec({"interface": {"addresses": ["192.0.2.5/24"]}}, rdma_link="mlx5_0", mode="exclusive")
    plan = plan_attach(s, NETNS, AttachObservation(on_host=HOST_ETH1))
    last = plan.steps[-1]
    assert last.action == MoveRdmaLink(Ns.HOST, Ns.POD, "mlx5_0")
    assert last.undo == (MoveRdmaLink(Ns.POD, Ns.HOST, "mlx5_0"),)
    assert plan.conditions[-1] == Condition("RDMALinkReady", "True", "RDMALinkReady")
    # Rollback: the RDMA link goes back first, then the netdev.
    undo = plan_rollback(plan, range(len(plan.steps)))
    assert undo[0] == MoveRdmaLink(Ns.POD, Ns.HOST, "mlx5_0")
    assert isinstance(undo[1], MoveLink)


def test_rdma_shared_mode_moves_no_link() -> None:
    s = spec({}, rdma_link="mlx5_0", mode="shared")
    plan = plan_attach(s, NETNS, AttachObservation(on_host=HOST_ETH1))
    assert not [a for a in actions(plan.steps) if isinstance(a, MoveRdmaLink)]
    assert [c.type for c in plan.conditions] == ["Ready", "NetworkReady"]


@pytest.mark.parametrize(
    ("mode", "steps", "conditions"),
    [
        ("shared", [], [Condition("Ready", "True", "RDMAOnlyDeviceReady")]),
        (
            "exclusive",
            [MoveRdmaLink(Ns.HOST, Ns.POD, "mlx5_0")],
            [
                Condition("RDMALinkReady", "True", "RDMALinkReady"),
                Condition("Ready", "True", "RDMAOnlyDeviceReady"),
            ],
        ),
    ],
)
def test_rdma_only_device(mode: str, steps: list[Step], conditions: list[Condition]) -> None:
    s = spec({}, host_ifname="", rdma_link="mlx5_0", mode=mode)
    assert s.kind == DeviceKind.RDMA_ONLY
    plan = plan_attach(s, NETNS, AttachObservation())
    assert actions(plan.steps) == steps
    assert list(plan.conditions) == conditions


def test_rollback_undoes_done_steps_last_first_then_restores_host_addresses_and_routes() -> None:
    host = {
        "interface": {"name": "eth1", "addresses": ["192.0.2.5/24"]},
        "routes": [
            {"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100},
            {"destination": "192.0.2.0/24", "scope": 253},
        ],
        "neighbors": [{"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:0a"}],
    }
    pod = {
        "interface": {"name": "net1", "addresses": ["192.0.2.5/24"]},
        "rules": [{"priority": 100, "source": "192.0.2.5/32", "table": 100}],
        "routes": [{"destination": "10.0.0.0/8", "gateway": "203.0.113.1", "table": 100}],
    }
    plan = plan_attach(spec(pod, host), NETNS, AttachObservation(on_host=HOST_ETH1))
    names = [type(a).__name__ for a in actions(plan.steps)]
    assert names == ["AddAltname", "MoveLink", "AddAddress", "SetLinkState", "AddRoute", "AddRule"]
    # The route (index 4) failed: altname, move, address and up were done.
    undo = plan_rollback(plan, [0, 1, 2, 3])
    assert undo == (
        MoveLink(Ns.POD, Ns.HOST, LinkLocator(("net1", "eth1"), TAG, HOST_ETH1.mac), "eth1"),
        SetLinkState(Ns.HOST, "eth1", up=True),
        DelAltname(Ns.HOST, "eth1", TAG),
        AddAddress(Ns.HOST, "eth1", "192.0.2.5/24"),
        AddRoute(Ns.HOST, "eth1", "192.0.2.0/24", scope=253),
        AddRoute(Ns.HOST, "eth1", "10.0.0.0/8", gateway="192.0.2.1", table=100),
        AddNeighbor(Ns.HOST, "eth1", "192.0.2.1", "02:00:00:00:00:0a"),
    )
    # A later failure also deletes the rule it added; nothing moved: nothing restored.
    assert plan_rollback(plan, [0, 1, 2, 3, 5])[0] == DelRule(Ns.POD, 100, "192.0.2.5/32", "", 100)
    assert plan_rollback(plan, [0]) == (DelAltname(Ns.HOST, "eth1", TAG),)


def test_rollback_takes_the_undo_the_executor_computed() -> None:
    pod = {"ethtool": {"features": {"rx-gro": False}}}
    plan = plan_attach(spec(pod), NETNS, AttachObservation(on_host=HOST_ETH1))
    i = next(i for i, s in enumerate(plan.steps) if isinstance(s.action, ApplyEthtool))
    back = ApplyEthtool(Ns.POD, "eth1", (("rx-gro", True),))
    undo = plan_rollback(plan, range(i + 1), {i: (back,)})
    assert undo[0] == back


def test_link_attrs_original_prefers_the_observed_link_then_the_host_snapshot() -> None:
    attrs = LinkAttrs(mtu=9000, mac="02:00:00:00:00:99", gro_max_size=1)
    host = spec({}, {"interface": {"name": "eth1", "mtu": 1400, "hardwareAddr": "02:00:00:00:00:77"}}).host
    assert attrs.original(None, host) == LinkAttrs(mtu=1400, mac="02:00:00:00:00:77")
    assert attrs.original(HOST_ETH1, host) == LinkAttrs(mtu=1500, mac=HOST_ETH1.mac)
    assert LinkAttrs().original(HOST_ETH1) == LinkAttrs()


# --- return --------------------------------------------------------------------------


TARGET = ReturnTarget("nic-eth1", "eth1", "net1", DeviceKind.PASSTHROUGH, "02:00:00:00:00:01")


@pytest.mark.parametrize(
    ("target", "seen", "state", "netdev"),
    [
        (
            TARGET,
            ReturnObservation(True, in_pod=LinkState("net1", 3, altnames=(TAG,))),
            ReturnState.RETURNED,
            [
                MoveLink(Ns.POD, Ns.HOST, LinkLocator(("net1",)), "eth1"),
                SetLinkState(Ns.HOST, "eth1", up=True),
                DelAltname(Ns.HOST, "eth1", TAG),
            ],
        ),
        (
            TARGET,
            ReturnObservation(True, in_pod=LinkState("renamed", 3)),
            ReturnState.RETURNED,
            [
                MoveLink(Ns.POD, Ns.HOST, LinkLocator(("renamed",)), "eth1"),
                SetLinkState(Ns.HOST, "eth1", up=True),
            ],
        ),
        (TARGET, ReturnObservation(True, on_host=HOST_ETH1), ReturnState.ALREADY_ON_HOST, []),
        (
            TARGET,
            ReturnObservation(False, on_host=LinkState("net1", 9, altnames=(TAG,))),
            ReturnState.RECLAIMED,
            [
                RenameLink(Ns.HOST, "net1", "eth1"),
                SetLinkState(Ns.HOST, "eth1", up=True),
                DelAltname(Ns.HOST, "eth1", TAG),
            ],
        ),
        (TARGET, ReturnObservation(False), ReturnState.GONE, []),
        (TARGET, ReturnObservation(True), ReturnState.GONE, []),
        (
            ReturnTarget("d", "rdma0", "net1", DeviceKind.IPVLAN),
            ReturnObservation(True, in_pod=LinkState("net1", 3, kind="ipvlan")),
            ReturnState.RETURNED,
            [DeleteLink(Ns.POD, "net1")],
        ),
        (
            ReturnTarget("d", "rdma0", "net1", DeviceKind.IPVLAN),
            ReturnObservation(False),
            ReturnState.ALREADY_ON_HOST,
            [],
        ),
        (
            # A config rebuilt from an AttachResult does not say IPvlan; the untagged child does.
            ReturnTarget("d", "rdma0", "net1", None),
            ReturnObservation(True, in_pod=LinkState("net1", 3, kind="ipvlan")),
            ReturnState.RETURNED,
            [DeleteLink(Ns.POD, "net1")],
        ),
    ],
    ids=[
        "in-pod",
        "renamed-untagged",
        "on-host",
        "back-by-itself",
        "netns-gone",
        "lost",
        "ipvlan",
        "ipvlan-gone",
        "ipvlan-from-result",
    ],
)
def test_return_plans(
    target: ReturnTarget, seen: ReturnObservation, state: ReturnState, netdev: list[Step]
) -> None:
    plan = plan_return(target, seen)
    assert plan.state == state
    assert list(plan.netdev_steps) == netdev
    assert plan.rdma_steps == ()


def test_gone_note_says_what_happens_to_a_veth_and_a_physical_nic() -> None:
    note = plan_return(TARGET, ReturnObservation(False)).note
    assert "veth" in note and "destroyed" in note and "physical NIC" in note


def test_return_moves_the_rdma_link_first_and_only_while_the_netns_exists() -> None:
    target = ReturnTarget(
        "d", "eth1", "net1", DeviceKind.PASSTHROUGH, rdma_link_dev="mlx5_0", rdma_exclusive=True
    )
    plan = plan_return(target, ReturnObservation(True, in_pod=LinkState("net1", 3, altnames=(TAG,))))
    assert plan.rdma_steps == (MoveRdmaLink(Ns.POD, Ns.HOST, "mlx5_0"),)
    assert plan_return(target, ReturnObservation(False)).rdma_steps == ()
    only = ReturnTarget("d", "", "", DeviceKind.RDMA_ONLY, rdma_link_dev="mlx5_0", rdma_exclusive=True)
    assert plan_return(only, ReturnObservation(True)).state == ReturnState.RETURNED
    shared = ReturnTarget("d", "", "", DeviceKind.RDMA_ONLY, rdma_link_dev="mlx5_0")
    assert plan_return(shared, ReturnObservation(True)).state == ReturnState.NOTHING


def test_return_target_from_an_attach_result() -> None:
    res = store_pb2.AttachResult(
        device="d", host_ifname="eth1", interface_name="net1", hardware_address="02:aa"
    )
    t = ReturnTarget.from_result(res)
    assert (t.kind, t.host_ifname, t.pod_ifname, t.mac) == (None, "eth1", "net1", "02:aa")
    assert t.locator() == LinkLocator(("net1", "eth1"), TAG, "02:aa")
    assert ReturnTarget.from_result(store_pb2.AttachResult(device="r")).kind == DeviceKind.RDMA_ONLY


# --- parsing and device files ---------------------------------------------------------


def test_spec_from_proto() -> None:
    s = spec({"interface": {"name": "net1"}}, {"interface": {"name": "eth1", "mtu": 1500}})
    assert (s.kind, s.host_ifname, s.pod_ifname, s.altname) == (DeviceKind.PASSTHROUGH, "eth1", "net1", TAG)
    assert s.host is not None and s.host.interface.mtu == 1500
    assert spec({}).pod_ifname == "eth1"
    assert altname_for("ens1f0np0") == "dranet-ens1f0np0"


def test_spec_errors_name_the_device_and_field_and_a_bad_host_snapshot_is_ignored() -> None:
    with pytest.raises(PlanError, match=r"device nic-eth1: pod_config_json: interface.bogus: unknown field"):
        spec({"interface": {"bogus": 1}})
    assert spec({}, {"interface": {"unknown": True}}).host is None


def test_container_devices_deduplicates_paths_across_devices() -> None:
    a = config({}, dev_chars=(("/dev/infiniband/rdma_cm", 10, 58), ("/dev/infiniband/uverbs0", 231, 192)))
    b = config({}, dev_chars=(("/dev/infiniband/rdma_cm", 10, 58), ("/dev/infiniband/uverbs1", 231, 193)))
    assert container_devices([a, b]) == (
        DeviceNode("/dev/infiniband/rdma_cm", "c", 10, 58, 0o666),
        DeviceNode("/dev/infiniband/uverbs0", "c", 231, 192, 0o666),
        DeviceNode("/dev/infiniband/uverbs1", "c", 231, 193, 0o666),
    )
    assert container_devices([config({})]) == ()


def test_every_step_describes_itself_with_its_netns() -> None:
    steps: list[Step] = [
        AddAltname(Ns.HOST, "eth1", TAG),
        MoveLink(Ns.HOST, Ns.POD, LinkLocator(("eth1",)), "net1", LinkAttrs(mtu=9000)),
        RenameLink(Ns.POD, "a", "b"),
        SetLink(Ns.POD, "net1", LinkAttrs(mac="02:00:00:00:00:01")),
        WriteSysctl(Ns.POD, "net/ipv4/conf/net1/arp_ignore", "1"),
        AddRoute(Ns.POD, "net1", "10.0.0.0/8", "192.0.2.1", "192.0.2.5", 0, 100),
        AddRule(Ns.POD, 100, "192.0.2.5/32", "10.0.0.0/8", 100),
        CreateChild(Ns.POD, "rdma0", "net1", mtu=1500),
        MoveRdmaLink(Ns.HOST, Ns.POD, "mlx5_0"),
        ApplyEthtool(Ns.POD, "net1", (("rx-gro", False),), (("x", True),)),
    ]
    texts = [s.describe() for s in steps]
    assert all(" netns" in t for t in texts), texts
    assert texts[5] == "add route 10.0.0.0/8 via 192.0.2.1 dev net1 src 192.0.2.5 table 100 in pod netns"
    assert texts[4] == "set sysctl net.ipv4.conf.net1.arp_ignore=1 in pod netns"
