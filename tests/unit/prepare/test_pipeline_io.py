"""The prepare service's I/O around the pure plan (services/prepare/pipeline.py): a profile
is resolved once and held in a provisional record, released when the config fails after
it, resumed from the record on a retry; a DHCP lease enters the stored config, and no
lease releases the profile. Prepare driven as a function, with fakes for the API server,
the inventory, the store and the DHCP client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from services.prepare.dhcp import DhcpError, DhcpLease
from services.prepare.pipeline import ClaimRef, Preparer
from shared.netconfig import RouteConfig
from shared.storeclient import StoreCallError

DRIVER, NODE = "dra.net", "node-a"
REF = ClaimRef(namespace="default", name="c1", uid="uid-1")
WHERE = "claim default/c1: request nic device eth1"


class FakeKube:
    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        opaque = {"driver": DRIVER, "parameters": self.params}
        return {
            "metadata": {"name": name, "namespace": namespace, "uid": REF.uid},
            "status": {
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
                "allocation": {
                    "devices": {
                        "results": [{"driver": DRIVER, "pool": NODE, "device": "eth1", "request": "nic"}],
                        "config": [{"source": "FromClaim", "opaque": opaque}],
                    }
                },
            },
        }


class FakeInventory:
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls: list[tuple[str, ...]] = []

    async def get_device(self, name: str) -> inv.Device | None:
        return inv.Device(name="eth1", ifname="eth1", mtu=1500, snapshot=inv.HostSnapshot(mtu=1500))

    async def node_info(self) -> inv.NodeInfo:
        return inv.NodeInfo(node_name=NODE, rdma_netns_mode="shared", has_profile_provider=True)

    async def resolve_profile(
        self, device: str, claim_uid: str, pod_uid: str, profile: str, config_json: str
    ) -> str:
        self.calls.append(("resolve", device, profile, config_json))
        return self.answer

    async def release_profile(self, device: str, claim_uid: str, profile: str, config_json: str) -> None:
        self.calls.append(("release", device, profile, config_json))


class FakeStore:
    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], st.DeviceConfig] = {}
        self.calls: list[tuple[str, ...]] = []
        self.reads: list[str] = []

    async def get_device(self, pod_uid: str, device: str) -> st.DeviceConfig | None:
        self.reads.append(device)
        return self.configs.get((pod_uid, device))

    async def put_devices(
        self,
        configs: Sequence[st.DeviceConfig],
        kept: Sequence[st.KeptDevice] = (),
        *,
        expect_new: bool = False,
    ) -> list[int]:
        if expect_new:  # the store's rule (services/store/db.py put_devices)
            for c in configs:
                cur = self.configs.get((c.pod.uid, c.device))
                if cur is not None and (cur.claim.uid != c.claim.uid or not cur.provisional):
                    raise StoreCallError("FAILED_PRECONDITION", f"device {c.device} is already prepared")
        for c in configs:
            self.calls.append(("put", c.device, "provisional" if c.provisional else "final"))
            c.revision = len(self.calls)
            self.configs[(c.pod.uid, c.device)] = c
        return [len(self.calls)] * len(configs)

    async def delete_device(self, pod_uid: str, device: str) -> None:
        self.calls.append(("delete", device))
        self.configs.pop((pod_uid, device), None)


class FakeDhcp:
    def __init__(self, lease: DhcpLease | None) -> None:
        self.result = lease
        self.asked: list[str] = []

    async def lease(self, ifname: str) -> DhcpLease:
        self.asked.append(ifname)
        if self.result is None:
            raise DhcpError(f"no DHCP lease on {ifname} within 1s")
        return self.result


def preparer(
    params: dict[str, Any], answer: str = "", lease: DhcpLease | None = None
) -> tuple[Preparer, FakeInventory, FakeStore, FakeDhcp]:
    inventory, store, dhcp = FakeInventory(answer), FakeStore(), FakeDhcp(lease)
    p = Preparer(
        DRIVER,
        NODE,
        FakeKube(params),  # type: ignore[arg-type]
        inventory,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        require_attach=False,
        dhcp=dhcp,  # type: ignore[arg-type]
    )
    return p, inventory, store, dhcp


PROFILE_ANSWER = json.dumps({"interface": {"addresses": ["10.1.0.5/16"], "mtu": 9000}})


async def test_profile_resolved_once_held_provisionally_then_stored() -> None:
    p, inventory, store, _ = preparer({"profile": "rdma-a", "interface": {"mtu": 1400}}, PROFILE_ANSWER)
    assert (await p.prepare([REF]))[REF.uid].error == ""
    assert inventory.calls == [("resolve", "eth1", "rdma-a", '{"profile":"rdma-a","interface":{"mtu":1400}}')]
    assert store.calls == [("put", "eth1", "provisional"), ("put", "eth1", "final")]
    stored = store.configs[("pod-1", "eth1")]
    assert json.loads(stored.pod_config_json) == {
        "profile": "rdma-a",
        "interface": {"name": "eth1", "addresses": ["10.1.0.5/16"], "mtu": 1400},
    }
    assert (stored.profile, stored.provisional) == ("rdma-a", False)


@pytest.mark.parametrize(
    ("answer", "error", "released_config"),
    [
        pytest.param(
            json.dumps({"interface": {"mtu": 50}}),
            f"{WHERE}: interface.mtu: must be between 68 and 65535, got 50",
            '{"profile":"rdma-a","interface":{"mtu":50}}',
            id="invalid-once-merged",
        ),
        pytest.param(
            "{bad",
            f"{WHERE}: profile 'rdma-a' returned an invalid config: invalid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            '{"profile":"rdma-a","interface":{}}',
            id="answer-not-json",
        ),
    ],
)
async def test_profile_released_when_the_config_fails_after_it(
    answer: str, error: str, released_config: str
) -> None:
    p, inventory, store, _ = preparer({"profile": "rdma-a"}, answer)
    assert (await p.prepare([REF]))[REF.uid].error == error
    assert inventory.calls[-1] == ("release", "eth1", "rdma-a", released_config)
    assert store.configs == {}


async def test_provisional_record_resumed_without_a_second_resolve() -> None:
    p, inventory, store, _ = preparer({"profile": "rdma-a"}, PROFILE_ANSWER)
    store.configs[("pod-1", "eth1")] = st.DeviceConfig(
        pod=st.PodRef(uid="pod-1", namespace="default", name="p"),
        device="eth1",
        claim=st.ClaimRef(uid=REF.uid, namespace="default", name="c1"),
        profile="rdma-a",
        pod_config_json='{"profile":"rdma-a","interface":{"addresses":["10.9.0.5/16"]}}',
        provisional=True,
    )
    assert (await p.prepare([REF]))[REF.uid].error == ""
    assert inventory.calls == []
    assert json.loads(store.configs[("pod-1", "eth1")].pod_config_json)["interface"]["addresses"] == [
        "10.9.0.5/16"
    ]


async def test_dhcp_lease_stored() -> None:
    lease = DhcpLease(
        interface="eth1",
        address="192.0.2.77/24",
        routes=(RouteConfig(destination="0.0.0.0/0", gateway="192.0.2.1"),),
    )
    p, _, store, dhcp = preparer({"interface": {"dhcp": True}}, lease=lease)
    assert (await p.prepare([REF]))[REF.uid].error == ""
    assert dhcp.asked == ["eth1"]
    assert json.loads(store.configs[("pod-1", "eth1")].pod_config_json) == {
        "interface": {"name": "eth1", "addresses": ["192.0.2.77/24"], "dhcp": True},
        "routes": [{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}],
    }


async def test_no_dhcp_lease_fails_the_claim_and_releases_its_profile() -> None:
    p, inventory, store, _ = preparer({"profile": "rdma-a", "interface": {"dhcp": True}}, "")
    assert (await p.prepare([REF]))[
        REF.uid
    ].error == f"{WHERE}: interface.dhcp: no DHCP lease on eth1 within 1s"
    assert inventory.calls[-1][:3] == ("release", "eth1", "rdma-a")
    assert store.calls == [("put", "eth1", "provisional"), ("delete", "eth1")]
    assert store.configs == {}


class GatedStore(FakeStore):
    """The store's view of attach: connected or not, answered after ``delay`` seconds."""

    def __init__(self, connected: bool, delay: float) -> None:
        super().__init__()
        self.connected, self.delay = connected, delay
        self.answered = False

    async def get_liveness(self) -> st.AttachLiveness:
        await asyncio.sleep(self.delay)
        self.answered = True
        return st.AttachLiveness(connected=self.connected)


