"""prepare end to end on the real cluster: the real scheduler allocates dra.net devices with CEL
over the attributes the inventory published, the real controller-manager reserves the claims,
the real kubelet calls prepare's DRAPlugin over its gRPC socket when it starts the Pod and again
when it stops it, and the real API server holds it all. dranet's four services run as real
processes (``tests/e2e/conftest.py``); the attach service moves each claimed veth "NIC" into its
Pod over NRI, so a Pod that runs had its device prepared and attached.

What prepare did is read back from where it lives: the DeviceConfigs in the store, the kubelet's
Events (a failed NodePrepareResources shows as FailedPrepareDynamicResources with our error,
naming the claim, request, device and field), the kubelet's own checkpoint of the devices our
answer named, and the webhook profile provider's request log.

The profiles of this module come from a fake webhook (``tests/integration/inventory/cloud/fakes``)
served on the host end of the node's link, where the inventory inside the node's network
namespace reaches it; the GCE profile provider has a module of its own (``test_prepare_gce.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from dev.cluster.cri import CriClient
from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from proto.dranet.store.v1 import store_pb2 as st
from proto.kubelet.pluginregistration.v1 import registration_pb2 as reg
from proto.kubelet.pluginregistration.v1 import registration_pb2_grpc as reg_grpc
from shared.rpc import sync_channel
from tests.e2e.conftest import Node, start_driver, stop_driver
from tests.integration.inventory.cloud.fakes import FakeServer, Webhook
from tests.support.kube import ALL_DEVICES, DRIVER, Kube, eventually, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

# Generous: several clusters share this machine's two cores.
RUNNING = 180.0
EVENT = 180.0
FAILED_PREPARE = "FailedPrepareDynamicResources"
PROFILE = "python-profile"


# --- fakes served on the host end of the node's link ------------------------------------------


class Served:
    """A fake server of ``fakes.py`` on ``host`` in an event loop of its own (a thread), so sync
    module fixtures can hold it and the tests' own loops never have to run it."""

    def __init__(self, fake: FakeServer, host: str) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-server", daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(host), self.loop).result(30)

    async def _start(self, host: str) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.fake._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, host, 0).start()
        self.fake._runner = runner
        self.fake.url = f"http://{host}:{runner.addresses[0][1]}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def webhook(kube_cluster: KubeCluster) -> Iterator[Webhook]:
    fake = Webhook(cloud_provider=False, profile_provider=True, profiles=(PROFILE,))
    served = Served(fake, kube_cluster.net.host_ip)
    try:
        yield fake
    finally:
        served.close()


@pytest.fixture(scope="module")
def driver(kube_cluster: KubeCluster, webhook: Webhook) -> Iterator[Driver]:
    """The four services, the inventory's profiles from the webhook. attach drains for long on a
    graceful stop while a prepared Pod exists, so the safety gate's "stopping" state can be seen."""
    d = start_driver(
        kube_cluster,
        inventory_args=[
            "--cloud-provider-hint", "webhook",
            "--profile-provider", "webhook",
            "--webhook-url", webhook.url,
        ],
        attach_args=["--drain-quiet", "300", "--drain-poll", "1"],
    )  # fmt: skip
    try:
        yield d
    except BaseException:
        print(d.logs())
        raise
    finally:
        stop_driver(kube_cluster, d)


def profile_calls(webhook: Webhook, path: str, claim_uid: str) -> int:
    """Requests to ``path`` (/GetProfileConfig, /ReleaseProfileConfig) about one claim."""
    n = 0
    for r in list(webhook.requests):
        if r.path == path and r.body:
            with contextlib.suppress(ValueError):
                n += json.loads(r.body).get("claim_uid") == claim_uid
    return n


# --- the node's NICs ---------------------------------------------------------------------------


