"""The driver as operators run it: the product image imported into the node's containerd and
charts/dranet installed by a real Helm engine (Helm v4's Go SDK through helm-python-sdk; no
``kubectl apply`` of rendered YAML). Development tooling: never in the image.

``Installed(cluster)`` holds what the harness sets for this host: host paths under the cluster's
state directory (nothing of the host's own /var/lib/dranet is used), the kubelet root dir and the
NRI socket of the cluster's containerd, the development filter (the node namespace's API link,
CNI bridge and pod veths are no NICs). ``install()``, ``upgrade(values)``, ``wait_ready()``,
``pod()``, ``uninstall()``; the methods block.
"""

from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path
from typing import Any

from dev.cluster.driver import FILTER
from dev.cluster.kube import ClusterError, KubeCluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "dranet"
RELEASE = "dranet"
NAMESPACE = "kube-system"
CONTAINERS = ("store", "inventory", "prepare", "attach")
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Installed:
    """charts/dranet installed on ``cluster`` (see the module docstring)."""

    def __init__(self, cluster: KubeCluster, image: str | None = None) -> None:
        self.cluster = cluster
        self.image = image  # a reference containerd knows; None: build and import the product image
        self.node_dir = cluster.state / "node"
        self.values: dict[str, Any] = {}
        self.built: Any = None  # dev.image.build.BuiltImage, when this run built or reused it
        self.started = 0.0
        self.installed_s = 0.0

    # -- values -------------------------------------------------------------------------------------

    def base_values(self, image: str) -> dict[str, Any]:
        assert self.cluster.containerd is not None, "cluster not started"
        repo, _, tag = image.rpartition(":")
        return {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "kubeletRootDir": str(self.cluster.kubelet_dir),
            "hostPaths": {
                "runDir": str(self.node_dir / "run"),
                "storeDir": str(self.node_dir / "store"),
                "inventoryStateDir": str(self.node_dir / "inventory"),
                "nriDir": str(self.cluster.containerd.nri_socket.parent),
                "devInfiniband": "",
                # /var/run is a symlink to /run here, and / is a private mount: containerd checks
                # the propagation of the path as written, and only /run/netns is a (shared) mount.
                "netnsDir": "/run/netns",
                # Bidirectional propagation needs a shared mount: the kubelet's root dir is one
                # here (and the cluster's stop unmounts everything below it).
                "netnsPinDir": str(self.cluster.kubelet_dir / "dranet-netns"),
            },
            "inventory": {"filter": FILTER, "cloudProviderHint": "NONE", "logLevel": "DEBUG"},
            "prepare": {"logLevel": "DEBUG"},
            "attach": {"logLevel": "DEBUG"},
            "store": {"logLevel": "DEBUG"},
            # The node here has one CPU's worth of room for everything: no requests to fit.
            "priorityClassName": "system-node-critical",
        }

    def _config(self) -> Any:
        import helm_python as helm  # loads the Helm engine (a shared library): only when asked

        return helm.Config(kubeconfig_path=str(self.cluster.kubeconfig), namespace=NAMESPACE)

    # -- life cycle ---------------------------------------------------------------------------------

    def ensure_image(self) -> str:
        if self.image is None:
            from dev.image import build as image_build

            built = image_build.build()
            assert self.cluster.containerd is not None
            self.built = built
            self.image = image_build.import_image(built.archive, self.cluster.containerd.grpc_socket)
        return self.image

    def tag_image(self, new: str) -> str:
        """Another name for the imported image in the node's containerd (what a new release
        pushed to a registry looks like to a rollout); returns it."""
        from dev.cluster.cri_install import RuntimeCache

        assert self.cluster.containerd is not None and self.image is not None
        ctr = RuntimeCache.default().ctr
        sock = str(self.cluster.containerd.grpc_socket)
        subprocess.run(
            [str(ctr), "--address", sock, "-n", "k8s.io", "images", "tag", "--force", self.image, new],
            check=True,
            capture_output=True,
        )
        return new

    def install(self, values: dict[str, Any] | None = None, timeout: float = 180.0) -> float:
        """helm install into kube-system and wait until the pod's four containers are Ready;
        returns the seconds from the install call to Ready."""
        image = self.ensure_image()
        for d in ("run", "store", "inventory"):
            (self.node_dir / d).mkdir(parents=True, exist_ok=True)
        self.values = _merge(self.base_values(image), values or {})
        self.started = time.monotonic()
        with self._config() as cfg:
            cfg.install(str(CHART), RELEASE, self.values, namespace=NAMESPACE, timeout=int(timeout))
        self.wait_ready(timeout)
        self.installed_s = time.monotonic() - self.started
        return self.installed_s

    def upgrade(self, values: dict[str, Any], timeout: float = 180.0) -> None:
        """helm upgrade with ``values`` merged over the current ones (no wait: callers watch)."""
        new = _merge(self.values, values)
        with self._config() as cfg:
            cfg.upgrade(str(CHART), RELEASE, new, namespace=NAMESPACE, timeout=int(timeout))
        self.values = new

    def uninstall(self, timeout: float = 90.0) -> None:
        with self._config() as cfg:
            cfg.uninstall(RELEASE, ignore_not_found=True, timeout=int(timeout))
        deadline = time.monotonic() + timeout
        while self.pods() and time.monotonic() < deadline:
            time.sleep(0.5)

    # -- state --------------------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")
        return list(out["items"])

    def pod(self) -> dict[str, Any] | None:
        """The driver pod that is not terminating, if any."""
        live = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        return live[0] if live else None

    @staticmethod
    def ready(pod: dict[str, Any] | None) -> dict[str, bool]:
        """Each container's Ready (the store is an init container: a sidecar)."""
        if pod is None:
            return {}
        st = pod.get("status", {})
        found = st.get("initContainerStatuses", []) + st.get("containerStatuses", [])
        return {c["name"]: bool(c.get("ready")) for c in found}

    def wait_ready(self, timeout: float = 180.0, uid_not: str | None = None) -> dict[str, Any]:
        """Until a driver pod (other than ``uid_not``) has its four containers Ready."""
        deadline = time.monotonic() + timeout
        pod = None
        while time.monotonic() < deadline:
            pod = self.pod()
            if pod is not None and pod["metadata"]["uid"] != uid_not:
                r = self.ready(pod)
                if all(r.get(c) for c in CONTAINERS):
                    return pod
            time.sleep(0.25)
        raise ClusterError(f"driver pod not Ready in {timeout}s: {self.ready(pod)}\n{self.logs(pod)}")

    def logs(self, pod: dict[str, Any] | None, tail: int = 40) -> str:
        if pod is None:
            return "(no driver pod)"
        name = pod["metadata"]["name"]
        out = []
        for c in CONTAINERS:
            text = self.cluster.kubectl("-n", NAMESPACE, "logs", name, "-c", c, f"--tail={tail}", check=False)
            out.append(f"--- {c} ---\n{text}")
        return "\n".join(out)
