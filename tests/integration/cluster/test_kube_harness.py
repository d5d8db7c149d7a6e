"""The real-cluster harness itself (dev/cluster/kube.py): a KubeCluster of its own, not the
session's, started with a Pod and a NIC, then stopped; it must leave nothing behind. No process
of its binaries (checked by pid), no mount under its state dir, its netns and links gone, its
cgroup dirs gone, its own state dir removed, the host's sysctls the kubelet writes unchanged (also
while the kubelet runs), and /var/log/containers and /var/lib/kubelet as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from dev.cluster import containerd as ctrd
from dev.cluster.kube import CACHE, CONTAINER_LOGS, VAR_LIB_KUBELET, KubeCluster
from tests.support.kube import Kube, nic_name

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.cluster]

SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom")
# What the kubelet sets (pkg/kubelet/cm setupKernelTunables) when it does not protect defaults.
KUBELET_WANTS = {"kernel/panic": "10", "kernel/panic_on_oops": "1", "vm/overcommit_memory": "1"}


def host_sysctls() -> dict[str, str]:
    return {n: Path("/proc/sys", n).read_text().strip() for n in SYSCTLS}


def seen_by(pid: int) -> dict[str, str]:
    """The sysctl files as the process ``pid`` sees them, through its mount namespace."""
    return {n: Path(f"/proc/{pid}/root/proc/sys", n).read_text().strip() for n in SYSCTLS}


def alive(pid: int) -> bool:
    """``pid`` runs (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def mounts_under(path: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4]
        if mnt == str(path) or mnt.startswith(f"{path}/"):
            out.append(mnt)
    return out


def container_logs() -> set[str]:
    return {p.name for p in CONTAINER_LOGS.iterdir()} if CONTAINER_LOGS.is_dir() else set()


def links_into(state: Path) -> list[str]:
    """Entries of /var/log/containers that point into ``state``."""
    if not CONTAINER_LOGS.is_dir():
        return []
    return [
        p.name for p in CONTAINER_LOGS.iterdir() if p.is_symlink() and os.readlink(p).startswith(str(state))
    ]


def other_kubelets(mine: set[int]) -> list[int]:
    """Kubelets of other clusters on this host, of any version (they may make
    /var/log/containers entries)."""

    def is_kubelet(path: str) -> bool:
        return Path(path).name == "kubelet" and path.startswith(f"{CACHE}/")

    return [
        int(d.name)
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and int(d.name) not in mine and is_kubelet(exe(int(d.name)))
    ]


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {n["name"] for n in json.loads(out or "[]")}


def host_link(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def test_cluster_starts_runs_a_pod_and_leaves_nothing_behind() -> None:
    sysctls_before = host_sysctls()
    logs_existed, logs_before = CONTAINER_LOGS.is_dir(), container_logs()
    var_lib_kubelet_existed = VAR_LIB_KUBELET.exists()
    c = KubeCluster(node_name="harness-node")
    pids: dict[str, int] = {}
    try:
        c.start()
        # Node Ready: the kubelet wrote its sysctls by now, into files of its own.
        kubelet_pid = c.procs["kubelet"].popen.pid  # type: ignore[union-attr]
        assert exe(kubelet_pid) == str(c.bin("kubelet"))
        assert host_sysctls() == sysctls_before
        kubelet_view = seen_by(kubelet_pid)
        for name, value in KUBELET_WANTS.items():
            assert kubelet_view[name] == value, (name, kubelet_view, sysctls_before)

        # A Pod and a NIC: pod netns, sandbox mounts, container log links, pod cgroups, shims.
        nic = nic_name("h")
        peer = c.net.add_nic(nic)
        assert host_link(peer) and host_link(c.net.host_link)
        k = Kube(c, "harness")
        k.create_namespace()
        k.pod("p")
        deadline = time.monotonic() + 180
        while ((k.get_pod("p") or {}).get("status") or {}).get("phase") != "Running":
            assert time.monotonic() < deadline, k.events("p")
            time.sleep(0.2)
        pod_netns = asyncio.run(k.pod_netns("p"))
        assert pod_netns in netns_names()
        assert links_into(c.state), sorted(container_logs())
        assert mounts_under(c.state), "no mount under the state dir while the Pod runs"
        cgroups = [Path(d) for d in Path("/sys/fs/cgroup").glob(f"*/{c.cgroup_name}")]
        assert cgroups and any(len(list(d.rglob("cgroup.procs"))) > 1 for d in cgroups), cgroups
        assert c.containerd is not None and c.containerd.pid is not None
        pids = {name: p.popen.pid for name, p in c.procs.items() if p.popen is not None}
        pids["containerd"] = c.containerd.pid
        shims = ctrd._shim_pids(c.containerd.grpc_socket)
        assert shims, "no containerd shim for the running Pod"
        pids.update({f"shim-{p}": p for p in shims})
        exes = {name: exe(pid) for name, pid in pids.items()}
        assert all(exes.values()), exes
        assert host_sysctls() == sysctls_before
        state, netns, api_link = c.state, c.netns, c.net.host_link
    finally:
        c.stop()

    left = {name: pid for name, pid in pids.items() if alive(pid) and exe(pid) == exes[name]}
    assert left == {}, left
    assert mounts_under(state) == []
    assert not state.exists(), "the cluster made its state dir and did not remove it"
    assert netns not in netns_names() and pod_netns not in netns_names()
    assert not host_link(api_link) and not host_link(peer)
    assert [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{c.cgroup_name}")] == []
    assert host_sysctls() == sysctls_before
    assert links_into(state) == []
    # /var/log/containers as before: what was there stays unless another cluster's kubelet
    # removed its own links; a directory this cluster made is gone again.
    if not logs_existed and not other_kubelets(set(pids.values())):
        assert not CONTAINER_LOGS.exists(), sorted(container_logs())
    if not other_kubelets(set(pids.values())):
        assert container_logs() == logs_before
        # The kubelet's one fixed host path (device-plugins/kubelet.sock) goes with the last one.
        assert VAR_LIB_KUBELET.exists() == var_lib_kubelet_existed
