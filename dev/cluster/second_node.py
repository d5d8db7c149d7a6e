"""A second node joining a running ``KubeCluster``: its own kubelet (root dir, node name,
certificate ``CN=system:node:<name>, O=system:nodes``, cgroup root), its own network namespace
with its own NICs and API link, and its own containerd, by default 2.x built from its Go module
(``dev/build-containerd.sh``, CONTAINERD2_VERSION in ``dev/versions.env``) while the first node
keeps Debian's 1.7. Development tooling: never in the image.

It is a ``KubeCluster`` without a control plane: the node's half of ``start()`` (namespace, link,
certificates, containerd, the kubelet in a private mount namespace with the sysctls it writes
bind-mounted over ``/proc/sys``, so the host keeps ``kernel.panic_on_oops=0``), the same
``stop()`` (Pods on this node deleted while its attach runs, the kubelet and containerd stopped,
mounts, cgroups, namespace and links removed, the host's sysctls checked), and the cluster's API
server, admin client and CA. The node's namespace reaches the API server on the first node's
``host_ip`` through a route over its own host link. A ``Driver(SecondNode(...))`` runs one set
of the four services for this node, as the DaemonSet does on every node.

    with KubeCluster(node_name="a") as a, SecondNode(a, node_name="b") as b:
        ...
"""

from __future__ import annotations

import os
from pathlib import Path

from dev.cluster.containerd import Containerd
from dev.cluster.kube import (
    SERVICE_IP,
    ClusterError,
    KubeCluster,
    containerd2_bin_dir,
    read_host_sysctls,
)


class SecondNode(KubeCluster):
    """See the module docstring. ``containerd_bin_dir=None`` runs containerd 2.x
    (``containerd2_bin_dir()``); pass the runtime cache's bin dir for a second 1.7 node."""

    def __init__(
        self,
        control: KubeCluster,
        node_name: str,
        state_dir: str | os.PathLike[str] | None = None,
        netns: str | None = None,
        containerd_bin_dir: Path | None = None,
    ) -> None:
        super().__init__(state_dir, node_name=node_name, netns=netns, kube_version=control.kube_version)
        self.control = control
        self.containerd_bin_dir = containerd_bin_dir or containerd2_bin_dir()
        self.kubeconfig = control.kubeconfig  # admin (kubectl, service identities)
        self._pods_selector = f"?fieldSelector=spec.nodeName={node_name}"

    @property
    def server(self) -> str:
        return self.control.server

    def start(self, timeout: float = 120.0) -> None:
        if not (self.containerd_bin_dir / "containerd").exists():
            raise ClusterError(
                f"{self.containerd_bin_dir / 'containerd'} is missing: run dev/build-containerd.sh (make setup)"
            )
        if self.control.rest is None:
            raise ClusterError("the control plane of a SecondNode must be started first")
        self.rest, self.api_port = self.control.rest, self.control.api_port
        self.host_sysctls = read_host_sysctls()
        for d in (self.state, self.logs, self.kubelet_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.net.create()
        self._record()
        self.net.route_to(self.control.net.host_ip)
        self.net.route_service(SERVICE_IP, self.api_port, self.control.net.host_ip)
        self.pki.adopt_ca(self.control.pki)  # its own certificates, signed by the cluster's CA
        self._make_node_certs()
        self.containerd = Containerd(
            self.state / "containerd", netns=self.net.netns, bin_dir=self.containerd_bin_dir
        )
        self.containerd.start(timeout=60)
        self._start_kubelet()
        self.wait_node_ready(timeout)
        self._check_host_sysctls()