class Nics:
    """veth "NICs" a test adds to the node; those still on the node at the end are removed."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def add(self, prefix: str = "n", **kw: Any) -> str:
        name = nic_name(prefix)
        self.cluster.net.add_nic(name, **kw)
        self.names.append(name)
        return name

    def on_node(self, name: str) -> bool:
        return link(self.cluster.netns, name) is not None

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.cluster.netns, *args], check=True, capture_output=True)

    def delete(self, name: str) -> None:
        self.ip("link", "del", name)

    def remove_left(self) -> None:
        for name in self.names:
            if self.on_node(name):
                subprocess.run(["ip", "-n", self.cluster.netns, "link", "del", name], capture_output=True)


@pytest.fixture
def nics(node: Node) -> Iterator[Nics]:
    n = Nics(node.cluster)
    yield n
    # The namespace first: its Pods stop and attach gives their NICs back to the node.
    node.kube.delete_namespace()
    n.remove_left()


# --- what the cluster shows --------------------------------------------------------------------


def claim_uid(kube: Kube, name: str) -> str:
    return str(kube.get_claim(name)["metadata"]["uid"])


def pod_uid(kube: Kube, name: str) -> str:
    pod = kube.get_pod(name)
    assert pod is not None, f"pod {kube.ns}/{name} does not exist"
    return str(pod["metadata"]["uid"])


def published(kube: Kube) -> dict[str, dict[str, Any]]:
    """Device name -> device over this node's ResourceSlices. ``Kube.published`` fails on a slice
    without devices: the real API server sends ``"devices": null`` for it."""
    items = kube.api.get(
        f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={kube.c.node_name}"
    )["items"]
    return {d["name"]: d for s in items for d in (s["spec"].get("devices") or [])}


async def wait_published(kube: Kube, *devices: str, within: float = 60.0) -> dict[str, dict[str, Any]]:
    def check() -> dict[str, dict[str, Any]] | None:
        got = published(kube)
        return got if set(devices) <= set(got) else None

    return await eventually(check, within, f"devices {devices} published")


def stored_config(dc: st.DeviceConfig) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(dc.pod_config_json)
    return cfg


async def failed_prepare(kube: Kube, pod: str, *texts: str, within: float = EVENT) -> str:
    """The message of the kubelet's FailedPrepareDynamicResources event on ``pod`` that contains
    every one of ``texts`` (prepare's error for the claim, as the kubelet reports it)."""

    def check() -> str | None:
        for e in kube.events(pod):
            msg = str(e.get("message", ""))
            if e.get("reason") == FAILED_PREPARE and all(t in msg for t in texts):
                return msg
        return None

    try:
        return await eventually(check, within, f"{FAILED_PREPARE} of pod {pod} with {texts}", every=0.5)
    except AssertionError as exc:
        seen = [(e.get("reason"), e.get("message")) for e in kube.events(pod)]
        raise AssertionError(f"{exc}; events: {seen[-6:]}") from None


def not_started(kube: Kube, name: str) -> None:
    pod = kube.get_pod(name)
    assert pod is not None
    status = pod.get("status") or {}
    assert status.get("phase") == "Pending", status
    running = [c for c in status.get("containerStatuses") or [] if "running" in (c.get("state") or {})]
    assert running == [], running


def kubelet_prepared(cluster: KubeCluster, uid: str) -> list[tuple[str, str, list[str]]] | None:
    """(pool, device, requests) per device our NodePrepareResources answer named for the claim,
    as the kubelet recorded it in its DRA checkpoint; None when the kubelet holds no such claim
    (it drops a claim after a successful NodeUnprepareResources)."""
    path = cluster.kubelet_dir / "dra_manager_state"
    try:
        data = json.loads(json.loads(path.read_text())["Data"])
    except (OSError, ValueError, KeyError):
        return None
    for entry in data.get("ClaimInfoStateList") or []:
        if entry.get("ClaimUID") == uid:
            devices = ((entry.get("DriverState") or {}).get(DRIVER) or {}).get("Devices") or []
            return [
                (d.get("PoolName"), d.get("DeviceName"), list(d.get("RequestNames") or [])) for d in devices
            ]
    return None


def answered(cluster: KubeCluster, uid: str) -> set[tuple[str, str, tuple[str, ...]]]:
    """``kubelet_prepared`` as a set: a kubelet that restarted and prepared a claim again appends
    the devices of the new answer to those it restored from its checkpoint (it lists each twice)."""
    return {(pool, dev, tuple(reqs)) for pool, dev, reqs in kubelet_prepared(cluster, uid) or []}


def prepare_log(d: Driver, msg: str, uid: str) -> list[Any]:
    """The ``devices`` of each record ``msg`` ("claim prepared", "claim unprepared") prepare
    logged for the claim: one per successful call (a restarted process appends to the file)."""
    out = []
    for line in d.procs["prepare"].log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("msg") == msg and rec.get("claim_uid") == uid:
                out.append(rec.get("devices"))
    return out


def prepare_calls(d: Driver, uid: str) -> int:
    """How often prepare answered NodePrepareResources for the claim with success."""
    return len(prepare_log(d, "claim prepared", uid))


async def liveness(node: Node) -> st.AttachLiveness:
    async with node.store() as store:
        return await store.get_liveness()


async def wait_liveness(node: Node, connected: bool, draining: bool = False) -> None:
    async def check() -> bool:
        live = await liveness(node)
        return live.connected == connected and live.draining == draining

    await eventually(check, 60, f"attach liveness connected={connected} draining={draining}")


async def gone_from_store(node: Node, uid: str, within: float = 120.0) -> None:
    async def empty() -> bool:
        return await node.stored(uid) == []

    await eventually(empty, within, f"store holds nothing for claim {uid}")


async def delete_and_wait(kube: Kube, name: str) -> None:
    kube.delete_pod(name)
    await kube.wait_gone(name, within=RUNNING)


async def sandbox_of(kube: Kube, name: str) -> str | None:
    """The id of the Pod's ready sandbox, or None."""
    assert kube.c.containerd is not None
    async with CriClient(kube.c.containerd.grpc_socket) as cri:
        boxes = await cri.list_pod_sandboxes({"io.kubernetes.pod.uid": pod_uid(kube, name)}, ready_only=True)
    return boxes[0].id if boxes else None


async def kubelet_prepares_again(node: Node, pod: str, claim: str, ifname: str) -> None:
    """Make the real kubelet repeat NodePrepareResources for a running Pod's claim, and wait until
    the Pod runs again with its device. A running Pod is never prepared again by a kubelet restart
    alone (prepare runs when a sandbox is created); a restarted kubelet has no claim marked
    prepared, so when the Pod's sandbox then dies it prepares the claim again before making a new
    one."""
    kube, cluster = node.kube, node.cluster
    uid = claim_uid(kube, claim)
    calls = prepare_calls(node.driver, uid)
    old = await sandbox_of(kube, pod)
    assert old is not None
    await asyncio.to_thread(cluster.restart_kubelet)
    assert cluster.containerd is not None
    async with CriClient(cluster.containerd.grpc_socket) as cri:
        await cri.stop_pod_sandbox(old)
    await eventually(lambda: prepare_calls(node.driver, uid) > calls, RUNNING, "the kubelet prepares again")

    async def runs_again() -> bool:
        box = await sandbox_of(kube, pod)
        if box is None or box == old:
            return False
        pod_obj = kube.get_pod(pod) or {}
        if (pod_obj.get("status") or {}).get("phase") != "Running":
            return False
        return link(await kube.pod_netns(pod), ifname) is not None

    await eventually(runs_again, RUNNING, f"pod {pod} runs again in a new sandbox with {ifname}", every=0.5)
    assert prepare_calls(node.driver, uid) == calls + 1


# --- tests ---------------------------------------------------------------------------------------


async def test_registers_with_the_kubelet_newest_version_first(node: Node, nics: Nics) -> None:
    cluster, kube = node.cluster, node.kube
    sock = cluster.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    with sync_channel(sock) as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=10)
    endpoint = cluster.kubelet_dir / "plugins" / DRIVER / "dra.sock"
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(endpoint))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    # The real kubelet took it: it connected to the endpoint and told prepare so (its health).
    def registered() -> bool:
        with sync_channel(node.driver.run_dir / "prepare.sock") as ch:
            health = admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=10)
        return bool(health.ready)

    await eventually(registered, 60, "prepare registered with the kubelet")
    kubelet_log = cluster.procs["kubelet"].log_path.read_text(errors="replace").splitlines()
    changes = [
        line for line in kubelet_log if '"Connection changed"' in line and f'driverName="{DRIVER}"' in line
    ]
    assert changes and f'endpoint="{endpoint}" connected=true' in changes[-1], changes[-3:]
    # ... and calls the newest version it supports: v1, never v1beta1.
    nic = nics.add()
    await wait_published(kube, nic)
    kube.claim_and_pod("c-reg", kube.device_class("nic"), on(nic))
    await kube.wait_phase("c-reg", within=RUNNING)
    metrics = str(cluster.api.call("GET", f"/api/v1/nodes/{cluster.node_name}/proxy/metrics"))
    calls = [
        line
        for line in metrics.splitlines()
        if line.startswith("dra_grpc_operations_duration_seconds_count") and f'driver_name="{DRIVER}"' in line
    ]
    assert any("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" in c for c in calls), calls
    assert not any(".v1beta1." in c for c in calls), calls


