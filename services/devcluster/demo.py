"""``make up --demo``: one Pod that claims the node's eth1 through dra.net.

Applies a DeviceClass, a ResourceClaim with a config (name net1, MTU 1400, an
address) and a Pod; waits until the Pod runs; finds the Pod's network
namespace and checks the NIC there (name, MTU, address) and that it reaches
its peer on the host; deletes the Pod and checks the NIC is back on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

NETNS_DIR = Path("/var/run/netns")
CLAIM_CONFIG = {"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.168.101.10/24"]}}


def _ip_json(*argv: str) -> Any:
    res = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True)
    return json.loads(res.stdout or "[]") if res.returncode == 0 else []


def find_pod_netns(ifname: str, address: str) -> str | None:
    for ns in sorted(NETNS_DIR.glob("*")):
        for link in _ip_json("-n", ns.name, "addr", "show", "dev", ifname):
            if any(a.get("local") == address.split("/")[0] for a in link.get("addr_info", [])):
                return ns.name
    return None


async def _wait(what: str, within: float, check: Any) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {within:.0f}s")
        await asyncio.sleep(0.2)


async def _run(kubeconfig: str, node_netns: str) -> dict[str, Any]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        # Dict bodies, as the services send them (the models validate client-side).
        core: Any = client.CoreV1Api(api)
        res: Any = client.ResourceV1Api(api)
        out: dict[str, Any] = {"ok": False}
        t0 = time.monotonic()

        async def eth1_published() -> bool:
            slices = await res.list_resource_slice()
            return any(d.name == "eth1" for s in slices.items for d in (s.spec.devices or []))

        await _wait("eth1 published in a ResourceSlice", 30, eth1_published)
        await res.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "dranet-demo"},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "dra.net"'}}]},
            }
        )
        await res.create_namespaced_resource_claim(
            "default",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "demo-nic"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "nic",
                                "exactly": {
                                    "deviceClassName": "dranet-demo",
                                    "selectors": [
                                        {
                                            "cel": {
                                                "expression": 'device.attributes["dra.net"].ifName == "eth1"'
                                            }
                                        }
                                    ],
                                },
                            }
                        ],
                        "config": [{"opaque": {"driver": "dra.net", "parameters": CLAIM_CONFIG}}],
                    }
                },
            },
        )
        await core.create_namespaced_pod(
            "default",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "demo"},
                "spec": {
                    "containers": [{"name": "app", "image": "local/pause:1"}],
                    "resourceClaims": [{"name": "nic", "resourceClaimName": "demo-nic"}],
                },
            },
        )

        async def running() -> bool:
            pod = await core.read_namespaced_pod("demo", "default")
            return bool(pod.status and pod.status.phase == "Running")

        await _wait("the demo Pod running", 60, running)
        out["pod_running_s"] = round(time.monotonic() - t0, 2)
        ns = find_pod_netns("net1", "192.168.101.10")
        out["pod_netns"] = ns
        if ns:
            (link,) = _ip_json("-n", ns, "addr", "show", "dev", "net1")
            out["interface"] = {
                "name": link["ifname"],
                "mtu": link["mtu"],
                "addresses": [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])],
            }
            ping = await asyncio.to_thread(
                subprocess.run,
                ["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", "192.168.101.1"],
                capture_output=True,
            )
            out["ping_peer"] = ping.returncode == 0

        async def claim_status() -> Any:
            claim = await res.read_namespaced_resource_claim("demo-nic", "default")
            return claim.status.devices if claim.status and claim.status.devices else None

        devices = await _wait("the claim's status.devices", 15, claim_status)
        out["claim_status"] = [d.to_dict() for d in devices]
        await core.delete_namespaced_pod("demo", "default")

        async def gone() -> bool:
            try:
                await core.read_namespaced_pod("demo", "default")
            except ApiException as exc:
                return exc.status == 404
            return False

        await _wait("the demo Pod deleted", 90, gone)
        out["returned_to_node"] = bool(_ip_json("-n", node_netns, "link", "show", "dev", "eth1"))
        await res.delete_namespaced_resource_claim("demo-nic", "default")
        await res.delete_device_class("dranet-demo")
        itf = out.get("interface", {})
        out["ok"] = bool(
            ns
            and itf.get("mtu") == 1400
            and "192.168.101.10/24" in itf.get("addresses", [])
            and out.get("ping_peer")
            and out["returned_to_node"]
        )
        return out


def run(kubeconfig: str, node_netns: str) -> dict[str, Any]:
    """Run the demo; a dict of what was seen, with ``ok``."""
    try:
        return asyncio.run(_run(kubeconfig, node_netns))
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


async def _delete_all_pods(kubeconfig: str, within: float) -> int:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        core: Any = client.CoreV1Api(api)
        pods = (await core.list_pod_for_all_namespaces()).items
        for pod in pods:
            with contextlib.suppress(ApiException):
                await core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)

        async def none_left() -> bool:
            return not (await core.list_pod_for_all_namespaces()).items

        if pods:
            await _wait("every Pod stopped and deleted", within, none_left)
        return len(pods)


def delete_all_pods(kubeconfig: str, within: float = 60.0) -> int:
    """Delete every Pod and wait until the kubelet stopped and removed them."""
    return asyncio.run(_delete_all_pods(kubeconfig, within))
