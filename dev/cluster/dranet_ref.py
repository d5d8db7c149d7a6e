"""dranet itself (the Go driver we re-implement, built by dev/build-dranet.sh) as a host process
beside a ``KubeCluster``, run the way ``dev.cluster.driver.Driver`` runs our four services: in
the node's network namespace (where the NICs are), on the kubelet's root dir, on containerd's
NRI socket, with a ServiceAccount token of its own. A test oracle and benchmark peer only.

Both drivers are ``dra.net``: one serves the node at a time. dranet has no flag for the NRI
socket (it dials ``/var/run/nri/nri.sock``), so it runs in a mount namespace of its own where
``/run`` is a small tmpfs holding the host's ``/run/netns`` (the Pods' namespaces, by the paths
NRI names) and the test containerd's NRI socket directory at ``/run/nri``; the host's ``/run``
is not touched. It never probes cloud metadata (``--cloud-provider-hint=NONE``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

from dev.cluster.driver import FILTER
from dev.cluster.kube import KubeCluster

CACHE = Path(os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev"))
VERSIONS = Path(__file__).resolve().parents[1] / "versions.env"
SERVICE = "reference"  # ServiceAccount dranet-reference

# The mounts described above, then dranet: "$1" the work dir, "$2" the NRI socket directory.
MOUNT_SCRIPT = r"""
set -eu
w=$1 nri=$2
shift 2
mkdir -p "$w/hostrun"
mount --rbind /run "$w/hostrun"
mount -t tmpfs -o mode=0755,size=4m dranet-ref-run /run
mkdir -p /run/netns /run/nri /run/dranet
mount --rbind "$w/hostrun/netns" /run/netns
mount --bind "$nri" /run/nri
umount -l "$w/hostrun"
exec "$@"
"""


def version() -> str:
    m = re.search(r"^DRANET_VERSION=(\S+)", VERSIONS.read_text(), re.M)
    if not m:
        raise RuntimeError(f"{VERSIONS}: no DRANET_VERSION")
    return m.group(1)


def binary() -> Path | None:
    """The cached dranet binary of the pinned commit, or None if dev/build-dranet.sh has not run."""
    path = CACHE / f"dranet-{version()}" / "bin" / "dranet"
    return path if os.access(path, os.X_OK) else None


def rbac(namespace: str = "kube-system") -> str:
    """What dranet's own install manifest grants it: slices, claims and their status, nodes,
    events (the kubelet plugin library reads claims by name; the slice controller watches)."""
    sa = f"dranet-{SERVICE}"
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "deviceclasses"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/status"],
            "verbs": ["patch", "update"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": ["dra.net"],
            "verbs": ["associated-node:patch", "associated-node:update"],
        },
    ]
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": sa},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    ]
    return yaml.safe_dump_all(docs)


class DranetRef:
    """``start()``, ``stop()``, ``pid``, ``log()``: dranet serving the cluster's node."""

    def __init__(
        self, cluster: KubeCluster, extra_args: list[str] | None = None, workdir: Path | None = None
    ):
        self.cluster = cluster
        self.workdir = workdir or cluster.state / f"dranet-ref-{secrets.token_hex(3)}"
        self.log_path = self.workdir / "dranet.log"
        self.extra = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, exe: Path, kubeconfig: Path) -> list[str]:
        c = self.cluster
        assert c.containerd is not None
        return [
            "ip", "netns", "exec", c.netns,
            "unshare", "--mount", "--propagation", "slave",
            "sh", "-c", MOUNT_SCRIPT, "dranet-ref", str(self.workdir), str(c.containerd.nri_socket.parent),
            str(exe),
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={c.node_name}",
            f"--kubelet-root-dir={c.kubelet_dir}",
            f"--db-path={self.workdir / 'dranet.db'}",
            "--bind-address=127.0.0.1:9177",
            "--cloud-provider-hint=NONE",
            "--profile-provider=none",
            f"--filter={FILTER}",
            "--inventory-min-poll-interval=200ms",
            "-v=2",
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 60.0) -> DranetRef:
        exe = binary()
        if exe is None:
            raise FileNotFoundError(f"no dranet binary under {CACHE}: run dev/build-dranet.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.cluster.service_identity(SERVICE, rbac=rbac())
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(exe, kubeconfig), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        # "driver started" comes after the kubelet registration and the NRI connection.
        deadline = time.monotonic() + timeout
        while "driver started" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {self.proc.returncode}" if self.proc.poll() is not None else "timed out"
                self.stop()
                raise RuntimeError(f"dranet did not start ({why}):\n{self.log()[-4000:]}")
            time.sleep(0.1)
        return self

    @property
    def pid(self) -> int:
        """The dranet process itself (the sh of the mount script exec()s into it)."""
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-40000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 40.0, remove: bool = False) -> None:
        """SIGTERM and wait (its graceful stop waits for NRI to go quiet; delete Pods first),
        SIGKILL after ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if remove:
            shutil.rmtree(self.workdir, ignore_errors=True)