async def test_class_only_config(node: Node, nics: Nics) -> None:
    kube = node.kube
    nic = nics.add(addresses=["192.168.20.5/24"])
    await wait_published(kube, nic)
    dc_name = kube.device_class(
        "nic-mtu", ALL_DEVICES, config={"interface": {"mtu": 1400, "name": "net-class"}}
    )
    kube.claim_and_pod("c-class", dc_name, on(nic))
    await kube.wait_phase("c-class", within=RUNNING)
    uid = claim_uid(kube, "c-class")
    # What our answer named, as the kubelet keeps it.
    assert kubelet_prepared(node.cluster, uid) == [("node-a", nic, ["nic"])]
    (dc,) = await node.stored(uid)
    assert dc.pod.uid == pod_uid(kube, "c-class") and dc.pod.name == "c-class"
    assert dc.pod.namespace == kube.ns and dc.claim.name == "c-class" and dc.claim.uid == uid
    assert dc.host_ifname == nic and dc.request == "nic" and dc.pool == "node-a" and not dc.provisional
    cfg = stored_config(dc)
    assert cfg["interface"] == {"name": "net-class", "mtu": 1400, "addresses": ["192.168.20.5/24"]}
    assert json.loads(dc.host_config_json)["interface"]["name"] == nic
    # attach used it: the NIC is in the Pod under the class's name and MTU.
    inside = link(await kube.pod_netns("c-class"), "net-class")
    assert inside is not None and inside["mtu"] == 1400
    # Unprepare: the kubelet calls it when the Pod goes; the store forgets the claim and the
    # kubelet, told it succeeded, drops the claim from its checkpoint.
    await delete_and_wait(kube, "c-class")
    await gone_from_store(node, uid)
    await eventually(lambda: kubelet_prepared(node.cluster, uid) is None, 60, "the kubelet forgets the claim")


