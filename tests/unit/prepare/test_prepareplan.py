"""Prepare's per-device plan as a pure function (shared/prepareplan.py), table by table:
DeviceClass and claim configs and the pick rule, the provider config under the claim's,
profiles, the VF and IPvlan MTU limits, RDMA modes and RDMA-only devices, the host
snapshot, a DHCP lease, and invalid configs. No root, no I/O."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from shared.netconfig import InterfaceConfig, NetworkConfig, RouteConfig, parse_network_config
from shared.prepareplan import (
    Allocated,
    DeviceInputs,
    DevicePlan,
    Lease,
    NeedsLease,
    NeedsProfile,
    PlanError,
    merge_profile_answer,
    plan_device,
    provisional_record,
)

DRIVER, NODE = "dra.net", "node-a"
CLAIM = st.ClaimRef(uid="uid-1", namespace="default", name="c1")
POD = st.PodRef(uid="pod-1", namespace="default", name="p")
NOW = 1_700_000_000_000_000_000
SHARED = inv.NodeInfo(node_name=NODE, rdma_netns_mode="shared")
EXCLUSIVE = inv.NodeInfo(node_name=NODE, rdma_netns_mode="exclusive")
WITH_PROVIDER = inv.NodeInfo(node_name=NODE, rdma_netns_mode="shared", has_profile_provider=True)


def entry(
    params: Any, source: str = "FromClaim", requests: list[str] | None = None, driver: str = DRIVER
) -> Any:
    e: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        e["requests"] = requests
    return e


def klass(params: Any, requests: list[str] | None = None) -> Any:
    return entry(params, "FromClass", requests)


def nic(**kw: Any) -> inv.Device:
    """A plain NIC eth1 (MTU 1500) with no host L3 state, changed by ``kw``."""
    d = inv.Device(name="eth1", ifname="eth1", mtu=1500, snapshot=inv.HostSnapshot(mtu=1500))
    for k, v in kw.items():
        if isinstance(v, inv.HostSnapshot):
            getattr(d, k).CopyFrom(v)
        else:
            setattr(d, k, v)
    return d


ETH1 = nic()
# A NIC whose host side has an address, a route in table 100 with that address as its
# source, a rule for table 100 and one for an unrelated table, and a permanent neighbor.
HOSTED = nic(
    snapshot=inv.HostSnapshot(
        mtu=1500,
        hardware_addr="02:00:00:00:00:01",
        addresses=[inv.Address(cidr="192.0.2.5/24")],
        routes=[inv.Route(destination="10.0.0.0/8", gateway="192.0.2.1", source="192.0.2.5", table=100)],
        rules=[inv.Rule(priority=100, source="192.0.2.5/32", table=100), inv.Rule(priority=200, table=200)],
        neighbors=[inv.Neighbor(destination="192.0.2.9", hardware_addr="02:00:00:00:00:09")],
    )
)
VF = inv.Device(name="vf0", ifname="ens1f0v0", is_sriov_vf=True, pf_ifname="ens1f0", pf_mtu=1500, mtu=1500)
# The snapshot's PF facts are fresher than the device's and win.
VF_SNAP = inv.Device(
    name="vf0",
    ifname="ens1f0v0",
    is_sriov_vf=True,
    pf_ifname="ens1f0",
    pf_mtu=1500,
    snapshot=inv.HostSnapshot(pf_ifname="ens1f0np0", pf_mtu=4000),
)
RDMA_ONLY = inv.Device(
    name="mlx5_0",
    rdma_only=True,
    rdma_device="mlx5_0",
    snapshot=inv.HostSnapshot(
        rdma_dev_chars=[
            inv.LinuxDevice(path="/dev/infiniband/uverbs0", type="c", major=231, minor=192, file_mode=0o666)
        ]
    ),
)
PROVIDER = nic(
    provider_config_json=json.dumps(
        {
            "interface": {"name": "gpu0", "mtu": 8896},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}],
        }
    )
)
NO_NETDEV = inv.Device(name="eth1")

MTU = {"interface": {"mtu": 1400}}
HOST_ROUTE = {"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "source": "192.0.2.5", "table": 100}
HOST_RULE = {"priority": 100, "source": "192.0.2.5/32", "table": 100}
HOST_NEIGHBOR = {"destination": "192.0.2.9", "hardwareAddr": "02:00:00:00:00:09"}


def inputs(
    entries: list[Any] | None = None,
    dev: inv.Device = ETH1,
    node: inv.NodeInfo = SHARED,
    request: str = "nic",
) -> DeviceInputs:
    return DeviceInputs(
        claim=CLAIM,
        pod=POD,
        allocated=Allocated(request=request, device=dev.name, pool=NODE),
        entries=entries or [],
        dev=dev,
        node=node,
        driver=DRIVER,
        node_name=NODE,
    )


def config(raw: dict[str, Any] | None) -> NetworkConfig | None:
    return None if raw is None else parse_network_config(raw) or NetworkConfig()


def plan(inp: DeviceInputs, **kw: Any) -> DevicePlan:
    got = plan_device(inp, now_unix_nano=NOW, **kw)
    assert isinstance(got, DevicePlan), got
    return got


# --- what the Pod gets --------------------------------------------------------------------

POD_CONFIG_CASES = [
    # (entries, device, request name, profiled, lease, expected pod_config_json)
    pytest.param(
        [], ETH1, "nic", None, None, {"interface": {"name": "eth1"}}, id="no-config-keeps-host-name"
    ),
    pytest.param(
        [klass(MTU)], ETH1, "nic", None, None, {"interface": {"name": "eth1", "mtu": 1400}}, id="class-only"
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1300}})],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 1300}},
        id="claim-only",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1300}}), klass(MTU)],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 1400}},
        id="class-and-claim-class-wins",
    ),
    pytest.param(
        [klass(MTU, requests=["gpu"]), entry({"interface": {"mtu": 1300}}, requests=["nic"])],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 1300}},
        id="class-for-another-request-claim-applies",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1300}}, requests=["nic"])],
        ETH1,
        "nic/fast",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 1300}},
        id="subrequest-takes-its-parents-config",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1}}, driver="gpu.example.com"), entry({"interface": {"mtu": 1300}})],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 1300}},
        id="other-drivers-config-ignored",
    ),
    pytest.param(
        [entry({"interface": {"name": "net1"}})],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "net1"}},
        id="configured-name-wins-over-host-name",
    ),
    pytest.param(
        [],
        PROVIDER,
        "nic",
        None,
        None,
        {
            "interface": {"name": "gpu0", "mtu": 8896},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}],
        },
        id="provider-config-only",
    ),
    pytest.param(
        [
            entry(
                {
                    "interface": {"mtu": 1460},
                    "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.254"}],
                }
            )
        ],
        PROVIDER,
        "nic",
        None,
        None,
        {
            "interface": {"name": "gpu0", "mtu": 1460},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.254"}],
        },
        id="provider-config-merged-under-claim-config",
    ),
    pytest.param(
        # A resumed provisional record (or the profile's merged answer): the pick is not
        # run again, so an entry that would fail it does not matter.
        [entry({"interface": {"mtu": "big"}})],
        ETH1,
        "nic",
        {"profile": "rdma-a", "interface": {"addresses": ["10.1.0.5/16"]}},
        None,
        {"profile": "rdma-a", "interface": {"name": "eth1", "addresses": ["10.1.0.5/16"]}},
        id="profiled-config-used-as-merged",
    ),
    pytest.param(
        [],
        HOSTED,
        "nic",
        None,
        None,
        {
            "interface": {"name": "eth1", "addresses": ["192.0.2.5/24"]},
            "routes": [HOST_ROUTE],
            "rules": [HOST_RULE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="host-snapshot-copied",
    ),
    pytest.param(
        [entry({"interface": {"addresses": ["198.51.100.7/24"]}})],
        HOSTED,
        "nic",
        None,
        None,
        {
            "interface": {"name": "eth1", "addresses": ["198.51.100.7/24"]},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100}],
            "rules": [HOST_RULE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="configured-addresses-host-route-loses-foreign-source",
    ),
    pytest.param(
        [entry({"routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.254", "table": 100}]})],
        HOSTED,
        "nic",
        None,
        None,
        {
            "interface": {"name": "eth1", "addresses": ["192.0.2.5/24"]},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.254", "table": 100}],
            "rules": [HOST_RULE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="configured-route-wins-over-host-route",
    ),
    pytest.param(
        [entry({"interface": {"vrf": {"name": "blue"}}})],
        HOSTED,
        "nic",
        None,
        None,
        {
            "interface": {
                "name": "eth1",
                "addresses": ["192.0.2.5/24"],
                "vrf": {"name": "blue", "table": 1541},
            },
            "routes": [HOST_ROUTE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="vrf-defaulted-and-no-host-rules",
    ),
    pytest.param(
        [entry({"interface": {"type": "IPVLAN", "addresses": ["10.2.0.5/16"]}})],
        HOSTED,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "type": "IPVLAN", "addresses": ["10.2.0.5/16"]}},
        id="ipvlan-copies-nothing-from-the-parent",
    ),
    pytest.param(
        [entry({"interface": {"addressing": "Unnumbered"}})],
        HOSTED,
        "nic",
        None,
        None,
        {
            "interface": {"name": "eth1", "addressing": "Unnumbered"},
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100}],
            "rules": [HOST_RULE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="unnumbered-takes-no-host-address",
    ),
    pytest.param(
        [
            entry(
                {
                    "interface": {"dhcp": True},
                    "routes": [{"destination": "172.16.0.0/12", "gateway": "192.0.2.254"}],
                }
            )
        ],
        HOSTED,
        "nic",
        None,
        Lease(
            address="192.0.2.77/24",
            routes=(
                RouteConfig(destination="172.16.0.0/12", gateway="192.0.2.1"),
                RouteConfig(destination="0.0.0.0/0", gateway="192.0.2.1"),
            ),
        ),
        {
            "interface": {"name": "eth1", "addresses": ["192.0.2.77/24"], "dhcp": True},
            "routes": [
                {"destination": "172.16.0.0/12", "gateway": "192.0.2.254"},
                {"destination": "0.0.0.0/0", "gateway": "192.0.2.1"},
                {"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100},
            ],
            "rules": [HOST_RULE],
            "neighbors": [HOST_NEIGHBOR],
        },
        id="dhcp-lease-address-and-routes-before-host-snapshot",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1500}})],
        VF,
        "nic",
        None,
        None,
        {"interface": {"name": "ens1f0v0", "mtu": 1500}},
        id="vf-mtu-at-pf-mtu",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 4000}})],
        VF_SNAP,
        "nic",
        None,
        None,
        {"interface": {"name": "ens1f0v0", "mtu": 4000}},
        id="vf-mtu-limit-from-snapshot-pf",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 9000}})],
        nic(),
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "mtu": 9000}},
        id="passthrough-non-vf-has-no-mtu-limit",
    ),
    pytest.param(
        [entry({"interface": {"type": "IPVLAN", "mtu": 1500, "addresses": ["10.2.0.5/16"]}})],
        ETH1,
        "nic",
        None,
        None,
        {"interface": {"name": "eth1", "type": "IPVLAN", "addresses": ["10.2.0.5/16"], "mtu": 1500}},
        id="ipvlan-mtu-at-parent-mtu",
    ),
    pytest.param(
        [],
        RDMA_ONLY,
        "rdma",
        {"profile": "rdma-a"},
        None,
        {"profile": "rdma-a", "interface": {}},
        id="rdma-only-device-with-profile",
    ),
]


@pytest.mark.parametrize(("entries", "dev", "req", "profiled", "lease", "want"), POD_CONFIG_CASES)
def test_pod_config(
    entries: list[Any],
    dev: inv.Device,
    req: str,
    profiled: dict[str, Any] | None,
    lease: Lease | None,
    want: dict[str, Any],
) -> None:
    got = plan(inputs(entries, dev, request=req), profiled=config(profiled), lease=lease).config
    assert json.loads(got.pod_config_json) == want
    assert (got.device, got.request, got.host_ifname, got.profile) == (
        dev.name,
        req,
        dev.ifname,
        want.get("profile", ""),
    )
    assert (got.claim, got.pod, got.driver, got.pool, got.prepared_unix_nano) == (
        CLAIM,
        POD,
        DRIVER,
        NODE,
        NOW,
    )
    assert not got.provisional and got.revision == 0


# --- what fails, and how it says so -------------------------------------------------------

W = "request nic device eth1"
ERROR_CASES = [
    # (entries, device, node, profiled, expected error)
    pytest.param(
        [klass({"interface": {"mtu": 10}})],
        ETH1,
        SHARED,
        None,
        f"{W}: config[0] (FromClass) interface.mtu: must be between 68 and 65535, got 10",
        id="class-config-invalid",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1300}}), klass({"interface": {"mtu": "big"}})],
        ETH1,
        SHARED,
        None,
        f'{W}: config[1] (FromClass) interface.mtu: expected an integer, got string "big"',
        id="invalid-class-entry-read-before-valid-claim-entry",
    ),
    pytest.param(
        [entry({"bogus": 1})],
        ETH1,
        SHARED,
        None,
        f"{W}: config[0] (FromClaim) bogus: unknown field (known: profile, interface, routes, rules, neighbors, ethtool)",
        id="claim-config-unknown-field",
    ),
    pytest.param(
        [entry({"interface": {"addresses": ["1.2.3.4"]}})],
        ETH1,
        SHARED,
        None,
        f"{W}: config[0] (FromClaim) interface.addresses[0]: invalid IP CIDR '1.2.3.4' (want e.g. 192.0.2.5/24)",
        id="claim-config-bad-address",
    ),
    pytest.param(
        [entry({"routes": [{"destination": "10.0.0.0/8"}]})],
        ETH1,
        SHARED,
        None,
        f"{W}: config[0] (FromClaim) routes[0].gateway: must be set for universe-scope routes (or use scope 253, link)",
        id="claim-config-route-without-gateway",
    ),
    pytest.param(
        [],
        nic(provider_config_json='{"interface": {"mtu": "x"}}'),
        SHARED,
        None,
        f'{W}: the provider config is invalid: interface.mtu: expected an integer, got string "x"',
        id="provider-config-invalid",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 1200}})],
        nic(provider_config_json='{"interface": {"addresses": ["2001:db8::5/64"]}}'),
        SHARED,
        None,
        f"{W}: interface.mtu: 1200 is below 1280, the minimum for IPv6 (interface.addresses[0] is 2001:db8::5/64)",
        id="valid-alone-invalid-once-merged-with-provider",
    ),
    pytest.param(
        [entry({"profile": "rdma-a"})],
        ETH1,
        SHARED,
        None,
        f"{W}: profile 'rdma-a' requested, but node node-a has no profile provider",
        id="profile-without-profile-provider",
    ),
    pytest.param(
        [],
        ETH1,
        WITH_PROVIDER,
        {"profile": "rdma-a", "interface": {"mtu": 50}},
        f"{W}: interface.mtu: must be between 68 and 65535, got 50",
        id="profile-answer-invalid-after-merge",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 9000}})],
        VF,
        SHARED,
        None,
        "request nic device vf0: interface.mtu 9000 exceeds PF ens1f0 MTU 1500",
        id="vf-mtu-above-pf-mtu",
    ),
    pytest.param(
        [entry({"interface": {"mtu": 4001}})],
        VF_SNAP,
        SHARED,
        None,
        "request nic device vf0: interface.mtu 4001 exceeds PF ens1f0np0 MTU 4000",
        id="vf-mtu-above-snapshot-pf-mtu",
    ),
    pytest.param(
        [],
        VF,
        SHARED,
        {"interface": {"mtu": 9000}},
        "request nic device vf0: interface.mtu 9000 exceeds PF ens1f0 MTU 1500",
        id="vf-mtu-from-profile-above-pf-mtu",
    ),
    pytest.param(
        [entry({"interface": {"type": "IPVLAN", "mtu": 9000, "addresses": ["10.2.0.5/16"]}})],
        ETH1,
        SHARED,
        None,
        f"{W}: interface.mtu 9000 exceeds parent eth1 MTU 1500",
        id="ipvlan-mtu-above-parent-mtu",
    ),
    pytest.param(
        [entry({"interface": {"type": "IPVLAN", "addresses": ["10.2.0.5/16"]}})],
        ETH1,
        EXCLUSIVE,
        None,
        f"{W}: interface.type IPVLAN is not supported when the node's RDMA netns mode is exclusive",
        id="ipvlan-in-exclusive-rdma-mode",
    ),
    pytest.param(
        [
            entry(
                {
                    "interface": {"mtu": 1500},
                    "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}],
                }
            )
        ],
        RDMA_ONLY,
        SHARED,
        None,
        "request nic device mlx5_0: interface: not supported for an RDMA-only device (no network interface); "
        "set: mtu; routes: not supported for an RDMA-only device (no network interface)",
        id="rdma-only-device-with-netdev-config",
    ),
    pytest.param(
        # Refused before a profile is allocated for it.
        [entry({"profile": "rdma-a", "interface": {"name": "net1"}})],
        RDMA_ONLY,
        WITH_PROVIDER,
        None,
        "request nic device mlx5_0: interface: not supported for an RDMA-only device (no network interface); "
        "set: name",
        id="rdma-only-device-own-config-refused-before-profile",
    ),
    pytest.param(
        [],
        RDMA_ONLY,
        WITH_PROVIDER,
        {
            "profile": "rdma-a",
            "neighbors": [{"destination": "192.0.2.9", "hardwareAddr": "02:00:00:00:00:09"}],
        },
        "request nic device mlx5_0: neighbors: not supported for an RDMA-only device (no network interface)",
        id="rdma-only-device-profile-adds-netdev-config",
    ),
    pytest.param(
        [],
        NO_NETDEV,
        SHARED,
        None,
        f"{W}: the device has no network interface",
        id="device-without-netdev",
    ),
]


@pytest.mark.parametrize(("entries", "dev", "node", "profiled", "want"), ERROR_CASES)
def test_errors_name_request_device_and_field(
    entries: list[Any], dev: inv.Device, node: inv.NodeInfo, profiled: dict[str, Any] | None, want: str
) -> None:
    with pytest.raises(PlanError) as err:
        plan_device(inputs(entries, dev, node), profiled=config(profiled), now_unix_nano=NOW)
    assert str(err.value) == want


@pytest.mark.parametrize(
    ("result", "want"),
    [
        ({"request": "nic", "device": "eth1", "pool": NODE}, ""),
        (
            {"request": "nic", "device": "eth1", "pool": "node-b"},
            "request nic device eth1: allocated from pool 'node-b', not from this node's pool 'node-a'",
        ),
        (
            {"request": "nic", "device": "eth1"},
            "request nic device eth1: allocated from pool None, not from this node's pool 'node-a'",
        ),
    ],
    ids=["this-nodes-pool", "other-pool", "no-pool"],
)
def test_allocated_from_this_nodes_pool(result: dict[str, Any], want: str) -> None:
    allocated = Allocated.from_result(result)
    if not want:
        allocated.check_pool(NODE)
        return
    with pytest.raises(PlanError) as err:
        allocated.check_pool(NODE)
    assert str(err.value) == want


# --- what the service must fetch first ----------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "dev", "profiled", "lease", "want"),
    [
        pytest.param(
            [entry({"profile": "rdma-a", "interface": {"mtu": 1400}})],
            PROVIDER,
            None,
            None,
            NeedsProfile(
                NetworkConfig(
                    profile="rdma-a",
                    interface=InterfaceConfig(name="gpu0", mtu=1400),
                    routes=(RouteConfig(destination="10.0.0.0/8", gateway="192.0.2.1"),),
                )
            ),
            id="profile-named-resolve-the-merged-config",
        ),
        pytest.param(
            [entry({"profile": "rdma-a"})],
            ETH1,
            {"profile": "rdma-a"},
            None,
            DevicePlan,
            id="profile-answer-given-no-second-resolve",
        ),
        pytest.param(
            [entry({"interface": {"dhcp": True}})], ETH1, None, None, NeedsLease("eth1"), id="dhcp-lease"
        ),
        pytest.param(
            [entry({"profile": "rdma-a"})],
            ETH1,
            {"profile": "rdma-a", "interface": {"dhcp": True}},
            None,
            NeedsLease("eth1"),
            id="dhcp-from-profile-lease",
        ),
        pytest.param(
            [entry({"interface": {"dhcp": False}})], ETH1, None, None, DevicePlan, id="dhcp-false-no-lease"
        ),
    ],
)
def test_what_the_plan_needs_first(
    entries: list[Any],
    dev: inv.Device,
    profiled: dict[str, Any] | None,
    lease: Lease | None,
    want: NeedsProfile | NeedsLease | type[DevicePlan],
) -> None:
    got = plan_device(inputs(entries, dev, WITH_PROVIDER), profiled=config(profiled), lease=lease)
    if isinstance(want, type):
        assert isinstance(got, want)
    else:
        assert got == want


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param("", {"profile": "rdma-a", "interface": {"mtu": 1400}}, id="empty-answer"),
        pytest.param(
            json.dumps(
                {
                    "profile": "other",
                    "interface": {"mtu": 9000, "addresses": ["10.1.0.5/16"]},
                    "routes": [{"destination": "10.0.0.0/8", "gateway": "10.1.0.1"}],
                }
            ),
            {
                "profile": "rdma-a",
                "interface": {"addresses": ["10.1.0.5/16"], "mtu": 1400},
                "routes": [{"destination": "10.0.0.0/8", "gateway": "10.1.0.1"}],
            },
            id="answer-fills-unset-fields-config-wins",
        ),
    ],
)
def test_profile_answer_merged_under_the_config(answer: str, want: dict[str, Any]) -> None:
    merged = NetworkConfig(profile="rdma-a", interface=InterfaceConfig(mtu=1400))
    assert merge_profile_answer(W, merged, answer).to_dict() == want


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param(
            "{bad",
            f"{W}: profile 'rdma-a' returned an invalid config: invalid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            id="not-json",
        ),
        pytest.param(
            '{"routes": {}}',
            f"{W}: profile 'rdma-a' returned an invalid config: routes: expected an array of objects, got object {{}}",
            id="wrong-type",
        ),
    ],
)
def test_invalid_profile_answer(answer: str, want: str) -> None:
    with pytest.raises(PlanError) as err:
        merge_profile_answer(W, NetworkConfig(profile="rdma-a"), answer)
    assert str(err.value) == want


def test_provisional_record_holds_the_config_before_the_answer() -> None:
    merged = NetworkConfig(profile="rdma-a", interface=InterfaceConfig(mtu=1400))
    rec = provisional_record(inputs(dev=PROVIDER), merged)
    assert rec == st.DeviceConfig(
        pod=POD,
        device="eth1",
        claim=CLAIM,
        request="nic",
        driver=DRIVER,
        pool=NODE,
        host_ifname="eth1",
        profile="rdma-a",
        pod_config_json='{"profile":"rdma-a","interface":{"mtu":1400}}',
        provisional=True,
    )


# --- RDMA, host config and the kept device ------------------------------------------------

UVERBS0 = st.LinuxDevice(path="/dev/infiniband/uverbs0", type="c", major=231, minor=192, file_mode=0o666)


@pytest.mark.parametrize(
    ("dev", "node", "want_mode", "want_link", "want_chars"),
    [
        pytest.param(ETH1, SHARED, "shared", "", [], id="shared-plain-nic"),
        pytest.param(ETH1, inv.NodeInfo(node_name=NODE), "shared", "", [], id="unknown-mode-is-shared"),
        pytest.param(
            nic(rdma_device="mlx5_1"),
            EXCLUSIVE,
            "exclusive",
            "mlx5_1",
            [],
            id="exclusive-rdma-nic-link-from-device",
        ),
        pytest.param(
            nic(rdma_device="mlx5_1", snapshot=inv.HostSnapshot(mtu=1500, rdma_device="mlx5_3")),
            SHARED,
            "shared",
            "mlx5_3",
            [],
            id="snapshot-rdma-link-wins",
        ),
        pytest.param(RDMA_ONLY, EXCLUSIVE, "exclusive", "mlx5_0", [UVERBS0], id="exclusive-rdma-only-device"),
        pytest.param(RDMA_ONLY, SHARED, "shared", "mlx5_0", [UVERBS0], id="shared-rdma-only-device"),
    ],
)
def test_rdma(
    dev: inv.Device, node: inv.NodeInfo, want_mode: str, want_link: str, want_chars: list[st.LinuxDevice]
) -> None:
    got = plan(inputs([], dev, node)).config
    assert got.rdma_netns_mode == want_mode
    assert got.rdma.link_dev == want_link
    assert list(got.rdma.dev_chars) == want_chars


@pytest.mark.parametrize(
    ("dev", "want"),
    [
        pytest.param(ETH1, {"interface": {"name": "eth1", "mtu": 1500}}, id="plain"),
        pytest.param(
            HOSTED,
            {
                "interface": {
                    "name": "eth1",
                    "addresses": ["192.0.2.5/24"],
                    "mtu": 1500,
                    "hardwareAddr": "02:00:00:00:00:01",
                },
                "routes": [HOST_ROUTE],
                "rules": [HOST_RULE, {"priority": 200, "table": 200}],
            },
            id="host-addresses-routes-and-all-rules",
        ),
        pytest.param(RDMA_ONLY, {"interface": {}}, id="rdma-only-no-netdev"),
    ],
)
def test_host_config_is_the_snapshot(dev: inv.Device, want: dict[str, Any]) -> None:
    """What the device returns to: its host side as the inventory saw it."""
    # The Pod's own config must not leak into the host record.
    entries = [] if dev.rdma_only else [entry({"interface": {"name": "net1", "mtu": 1400}})]
    got = plan(inputs(entries, dev)).config
    assert json.loads(got.host_config_json) == want


ENTRY_JSON = json.dumps({"name": "eth1", "attributes": {"dra.net/ifName": {"string": "eth1"}}})


@pytest.mark.parametrize(
    ("keep", "entry_json", "want"),
    [
        pytest.param(False, ENTRY_JSON, None, id="not-asked"),
        pytest.param(
            True,
            ENTRY_JSON,
            st.KeptDevice(
                device="eth1",
                claim=CLAIM,
                pod_uid="pod-1",
                pool=NODE,
                device_json=ENTRY_JSON,
                kept_unix_nano=NOW,
            ),
            id="asked",
        ),
        pytest.param(True, "", None, id="asked-but-inventory-did-not-say"),
    ],
)
def test_kept_device(keep: bool, entry_json: str, want: st.KeptDevice | None) -> None:
    assert plan(inputs([], nic(slice_entry_json=entry_json)), keep=keep).kept == want