class WatchedInventory(FakeInventory):
    def __init__(self, store: GatedStore) -> None:
        super().__init__("")
        self.store = store
        self.looked_up_before_the_gate = False

    async def get_device(self, name: str) -> inv.Device | None:
        self.looked_up_before_the_gate = not self.store.answered
        return await super().get_device(name)


def gated(connected: bool) -> tuple[Preparer, WatchedInventory, GatedStore, FakeDhcp]:
    store = GatedStore(connected, delay=0.05)
    inventory, dhcp = WatchedInventory(store), FakeDhcp(DhcpLease(interface="eth1", address="192.0.2.7/24"))
    p = Preparer(
        DRIVER,
        NODE,
        FakeKube({"profile": "rdma-a", "interface": {"dhcp": True}}),  # type: ignore[arg-type]
        inventory,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        require_attach=True,
        dhcp=dhcp,  # type: ignore[arg-type]
    )
    return p, inventory, store, dhcp


async def test_a_closed_gate_stops_every_claim_before_any_side_effect() -> None:
    """The claim read and the device lookups run while the gate is asked (they change
    nothing); the profile, the DHCP lease and the store write wait for its answer."""
    p, inventory, store, dhcp = gated(connected=False)
    result = (await p.prepare([REF]))[REF.uid]
    assert result.error == (
        "claim default/c1: the attach service is not connected to the container runtime (NRI); "
        "a Pod started now would miss its devices, retry later"
    )
    assert inventory.looked_up_before_the_gate
    assert inventory.calls == [] and dhcp.asked == [] and store.calls == []