async def test_claim_only_config(node: Node, nics: Nics) -> None:
    kube = node.kube
    nic = nics.add(addresses=["192.168.20.5/24"])
    await wait_published(kube, nic)
    params = {"interface": {"name": "net7", "mtu": 1500}}
    kube.claim_and_pod("c-claim", kube.device_class("nic"), on(nic), configs=[{"parameters": params}])
    await kube.wait_phase("c-claim", within=RUNNING)
    uid = claim_uid(kube, "c-claim")
    (dc,) = await node.stored(uid)
    assert stored_config(dc)["interface"] == {"name": "net7", "mtu": 1500, "addresses": ["192.168.20.5/24"]}
    assert link(await kube.pod_netns("c-claim"), "net7") is not None
    await delete_and_wait(kube, "c-claim")
    await gone_from_store(node, uid)


def read_ahead_of(d: Driver, uid: str) -> list[tuple[bool, int]]:
    """``read_ahead`` and ``devices_read_ahead`` of each "claim prepared" record of the claim."""
    out = []
    for line in d.procs["prepare"].log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("msg") == "claim prepared" and rec.get("claim_uid") == uid:
                out.append((rec.get("read_ahead"), rec.get("devices_read_ahead")))
    return out


async def test_claims_are_read_ahead_from_the_pod_watch(node: Node, nics: Nics) -> None:
    """prepare watches the node's Pods and reads a bound Pod's claims before the kubelet calls
    (services/prepare/prefetch.py), so the Pod does not wait for that GET. The binding reaches
    prepare's watch as it reaches the kubelet's, which then still admits the Pod, reads the
    claims itself and writes its checkpoint before it calls: the copy is ready, or on its way
    (then awaited), nearly always. With the claim, the inventory's answer for its device
    (with the host snapshot) is read ahead too: the host address is what the Pod gets. One
    miss in three is allowed for a loaded machine; a prefetch that never works fails this."""
    kube = node.kube
    seen = []
    for i in range(3):
        nic = nics.add(addresses=[f"192.168.31.{i + 2}/24"])
        await wait_published(kube, nic)
        name = f"c-ahead{i}"
        kube.claim_and_pod(name, kube.device_class("nic"), on(nic))
        await kube.wait_phase(name, within=RUNNING)
        uid = claim_uid(kube, name)
        (ahead,) = read_ahead_of(node.driver, uid)
        seen.append(ahead)
        (dc,) = await node.stored(uid)
        assert stored_config(dc)["interface"]["addresses"] == [f"192.168.31.{i + 2}/24"]
        await delete_and_wait(kube, name)
        await gone_from_store(node, uid)
    assert [a for a, _ in seen].count(True) >= 2, seen
    assert [n for _, n in seen].count(1) >= 2, seen


async def test_class_and_claim_config_class_entry_first(node: Node, nics: Nics) -> None:
    kube = node.kube
    nic = nics.add(addresses=["192.168.20.5/24"])
    await wait_published(kube, nic)
    dc_name = kube.device_class(
        "nic-mtu", ALL_DEVICES, config={"interface": {"mtu": 1400, "name": "net-class"}}
    )
    params = {"interface": {"name": "ignored", "mtu": 1500}}
    kube.claim_and_pod("c-both", dc_name, on(nic), configs=[{"parameters": params}])
    await kube.wait_phase("c-both", within=RUNNING)
    (dc,) = await node.stored(claim_uid(kube, "c-both"))
    # The first non-empty entry (the class's) is used; later entries are not read.
    assert stored_config(dc)["interface"]["mtu"] == 1400
    assert stored_config(dc)["interface"]["name"] == "net-class"
    assert link(await kube.pod_netns("c-both"), "net-class") is not None


