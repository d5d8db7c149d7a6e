"""The driver installed as operators install it: the product image (dev/image) imported into the
node's containerd, charts/dranet installed into kube-system by a real Helm engine, the four
containers started by the real kubelet and judged by their native gRPC probes.

One installation for the module (``installed``); the host-process Driver of the other e2e modules
is not running meanwhile (one dra.net plugin and one NRI plugin per node). Each test adds its own
NICs and removes them at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import secrets
import time
from collections.abc import Iterator

import pytest

from dev.cluster.install import CONTAINERS, NAMESPACE, Installed
from dev.cluster.kube import KubeCluster
from tests.e2e.test_cluster import Nics
from tests.support.kube import Kube, addresses, eventually, link

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

RUN_WITHIN = 120.0


@pytest.fixture(scope="module")
def installed(kube_cluster: KubeCluster) -> Iterator[Installed]:
    inst = Installed(kube_cluster)
    try:
        seconds = inst.install()
        print(f"helm install -> four containers Ready: {seconds:.1f}s")
    except BaseException:
        print(inst.logs(inst.pod()))
        with contextlib.suppress(Exception):
            inst.uninstall()
        raise
    try:
        yield inst
    finally:
        # The tests' Pods go while attach runs, so their devices come back first.
        kube_cluster.delete_pods(namespaces_except=(NAMESPACE,))
        inst.uninstall()


@pytest.fixture
def nics(kube: Kube, kube_cluster: KubeCluster) -> Iterator[Nics]:
    n = Nics(kube_cluster)
    yield n
    kube.delete_namespace()
    n.cleanup()


def exec_in(c: KubeCluster, pod: str, container: str, *argv: str, check: bool = True) -> str:
    return c.kubectl("-n", NAMESPACE, "exec", pod, "-c", container, "--", *argv, check=check)


def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    assert found, f"no sample of {name} with {labels}"
    return total


async def run_pod_with_nic(kube: Kube, nics: Nics, name: str | None = None) -> tuple[str, str, str]:
    """A NIC, a claim for it and a Pod; waits until the Pod runs with net1. (pod, nic, netns)"""
    nic = nics.add(addresses=["192.168.77.2/24"])
    dc = kube.device_class("nic", f'device.attributes["dra.net"].ifName == "{nic}"')
    pod = name or f"p-{secrets.token_hex(2)}"
    kube.claim_and_pod(pod, dc, configs=[{"parameters": {"interface": {"name": "net1"}}}])
    await kube.wait_phase(pod, within=RUN_WITHIN)
    ns = await kube.pod_netns(pod)
    assert link(ns, "net1") is not None, f"{pod} runs without net1"
    assert "192.168.77.2/24" in addresses(ns, "net1")
    assert link(kube.c.netns, nic) is None, "the NIC is still on the node"
    return pod, nic, ns


# --- the tests ----------------------------------------------------------------------------------


def test_helm_install_gives_four_ready_containers_judged_by_grpc_probes(installed: Installed) -> None:
    pod = installed.wait_ready()
    spec = pod["spec"]
    (store,) = spec["initContainers"]
    assert store["name"] == "store" and store["restartPolicy"] == "Always", "the store is a native sidecar"
    for c in [store, *spec["containers"]]:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" in c[probe], (c["name"], probe, c[probe])
        assert c["readinessProbe"]["grpc"]["service"] == f"dranet.{c['name']}"
    assert installed.ready(pod) == dict.fromkeys(CONTAINERS, True)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    privileged = [c["name"] for c in [store, *spec["containers"]] if c["securityContext"].get("privileged")]
    assert privileged == ["attach"]
    # Installed by Helm: the release's secret is there, the objects carry its labels.
    secrets_ = installed.cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets?labelSelector=owner=helm")
    assert [s["metadata"]["labels"]["name"] for s in secrets_["items"]] == ["dranet"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_no_kubernetes_token_in_attach_and_store(installed: Installed) -> None:
    pod = installed.wait_ready()["metadata"]["name"]
    c = installed.cluster
    probe = "import os; print(os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))"
    seen = {name: exec_in(c, pod, name, "python", "-c", probe).strip() for name in CONTAINERS}
    assert seen == {"store": "False", "attach": "False", "inventory": "True", "prepare": "True"}, seen


async def test_a_pod_gets_its_nic_through_the_installed_driver(
    installed: Installed, kube: Kube, nics: Nics
) -> None:
    pod, nic, _ = await run_pod_with_nic(kube, nics)
    kube.delete_pod(pod)
    await kube.wait_gone(pod, within=60)
    await nics.wait_back(nic)


async def test_metrics_on_the_pod_port_count_dra_and_nri_and_each_process(
    installed: Installed, kube: Kube, nics: Nics
) -> None:
    await run_pod_with_nic(kube, nics)
    c = installed.cluster
    status, text = http_get(c.net.node_ip, 9177, "/metrics")
    assert status == 200, text[:500]
    assert (
        metric(
            text, "dranet_driver_dra_plugin_requests_total", method="PrepareResourceClaims", status="success"
        )
        > 0
    )
    assert (
        metric(text, "dranet_driver_nri_plugin_requests_total", method="RunPodSandbox", status="success") > 0
    )
    assert metric(text, "dranet_driver_published_devices_total") > 0
    for svc in CONTAINERS:
        assert metric(text, "process_start_time_seconds", service=svc) > 0, svc
    status, body = http_get(c.net.node_ip, 9177, "/readyz")
    assert status == 200, body
    assert http_get(c.net.node_ip, 9177, "/healthz")[0] == 200


async def test_readiness_follows_nri(installed: Installed) -> None:
    """containerd down: attach loses NRI, its readiness probe fails and the kubelet marks the
    container not Ready; containerd back: attach reconnects and is Ready again."""
    c = installed.cluster
    assert c.containerd is not None
    installed.wait_ready()
    c.containerd.stop()
    try:
        await eventually(
            lambda: installed.ready(installed.pod()).get("attach") is False or None,
            60,
            "attach not Ready without NRI",
        )
        assert installed.ready(installed.pod())["store"] is True, "only attach depends on NRI"
    finally:
        c.containerd.start(timeout=60)
    await asyncio.to_thread(installed.wait_ready, 90)
    pod = installed.pod()
    assert pod is not None
    log = c.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"], "-c", "attach", "--tail=2000")
    warnings = [json.loads(line) for line in log.splitlines() if '"WARNING"' in line and "NRI" in line]
    assert any("disable = false" in w["msg"] for w in warnings), log[-3000:]


async def test_deleting_the_driver_pod_stops_it_in_seconds_and_loses_nothing(
    installed: Installed, kube: Kube, nics: Nics
) -> None:
    c = installed.cluster
    pod, nic, ns = await run_pod_with_nic(kube, nics)
    old = installed.wait_ready()
    name, uid = old["metadata"]["name"], old["metadata"]["uid"]
    t0 = time.monotonic()
    c.api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", ok=(200, 202))

    def gone() -> bool | None:
        got = c.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", ok=(200, 404))
        return True if got.get("kind") == "Status" or got["metadata"]["uid"] != uid else None

    await eventually(gone, 60, "the old driver pod gone")
    stopped_s = time.monotonic() - t0
    print(f"driver pod deleted -> every container gone: {stopped_s:.1f}s")
    assert stopped_s < 15, f"the driver pod took {stopped_s:.1f}s to stop"
    # The Pod kept its NIC; the new driver pod takes over and gives it back when the Pod ends.
    await asyncio.to_thread(installed.wait_ready, 120, uid)
    assert link(ns, "net1") is not None
    kube.delete_pod(pod)
    await kube.wait_gone(pod, within=60)
    await nics.wait_back(nic)
    new = installed.pod()
    assert new is not None
    for cont in CONTAINERS:
        text = c.kubectl(
            "-n", NAMESPACE, "logs", new["metadata"]["name"], "-c", cont, "--previous", check=False
        )
        assert "Traceback" not in text, (cont, text[-2000:])


async def test_helm_upgrade_of_one_container_under_a_churn_of_pods(
    installed: Installed, kube: Kube, nics: Nics
) -> None:
    """attach gets a new image tag while Pods with devices are being created: the rollout ends on
    the node in under 30 s, and every Pod that ran had its NIC (none without, none lost)."""
    c = installed.cluster
    assert c.containerd is not None and installed.image is not None
    retag = installed.tag_image(installed.image.rpartition(":")[0] + ":upgrade-" + secrets.token_hex(2))
    old_uid = installed.wait_ready()["metadata"]["uid"]
    names = [nics.add(addresses=[f"192.168.78.{i + 2}/24"]) for i in range(3)]
    dc = kube.device_class("nic", " || ".join(f'device.attributes["dra.net"].ifName == "{n}"' for n in names))
    results: dict[str, str] = {}

    async def one(i: int) -> None:
        pod = f"churn-{i}"
        kube.claim_and_pod(pod, dc, configs=[{"parameters": {"interface": {"name": "net1"}}}])
        try:
            await kube.wait_phase(pod, within=RUN_WITHIN)
            ns = await kube.pod_netns(pod)
            results[pod] = "nic" if link(ns, "net1") is not None else "NO NIC"
        except Exception as exc:
            results[pod] = f"not running: {exc}"
        kube.delete_pod(pod)
        await kube.wait_gone(pod, within=90)
        kube.delete_claim(pod)

    async def churn() -> None:
        for wave in range(4):
            await asyncio.gather(*(one(wave * 3 + j) for j in range(3)))

    task = asyncio.create_task(churn())
    await asyncio.sleep(3)
    repo, _, tag = retag.rpartition(":")
    t0 = time.monotonic()
    await asyncio.to_thread(installed.upgrade, {"attach": {"image": {"repository": repo, "tag": tag}}})
    new = await asyncio.to_thread(installed.wait_ready, 120, old_uid)
    rollout_s = time.monotonic() - t0
    print(f"helm upgrade -> new driver pod Ready on the node: {rollout_s:.1f}s")
    attach = next(x for x in new["spec"]["containers"] if x["name"] == "attach")
    assert attach["image"].endswith(tag)
    await task
    print(f"churn: {results}")
    assert len(results) == 12 and set(results.values()) == {"nic"}, results
    assert rollout_s < 30, f"rollout took {rollout_s:.1f}s"
    for n in names:
        await nics.wait_back(n)


def test_helm_refuses_a_values_typo(installed: Installed) -> None:
    with pytest.raises(Exception, match="additional properties 'atach' not allowed"):
        installed.upgrade({"atach": {"logLevel": "DEBUG"}})
    with pytest.raises(Exception, match="/attach/healthPort"):
        installed.upgrade({"attach": {"healthPort": "9184"}})
    # Nothing changed: the same pod is still Ready.
    installed.wait_ready(30)