async def test_an_open_gate_answered_late_still_prepares() -> None:
    p, inventory, store, dhcp = gated(connected=True)
    assert (await p.prepare([REF]))[REF.uid].error == ""
    assert inventory.looked_up_before_the_gate
    assert [c[0] for c in inventory.calls] == ["resolve"] and dhcp.asked == ["eth1"]
    assert store.calls[-1] == ("put", "eth1", "final")


async def test_a_plain_device_is_planned_without_reading_the_store() -> None:
    p, _, store, _ = preparer({"interface": {"mtu": 1400}})
    assert (await p.prepare([REF]))[REF.uid].error == ""
    # One store call: the write, which checks that the device was free.
    assert store.calls == [("put", "eth1", "final")] and store.reads == []
    assert p.last_timings.store_reads == 0


async def test_a_retried_prepare_reuses_the_stored_config() -> None:
    p, _, store, _ = preparer({"interface": {"mtu": 1400}})
    assert (await p.prepare([REF]))[REF.uid].error == ""
    first = store.configs[("pod-1", "eth1")]
    # The kubelet asks again (its restart, a lost answer): the write refuses, nothing is
    # written, and the second pass reads the record and reuses it.
    res = (await p.prepare([REF]))[REF.uid]
    assert res.error == "" and [d.device for d in res.devices] == ["eth1"]
    assert store.calls == [("put", "eth1", "final")] and store.reads == ["eth1"]
    assert p.last_timings.store_reads == 1
    assert store.configs[("pod-1", "eth1")] is first


async def test_a_device_another_claim_prepared_for_the_pod_is_an_error() -> None:
    p, _, store, _ = preparer({"interface": {"mtu": 1400}})
    store.configs[("pod-1", "eth1")] = st.DeviceConfig(
        pod=st.PodRef(uid="pod-1", namespace="default", name="p"),
        device="eth1",
        claim=st.ClaimRef(uid="uid-other", namespace="default", name="other"),
        revision=7,
    )
    res = (await p.prepare([REF]))[REF.uid]
    assert res.error == f"{WHERE}: already prepared for pod default/p by claim default/other"
    assert store.configs[("pod-1", "eth1")].claim.uid == "uid-other"
    assert ("put", "eth1", "final") not in store.calls


@pytest.mark.parametrize(
    ("watched", "error", "asked_store"),
    [
        pytest.param(st.AttachLiveness(connected=True), "", False, id="watched-connected"),
        pytest.param(
            st.AttachLiveness(connected=True, draining=True),
            "claim default/c1: the attach service is stopping (graceful stop); retry later",
            False,
            id="watched-draining",
        ),
        pytest.param(
            st.AttachLiveness(connected=False),
            "claim default/c1: the attach service is not connected to the container runtime (NRI); "
            "a Pod started now would miss its devices, retry later",
            False,
            id="watched-disconnected",
        ),
        # No current view (the store's watch is down or not synced yet): the store is asked,
        # and says disconnected.
        pytest.param(
            None,
            "claim default/c1: the attach service is not connected to the container runtime (NRI); "
            "a Pod started now would miss its devices, retry later",
            True,
            id="no-view-asks-the-store",
        ),
    ],
)
async def test_the_gate_reads_the_watched_liveness(
    watched: st.AttachLiveness | None, error: str, asked_store: bool
) -> None:
    store = GatedStore(connected=False, delay=0.0)
    p = Preparer(
        DRIVER,
        NODE,
        FakeKube({"interface": {"mtu": 1400}}),  # type: ignore[arg-type]
        FakeInventory(""),  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        require_attach=True,
        liveness=lambda: watched,
    )
    assert (await p.prepare([REF]))[REF.uid].error == error
    assert store.answered is asked_store
    assert store.calls == ([("put", "eth1", "final")] if not error else [])