async def test_invalid_earlier_entry_fails_the_claim(node: Node, nics: Nics) -> None:
    kube = node.kube
    nic = nics.add()
    await wait_published(kube, nic)
    dc_name = kube.device_class("nic-bad", ALL_DEVICES, config={"interface": {"mtu": "big"}})
    kube.claim_and_pod("c-bad", dc_name, on(nic), configs=[{"parameters": {"interface": {"mtu": 1500}}}])
    msg = await failed_prepare(kube, "c-bad", f"claim {kube.ns}/c-bad")
    assert f"request nic device {nic}" in msg, msg
    assert 'config[0] (FromClass) interface.mtu: expected an integer, got string "big"' in msg, msg
    not_started(kube, "c-bad")
    uid = claim_uid(kube, "c-bad")
    assert await node.stored(uid) == []
    assert nics.on_node(nic)
    # The Pod goes: the kubelet unprepares the claim it never got prepared; with nothing stored
    # that succeeds (the kubelet forgets the claim and lets the Pod go).
    await delete_and_wait(kube, "c-bad")
    assert prepare_log(node.driver, "claim unprepared", uid) == [[]]
    assert kubelet_prepared(node.cluster, uid) is None


async def test_host_snapshot_goes_with_the_device(node: Node, nics: Nics) -> None:
    kube = node.kube
    nic = nics.add(addresses=["192.168.10.5/24"], mtu=9000)
    rule = ("from", "192.168.10.5/32", "table", "100", "priority", "100")
    try:
        nics.ip("route", "add", "10.10.0.0/16", "via", "192.168.10.1", "dev", nic)
        nics.ip("route", "add", "default", "via", "192.168.10.1", "dev", nic, "table", "100")
        nics.ip("rule", "add", *rule)
        nics.ip("neigh", "add", "192.168.10.1", "lladdr", "02:00:00:00:01:01", "dev", nic, "nud", "permanent")
        await wait_published(kube, nic)
        kube.claim_and_pod("c-snap", kube.device_class("nic"), on(nic))
        await kube.wait_phase("c-snap", within=RUNNING)
        (dc,) = await node.stored(claim_uid(kube, "c-snap"))
        cfg = stored_config(dc)
        assert cfg["interface"] == {"name": nic, "addresses": ["192.168.10.5/24"]}
        routes = {(r["destination"], r.get("gateway", ""), r.get("table", 0)) for r in cfg["routes"]}
        assert ("10.10.0.0/16", "192.168.10.1", 254) in routes
        assert ("0.0.0.0/0", "192.168.10.1", 100) in routes
        assert {"priority": 100, "source": "192.168.10.5/32", "table": 100} in cfg["rules"]
        assert cfg["neighbors"] == [{"destination": "192.168.10.1", "hardwareAddr": "02:00:00:00:01:01"}]
        assert json.loads(dc.host_config_json)["interface"]["mtu"] == 9000
    finally:
        subprocess.run(["ip", "-n", node.cluster.netns, "rule", "del", *rule], capture_output=True)


async def test_webhook_profile_allocated_once_and_released(node: Node, nics: Nics, webhook: Webhook) -> None:
    kube = node.kube
    nic = nics.add()
    await wait_published(kube, nic)
    kube.claim_and_pod(
        "c-prof", kube.device_class("nic"), on(nic), configs=[{"parameters": {"profile": PROFILE}}]
    )
    await kube.wait_phase("c-prof", within=RUNNING)
    uid = claim_uid(kube, "c-prof")
    (first,) = await node.stored(uid)
    cfg = stored_config(first)
    assert first.profile == PROFILE and cfg["profile"] == PROFILE and not first.provisional
    assert cfg["interface"]["addresses"] == [f"{webhook.leases[uid]}/24"]
    assert {"destination": "10.201.0.0/16", "gateway": "10.200.200.1"} in cfg["routes"]
    assert profile_calls(webhook, "/GetProfileConfig", uid) == 1
    # Idempotent: the kubelet repeats the call; the stored device is reused, nothing allocated.
    await kubelet_prepares_again(node, "c-prof", "c-prof", nic)
    assert answered(node.cluster, uid) == {("node-a", nic, ("nic",))}
    assert await node.stored(uid) == [first]
    assert profile_calls(webhook, "/GetProfileConfig", uid) == 1
    assert profile_calls(webhook, "/ReleaseProfileConfig", uid) == 0
    # Unprepare (the Pod goes) releases the profile once and forgets the claim.
    await delete_and_wait(kube, "c-prof")
    await gone_from_store(node, uid)
    await eventually(
        lambda: profile_calls(webhook, "/ReleaseProfileConfig", uid) == 1, 60, "the profile released"
    )
    assert uid not in webhook.leases
    assert profile_calls(webhook, "/GetProfileConfig", uid) == 1


