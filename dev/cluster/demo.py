"""``make up --demo``: one Pod that claims the node's eth1 through dra.net.

Applies a DeviceClass, a ResourceClaim with a config (name net1, MTU 1400, an address) and a Pod;
waits until the real scheduler placed it and the kubelet runs it; finds the Pod's network namespace
and checks the NIC there (name, MTU, address) and that it reaches its peer on the host; reads the
claim's status.devices. The Pod keeps running; ``make up`` deletes it at stop and checks the NIC came
back to the node.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from dev.cluster.kube import KubeCluster

NETNS_DIR = Path("/var/run/netns")
CLAIM_CONFIG = {"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.168.101.10/24"]}}
SELECTOR = 'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName == "eth1"'


def _ip_json(*argv: str) -> Any:
    res = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True)
    return json.loads(res.stdout or "[]") if res.returncode == 0 else []


def find_pod_netns(ifname: str, address: str) -> str | None:
    for ns in sorted(NETNS_DIR.glob("*")):
        for link in _ip_json("-n", ns.name, "addr", "show", "dev", ifname):
            if any(a.get("local") == address.split("/")[0] for a in link.get("addr_info", [])):
                return ns.name
    return None


def _wait(what: str, within: float, check: Any) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {within:.0f}s")
        time.sleep(0.2)


def _run(c: KubeCluster) -> dict[str, Any]:
    api = c.api
    out: dict[str, Any] = {"ok": False}
    t0 = time.monotonic()

    def eth1_published() -> bool:
        slices = api.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
        return any(d["name"] == "eth1" for s in slices for d in (s["spec"].get("devices") or []))

    _wait("eth1 published in a ResourceSlice", 30, eth1_published)
    _wait(
        "the default ServiceAccount",
        30,
        lambda: api.exists("/api/v1/namespaces/default/serviceaccounts/default"),
    )
    api.create(
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "dranet-demo"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "dra.net"'}}]},
        },
    )
    api.create(
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
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
                                "selectors": [{"cel": {"expression": SELECTOR}}],
                            },
                        }
                    ],
                    "config": [{"opaque": {"driver": "dra.net", "parameters": CLAIM_CONFIG}}],
                }
            },
        },
    )
    api.create(
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "demo"},
            "spec": {
                "containers": [{"name": "app", "image": "local/pause:1", "imagePullPolicy": "Never"}],
                "resourceClaims": [{"name": "nic", "resourceClaimName": "demo-nic"}],
                "terminationGracePeriodSeconds": 5,
            },
        },
    )

    def running() -> bool:
        pod = api.get("/api/v1/namespaces/default/pods/demo")
        return bool((pod.get("status") or {}).get("phase") == "Running")

    _wait("the demo Pod running", 90, running)
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
        ping = subprocess.run(
            ["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", "192.168.101.1"], capture_output=True
        )
        out["ping_peer"] = ping.returncode == 0

    def claim_status() -> Any:
        claim = api.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/demo-nic")
        return (claim.get("status") or {}).get("devices")

    out["claim_status"] = _wait("the claim's status.devices", 30, claim_status)
    out["on_node_while_running"] = bool(_ip_json("-n", c.netns, "link", "show", "dev", "eth1"))
    itf = out.get("interface", {})
    out["ok"] = bool(
        ns
        and itf.get("mtu") == 1400
        and "192.168.101.10/24" in itf.get("addresses", [])
        and out.get("ping_peer")
        and not out["on_node_while_running"]
    )
    return out


def run(c: KubeCluster) -> dict[str, Any]:
    """Run the demo; a dict of what was seen, with ``ok``."""
    try:
        return _run(c)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
