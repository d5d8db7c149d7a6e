"""What the real cluster shows that the doubles could not: the kubelet registers dranet's plugin over
the real registration API, the real scheduler allocates from our published ResourceSlices with CEL on
``dra.net`` attributes, the real kubelet prepares claims and runs Pods whose NIC attach moved in over
NRI, the controller-manager makes claims from templates, the real API server takes the claim status
prepare writes, and kubectl works against all of it.

The session's KubeCluster (tests/fixtures_cluster.py) and the module's Driver (tests/e2e/conftest.py);
every test adds NICs of its own (``nic_name()``) and removes them at the end.
"""

from __future__ import annotations

import json
import re
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.cluster.cri import CriClient
from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from shared.storeclient import StoreClient
from tests.e2e.conftest import Node
from tests.integration.attach import attach_env as env
from tests.support.kube import Kube, addresses, eventually, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

# Several clusters share two CPUs: waits are long, and each ends on an observable state.
RUN_WITHIN = 180.0
GONE_WITHIN = 120.0
REG_LINE = re.compile(
    r'"Connection changed".*driverName="dra\.net".*endpoint="([^"]+)".*connected=(true|false)'
)


# --- helpers ------------------------------------------------------------------------------------


class Nics:
    """NICs one test adds to the node; removed at the end (after its Pods gave them back)."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.c = cluster
        self.names: list[str] = []

    def add(self, name: str | None = None, **kw: Any) -> str:
        name = name or nic_name()
        self.c.net.add_nic(name, **kw)
        self.names.append(name)
        return name

    def on_node(self, name: str) -> dict[str, Any] | None:
        return link(self.c.netns, name)

    async def wait_back(self, name: str, within: float = 60.0) -> dict[str, Any]:
        back = await eventually(lambda: self.on_node(name), within, f"{name} back on the node")
        assert "UP" in back["flags"], back
        # The device comes back under its host name, without attach's tag.
        assert back["ifname"] == name and not [a for a in back.get("altnames", []) if "dranet" in a], back
        return back

    def cleanup(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "-n", self.c.netns, "link", "del", name], capture_output=True)


@pytest.fixture
def nics(kube: Kube, kube_cluster: KubeCluster) -> Iterator[Nics]:
    n = Nics(kube_cluster)
    yield n
    # The namespace goes first: its Pods stop while attach runs and give their NICs back.
    kube.delete_namespace()
    n.cleanup()


def registrations(c: KubeCluster, since: int = 0) -> list[tuple[str, bool]]:
    """The kubelet's DRA "Connection changed" lines for dra.net after byte ``since`` of its log:
    (endpoint, connected)."""
    data = c.procs["kubelet"].log_path.read_bytes()[since:].decode(errors="replace")
    return [(m.group(1), m.group(2) == "true") for m in REG_LINE.finditer(data)]


def kubelet_log_size(c: KubeCluster) -> int:
    return c.procs["kubelet"].log_path.stat().st_size


def kubelet_metrics(c: KubeCluster) -> dict[str, float]:
    """The kubelet's /metrics (through the API server's node proxy): 'name{labels}' -> value."""
    text = c.api.get(f"/api/v1/nodes/{c.node_name}/proxy/metrics")
    out: dict[str, float] = {}
    for line in str(text).splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def sandboxes(c: KubeCluster, pod_uid: str) -> list[Any]:
    assert c.containerd is not None
    async with CriClient(c.containerd.grpc_socket) as cri:
        return await cri.list_pod_sandboxes({"io.kubernetes.pod.uid": pod_uid})


async def store_for_claim(d: Driver, claim_uid: str) -> tuple[list[Any], list[Any]]:
    async with StoreClient(d.run_dir / "store.sock") as store:
        listing = await store.list(claim_uid=claim_uid)
    return list(listing.devices), list(listing.results)


async def run_and_time(kube: Kube, name: str, t0: float) -> tuple[dict[str, Any], float]:
    """Wait until the Pod runs; (pod, seconds from ``t0``, taken just before it was created)."""
    pod = await kube.wait_phase(name, within=RUN_WITHIN)
    return pod, time.monotonic() - t0


def append_cri_log(path: Path, line: str) -> None:
    """One line in the CRI log format the kubelet reads (``<RFC 3339> stdout F <text>``)."""
    assert path.exists(), sorted(path.parents[1].rglob("*"))
    with open(path, "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S.000000000Z', time.gmtime())} stdout F {line}\n")


def published(k: Kube) -> dict[str, dict[str, Any]]:
    """Device name -> device over the node's ResourceSlices. (Kube.published trips over a slice
    whose ``devices`` is null, as the API server returns a slice with none.)"""
    items = k.api.get(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={k.c.node_name}")[
        "items"
    ]
    return {dv["name"]: dv for s in items for dv in s["spec"].get("devices") or []}


async def wait_published(k: Kube, *names: str, within: float = 60.0) -> dict[str, dict[str, Any]]:
    def check() -> dict[str, dict[str, Any]] | None:
        got = published(k)
        return got if set(names) <= set(got) else None

    return await eventually(check, within, f"devices {names} published")


def attr(name: str) -> str:
    return f'device.attributes["dra.net"].{name}'


# --- the tests ----------------------------------------------------------------------------------


async def test_kubelet_registers_the_plugin_over_the_registration_api(node: Node) -> None:
    """The kubelet's plugin watcher finds dra.net-reg.sock, registers the driver and connects to
    its DRA socket; prepare replaced, the kubelet sees it go and registers the new one."""
    c, d = node.cluster, node.driver
    reg = c.kubelet_dir / "plugins_registry" / "dra.net-reg.sock"
    endpoint = str(c.kubelet_dir / "plugins" / "dra.net" / "dra.sock")
    assert stat.S_ISSOCK(reg.stat().st_mode), reg
    await eventually(lambda: (endpoint, True) in registrations(c), 60, "dra.net registered")

    def in_actual_state() -> bool:
        key = f'plugin_manager_total_plugins{{socket_path="{reg}",state="actual_state_of_world"}}'
        return kubelet_metrics(c).get(key) == 1.0

    await eventually(in_actual_state, 60, "dra.net in the plugin manager's actual state")

    since = kubelet_log_size(c)
    d.procs["prepare"].stop()
    try:
        await eventually(lambda: (endpoint, False) in registrations(c, since), 60, "kubelet sees dra.net go")
    finally:
        d.start_one("prepare")
    await eventually(lambda: (endpoint, True) in registrations(c, since), 60, "dra.net registered again")
    assert stat.S_ISSOCK(reg.stat().st_mode)


async def test_scheduler_allocates_by_cel_on_published_attributes(node: Node, nics: Nics) -> None:
    """A selector on ``mtu`` and ``ifName``: of two NICs with the same stem, the real scheduler
    takes the 9000-byte one; a second such claim finds no other and stays unschedulable, though a
    1500-byte NIC with the stem is free, until the first Pod is gone and its NIC free again."""
    k = node.kube
    stem = nic_name("c")
    big, small = nics.add(f"{stem}a", mtu=9000), nics.add(f"{stem}b", mtu=1500)
    published = await wait_published(k, big, small, within=60)
    assert published[big]["attributes"]["dra.net/mtu"] == {"int": 9000}
    assert published[small]["attributes"]["dra.net/mtu"] == {"int": 1500}
    dc = k.device_class("nic")
    sel = (
        f'has({attr("ifName")}) && {attr("ifName")}.startsWith("{stem}")'
        f" && has({attr('mtu')}) && {attr('mtu')} == 9000"
    )
    t0 = time.monotonic()
    k.claim_and_pod("jumbo", dc, sel)
    _, took = await run_and_time(k, "jumbo", t0)
    print(f"pod create -> Running: {took:.1f}s")
    (result,) = k.get_claim("jumbo")["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == ("dra.net", node.cluster.node_name, big)
    netns = await k.pod_netns("jumbo")
    inside = link(netns, big)
    assert inside is not None and inside["mtu"] == 9000
    assert nics.on_node(big) is None and nics.on_node(small) is not None

    k.claim_and_pod("jumbo2", dc, sel)
    await k.wait_event("jumbo2", "cannot allocate all claims", within=RUN_WITHIN)
    claim2 = k.get_claim("jumbo2")
    assert not (claim2.get("status") or {}).get("allocation"), claim2["status"]
    assert not (k.get_pod("jumbo2") or {}).get("spec", {}).get("nodeName")
    assert nics.on_node(small) is not None

    # Once the first Pod is gone its claim is deallocated: the waiting one gets the 9000-byte NIC,
    # still never the other.
    k.delete_pod("jumbo")
    await k.wait_gone("jumbo", within=GONE_WITHIN)
    await k.wait_phase("jumbo2", within=RUN_WITHIN)
    (result,) = k.get_claim("jumbo2")["status"]["allocation"]["devices"]["results"]
    assert result["device"] == big
    assert link(await k.pod_netns("jumbo2"), big) is not None
    assert nics.on_node(small) is not None
    k.delete_pod("jumbo2")
    await k.wait_gone("jumbo2", within=GONE_WITHIN)
    await nics.wait_back(big)


async def test_pod_with_a_device_runs_and_gives_it_back(node: Node, nics: Nics) -> None:
    """A claim for one NIC: the Pod runs with it in its netns (seen with ip -n), the kubelet counts
    the claim in use for dra.net; deleted, the device returns to the node under its host name and
    the store forgets the claim."""
    k, c = node.kube, node.cluster
    nic = nics.add(addresses=["10.91.0.2/24"])
    await wait_published(k, nic, within=60)
    before = link(c.netns, nic)
    assert before is not None
    mac = before["address"]
    claim = k.claim(nic, k.claim_spec(k.device_class("nic"), on(nic)))
    t0 = time.monotonic()
    k.pod(nic, claims=[nic])
    _, took = await run_and_time(k, nic, t0)
    print(f"pod create -> Running: {took:.1f}s")
    netns = await k.pod_netns(nic)
    inside = link(netns, nic)
    assert inside is not None, subprocess.run(["ip", "-n", netns, "link"], capture_output=True, text=True)
    assert inside["address"] == mac and "UP" in inside["flags"]
    assert addresses(netns, nic) == ["10.91.0.2/24"]  # the host's address went with it
    assert nics.on_node(nic) is None

    def in_use() -> bool:
        return kubelet_metrics(c).get('dra_resource_claims_in_use{driver_name="dra.net"}', 0) >= 1

    await eventually(in_use, 60, "kubelet metrics: a dra.net claim in use")
    devices, _ = await store_for_claim(node.driver, claim["metadata"]["uid"])
    assert [(dc.device, dc.host_ifname) for dc in devices] == [(nic, nic)]

    k.delete_pod(nic)
    await k.wait_gone(nic, within=GONE_WITHIN)
    back = await nics.wait_back(nic)
    assert back["address"] == mac
    assert link(netns, nic) is None

    async def forgotten() -> bool:
        devices, results = await store_for_claim(node.driver, claim["metadata"]["uid"])
        return not devices and not results

    await eventually(forgotten, 60, "the store forgets the claim after unprepare")


async def test_two_claims_in_one_pod(node: Node, nics: Nics) -> None:
    """Two claims, one NIC each, in one Pod: both NICs in the Pod under their configured names,
    both gone from the node; both back after the Pod."""
    k = node.kube
    a, b = nics.add(), nics.add()
    await wait_published(k, a, b, within=60)
    dc = k.device_class("nic")
    for claim, nic, ifname in (("ca", a, "net-a"), ("cb", b, "net-b")):
        k.claim(claim, k.claim_spec(dc, on(nic), [{"parameters": {"interface": {"name": ifname}}}]))
    t0 = time.monotonic()
    k.pod("two", claims=["ca", "cb"])
    _, took = await run_and_time(k, "two", t0)
    print(f"pod create -> Running: {took:.1f}s")
    netns = await k.pod_netns("two")
    assert link(netns, "net-a") is not None and link(netns, "net-b") is not None
    assert nics.on_node(a) is None and nics.on_node(b) is None
    for claim, nic in (("ca", a), ("cb", b)):
        (dev,) = (await k.wait_claim(claim, lambda cl: bool((cl.get("status") or {}).get("devices"))))[
            "status"
        ]["devices"]
        assert dev["device"] == nic
    k.delete_pod("two")
    await k.wait_gone("two", within=GONE_WITHIN)
    await nics.wait_back(a)
    await nics.wait_back(b)


async def test_claim_from_a_template_made_and_deleted_with_the_pod(node: Node, nics: Nics) -> None:
    """A ResourceClaimTemplate: the controller-manager makes the Pod's claim (owned by the Pod),
    the Pod runs with the NIC, and the claim is deleted with the Pod."""
    k = node.kube
    nic = nics.add()
    await wait_published(k, nic, within=60)
    spec = k.claim_spec(k.device_class("nic"), on(nic), [{"parameters": {"interface": {"name": "tnic"}}}])
    k.claim_template("tmpl", spec)
    t0 = time.monotonic()
    pod = k.pod("templated", templates=["tmpl"])

    def claim_name() -> str | None:
        statuses = ((k.get_pod("templated") or {}).get("status") or {}).get("resourceClaimStatuses") or []
        return next((s.get("resourceClaimName") for s in statuses if s["name"] == "t0"), None)

    name = await eventually(claim_name, 60, "the controller-manager made the claim")
    claim = k.get_claim(name)
    owners = claim["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["uid"]) for o in owners] == [("Pod", pod["metadata"]["uid"])]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] == [
        {"cel": {"expression": on(nic)}}
    ]
    assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {"interface": {"name": "tnic"}}
    _, took = await run_and_time(k, "templated", t0)
    print(f"pod create -> Running: {took:.1f}s")
    netns = await k.pod_netns("templated")
    assert link(netns, "tnic") is not None and nics.on_node(nic) is None

    k.delete_pod("templated")
    await k.wait_gone("templated", within=GONE_WITHIN)

    def claim_gone() -> bool:
        path = f"/apis/resource.k8s.io/v1/namespaces/{k.ns}/resourceclaims/{name}"
        return not k.api.exists(path)

    await eventually(claim_gone, 60, "the templated claim deleted with its Pod")
    await nics.wait_back(nic)


async def test_unsatisfiable_claim_leaves_the_pod_pending(node: Node, nics: Nics) -> None:
    """A selector that matches no device: FailedScheduling, no node, no allocation; prepare never
    sees the claim and the store holds nothing of it."""
    k = node.kube
    nic = nics.add()  # a free NIC the selector does not match
    await wait_published(k, nic, within=60)
    claim = k.claim("nothing", k.claim_spec(k.device_class("nic"), on(nic_name("none"))))
    k.pod("nothing", claims=["nothing"])
    ev = await k.wait_event("nothing", "cannot allocate all claims", within=RUN_WITHIN)
    assert ev["reason"] == "FailedScheduling" and ev["type"] == "Warning"
    pod = k.get_pod("nothing")
    assert pod is not None and not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert not (k.get_claim("nothing").get("status") or {}).get("allocation")
    uid = claim["metadata"]["uid"]
    assert await store_for_claim(node.driver, uid) == ([], [])
    assert uid not in node.driver.procs["prepare"].log()
    assert await sandboxes(node.cluster, pod["metadata"]["uid"]) == []
    assert nics.on_node(nic) is not None


async def test_claim_status_with_network_data_through_the_api_server(node: Node, nics: Nics) -> None:
    """prepare writes status.devices with networkData and conditions; the real API server takes it
    (it validates the device against the allocation) and kubectl shows it (-o yaml, describe)."""
    k, c = node.kube, node.cluster
    nic = nics.add()
    await wait_published(k, nic, within=60)
    cfg = {"interface": {"name": "net-s", "addresses": ["10.92.0.2/24"], "hardwareAddr": "02:42:ac:11:00:07"}}
    t0 = time.monotonic()
    k.claim_and_pod("status", k.device_class("nic"), on(nic), [{"parameters": cfg}])
    _, took = await run_and_time(k, "status", t0)
    print(f"pod create -> Running: {took:.1f}s")

    def with_network_data(cl: dict[str, Any]) -> bool:
        return any(dv.get("networkData") for dv in (cl.get("status") or {}).get("devices") or [])

    await k.wait_claim("status", with_network_data, within=60)
    out = yaml.safe_load(
        c.kubectl("get", "resourceclaim", "status", "-n", k.ns, "-o", "yaml", "--show-managed-fields")
    )
    (dev,) = out["status"]["devices"]
    assert (dev["driver"], dev["pool"], dev["device"]) == ("dra.net", c.node_name, nic)
    assert dev["networkData"] == {
        "interfaceName": "net-s",
        "ips": ["10.92.0.2/24"],
        "hardwareAddress": "02:42:ac:11:00:07",
    }
    conds = {x["type"]: x["status"] for x in dev["conditions"]}
    assert conds["Ready"] == "True", dev["conditions"]
    # Written through the status subresource by prepare's client, not by the scheduler.
    writers = [
        m["manager"]
        for m in out["metadata"]["managedFields"]
        if m.get("subresource") == "status" and "f:devices" in m.get("fieldsV1", {}).get("f:status", {})
    ]
    assert writers and "kube-scheduler" not in writers, out["metadata"]["managedFields"]
    described = c.kubectl("describe", "resourceclaim", "status", "-n", k.ns)
    assert re.search(r"Network Data:\s+Hardware Address:\s+02:42:ac:11:00:07", described), described
    assert re.search(r"Interface Name:\s+net-s", described) and "10.92.0.2/24" in described
    assert re.search(r"Reason:\s+NetworkDeviceReady\s+Status:\s+True\s+Type:\s+Ready", described)


async def test_prepare_gate_holds_the_pod_until_attach_is_back(node: Node, nics: Nics) -> None:
    """attach SIGKILLed: the kubelet's NodePrepareResources fails with the gate's error (an event
    from the kubelet), no sandbox is made, and the kubelet keeps retrying; attach started again,
    a retry succeeds and the Pod runs with its NIC."""
    k, c, d = node.kube, node.cluster, node.driver
    nic = nics.add()
    await wait_published(k, nic, within=60)
    dc = k.device_class("nic")
    d.procs["attach"].kill()
    try:
        async with node.store() as store:
            await env.wait_liveness(store, connected=False, timeout_s=30)
        claim = k.claim("gated", k.claim_spec(dc, on(nic), [{"parameters": {"interface": {"name": "net3"}}}]))
        k.pod("gated", claims=["gated"])
        ev = await k.wait_event("gated", "attach service is not connected", within=RUN_WITHIN)
        assert ev["reason"] == "FailedPrepareDynamicResources" and ev["source"]["component"] == "kubelet"
        assert "NodePrepareResources failed for ResourceClaim gated" in ev["message"]

        def retried() -> bool:
            return any(
                "attach service is not connected" in e["message"]
                and max(e.get("count") or 1, (e.get("series") or {}).get("count") or 1) >= 2
                for e in k.events("gated")
            )

        await eventually(retried, RUN_WITHIN, "the kubelet retried the prepare call")
        pod = k.get_pod("gated")
        assert pod is not None and pod["status"]["phase"] == "Pending"
        assert await sandboxes(c, pod["metadata"]["uid"]) == []
        assert nics.on_node(nic) is not None
        assert await store_for_claim(d, claim["metadata"]["uid"]) == ([], [])
        back_at = time.monotonic()
        d.start_one("attach")
    finally:
        if d.procs["attach"].proc is None or d.procs["attach"].proc.poll() is not None:
            d.start_one("attach")
    async with node.store() as store:
        await env.wait_liveness(store, connected=True, timeout_s=30)
    _, took = await run_and_time(k, "gated", back_at)
    print(f"Running {took:.1f}s after attach came back")
    netns = await k.pod_netns("gated")
    assert link(netns, "net3") is not None and nics.on_node(nic) is None
    k.delete_pod("gated")
    await k.wait_gone("gated", within=GONE_WITHIN)
    await nics.wait_back(nic)


async def test_invalid_opaque_config_is_refused_with_the_field_named(node: Node, nics: Nics) -> None:
    """``interface.mtu: "big"`` and an unknown field, through the real path (API server, scheduler,
    kubelet, prepare): the Pod never gets a sandbox, the kubelet's event names both fields, nothing
    is stored, the device stays on the node."""
    k, c = node.kube, node.cluster
    nic = nics.add()
    await wait_published(k, nic, within=60)
    bad = {"interface": {"mtu": "big", "colour": "red"}}
    claim = k.claim("bad", k.claim_spec(k.device_class("nic"), on(nic), [{"parameters": bad}]))
    k.pod("bad", claims=["bad"])
    ev = await k.wait_event("bad", "interface.mtu", within=RUN_WITHIN)
    assert ev["reason"] == "FailedPrepareDynamicResources", ev
    assert 'interface.mtu: expected an integer, got string "big"' in ev["message"], ev["message"]
    assert "interface.colour: unknown field" in ev["message"], ev["message"]
    pod = k.get_pod("bad")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert await sandboxes(c, pod["metadata"]["uid"]) == []
    assert await store_for_claim(node.driver, claim["metadata"]["uid"]) == ([], [])
    assert nics.on_node(nic) is not None


async def test_kubectl_works_against_the_cluster(node: Node, nics: Nics) -> None:
    """kubectl 1.34 as admin: create namespace, run, describe, logs, get events, get resourceslices
    and resourceclaims -o yaml."""
    k, c = node.kube, node.cluster
    kc = c.kubectl
    ns = f"kc-{secrets.token_hex(3)}"
    assert kc("create", "namespace", ns).strip() == f"namespace/{ns} created"
    try:
        await eventually(
            lambda: kc("get", "serviceaccount", "default", "-n", ns, check=False), 60, "default SA"
        )
        out = kc(
            "run", "p", "-n", ns, "--image=local/pause:1", "--image-pull-policy=Never", "--restart=Never"
        )
        assert out.strip() == "pod/p created"
        kc("wait", "--for=condition=Ready", "pod/p", "-n", ns, f"--timeout={int(RUN_WITHIN)}s")
        described = kc("describe", "pod", "p", "-n", ns)
        assert re.search(r"Status:\s+Running", described) and re.search(rf"Node:\s+{c.node_name}/", described)
        assert re.search(r"Image:\s+local/pause:1", described)
        # pause writes nothing: one CRI-format line in the file the runtime logs to, and kubectl
        # logs (API server -> the kubelet's log endpoint) shows it.
        uid = json.loads(kc("get", "pod", "p", "-n", ns, "-o", "json"))["metadata"]["uid"]
        append_cri_log(Path(c.state, "pod-logs", f"{ns}_p_{uid}", "p", "0.log"), "hello-dranet")
        assert kc("logs", "p", "-n", ns).strip() == "hello-dranet"
        events = kc("get", "events", "-n", ns)
        assert "Scheduled" in events and "Started" in events and "pod/p" in events
    finally:
        kc("delete", "namespace", ns, "--wait=true", f"--timeout={int(GONE_WITHIN)}s", check=False)

    nic = nics.add()
    await wait_published(k, nic, within=60)
    slices = yaml.safe_load(kc("get", "resourceslices", "-o", "yaml"))
    ours = [s for s in slices["items"] if s["spec"]["driver"] == "dra.net"]
    assert ours and all(s["spec"]["nodeName"] == c.node_name for s in ours)
    names = {dv["name"] for s in ours for dv in s["spec"].get("devices") or []}
    assert nic in names and "apilink" not in names
    params = {"interface": {"name": "kx", "mtu": 1400}}
    k.claim("kc", k.claim_spec(k.device_class("nic"), on(nic), [{"parameters": params}]))
    claims = yaml.safe_load(kc("get", "resourceclaims", "-n", k.ns, "-o", "yaml"))
    (cl,) = claims["items"]
    assert cl["metadata"]["name"] == "kc"
    assert cl["spec"]["devices"]["config"][0]["opaque"] == {"driver": "dra.net", "parameters": params}
    assert cl["spec"]["devices"]["requests"][0]["exactly"]["selectors"] == [{"cel": {"expression": on(nic)}}]