async def test_validation_failure_releases_the_profile(node: Node, nics: Nics, webhook: Webhook) -> None:
    kube = node.kube
    nic = nics.add()
    await wait_published(kube, nic)
    params = {"profile": PROFILE, "interface": {"type": "IPVLAN", "mtu": 9500}}
    kube.claim_and_pod("c-rel", kube.device_class("nic"), on(nic), configs=[{"parameters": params}])
    msg = await failed_prepare(kube, "c-rel", f"interface.mtu 9500 exceeds parent {nic} MTU 1500")
    assert f"claim {kube.ns}/c-rel" in msg, msg
    uid = claim_uid(kube, "c-rel")

    # The kubelet retries (and fails) again and again: every profile it got was given back.
    def settled() -> bool:
        gets = profile_calls(webhook, "/GetProfileConfig", uid)
        return (
            gets >= 1
            and profile_calls(webhook, "/ReleaseProfileConfig", uid) == gets
            and uid not in webhook.leases
        )

    await eventually(settled, 60, "every allocated profile released", every=0.1)
    assert await node.stored(uid) == []
    not_started(kube, "c-rel")
    assert nics.on_node(nic)


async def test_safety_gate_refuses_while_attach_is_not_connected(node: Node, nics: Nics) -> None:
    kube, d = node.kube, node.driver
    holder, nic = nics.add(), nics.add()
    await wait_published(kube, holder, nic)
    dc_name = kube.device_class("nic")
    # A prepared Pod keeps a gracefully stopping attach draining (it waits for the Pod's hooks).
    kube.claim_and_pod("c-holder", dc_name, on(holder))
    await kube.wait_phase("c-holder", within=RUNNING)
    try:
        assert d.procs["attach"].proc is not None
        d.procs["attach"].proc.send_signal(signal.SIGTERM)
        await wait_liveness(node, connected=True, draining=True)
        kube.claim_and_pod("c-gate", dc_name, on(nic))
        msg = await failed_prepare(
            kube, "c-gate", "the attach service is stopping (graceful stop); retry later"
        )
        assert f"claim {kube.ns}/c-gate" in msg, msg
        uid = claim_uid(kube, "c-gate")
        not_started(kube, "c-gate")
        assert await node.stored(uid) == []
        assert nics.on_node(nic)
        # SIGKILL: no runtime connection at all.
        d.procs["attach"].kill()
        await wait_liveness(node, connected=False)
        msg = await failed_prepare(kube, "c-gate", "attach service is not connected to the container runtime")
        assert "retry" in msg, msg
        not_started(kube, "c-gate")
        assert await node.stored(uid) == []
        assert nics.on_node(nic)
        # attach back: the kubelet's own retry prepares the claim and the Pod runs with its NIC.
        await asyncio.to_thread(d.start_one, "attach")
        await kube.wait_phase("c-gate", within=RUNNING)
        assert len(await node.stored(uid)) == 1
        assert link(await kube.pod_netns("c-gate"), nic) is not None
        assert not nics.on_node(nic)
    finally:
        attach = d.procs["attach"]
        if attach.proc is None or attach.proc.poll() is not None or (await liveness(node)).draining:
            attach.kill()
            await asyncio.to_thread(d.start_one, "attach")
        await wait_liveness(node, connected=True)


