"""The whole dev cluster for end-to-end tests with a real runtime: a private
containerd with NRI, the API server double and allocator, the kubelet emulator,
and dranet's four services as real processes, the node being a network
namespace that holds veth "NICs" (inventory and attach run inside it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from services.devcluster.kubelet import Kubelet
from services.devcluster.kubelet_api import KubeApi

from dev.cluster.containerd import Containerd
from dev.cluster.cri import CriClient
from dev.cluster.procs import ServiceProcess
from tests.integration.attach import attach_env as env
from tests.support.stack import NodeStack, bounded, sh

ALL_DEVICES = 'device.driver == "dra.net"'


def on(name: str) -> str:
    return f'device.driver == "dra.net" && device.attributes["dra.net"].ifName == "{name}"'


@dataclass
class Peer:
    """The far end of a node NIC, in a netns of its own, with an address."""

    netns: str
    name: str
    ip: str
    mac: str


@dataclass
class Cluster:
    node: NodeStack
    ctrd: Containerd
    kubelet: Kubelet
    attach: ServiceProcess

    def add_nic(self, name: str, subnet: int) -> Peer:
        peer_link = self.node.add_nic(name)
        peer_ns = f"{self.node.netns}-p{subnet}"
        sh("ip", "netns", "add", peer_ns)
        sh("ip", "link", "set", peer_link, "netns", peer_ns)
        sh("ip", "-n", peer_ns, "addr", "add", f"10.77.{subnet}.1/24", "dev", peer_link)
        sh("ip", "-n", peer_ns, "link", "set", peer_link, "up")
        mac = json.loads(sh("ip", "-j", "-n", peer_ns, "link", "show", peer_link).stdout)[0]["address"]
        return Peer(peer_ns, peer_link, f"10.77.{subnet}.1", mac)

    def node_link(self, name: str) -> dict[str, Any] | None:
        res = sh("ip", "-j", "-n", self.node.netns, "link", "show", name, check=False)
        return json.loads(res.stdout)[0] if res.returncode == 0 else None

    async def claim_status(self, name: str) -> dict[str, Any]:
        resp = await self.node.resource.read_namespaced_resource_claim(
            name, "default", _preload_content=False
        )
        status: dict[str, Any] = json.loads(await resp.read()).get("status") or {}
        return status


@pytest.fixture
async def cluster(containerd_private: Containerd) -> AsyncIterator[Cluster]:
    ctrd = containerd_private
    node = NodeStack(inventory_args=["--filter", ""])
    kubelet: Kubelet | None = None
    api: KubeApi | None = None
    try:
        await node.start()
        # The node's layout: its run dir is <workdir>/run.
        attach = env.attach_process(node.workdir, ctrd.nri_socket, netns=node.netns)
        node.procs["attach"] = attach
        await asyncio.to_thread(attach.start)
        assert node.store is not None
        await env.wait_liveness(node.store, connected=True)
        assert node.api is not None
        api = await KubeApi.from_kubeconfig(node.api.kubeconfig_path)
        cri = CriClient(ctrd.grpc_socket)
        kubelet = Kubelet(
            node.node_name,
            node.kubelet_dir,
            cri,
            api=api,
            backoff_initial=0.2,
            backoff_max=1.0,
            wipe_slices=False,
            on_netns=ctrd.note_netns,
        )
        await kubelet.start()
        c = Cluster(node, ctrd, kubelet, attach)
        yield c
        # Pods go while attach runs, so the NICs come back to the node.
        await asyncio.to_thread(ctrd.remove_all_pods)
    except BaseException:
        print(node.logs())
        raise
    finally:
        if kubelet is not None:
            await bounded("kubelet emulator", kubelet.stop())
            await bounded("CRI client", kubelet.runtime.close())
        if api is not None:
            await bounded("kubelet API client", api.close())
        await node.stop()
        for i in range(4):
            sh("ip", "netns", "del", f"{node.netns}-p{i}", check=False)
