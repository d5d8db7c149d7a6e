"""PersistentResourceSliceAttributes in prepare: with the gate on, each newly prepared device's
published form (the inventory's slice_entry_json) is saved as a KeptDevice in the same store
put as its DeviceConfig; with it off nothing is kept. Prepare driven as a function, with fakes
for the API server, the inventory and the store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from services.prepare.pipeline import ClaimRef, Preparer
from shared.storeclient import StoreCallError

DRIVER, NODE = "dra.net", "node-a"
ENTRY = {"name": "eth1", "attributes": {"dra.net/ifName": {"string": "eth1"}, "dra.net/mtu": {"int": 1500}}}


class FakeKube:
    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self.claims = claims

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get(name)


class FakeInventory:
    def __init__(self, device: inv.Device) -> None:
        self.device = device

    async def get_device(self, name: str) -> inv.Device | None:
        return self.device if name == self.device.name else None

    async def node_info(self) -> inv.NodeInfo:
        return inv.NodeInfo(node_name=NODE, rdma_netns_mode="shared")


class FakeStore:
    def __init__(self) -> None:
        self.configs: dict[tuple[str, str], st.DeviceConfig] = {}
        self.kept: dict[tuple[str, str], st.KeptDevice] = {}
        self.puts: list[tuple[list[st.DeviceConfig], list[st.KeptDevice]]] = []

    async def get_device(self, pod_uid: str, device: str) -> st.DeviceConfig | None:
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
        self.puts.append((list(configs), list(kept)))
        for c in configs:
            c.revision = len(self.puts)
            self.configs[(c.pod.uid, c.device)] = c
        for k in kept:
            self.kept[(k.claim.uid, k.device)] = k
        return [len(self.puts)] * len(configs)

    async def list(self, pod_uid: str = "", claim_uid: str = "") -> st.ListResponse:
        return st.ListResponse(devices=[c for c in self.configs.values() if c.claim.uid == claim_uid])

    async def delete_claim(self, claim_uid: str) -> Sequence[st.DeviceConfig]:
        gone = [k for k, c in self.configs.items() if c.claim.uid == claim_uid]
        self.kept = {k: v for k, v in self.kept.items() if v.claim.uid != claim_uid}
        return [self.configs.pop(k) for k in gone]


def claim(uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "c1", "namespace": "default", "uid": uid},
        "status": {
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
            "allocation": {
                "devices": {"results": [{"driver": DRIVER, "pool": NODE, "device": "eth1", "request": "nic"}]}
            },
        },
    }


def preparer(keep: bool, entry_json: str) -> tuple[Preparer, FakeStore]:
    device = inv.Device(
        name="eth1", ifname="eth1", mtu=1500, snapshot=inv.HostSnapshot(mtu=1500), slice_entry_json=entry_json
    )
    store = FakeStore()
    p = Preparer(
        DRIVER,
        NODE,
        FakeKube({"c1": claim("uid-1")}),  # type: ignore[arg-type]
        FakeInventory(device),  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        require_attach=False,
        keep_devices=keep,
    )
    return p, store


@pytest.mark.parametrize(
    ("keep", "entry_json", "want_kept"),
    [
        (False, json.dumps(ENTRY), False),  # the gate off: nothing kept
        (True, json.dumps(ENTRY), True),
        (True, "", False),  # an inventory that does not say how it publishes: nothing to keep
    ],
    ids=["gate-off", "gate-on", "gate-on-old-inventory"],
)
async def test_prepare_keeps_the_published_device_with_its_config(
    keep: bool, entry_json: str, want_kept: bool
) -> None:
    p, store = preparer(keep, entry_json)
    ref = ClaimRef(namespace="default", name="c1", uid="uid-1")
    assert not (await p.prepare([ref]))["uid-1"].error
    ((configs, kept),) = store.puts  # one put: configs and kept devices together
    assert [c.device for c in configs] == ["eth1"]
    if want_kept:
        (k,) = kept
        assert (k.device, k.claim.uid, k.pod_uid, k.pool) == ("eth1", "uid-1", "pod-1", NODE)
        assert json.loads(k.device_json) == ENTRY and k.kept_unix_nano == configs[0].prepared_unix_nano
    else:
        assert kept == []
    # Prepared again (the kubelet retries): the stored config is reused, nothing written.
    assert not (await p.prepare([ref]))["uid-1"].error
    assert len(store.puts) == 1
    # Unprepared: the claim's configs and kept devices go.
    assert await p.unprepare([ref]) == {"uid-1": ""}
    assert store.configs == {} and store.kept == {}
