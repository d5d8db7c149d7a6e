"""prepare end to end with the GCE profile provider: the inventory reads the (local, fake) GCE
metadata server, publishes the NIC's cloud attributes and resolves the ``gce-managed`` profile
the provider config names; the real scheduler, kubelet and API server drive prepare as in
``test_prepare.py``, whose helpers this module uses. The Node is ``node-a``, not the VM's name in
the metadata (``gke-a3-node-1``): the GCE provider never compares them, it matches NICs by MAC."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from tests.e2e.conftest import Node, start_driver, stop_driver
from tests.e2e.test_prepare import (
    RUNNING,
    Nics,
    Served,
    claim_uid,
    delete_and_wait,
    gone_from_store,
    kubelet_prepared,
    stored_config,
    wait_published,
)
from tests.integration.inventory.cloud.fakes import GceMetadata
from tests.support.kube import eventually, link, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

# The first NIC of the captured a3 VM (fakes.GCE_NICS), with its alias range 10.24.3.0/24.
GCE_MAC = "42:01:0a:80:00:46"


@pytest.fixture(scope="module")
def cloud_state(kube_cluster: KubeCluster) -> Path:
    return kube_cluster.state / f"gce-cloud-{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def driver(kube_cluster: KubeCluster, cloud_state: Path) -> Iterator[Driver]:
    metadata = GceMetadata()
    served = Served(metadata, kube_cluster.net.host_ip)
    try:
        d = start_driver(
            kube_cluster,
            inventory_args=[
                "--cloud-provider-hint", "GCE",
                "--gce-metadata-url", metadata.url,
                "--cloud-state-dir", str(cloud_state),
            ],
        )  # fmt: skip
        try:
            yield d
        except BaseException:
            print(d.logs())
            raise
        finally:
            stop_driver(kube_cluster, d)
    finally:
        served.close()


@pytest.fixture
def nics(node: Node) -> Iterator[Nics]:
    n = Nics(node.cluster)
    yield n
    node.kube.delete_namespace()
    n.remove_left()


def kernel_has_ipvlan() -> bool:
    """Whether this kernel makes IPvlan links (some CI VM kernels are built without CONFIG_IPVLAN);
    probed in a scratch network namespace."""
    ns = f"ipvl-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
            check=True,
            capture_output=True,
        )
        res = subprocess.run(
            ["ip", "-n", ns, "link", "add", "c0", "link", "p0", "type", "ipvlan", "mode", "l2"],
            capture_output=True,
        )
        return res.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def leases(state_dir: Path) -> dict[str, list[str]]:
    """Every lease in the profile lease files under ``state_dir``."""
    out: dict[str, list[str]] = {}
    for p in state_dir.rglob("*"):
        if p.is_file():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                out.update(json.loads(p.read_text()).get("leases") or {})
    return out


async def test_profile_from_the_cloud_metadata_server(node: Node, nics: Nics, cloud_state: Path) -> None:
    kube = node.kube
    nic = nics.add("g", mac=GCE_MAC, addresses=["10.128.0.70/20"], mtu=1460)
    published = await wait_published(kube, nic)
    assert published[nic]["attributes"]["gce.dra.net/networkName"]["string"] == "default"
    params = {"interface": {"type": "IPVLAN", "name": "net1"}}
    kube.claim_and_pod("c-gce", kube.device_class("gce-nic"), on(nic), configs=[{"parameters": params}])
    uid = claim_uid(kube, "c-gce")
    ipvlan = kernel_has_ipvlan()
    if ipvlan:
        await kube.wait_phase("c-gce", within=RUNNING)
    else:
        # Without IPvlan in the kernel prepare still succeeds (the kubelet holds our answer), then
        # attach's RunPodSandbox hook cannot make the child: the sandbox fails, the kubelet retries it.
        await eventually(
            lambda: kubelet_prepared(node.cluster, uid) == [("node-a", nic, ["nic"])],
            RUNNING,
            "claim prepared",
        )
        event = await kube.wait_event("c-gce", "create ipvlan child net1", within=RUNNING)
        assert "Unknown device type" in event["message"], event["message"]
    (dc,) = await node.stored(uid)
    cfg = stored_config(dc)
    # The provider config named the profile; the profile gave the child an address.
    assert dc.profile == "gce-managed" and cfg["interface"]["type"] == "IPVLAN" and not dc.provisional
    (addr,) = cfg["interface"]["addresses"]
    assert addr.startswith("10.24.3."), addr
    # The lease is on disk, under the device and the claim.
    assert leases(cloud_state).get(f"{nic}/{uid}") == [addr]
    if ipvlan:
        # attach made the IPvlan child in the Pod; the parent stays on the node.
        assert link(await kube.pod_netns("c-gce"), "net1") is not None
    assert nics.on_node(nic)
    await delete_and_wait(kube, "c-gce")
    await gone_from_store(node, uid)
    await eventually(lambda: f"{nic}/{uid}" not in leases(cloud_state), 60, "the GCE lease released")
