"""The README's first command, as a process: ``python -m dev.cluster up --demo`` starts a real
single-node Kubernetes (etcd, API server, controller-manager, scheduler, containerd with NRI, the
kubelet) and dranet's four services on this host; the demo Pod gets its NIC (name, MTU, address,
reaching its peer), the claim status shows it, and at stop the NICs are back on the node and
nothing of the run is left: no process, mount, network namespace or link.

It runs beside the session's cluster, which serves a Pod with a NIC all along: two clusters on one
host must not disturb each other.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dev.cluster.containerd import CLAIMS_DIR
from dev.cluster.kube import selected_kube_version
from tests.e2e.conftest import Node
from tests.support.kube import Kube, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

REPO = Path(__file__).resolve().parents[2]


def sh_out(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True).stdout


def ip_links() -> list[dict[str, Any]]:
    return list(json.loads(sh_out("ip", "-j", "link", "show") or "[]"))


def processes_mentioning(path: str) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd:
            found.append(f"{d.name}: {cmd[:200]}")
    return found


def mounts_under(path: str) -> list[str]:
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == path or line.split()[4].startswith(path + "/")
    ]


def published(k: Kube) -> set[str]:
    """Device names over the node's ResourceSlices (a slice with no devices has ``devices: null``)."""
    items = k.api.get(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={k.c.node_name}")[
        "items"
    ]
    return {d["name"] for s in items for d in s["spec"].get("devices") or []}


class Watcher(threading.Thread):
    """While ``make up`` runs: the host links that belong to its cluster (the veths whose other
    end is in its node netns; its containerd's bridge, were it on the host) and its
    containerd's claim record, so the test can check afterwards that all of them went."""

    def __init__(self, netns: str, state: Path) -> None:
        super().__init__(daemon=True)
        self.netns, self.state = netns, state
        self.links: set[str] = set()
        self.bridges: set[str] = set()
        self.claims: set[Path] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.poll()
            self.done.wait(0.2)

    def poll(self) -> None:
        for f in CLAIMS_DIR.glob("[0-9]*"):
            try:
                rec = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if str(rec.get("workdir", "")).startswith(str(self.state)):
                self.claims.add(f)
                self.bridges.add(rec["bridge"])
        # ip -j names a peer's netns by id only (link_netnsid); `ip netns list` maps names to ids.
        ids = {n["name"]: n.get("id") for n in json.loads(sh_out("ip", "-j", "netns", "list") or "[]")}
        nsid = ids.get(self.netns)
        for ln in ip_links():
            if nsid is not None and ln.get("link_netnsid") == nsid:
                self.links.add(ln["ifname"])
            if ln.get("master") in self.bridges:
                self.links.add(ln["ifname"])


def test_up_runs_the_demo_and_stops_cleanly(node: Node, tmp_path: Path) -> None:
    k, c = node.kube, node.cluster
    # The session's cluster serves a Pod with a NIC while `make up` runs its own cluster.
    mine = nic_name()
    c.net.add_nic(mine)
    try:
        deadline = time.monotonic() + 60
        while mine not in published(k):
            assert time.monotonic() < deadline, f"{mine} not published"
            time.sleep(0.2)
        k.claim_and_pod("beside", k.device_class("nic"), on(mine))
        deadline = time.monotonic() + 180
        while ((k.get_pod("beside") or {}).get("status") or {}).get("phase") != "Running":
            assert time.monotonic() < deadline, k.events("beside")
            time.sleep(0.2)

        netns = f"dranet-e2e-up-{secrets.token_hex(2)}"
        state = tmp_path / "up"
        watcher = Watcher(netns, state)
        watcher.start()
        try:
            res = subprocess.run(
                [
                    sys.executable, "-m", "dev.cluster", "up", "--demo", "--exit-after", "1",
                    "--state-dir", str(state), "--netns", netns,
                ],
                cwd=REPO, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        finally:
            watcher.done.set()
            watcher.join(5)
        lines = res.stdout.splitlines()
        tail = "\n".join(lines[-40:]) + res.stderr[-3000:]
        ready = [json.loads(line) for line in lines if line.startswith('{"ready"')]
        demo = [json.loads(line)["demo"] for line in lines if line.startswith('{"demo"')]
        stopped = [json.loads(line) for line in lines if line.startswith('{"stopped"')]
        assert res.returncode == 0, tail
        assert ready and ready[0]["nics"] == ["eth1", "eth2"] and ready[0]["node_netns"] == netns, tail
        assert ready[0]["kubernetes"] == selected_kube_version(), ready
        assert demo and demo[0]["ok"] is True, json.dumps(demo, indent=1) + tail
        d = demo[0]
        assert d["interface"]["name"] == "net1" and d["interface"]["mtu"] == 1400
        assert "192.168.101.10/24" in d["interface"]["addresses"] and d["ping_peer"] is True
        assert d["on_node_while_running"] is False
        (status,) = d["claim_status"]
        assert (status["driver"], status["device"]) == ("dra.net", "eth1")
        assert status["networkData"]["interfaceName"] == "net1"
        assert "192.168.101.10/24" in status["networkData"]["ips"]
        assert {x["type"]: x["status"] for x in status["conditions"]}["Ready"] == "True"
        assert stopped == [{"stopped": True, "nics_on_node": ["eth1", "eth2"]}], tail
        assert lines[-1].startswith("[up ") and lines[-1].endswith("] stopped"), tail

        # Nothing left behind: the node netns, its links, the bridge and the Pod's veth, any
        # process or mount of the run.
        assert watcher.links and watcher.bridges, "the watcher saw none of the run's links"
        # The node's API link and both NICs' host ends (containerd's bridge and the Pods' veths
        # are in the node's namespace, which went as a whole: checked below).
        assert len([n for n in watcher.links if n.startswith("dp")]) == 2, watcher.links
        assert [n for n in watcher.links if n.startswith("dk")], watcher.links
        now = {ln["ifname"] for ln in ip_links()}
        assert not (watcher.links | watcher.bridges) & now, (watcher.links | watcher.bridges) & now
        assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [f for f in watcher.claims if f.exists()]
        assert processes_mentioning(str(state)) == []
        assert mounts_under(str(state)) == []

        # The session's cluster did not notice.
        for name, p in c.procs.items():
            assert p.alive(), f"the session's {name} died"
        c.wait_node_ready(30)
        pod = k.get_pod("beside")
        assert pod is not None and pod["status"]["phase"] == "Running"
        assert link(c.netns, mine) is None  # still in the Pod
        k.delete_pod("beside")
        deadline = time.monotonic() + 120
        while link(c.netns, mine) is None:
            assert time.monotonic() < deadline, f"{mine} did not come back"
            time.sleep(0.2)
    finally:
        k.delete_namespace()
        subprocess.run(["ip", "-n", c.netns, "link", "del", mine], capture_output=True)


def test_watcher_sees_a_link_into_a_netns() -> None:
    """The leak check above relies on ``ip -j`` naming the netns a veth's peer is in."""
    ns, name = f"dw-{secrets.token_hex(2)}", f"dw{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "link", "add", name, "type", "veth", "peer", "name", "inner", "netns", ns], check=True
        )
        w = Watcher(ns, Path("/nonexistent"))
        w.poll()
        assert w.links == {name}
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", name], capture_output=True)
