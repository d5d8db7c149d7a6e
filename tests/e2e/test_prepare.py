"""prepare end to end: the kubelet's plugin manager registers it and calls
NodePrepareResources/NodeUnprepareResources for claims the allocator allocated
on the dev cluster; the store, the inventory (inside the node's network
namespace) and prepare run as real processes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from proto.dranet.store.v1 import store_pb2 as st
from tests.integration.inventory.cloud.fakes import GceMetadata, Webhook
from tests.support.stack import NodeStack, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.asyncio(loop_scope="module")]

ALL_DEVICES = 'device.driver == "dra.net"'


def on(name: str) -> str:
    return f'device.driver == "dra.net" && device.attributes["dra.net"].ifName == "{name}"'


async def serve_on(fake: Any, host: str) -> str:
    """Run a fake metadata/webhook server on ``host`` (reachable from the node namespace)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake._handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake._runner = runner
    fake.url = f"http://{host}:{port}"
    return str(fake.url)


def stored_config(dc: st.DeviceConfig) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(dc.pod_config_json)
    return cfg


# --- a node whose profiles come from a local webhook --------------------------------------


class WebhookNode:
    def __init__(self, node: NodeStack, webhook: Webhook) -> None:
        self.node = node
        self.webhook = webhook

    def profile_calls(self, path: str) -> int:
        return sum(1 for r in self.webhook.requests if r.path == path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wh() -> AsyncIterator[WebhookNode]:
    webhook = Webhook(cloud_provider=False, profile_provider=True, profiles=("python-profile",))
    node = NodeStack(
        inventory_args=["--filter", "", "--cloud-provider-hint", "webhook", "--profile-provider", "webhook"]
    )
    try:
        # The webhook listens where the inventory, inside the node namespace, reaches it.
        url = await serve_on(webhook, node.setup_namespace())
        node.inventory_args += ["--webhook-url", url]
        await node.start()
        node.add_nic("eth1", addresses=["192.168.10.5/24"], mtu=9000)
        node.add_nic("eth2", addresses=["192.168.20.5/24"])
        node.add_nic("eth3")
        node.add_nic("eth4")
        node.add_nic("eth5")
        node.add_nic("eth6")
        node.ip("route", "add", "10.10.0.0/16", "via", "192.168.10.1", "dev", "eth1")
        node.ip("route", "add", "default", "via", "192.168.10.1", "dev", "eth1", "table", "100")
        node.ip("rule", "add", "from", "192.168.10.5/32", "table", "100", "priority", "100")
        node.ip(
            "neigh", "add", "192.168.10.1", "lladdr", "02:00:00:00:01:01", "dev", "eth1", "nud", "permanent"
        )
        await node.wait_published("eth1", "eth2", "eth3", "eth4", "eth5", "eth6")
        await node.device_class("nic", ALL_DEVICES)
        await node.device_class(
            "nic-mtu", ALL_DEVICES, config={"interface": {"mtu": 1400, "name": "net-class"}}
        )
        await node.device_class("nic-bad", ALL_DEVICES, config={"interface": {"mtu": "big"}})
        await node.hold_attach_liveness()
        yield WebhookNode(node, webhook)
    finally:
        try:
            await node.stop()
        finally:
            await webhook.stop()


async def release(node: NodeStack, name: str, namespace: str = "default") -> None:
    """Delete the claim's pod and the claim, so its device can be allocated again."""
    from kubernetes_asyncio.client.exceptions import ApiException

    for call in (
        node.core.delete_namespaced_pod(f"{name}-pod", namespace, grace_period_seconds=0),
        node.resource.delete_namespaced_resource_claim(name, namespace),
    ):
        try:
            await call
        except ApiException as exc:
            if exc.status != 404:
                raise


async def configs_of(node: NodeStack, claim: dict[str, Any]) -> list[st.DeviceConfig]:
    assert node.store is not None
    return list((await node.store.list(claim_uid=claim["metadata"]["uid"])).devices)


def pod_uid(claim: dict[str, Any]) -> str:
    return str(claim["status"]["reservedFor"][0]["uid"])


async def test_registers_with_the_kubelet_newest_version_first(wh: WebhookNode) -> None:
    plugin = await wh.node.plugin()
    assert plugin.service == "v1.DRAPlugin" and plugin.version == "v1"
    assert plugin.endpoint == str(wh.node.kubelet_dir / "plugins" / "dra.net" / "dra.sock")


async def test_class_only_config(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod("c-class", "nic-mtu", on("eth2"))
    try:
        res = await node.prepare(claim)
        uid = claim["metadata"]["uid"]
        assert res[uid].error == "", res[uid].error
        assert [(d.pool_name, d.device_name, list(d.request_names)) for d in res[uid].devices] == [
            ("node-a", "eth2", ["nic"])
        ]
        (dc,) = await configs_of(node, claim)
        assert dc.pod.uid == pod_uid(claim) and dc.pod.name == "c-class-pod" and dc.claim.name == "c-class"
        assert dc.host_ifname == "eth2" and dc.request == "nic" and not dc.provisional
        cfg = stored_config(dc)
        assert cfg["interface"] == {"name": "net-class", "mtu": 1400, "addresses": ["192.168.20.5/24"]}
        assert json.loads(dc.host_config_json)["interface"]["name"] == "eth2"
        assert (await node.unprepare(claim)) == {uid: ""}
        assert await configs_of(node, claim) == []
    finally:
        await release(node, "c-class")


async def test_claim_only_config(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod(
        "c-claim", "nic", on("eth2"), configs=[{"parameters": {"interface": {"name": "net7", "mtu": 1500}}}]
    )
    try:
        uid = claim["metadata"]["uid"]
        assert (await node.prepare(claim))[uid].error == ""
        (dc,) = await configs_of(node, claim)
        assert stored_config(dc)["interface"] == {
            "name": "net7",
            "mtu": 1500,
            "addresses": ["192.168.20.5/24"],
        }
        assert (await node.unprepare(claim)) == {uid: ""}
    finally:
        await release(node, "c-claim")


async def test_class_and_claim_config_class_entry_first(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod(
        "c-both",
        "nic-mtu",
        on("eth2"),
        configs=[{"parameters": {"interface": {"name": "ignored", "mtu": 1500}}}],
    )
    try:
        uid = claim["metadata"]["uid"]
        assert (await node.prepare(claim))[uid].error == ""
        (dc,) = await configs_of(node, claim)
        # The first non-empty entry (the class's) is used; later entries are not read.
        assert stored_config(dc)["interface"]["mtu"] == 1400
        assert stored_config(dc)["interface"]["name"] == "net-class"
        await node.unprepare(claim)
    finally:
        await release(node, "c-both")


async def test_invalid_earlier_entry_fails_the_claim(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod(
        "c-bad", "nic-bad", on("eth2"), configs=[{"parameters": {"interface": {"mtu": 1500}}}]
    )
    try:
        uid = claim["metadata"]["uid"]
        err = (await node.prepare(claim))[uid].error
        assert "claim default/c-bad" in err and "request nic device eth2" in err
        assert 'config[0] (FromClass) interface.mtu: expected an integer, got string "big"' in err
        assert await configs_of(node, claim) == []
    finally:
        await release(node, "c-bad")


async def test_host_snapshot_goes_with_the_device(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod("c-snap", "nic", on("eth1"))
    try:
        uid = claim["metadata"]["uid"]
        assert (await node.prepare(claim))[uid].error == ""
        (dc,) = await configs_of(node, claim)
        cfg = stored_config(dc)
        assert cfg["interface"] == {"name": "eth1", "addresses": ["192.168.10.5/24"]}
        routes = {(r["destination"], r.get("gateway", ""), r.get("table", 0)) for r in cfg["routes"]}
        assert ("10.10.0.0/16", "192.168.10.1", 254) in routes
        assert ("0.0.0.0/0", "192.168.10.1", 100) in routes
        assert {"priority": 100, "source": "192.168.10.5/32", "table": 100} in cfg["rules"]
        assert cfg["neighbors"] == [{"destination": "192.168.10.1", "hardwareAddr": "02:00:00:00:01:01"}]
        assert json.loads(dc.host_config_json)["interface"]["mtu"] == 9000
        await node.unprepare(claim)
    finally:
        await release(node, "c-snap")


async def test_webhook_profile_allocated_once_and_released(wh: WebhookNode) -> None:
    node = wh.node
    before = wh.profile_calls("/GetProfileConfig")
    claim = await node.claim_for_pod(
        "c-prof", "nic", on("eth3"), configs=[{"parameters": {"profile": "python-profile"}}]
    )
    try:
        uid = claim["metadata"]["uid"]
        first = await node.prepare(claim)
        assert first[uid].error == ""
        (dc,) = await configs_of(node, claim)
        cfg = stored_config(dc)
        assert dc.profile == "python-profile" and cfg["profile"] == "python-profile"
        assert cfg["interface"]["addresses"] == [f"{wh.webhook.leases[uid]}/24"]
        assert {"destination": "10.201.0.0/16", "gateway": "10.200.200.1"} in cfg["routes"]
        assert wh.profile_calls("/GetProfileConfig") == before + 1
        # Idempotent: the kubelet repeats the call; the stored device is reused.
        again = await node.prepare(claim)
        assert [(d.device_name, d.pool_name) for d in again[uid].devices] == [("eth3", "node-a")]
        assert wh.profile_calls("/GetProfileConfig") == before + 1
        released = wh.profile_calls("/ReleaseProfileConfig")
        assert (await node.unprepare(claim)) == {uid: ""}
        assert wh.profile_calls("/ReleaseProfileConfig") == released + 1
        assert uid not in wh.webhook.leases
        # Unprepare twice: nothing left, still success.
        assert (await node.unprepare(claim)) == {uid: ""}
    finally:
        await release(node, "c-prof")


async def test_validation_failure_releases_the_profile(wh: WebhookNode) -> None:
    node = wh.node
    params = {"profile": "python-profile", "interface": {"type": "IPVLAN", "mtu": 9500}}
    claim = await node.claim_for_pod("c-rel", "nic", on("eth2"), configs=[{"parameters": params}])
    try:
        uid = claim["metadata"]["uid"]
        released = wh.profile_calls("/ReleaseProfileConfig")
        err = (await node.prepare(claim))[uid].error
        assert "interface.mtu 9500 exceeds parent eth2 MTU 1500" in err
        assert wh.profile_calls("/ReleaseProfileConfig") == released + 1
        assert uid not in wh.webhook.leases
        assert await configs_of(node, claim) == []
    finally:
        await release(node, "c-rel")


async def test_safety_gate_refuses_while_attach_is_not_connected(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod("c-gate", "nic", on("eth2"))
    uid = claim["metadata"]["uid"]
    try:
        await node.stop_attach_liveness()
        err = (await node.prepare(claim))[uid].error
        assert "attach service is not connected to the container runtime" in err and "retry" in err
        await node.hold_attach_liveness(draining=True)
        assert "stopping" in (await node.prepare(claim))[uid].error
        assert await configs_of(node, claim) == []
        await node.hold_attach_liveness()
        assert (await node.prepare(claim))[uid].error == ""
        await node.unprepare(claim)
    finally:
        await node.hold_attach_liveness()
        await release(node, "c-gate")


async def test_bad_input_fails_only_its_claim(wh: WebhookNode) -> None:
    node = wh.node
    good = await node.claim_for_pod("c-good", "nic", on("eth2"))
    unknown = await node.claim_for_pod(
        "c-unknown", "nic", on("eth1"), configs=[{"parameters": {"interface": {"mtuu": 1500}}}]
    )
    wrong = await node.claim_for_pod(
        "c-wrong", "nic", on("eth5"), configs=[{"parameters": {"routes": {"x": 1}}}]
    )
    absurd = await node.claim_for_pod(
        "c-absurd",
        "nic",
        on("eth6"),
        configs=[{"parameters": {"interface": {"mtu": 99999999, "arpIgnore": 77}}}],
    )
    vanished = await node.claim_for_pod("c-gone", "nic", on("eth4"))
    node.ip("link", "del", "eth4")
    deleted = {"metadata": {"namespace": "default", "name": "never-was", "uid": "0000-gone"}}
    other_node = await manual_claim(node, "c-other", pool="node-b", device="eth9")
    try:
        res = await node.prepare(good, unknown, wrong, absurd, vanished, deleted, other_node)
        errors = {
            name: res[c["metadata"]["uid"]].error
            for name, c in [
                ("good", good),
                ("unknown", unknown),
                ("wrong", wrong),
                ("absurd", absurd),
                ("vanished", vanished),
                ("deleted", deleted),
                ("other", other_node),
            ]
        }
        assert errors["good"] == ""
        assert (
            "claim default/c-unknown" in errors["unknown"]
            and "interface.mtuu: unknown field" in errors["unknown"]
        )
        assert "routes: expected an array of objects" in errors["wrong"]
        assert "interface.mtu: must be between 68 and 65535, got 99999999" in errors["absurd"]
        assert "interface.arpIgnore: must be one of 0, 1, 2, 3 or 8, got 77" in errors["absurd"]
        assert "no such device on node node-a" in errors["vanished"] and "device eth4" in errors["vanished"]
        assert "claim default/never-was: not found" in errors["deleted"]
        assert "pool 'node-b', not from this node's pool 'node-a'" in errors["other"]
        for c in (unknown, wrong, absurd, vanished, other_node):
            assert await configs_of(node, c) == []
        assert len(await configs_of(node, good)) == 1
        await node.unprepare(good)
    finally:
        for name in ("c-good", "c-gone", "c-unknown", "c-wrong", "c-absurd"):
            await release(node, name)
        await release_manual(node, "c-other")


async def test_config_errors_name_the_field_and_value(wh: WebhookNode) -> None:
    node = wh.node
    cases = [
        ({"interface": {"mtuu": 1500}}, "interface.mtuu: unknown field"),
        ({"routes": {"x": 1}}, "routes: expected an array of objects"),
        ({"interface": {"mtu": 99999999}}, "interface.mtu: must be between 68 and 65535, got 99999999"),
        ({"interface": {"hardwareAddr": "zz"}}, "interface.hardwareAddr: invalid MAC address 'zz'"),
        ({"interface": {"mtu": True}}, "interface.mtu: expected an integer, got boolean true"),
    ]
    for i, (params, message) in enumerate(cases):
        claim = await node.claim_for_pod(f"c-field-{i}", "nic", on("eth1"), configs=[{"parameters": params}])
        try:
            err = (await node.prepare(claim))[claim["metadata"]["uid"]].error
            assert f"claim default/c-field-{i}" in err and "request nic device eth1" in err
            assert message in err, err
            assert await configs_of(node, claim) == []
        finally:
            await release(node, f"c-field-{i}")


async def test_sigkill_between_calls_gives_the_same_result_and_no_second_profile(wh: WebhookNode) -> None:
    node = wh.node
    claim = await node.claim_for_pod(
        "c-kill", "nic", on("eth3"), configs=[{"parameters": {"profile": "python-profile"}}]
    )
    try:
        uid = claim["metadata"]["uid"]
        calls = wh.profile_calls("/GetProfileConfig")
        first = await node.prepare(claim)
        assert first[uid].error == ""
        (before,) = await configs_of(node, claim)
        await node.restart_prepare(kill=True)
        again = await node.prepare(claim)
        assert again[uid].error == ""
        assert [(d.device_name, list(d.request_names)) for d in again[uid].devices] == [
            (d.device_name, list(d.request_names)) for d in first[uid].devices
        ]
        (after,) = await configs_of(node, claim)
        assert after == before  # the same stored record, not a new one
        assert wh.profile_calls("/GetProfileConfig") == calls + 1
        await node.unprepare(claim)
    finally:
        await release(node, "c-kill")


async def test_claim_status_follows_attach_results(wh: WebhookNode) -> None:
    node = wh.node
    assert node.store is not None
    claim = await node.claim_for_pod("c-status", "nic", on("eth2"))
    try:
        uid = claim["metadata"]["uid"]
        assert (await node.prepare(claim))[uid].error == ""
        (dc,) = await configs_of(node, claim)
        # What attach records once the device is in the pod.
        await node.store.put_attach_result(
            st.AttachResult(
                pod_uid=dc.pod.uid,
                device="eth2",
                claim=dc.claim,
                pool="node-a",
                driver="dra.net",
                interface_name="eth2",
                ips=["192.168.20.5/24"],
                hardware_address="02:00:00:00:02:02",
                attached=True,
                host_ifname="eth2",
                conditions=[
                    st.Condition(type="Ready", status="True", reason="NetworkDeviceReady"),
                    st.Condition(type="NetworkReady", status="True", reason="NetworkReady"),
                ],
            )
        )
        found: dict[str, Any] = {}

        async def applied() -> bool:
            got = await node.wait_reserved("c-status")
            found.update(got)
            return bool(got.get("status", {}).get("devices"))

        await wait_for(applied, 10, "claim status.devices applied")
        (entry,) = found["status"]["devices"]
        assert (entry["driver"], entry["pool"], entry["device"]) == ("dra.net", "node-a", "eth2")
        assert entry["networkData"] == {
            "interfaceName": "eth2",
            "ips": ["192.168.20.5/24"],
            "hardwareAddress": "02:00:00:00:02:02",
        }
        assert [(c["type"], c["status"], c["reason"]) for c in entry["conditions"]] == [
            ("Ready", "True", "NetworkDeviceReady"),
            ("NetworkReady", "True", "NetworkReady"),
        ]
        # Attach clears its state when the pod goes: the entry goes too.
        await node.store.clear_attach_state(dc.pod.uid)

        async def cleared() -> bool:
            got = await node.wait_reserved("c-status")
            return not got.get("status", {}).get("devices")

        await wait_for(cleared, 10, "claim status.devices removed")
        await node.unprepare(claim)
    finally:
        await release(node, "c-status")


async def manual_claim(node: NodeStack, name: str, pool: str, device: str) -> dict[str, Any]:
    """A claim allocated by hand (as another node's scheduler decision would be),
    reserved for a real Pod bound to that node (the claim controller drops
    reservations of Pods that do not exist)."""
    pod = await node.core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-pod"},
            "spec": {"nodeName": pool, "containers": [{"name": "c", "image": "local/pause:1"}]},
        },
    )
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic"}}]}},
    }
    created = await node.resource.create_namespaced_resource_claim("default", body, _preload_content=False)
    obj = json.loads(await created.read())
    obj["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "nic", "driver": "dra.net", "pool": pool, "device": device}]}
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": pod.metadata.uid}],
    }
    resp = await node.resource.replace_namespaced_resource_claim_status(
        name, "default", obj, _preload_content=False
    )
    out: dict[str, Any] = json.loads(await resp.read())
    return out


async def release_manual(node: NodeStack, name: str) -> None:
    await release(node, name)


# --- a node on GCE: profiles from the (local) metadata server -----------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gce() -> AsyncIterator[tuple[NodeStack, GceMetadata]]:
    metadata = GceMetadata()
    node = NodeStack(
        node_name="gke-a3-node-1", inventory_args=["--filter", "", "--cloud-provider-hint", "GCE"]
    )
    try:
        url = await serve_on(metadata, node.setup_namespace())
        node.inventory_args += ["--gce-metadata-url", url, "--cloud-state-dir", str(node.workdir / "cloud")]
        await node.start()
        # The first NIC of the captured a3 VM, with its alias range 10.24.3.0/24.
        node.add_nic("eth0", mac="42:01:0a:80:00:46", addresses=["10.128.0.70/20"], mtu=1460)
        await node.wait_published("eth0")
        await node.device_class("gce-nic", ALL_DEVICES)
        await node.hold_attach_liveness()
        yield node, metadata
    finally:
        try:
            await node.stop()
        finally:
            await metadata.stop()


async def test_profile_from_the_cloud_metadata_server(gce: tuple[NodeStack, GceMetadata]) -> None:
    node, _ = gce
    published = await node.published()
    assert published["eth0"]["attributes"]["gce.dra.net/networkName"]["string"] == "default"
    claim = await node.claim_for_pod(
        "c-gce",
        "gce-nic",
        on("eth0"),
        configs=[{"parameters": {"interface": {"type": "IPVLAN", "name": "net1"}}}],
    )
    try:
        uid = claim["metadata"]["uid"]
        assert (await node.prepare(claim))[uid].error == ""
        (dc,) = await configs_of(node, claim)
        cfg = stored_config(dc)
        # The provider config named the profile; the profile gave the child an address.
        assert dc.profile == "gce-managed" and cfg["interface"]["type"] == "IPVLAN"
        (addr,) = cfg["interface"]["addresses"]
        assert addr.startswith("10.24.3."), addr
        leases = (node.workdir / "cloud").rglob("*")
        assert any(p.is_file() for p in leases)
        assert (await node.unprepare(claim)) == {uid: ""}
        assert await configs_of(node, claim) == []
    finally:
        await release(node, "c-gce")
