"""compose.yaml run for real on the session's cluster (``dev.compose``): Debian's Podman with its
Docker-compatible API in the node's network namespace, docker compose v2 bringing up the four
containers of the product image; they serve the demo claim (the node's eth1 in a Pod as net1),
give the NIC back when the Pod goes, and ``down`` leaves nothing on the host.

One compose project for the module; the host-process Driver and the Helm-installed driver of the
other modules are not running meanwhile (one dra.net plugin and one NRI plugin per node). The
tests run in file order: the last one brings compose down and checks what is left.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster import demo
from dev.cluster.kube import KubeCluster
from dev.compose import SERVICES, Compose, libpod_cgroups, processes_naming
from dev.image.build import HOST_BLOB_CACHE
from tests.support.kube import link

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

HOST_PATHS = (HOST_BLOB_CACHE.parent.parent, Path("/run/libpod"), Path("/dev/shm/libpod_lock"))


def host_state() -> dict[str, object]:
    """What Podman could leave on the host: its cgroups, /var/lib/containers, its default tmp dir
    and shm lock (both unused with this containers.conf)."""
    return {
        "cgroups": sorted(map(str, libpod_cgroups())),
        **{str(p): p.exists() for p in HOST_PATHS},
    }


@pytest.fixture(scope="module")
def eth1(kube_cluster: KubeCluster) -> Iterator[str]:
    c = kube_cluster
    assert not c.net.has_link("eth1"), "eth1 is already on the node: the demo needs it"
    c.net.add_nic("eth1", addresses=["192.168.101.2/24"], peer_addresses=["192.168.101.1/24"])
    yield "eth1"
    subprocess.run(["ip", "-n", c.netns, "link", "del", "eth1"], capture_output=True)


@pytest.fixture(scope="module")
def before() -> dict[str, object]:
    return host_state()


@pytest.fixture(scope="module")
def composed(kube_cluster: KubeCluster, eth1: str, before: dict[str, object]) -> Iterator[Compose]:
    comp = Compose(kube_cluster)
    try:
        up_s = comp.up()
    except BaseException:
        print(comp.logs())
        comp.down()
        raise
    print(f"compose up -> four containers healthy: {up_s:.1f}s; steps: {comp.timings}")
    try:
        yield comp
    finally:
        # The Pods go while attach runs, so their devices come back first.
        kube_cluster.delete_pods(namespaces_except=("kube-system",))
        for path in (
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/demo-nic",
            "/apis/resource.k8s.io/v1/deviceclasses/dranet-demo",
        ):
            kube_cluster.api.call("DELETE", path, ok=(200, 202, 404))
        comp.down()


def test_compose_up_gives_four_healthy_containers_in_the_node_namespace(composed: Compose) -> None:
    assert composed.health() == dict.fromkeys(SERVICES, "running/healthy")
    docs = composed.containers()
    assert all(d["HostConfig"]["NetworkMode"] == "host" for d in docs.values())
    assert [s for s, d in docs.items() if d["HostConfig"]["Privileged"]] == ["attach"]
    # Each service answers dranet.admin.v1 over the shared run dir, seen from any container.
    out = composed.compose("exec", "-T", "store", "dranet-admin", "health", timeout=60).stdout
    seen = {r["service"]: r["ready"] for r in map(json.loads, out.splitlines())}
    assert seen == dict.fromkeys(SERVICES, True), out
    # network_mode host is the node's namespace: the inventory's endpoint is on the node's IP.
    c = composed.cluster
    conn = http.client.HTTPConnection(c.net.node_ip, 9177, timeout=10)
    try:
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_the_demo_claim_gets_eth1_through_the_containers_and_gives_it_back(composed: Compose) -> None:
    c = composed.cluster
    t0 = time.monotonic()
    result = demo.run(c)
    print(f"demo: {time.monotonic() - t0:.1f}s; {json.dumps(result, default=str)}")
    assert result["ok"] is True, (result, composed.logs())
    assert result["interface"]["name"] == "net1" and result["interface"]["mtu"] == 1400
    (status,) = result["claim_status"]
    assert status["device"] == "eth1" and status["networkData"]["interfaceName"] == "net1"
    c.delete_pods(namespaces_except=("kube-system",))
    deadline = time.monotonic() + 60
    while (back := link(c.netns, "eth1")) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert back is not None, f"eth1 not back on the node:\n{composed.logs()}"
    assert "UP" in back["flags"], back


def test_compose_down_leaves_nothing(composed: Compose, before: dict[str, object]) -> None:
    ids = [d["Id"] for d in composed.containers().values()]
    service = composed.service
    assert len(ids) == 4 and service is not None
    t0 = time.monotonic()
    # compose down, the service stopped, the directory removed; raises naming what was left.
    composed.down()
    print(f"compose down: {time.monotonic() - t0:.1f}s")
    assert service.poll() is not None, "podman system service still runs"
    assert not composed.dir.exists()
    assert processes_naming(composed.dir) == []
    for cid in ids:
        assert processes_naming(cid) == [], f"a process of container {cid} is left"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert f" {composed.dir}/" not in mounts and f" {composed.dir} " not in mounts
    assert host_state() == before