def bound_pod(kube: Kube, name: str, claim: str) -> dict[str, Any]:
    """A Pod bound to this node by ``spec.nodeName`` (no scheduler) using ``claim``; sent as
    compact JSON by the cluster's REST client, as ``Kube.pod`` would (which cannot bind)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": kube.c.node_name,
            "containers": [
                {
                    "name": "app",
                    "image": "local/pause:1",
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "c0"}]},
                }
            ],
            "resourceClaims": [{"name": "c0", "resourceClaimName": claim}],
            "terminationGracePeriodSeconds": 5,
        },
    }
    return dict(kube.api.call("POST", f"/api/v1/namespaces/{kube.ns}/pods", body))


def allocate_by_hand(kube: Kube, claim: str, pod: dict[str, Any], pool: str, device: str) -> None:
    """Write the claim's status as another node's scheduler decision would: allocated from
    ``pool`` and reserved for ``pod`` (admin may write status.allocation)."""
    obj = kube.get_claim(claim)
    obj["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "nic", "driver": DRIVER, "pool": pool, "device": device}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    kube.api.call("PUT", f"/apis/resource.k8s.io/v1/namespaces/{kube.ns}/resourceclaims/{claim}/status", obj)


async def test_bad_input_fails_only_its_claim(node: Node, nics: Nics) -> None:
    kube, d = node.kube, node.driver
    good, unknown, wrong, absurd, vanished = (nics.add() for _ in range(5))
    await wait_published(kube, good, unknown, wrong, absurd, vanished)
    dc_name = kube.device_class("nic")
    kube.claim_and_pod("c-good", dc_name, on(good))
    kube.claim_and_pod(
        "c-unknown", dc_name, on(unknown), configs=[{"parameters": {"interface": {"mtuu": 1500}}}]
    )
    kube.claim_and_pod("c-wrong", dc_name, on(wrong), configs=[{"parameters": {"routes": {"x": 1}}}])
    bad = {"interface": {"mtu": 99999999, "arpIgnore": 77}}
    kube.claim_and_pod("c-absurd", dc_name, on(absurd), configs=[{"parameters": bad}])
    # Allocated from another node's pool (as that node's scheduler decision would be), bound here.
    kube.claim("c-other", kube.claim_spec(dc_name))
    allocate_by_hand(kube, "c-other", bound_pod(kube, "c-other", "c-other"), pool="node-b", device="eth9")

    await kube.wait_phase("c-good", within=RUNNING)
    good_uid = claim_uid(kube, "c-good")
    (good_dc,) = await node.stored(good_uid)
    msg = await failed_prepare(kube, "c-unknown", "interface.mtuu: unknown field")
    assert f"claim {kube.ns}/c-unknown" in msg and f"request nic device {unknown}" in msg, msg
    msg = await failed_prepare(kube, "c-wrong", "routes: expected an array of objects")
    assert f"claim {kube.ns}/c-wrong" in msg, msg
    msg = await failed_prepare(kube, "c-absurd", "interface.mtu: must be between 68 and 65535, got 99999999")
    assert "interface.arpIgnore: must be one of 0, 1, 2, 3 or 8, got 77" in msg, msg
    msg = await failed_prepare(kube, "c-other", "pool 'node-b', not from this node's pool 'node-a'")
    assert f"claim {kube.ns}/c-other" in msg and "request nic device eth9" in msg, msg

    # A device that vanishes between allocation and prepare: the gate (attach SIGKILLed) holds
    # the kubelet's prepare back while the scheduler allocates and binds, then the NIC goes.
    d.procs["attach"].kill()
    try:
        await wait_liveness(node, connected=False)
        kube.claim_and_pod("c-gone", dc_name, on(vanished))
        await failed_prepare(kube, "c-gone", "attach service is not connected")
        assert kube.get_claim("c-gone")["status"]["allocation"]["devices"]["results"][0]["device"] == vanished
        nics.delete(vanished)
        await eventually(lambda: vanished not in published(kube), 60, f"{vanished} withdrawn")
    finally:
        await asyncio.to_thread(d.start_one, "attach")
    msg = await failed_prepare(kube, "c-gone", "no such device on node node-a")
    assert f"device {vanished}" in msg and f"claim {kube.ns}/c-gone" in msg, msg

    for name in ("c-unknown", "c-wrong", "c-absurd", "c-other", "c-gone"):
        not_started(kube, name)
        assert await node.stored(claim_uid(kube, name)) == [], name
    for nic in (unknown, wrong, absurd):
        assert nics.on_node(nic)
    # The good claim was never disturbed.
    assert await node.stored(good_uid) == [good_dc]
    assert (kube.get_pod("c-good") or {})["status"]["phase"] == "Running"
    assert link(await kube.pod_netns("c-good"), good) is not None


async def test_config_errors_name_the_field_and_value(node: Node, nics: Nics) -> None:
    kube = node.kube
    cases = [
        ({"interface": {"mtuu": 1500}}, "interface.mtuu: unknown field"),
        ({"routes": {"x": 1}}, "routes: expected an array of objects"),
        ({"interface": {"mtu": 99999999}}, "interface.mtu: must be between 68 and 65535, got 99999999"),
        ({"interface": {"hardwareAddr": "zz"}}, "interface.hardwareAddr: invalid MAC address 'zz'"),
        ({"interface": {"mtu": True}}, "interface.mtu: expected an integer, got boolean true"),
    ]
    names = [nics.add() for _ in cases]
    await wait_published(kube, *names)
    dc_name = kube.device_class("nic")
    for i, ((params, _), nic) in enumerate(zip(cases, names, strict=True)):
        kube.claim_and_pod(f"c-field-{i}", dc_name, on(nic), configs=[{"parameters": params}])
    for i, ((_, message), nic) in enumerate(zip(cases, names, strict=True)):
        msg = await failed_prepare(kube, f"c-field-{i}", message)
        assert f"claim {kube.ns}/c-field-{i}" in msg and f"request nic device {nic}" in msg, msg
        not_started(kube, f"c-field-{i}")
        assert await node.stored(claim_uid(kube, f"c-field-{i}")) == []
        assert nics.on_node(nic)


async def test_sigkill_between_calls_gives_the_same_result_and_no_second_profile(
    node: Node, nics: Nics, webhook: Webhook
) -> None:
    kube, d = node.kube, node.driver
    nic = nics.add()
    await wait_published(kube, nic)
    kube.claim_and_pod(
        "c-kill", kube.device_class("nic"), on(nic), configs=[{"parameters": {"profile": PROFILE}}]
    )
    await kube.wait_phase("c-kill", within=RUNNING)
    uid = claim_uid(kube, "c-kill")
    (before,) = await node.stored(uid)
    first = kubelet_prepared(node.cluster, uid)
    assert first == [("node-a", nic, ["nic"])]
    assert profile_calls(webhook, "/GetProfileConfig", uid) == 1
    old_pid = d.procs["prepare"].pid
    await asyncio.to_thread(d.restart, "prepare", True)
    assert d.procs["prepare"].pid != old_pid
    # The new process answers the kubelet's repeated call.
    await kubelet_prepares_again(node, "c-kill", "c-kill", nic)
    assert answered(node.cluster, uid) == {("node-a", nic, ("nic",))}
    assert await node.stored(uid) == [before]  # the same stored record, not a new one
    assert profile_calls(webhook, "/GetProfileConfig", uid) == 1
    await delete_and_wait(kube, "c-kill")
    await gone_from_store(node, uid)
    await eventually(
        lambda: profile_calls(webhook, "/ReleaseProfileConfig", uid) == 1, 60, "the profile released"
    )


async def test_claim_status_follows_attach_results(node: Node, nics: Nics) -> None:
    kube = node.kube
    mac = "02:00:00:00:02:02"
    nic = nics.add(addresses=["192.168.20.5/24"], mac=mac)
    await wait_published(kube, nic)
    params = {"interface": {"name": "net-st"}}
    kube.claim_and_pod("c-status", kube.device_class("nic"), on(nic), configs=[{"parameters": params}])
    await kube.wait_phase("c-status", within=RUNNING)
    uid = pod_uid(kube, "c-status")

    def entry() -> dict[str, Any] | None:
        devices = (kube.get_claim("c-status").get("status") or {}).get("devices") or []
        return devices[0] if devices and devices[0].get("networkData") else None

    # What attach recorded once the device was in the Pod, written by prepare to status.devices.
    got = await eventually(entry, 60, "claim status.devices applied")
    assert (got["driver"], got["pool"], got["device"]) == (DRIVER, "node-a", nic)
    assert got["networkData"] == {
        "interfaceName": "net-st",
        "ips": ["192.168.20.5/24"],
        "hardwareAddress": mac,
    }
    assert [(c["type"], c["status"], c["reason"]) for c in got["conditions"]] == [
        ("Ready", "True", "NetworkDeviceReady"),
        ("NetworkReady", "True", "NetworkReady"),
    ]
    # attach clears its state when the Pod goes: the entry goes too.
    kube.delete_pod("c-status")

    async def cleared() -> bool:
        async with node.store() as store:
            state = await store.get_pod(uid)
        claim = kube.get_claim("c-status")
        return not state.results and not (claim.get("status") or {}).get("devices")

    await eventually(cleared, RUNNING, "attach results and claim status.devices removed")

    # ... and it was prepare's status writer that followed attach's clearing to no entry.
    def writer_cleared() -> bool:
        text = node.driver.procs["prepare"].log_path.read_text(errors="replace")
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("msg") == "claim status applied" and rec.get("claim") == f"{kube.ns}/c-status":
                    if rec.get("devices") == 0:
                        return True
        return False

    await eventually(writer_cleared, 30, "prepare applied an empty status.devices")
    await kube.wait_gone("c-status", within=RUNNING)
