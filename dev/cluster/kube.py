"""A real single-node Kubernetes on this host: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, a private containerd with NRI, and the kubelet, all built from upstream Go modules
(``dev/build-kube.sh``, versions in ``dev/versions.env``). Development tooling: never in the image.

Layout of one cluster (``KubeCluster(state_dir)``):

- The node's devices live in a network namespace of their own (``node_netns``) holding veth
  "NICs"; the inventory and attach run inside it, as in the DaemonSet pod (hostNetwork) on a node.
  A veth pair links it to the host; the host end's address (from the benchmarking range, never
  routed anywhere) is where the API server and the kubelet listen and the Node's InternalIP, so no
  traffic of the cluster leaves this machine and the host's uplink is never involved.
- Certificates and keys are made at start with openssl (a CA, the API server's serving certificate,
  client certificates per component, the node's with ``O=system:nodes`` so the Node authorizer and
  NodeRestriction apply, a service-account key pair).
- The kubelet runs in a private mount namespace in which the sysctls it writes at start
  (``kernel.panic_on_oops=1``, ``kernel.panic=10``, ``vm.overcommit_memory=1``, ...) are ordinary
  files bind-mounted over ``/proc/sys``: the host keeps its own values (an oops must never reboot
  this machine). Its root directory is a shared bind mount, so the volumes it mounts there reach
  containerd in the host's mount namespace.
- ``stop()`` undoes everything in reverse order: Pods are deleted while attach still runs, then the
  kubelet, containerd, the controllers, the API server and etcd stop; kubelet mounts, the pods'
  cgroups, network namespaces and links are removed, and the host's sysctls are checked unchanged.

The methods block (subprocesses, polling); asyncio callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.cluster.containerd import Containerd

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "dev"
CACHE = Path(os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev"))

# The sysctls the kubelet writes at start (pkg/kubelet/cm: setupKernelTunables) and the host keeps.
KUBELET_SYSCTLS = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# The API links of clusters on this host take a /30 from here: part of the benchmarking range
# (RFC 2544), which real networks never route; the containerd pod subnets use the lower part.
LINK_RANGE = ipaddress.IPv4Network("198.19.192.0/18")
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the ``kubernetes`` Service: the first address of SERVICE_CIDR
# The kubelet links every container's log here (a path it does not let one configure).
CONTAINER_LOGS = Path("/var/log/containers")
LOCK_DIR = Path("/run/dranet-dev")
VAR_LIB_KUBELET = Path("/var/lib/kubelet")  # allocated from, never routed: there is no kube-proxy here


class ClusterError(RuntimeError):
    """A component did not build, start or become ready; the message names it and its log."""


# Alpha control-plane feature gates the harness turns on where the version has them, because
# tests use the API fields they guard: name -> (first minor that has the gate, first minor that no
# longer accepts it, or None). Each is read in kube-apiserver (fields kept, validation) and
# kube-scheduler (CEL environment, allocation); the kubelet and the controllers do not need them.
CONTROL_PLANE_GATES: dict[str, tuple[int, int | None]] = {
    # KEP 5491: ResourceSlice attributes with list values (ints, bools, strings, versions),
    # includes() in CEL, matchAttribute on lists. Alpha in 1.36 and 1.37.
    "DRAListTypeAttributes": (36, None),
}


def versions() -> dict[str, str]:
    """``dev/versions.env`` as a dict (KUBE_VERSION, KUBE_VERSIONS, ETCD_VERSION, ...); a list
    value (``KUBE_VERSIONS="a b"``) is one space-separated string."""
    out: dict[str, str] = {}
    for line in (DEV / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = " ".join(shlex.split(v)) if v else ""
    return out


def selected_kube_version() -> str:
    """The Kubernetes version the harness runs: ``$DRANET_KUBE_VERSION`` if set (one that
    ``dev/build-kube.sh`` built, e.g. KUBE_VERSION_NEXT), else the pinned KUBE_VERSION."""
    return os.environ.get("DRANET_KUBE_VERSION") or versions()["KUBE_VERSION"]


def kube_minor(version: str) -> int:
    """``v1.37.2`` -> 37."""
    major, minor = version.lstrip("v").split(".")[:2]
    if major != "1":
        raise ClusterError(f"unexpected Kubernetes version {version!r}")
    return int(minor)


def control_plane_gates(version: str) -> dict[str, bool]:
    """The gates of CONTROL_PLANE_GATES that ``version`` has, all on."""
    minor = kube_minor(version)
    return {
        g: True
        for g, (since, until) in CONTROL_PLANE_GATES.items()
        if minor >= since and (until is None or minor < until)
    }


def kube_bin(name: str, version: str | None = None) -> Path:
    return CACHE / f"kube-{version or selected_kube_version()}" / "bin" / name


def containerd2_bin_dir(version: str | None = None) -> Path:
    """Where ``dev/build-containerd.sh`` put containerd 2.x (default CONTAINERD2_VERSION)."""
    return CACHE / f"containerd-{version or versions()['CONTAINERD2_VERSION']}" / "bin"


def etcd_bin() -> Path:
    return CACHE / f"etcd-{versions()['ETCD_VERSION']}" / "bin" / "etcd"


def build(version: str | None = None) -> None:
    """Build whatever of etcd and one Kubernetes version (default: the selected one) is not
    cached yet (prints progress)."""
    subprocess.run([str(DEV / "build-kube.sh"), str(CACHE), version or selected_kube_version()], check=True)


def sh(*argv: str, check: bool = True, netns: str | None = None) -> str:
    if netns:
        argv = ("ip", "netns", "exec", netns, *argv)
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def read_host_sysctls() -> dict[str, str]:
    out = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = Path("/proc/sys", name).read_text().strip()
    return out


# ----------------------------------------------------------------------------------------------
# Certificates


class Pki:
    """openssl-made keys and certificates in ``dir``: ``ca``, ``apiserver`` (serving), client
    certificates by name, and the service-account key pair ``sa.key``/``sa.pub``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_crt = self.dir / "ca.crt"
        self.ca_key = self.dir / "ca.key"

    def _openssl(self, *args: str, stdin: str | None = None) -> None:
        res = subprocess.run(["openssl", *args], capture_output=True, text=True, input=stdin, cwd=self.dir)
        if res.returncode != 0:
            raise ClusterError(f"openssl {' '.join(args)}: {res.stderr.strip()}")

    def make_ca(self) -> None:
        self._openssl("genrsa", "-out", str(self.ca_key), "2048")
        self._openssl(
            "req", "-x509", "-new", "-key", str(self.ca_key), "-subj", "/CN=dranet-dev-ca",
            "-days", "3650", "-out", str(self.ca_crt),
        )  # fmt: skip
        self._openssl("genrsa", "-out", str(self.dir / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(self.dir / "sa.key"), "-pubout", "-out", str(self.dir / "sa.pub"))

    def adopt_ca(self, other: Pki) -> None:
        """Sign with ``other``'s CA (a node joining that cluster): its key and certificate copied."""
        for src, dst in ((other.ca_crt, self.ca_crt), (other.ca_key, self.ca_key)):
            shutil.copyfile(src, dst)
        self.ca_key.chmod(0o600)

    def cert(
        self, name: str, subject: str, sans: Sequence[str] = (), server: bool = False
    ) -> tuple[Path, Path]:
        """A key and a certificate signed by the CA; returns (cert, key)."""
        key, csr, crt = (self.dir / f"{name}{ext}" for ext in (".key", ".csr", ".crt"))
        ext = self.dir / f"{name}.ext"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        lines.append("extendedKeyUsage=" + ("serverAuth" if server else "clientAuth"))
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        self._openssl("genrsa", "-out", str(key), "2048")
        self._openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_crt), "-CAkey", str(self.ca_key),
            "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(crt),
        )  # fmt: skip
        return crt, key


def write_kubeconfig(
    path: Path, server: str, ca: Path, user: str, cert: Path | None = None, key: Path | None = None,
    token: str | None = None,
) -> Path:  # fmt: skip
    """A kubeconfig (JSON is valid YAML) for one identity: a client certificate or a token."""
    creds: dict[str, str] = {}
    if cert is not None and key is not None:
        creds = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        creds = {"token": token}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": user}}],
        "current-context": "dev",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------------------------
# Processes


@dataclass
class Proc:
    """One component: its argv, its log file, start/stop/kill."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # Ctrl-C on `make up` reaches the harness, which stops us in order
            )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise ClusterError(f"{self.name} exited with code {self.popen.returncode}:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)

    def kill(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.kill()
            self.popen.wait(10)


# ----------------------------------------------------------------------------------------------
# A small REST client (admin certificate) for the harness's own calls


class Rest:
    """JSON over HTTPS to the API server with one client certificate; blocking."""

    def __init__(self, host: str, port: int, ca: Path, cert: Path, key: Path) -> None:
        self.host, self.port = host, port
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201)) -> Any:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
        try:
            # Compact, as kubectl sends it: the API server keeps opaque parameters byte for byte.
            data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            conn.request(method, path, body=data, headers={"Content-Type": ctype})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        if resp.status not in ok:
            raise ClusterError(f"{method} {path}: HTTP {resp.status}: {raw[:500].decode(errors='replace')}")
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def exists(self, path: str) -> bool:
        return self.call("GET", path, ok=(200, 404)).get("kind") != "Status"

    def create(self, path: str, body: dict[str, Any]) -> Any:
        """POST, tolerating AlreadyExists (the harness's objects are idempotent)."""
        return self.call("POST", path, body, ok=(200, 201, 409))


# ----------------------------------------------------------------------------------------------
# The node's network namespace


class NodeNet:
    """The node's network namespace and its veth link to the host (``host_ip`` <-> ``node_ip``)."""

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.host_ip = self.node_ip = ""
        self.prefix = 30
        self.host_link = f"dk{secrets.token_hex(3)}"

    @staticmethod
    def pick_subnet() -> ipaddress.IPv4Network:
        """A /30 of LINK_RANGE that no address on this host is in."""
        used = set()
        for line in sh("ip", "-o", "-4", "addr", "show").splitlines():
            parts = line.split()
            used.add(ipaddress.IPv4Interface(parts[3]).network)
        subnets = list(LINK_RANGE.subnets(new_prefix=30))
        for _ in range(64):
            cand = subnets[secrets.randbelow(len(subnets))]
            if not any(cand.overlaps(u) for u in used):
                return cand
        raise ClusterError(f"no free /30 in {LINK_RANGE} for the node's API link")

    def create(self) -> None:
        """The namespace and the link; the /30 is picked and its address added under a host-wide
        lock, so two clusters starting at once never take the same one."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOCK_DIR / "link.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = NodeNet.pick_subnet()
            hosts = list(subnet.hosts())
            self.host_ip, self.node_ip = str(hosts[0]), str(hosts[1])
            self._create()

    def _create(self) -> None:
        sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "netns", "add", self.netns)
        sh("ip", "-n", self.netns, "link", "set", "lo", "up")
        sh(
            "ip",
            "link",
            "add",
            self.host_link,
            "type",
            "veth",
            "peer",
            "name",
            "apilink",
            "netns",
            self.netns,
        )
        sh("ip", "addr", "add", f"{self.host_ip}/{self.prefix}", "dev", self.host_link)
        sh("ip", "link", "set", self.host_link, "up")
        sh("ip", "-n", self.netns, "addr", "add", f"{self.node_ip}/{self.prefix}", "dev", "apilink")
        sh("ip", "-n", self.netns, "link", "set", "apilink", "up")
        # Address in place before anything binds to it (duplicate address detection is IPv6 only).

    def add_nic(
        self,
        name: str,
        addresses: Sequence[str] = (),
        mtu: int | None = None,
        mac: str | None = None,
        peer_addresses: Sequence[str] = (),
        up: bool = True,
    ) -> str:
        """A veth in the node namespace standing in for a NIC; its peer stays on the host under a
        generated name (returned), with ``peer_addresses``."""
        peer = f"dp{secrets.token_hex(3)}"
        # The MAC and MTU are set as the link is made: set afterwards, a scan in between sees the
        # NIC with a random MAC (no cloud attributes match it) and publishes that first.
        opts = [*(["address", mac] if mac else []), *(["mtu", str(mtu)] if mtu else [])]
        sh("ip", "link", "add", peer, "type", "veth", "peer", "name", name, *opts, "netns", self.netns)
        for a in addresses:
            sh("ip", "-n", self.netns, "addr", "add", a, "dev", name)
        for a in peer_addresses:
            sh("ip", "addr", "add", a, "dev", peer)
        if up:
            sh("ip", "-n", self.netns, "link", "set", name, "up")
            sh("ip", "link", "set", peer, "up")
        return peer

    def link(self, netns: str) -> str:
        """A veth from the host into another namespace ``netns`` with a route to ``host_ip``, so
        a process there reaches the API server; returns the address it has in ``netns``."""
        name = f"dl{secrets.token_hex(3)}"
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOCK_DIR / "link.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sub = NodeNet.pick_subnet()
            a, b = (str(h) for h in sub.hosts())
            sh("ip", "link", "add", name, "type", "veth", "peer", "name", "apilink", "netns", netns)
            sh("ip", "addr", "add", f"{a}/30", "dev", name)
        sh("ip", "link", "set", name, "up")
        sh("ip", "-n", netns, "addr", "add", f"{b}/30", "dev", "apilink")
        sh("ip", "-n", netns, "link", "set", "apilink", "up")
        sh("ip", "-n", netns, "route", "add", f"{self.host_ip}/32", "via", a)
        return b

    def route_to(self, ip: str) -> None:
        """A route from the node's namespace to ``ip``, an address on the host (another node's
        ``host_ip``, where the API server listens), through this node's own host link."""
        sh("ip", "-n", self.netns, "route", "replace", f"{ip}/32", "via", self.host_ip)

    def route_service(self, service_ip: str, api_port: int, api_ip: str | None = None) -> None:
        """What kube-proxy does for the ``kubernetes`` Service, in the node's namespace only:
        ``service_ip:443`` goes to the API server (on ``api_ip``, default this node's
        ``host_ip``), so in-cluster clients of hostNetwork pods (KUBERNETES_SERVICE_HOST)
        reach it. Goes away with the namespace."""
        sh("ip", "-n", self.netns, "route", "replace", f"{service_ip}/32", "dev", "apilink")
        sh(
            "iptables", "-t", "nat", "-A", "OUTPUT", "-d", f"{service_ip}/32", "-p", "tcp",
            "--dport", "443", "-j", "DNAT", "--to-destination", f"{api_ip or self.host_ip}:{api_port}",
            netns=self.netns,
        )  # fmt: skip

    def has_link(self, name: str) -> bool:
        return bool(sh("ip", "-n", self.netns, "-o", "link", "show", "dev", name, check=False))

    def delete(self) -> None:
        # Deleting the namespace deletes the veths in it and so their host ends.
        sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "link", "del", self.host_link, check=False)


# ----------------------------------------------------------------------------------------------
# The cluster


def _mounts_under(prefix: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4]
        if mnt == str(prefix) or mnt.startswith(str(prefix) + "/"):
            out.append(mnt)
    return out


def _umount_tree(prefix: Path) -> None:
    for mnt in sorted(_mounts_under(prefix), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def _cgroup_dirs(name: str) -> list[Path]:
    out = []
    for ctl in Path("/sys/fs/cgroup").iterdir():
        d = ctl / name
        if d.is_dir():
            out.append(d)
    return out


def _remove_cgroup_tree(root: Path) -> None:
    """rmdir a cgroup and its children, deepest first (a cgroup with tasks stays)."""
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: len(t[0]), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


class KubeCluster:
    """See the module docstring. ``with KubeCluster(state_dir) as c:`` or start()/stop()."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        node_name: str = "dev-node",
        netns: str | None = None,
        kube_version: str | None = None,
    ) -> None:
        # Short paths: AF_UNIX socket paths under the kubelet root dir must stay < 108 bytes.
        self._own_state = state_dir is None
        self.state = Path(state_dir or tempfile.mkdtemp(prefix="dnk-", dir="/tmp")).resolve()
        self.node_name = node_name
        v = versions()
        self.kube_version = kube_version or selected_kube_version()
        self.etcd_version = v["ETCD_VERSION"]
        self.kube_minor = kube_minor(self.kube_version)
        # Control-plane gates on for this version (kube-apiserver and kube-scheduler).
        self.feature_gates = control_plane_gates(self.kube_version)
        self.pki = Pki(self.state / "pki")
        self.net = NodeNet(netns or f"dnode-{secrets.token_hex(2)}")
        self.kubelet_dir = self.state / "kubelet"
        self.logs = self.state / "logs"
        self.procs: dict[str, Proc] = {}
        self.containerd: Containerd | None = None
        self.api_port = 0
        self.kubeconfig = self.state / "admin.kubeconfig"
        self.rest: Rest | None = None
        self.host_sysctls: dict[str, str] = {}
        self._kubelet_bind = False
        self.started_at: dict[str, float] = {}
        self.cgroup_name = f"dranet-dev-{secrets.token_hex(3)}"
        self._container_logs_existed = CONTAINER_LOGS.exists()
        # Which Pods ``delete_pods`` deletes: all of them here; a SecondNode's only.
        self._pods_selector = ""

    # -- facts ------------------------------------------------------------------------------------

    def bin(self, name: str) -> Path:
        """One of this cluster's Kubernetes binaries (of ``kube_version``)."""
        return kube_bin(name, self.kube_version)

    def _gate_flags(self) -> list[str]:
        gates = ",".join(f"{g}={str(on).lower()}" for g, on in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"] if gates else []

    @property
    def netns(self) -> str:
        return self.net.netns

    @property
    def server(self) -> str:
        return f"https://{self.net.host_ip}:{self.api_port}"

    @property
    def api(self) -> Rest:
        assert self.rest is not None, "cluster not started"
        return self.rest

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        """The kubectl built with the cluster, as admin."""
        res = subprocess.run(
            [str(self.bin("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
        )
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    # -- life cycle ---------------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"):
            if not self.bin(b).exists():
                raise ClusterError(
                    f"{self.bin(b)} is missing: run dev/build-kube.sh {CACHE} {self.kube_version} (make setup)"
                )
        if not etcd_bin().exists():
            raise ClusterError(f"{etcd_bin()} is missing: run dev/build-kube.sh (make setup)")
        self.host_sysctls = read_host_sysctls()
        for d in (self.state, self.logs, self.kubelet_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.net.create()
        self._record()
        self._make_pki()
        self._start_etcd()
        self._start_apiserver(timeout)
        self.net.route_service(SERVICE_IP, self.api_port)
        self._start_controllers()
        self.containerd = Containerd(self.state / "containerd", netns=self.net.netns)
        self.containerd.start(timeout=60)
        self._start_kubelet()
        self.wait_node_ready(timeout)
        self._check_host_sysctls()

    def _make_pki(self) -> None:
        self.pki.make_ca()
        self.api_port = free_port(self.net.host_ip)
        sans = [f"IP:{self.net.host_ip}", "IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost"]
        sans += ["DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc"]
        self.pki.cert("apiserver", "/CN=kube-apiserver", sans, server=True)
        self.pki.cert("kubelet-client", "/CN=kube-apiserver-kubelet-client/O=system:masters")
        for user, subject in (
            ("admin", "/CN=admin/O=system:masters"),
            ("scheduler", "/CN=system:kube-scheduler"),
            ("controller-manager", "/CN=system:kube-controller-manager"),
        ):
            crt, key = self.pki.cert(user, subject)
            path = self.kubeconfig if user == "admin" else self.state / f"{user}.kubeconfig"
            write_kubeconfig(path, self.server, self.pki.ca_crt, user, crt, key)
        self._make_node_certs()
        self.rest = Rest(
            self.net.host_ip,
            self.api_port,
            self.pki.ca_crt,
            self.pki.dir / "admin.crt",
            self.pki.dir / "admin.key",
        )

    def _make_node_certs(self) -> None:
        """The kubelet's serving certificate, signed by the cluster CA so clients can verify it
        (left to itself the kubelet self-signs one into /var/lib/kubelet/pki on the host), and
        its client identity ``system:node:<name>`` in ``system:nodes``, so the Node authorizer
        and NodeRestriction apply: ``node.kubeconfig``."""
        self.pki.cert("kubelet-serving", f"/CN={self.node_name}", [f"IP:{self.net.node_ip}"], server=True)
        crt, key = self.pki.cert("node", f"/CN=system:node:{self.node_name}/O=system:nodes")
        write_kubeconfig(self.state / "node.kubeconfig", self.server, self.pki.ca_crt, "node", crt, key)

    def _proc(self, name: str, argv: list[str]) -> Proc:
        p = Proc(name, argv, self.logs / f"{name}.log").start()
        self.procs[name] = p
        self.started_at[name] = time.monotonic()
        self._record()
        return p

    def _record(self) -> None:
        """What a later run needs to clean up if this one is killed (``reap_stale``)."""
        rec = {
            "pids": {n: p.popen.pid for n, p in self.procs.items() if p.popen is not None},
            "netns": self.net.netns,
            "host_link": self.net.host_link,
            "cgroup": self.cgroup_name,
            "kubelet_dir": str(self.kubelet_dir),
        }
        (self.state / "cluster.json").write_text(json.dumps(rec))

    @staticmethod
    def reap_stale(state_dir: str | os.PathLike[str]) -> bool:
        """Clean up after a run in ``state_dir`` that was killed before its stop: its
        processes, mounts, network namespace, link and cgroups. True if there was one."""
        path = Path(state_dir) / "cluster.json"
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        for pid in rec.get("pids", {}).values():
            with contextlib.suppress(OSError):
                if str(CACHE) in Path(f"/proc/{pid}/cmdline").read_text(
                    errors="replace"
                ) or "unshare" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    os.kill(int(pid), signal.SIGKILL)
        _umount_tree(Path(rec.get("kubelet_dir", Path(state_dir) / "kubelet")))
        sh("ip", "netns", "del", rec.get("netns", ""), check=False)
        sh("ip", "link", "del", rec.get("host_link", ""), check=False)
        for d in _cgroup_dirs(rec.get("cgroup", "")) if rec.get("cgroup") else []:
            _remove_cgroup_tree(d)
        path.unlink(missing_ok=True)
        return True

    def _start_etcd(self) -> None:
        client, peer = free_port("127.0.0.1"), free_port("127.0.0.1")
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._proc(
            "etcd",
            [
                str(etcd_bin()),
                f"--data-dir={self.state / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.pki.dir
        self._proc(
            "kube-apiserver",
            [
                str(self.bin("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.net.host_ip}",
                f"--advertise-address={self.net.host_ip}",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.pki.ca_crt}",
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,"
                "DefaultStorageClass,ResourceQuota,NodeRestriction",
                # /debug/pprof for a profiling run (tests/bench/scale.py); off otherwise.
                f"--profiling={'true' if os.environ.get('DRANET_DEV_APISERVER_PROFILING') else 'false'}",
                *self._gate_flags(),
                "--v=1",
            ],
        )
        self.wait_apiserver_ready(timeout)

    def _start_controllers(self) -> None:
        common = ["--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "--v=1"]
        cm = str(self.state / "controller-manager.kubeconfig")
        self._proc(
            "kube-controller-manager",
            [
                str(self.bin("kube-controller-manager")),
                f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}",
                f"--authorization-kubeconfig={cm}",
                f"--service-account-private-key-file={self.pki.dir / 'sa.key'}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--use-service-account-credentials=true",
                "--controllers=*",
                *common,
            ],
        )
        sched = str(self.state / "scheduler.kubeconfig")
        self._proc(
            "kube-scheduler",
            [
                str(self.bin("kube-scheduler")),
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                *self._gate_flags(),
                *common,
            ],
        )

    def _kubelet_config(self) -> Path:
        assert self.containerd is not None
        endpoint = f"unix://{self.containerd.grpc_socket}"
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.pki.ca_crt)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            # The kubelet lives in the node's namespace (so do containerd and hostNetwork pods).
            "address": self.net.node_ip,
            "port": 10250,
            "healthzBindAddress": self.net.node_ip,
            "healthzPort": 10248,
            "readOnlyPort": 0,
            "tlsCertFile": str(self.pki.dir / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(self.pki.dir / "kubelet-serving.key"),
            # Both sides must agree; containerd 1.7 has no RuntimeConfig RPC to tell the kubelet.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            # CAP_SYS_RESOURCE is missing here: the kubelet may not lower its own OOM score.
            "oomScoreAdj": 0,
            "protectKernelDefaults": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "resolvConf": "/etc/resolv.conf",
            "kernelMemcgNotification": False,
            "podLogsDir": str(self.state / "pod-logs"),
            "serializeImagePulls": False,
            # A cgroup hierarchy of its own: two clusters on one host never share kubepods.
            "cgroupRoot": f"/{self.cgroup_name}",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
        }
        path = self.state / "kubelet-config.json"
        path.write_text(json.dumps(cfg, indent=2))
        self.kubelet_port = int(cfg["port"])  # type: ignore[call-overload]
        self.kubelet_healthz = int(cfg["healthzPort"])  # type: ignore[call-overload]
        return path

    def _start_kubelet(self) -> None:
        config = self._kubelet_config()
        # The one host path the kubelet cannot be told to leave alone: device-plugins/kubelet.sock
        # under /var/lib/kubelet. Created by us, removed by the last cluster to stop.
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        if not VAR_LIB_KUBELET.exists():
            (LOCK_DIR / "var-lib-kubelet.created").touch()
        for ctl in Path("/sys/fs/cgroup").iterdir():
            if ctl.name != "unified" and (ctl / "cgroup.procs").exists():
                (ctl / self.cgroup_name).mkdir(exist_ok=True)
        # The kubelet's volume mounts must reach containerd in the host's mount namespace: a
        # shared bind mount of its root dir, seen by its private namespace as a peer.
        if not self._kubelet_bind:
            sh("mount", "--bind", str(self.kubelet_dir), str(self.kubelet_dir))
            sh("mount", "--make-shared", str(self.kubelet_dir))
            self._kubelet_bind = True
        fake = self.state / "sysctl"
        fake.mkdir(exist_ok=True)
        binds = []
        for name, value in self.host_sysctls.items():
            f = fake / name.replace("/", ".")
            f.write_text(value + "\n")
            binds.append(f"mount --bind {shlex.quote(str(f))} /proc/sys/{name}")
        (self.state / "pod-logs").mkdir(exist_ok=True)
        kubelet = [
            str(self.bin("kubelet")),
            f"--config={config}",
            f"--kubeconfig={self.state / 'node.kubeconfig'}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.kubelet_dir / 'pki'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.net.node_ip}",
            "--v=2",
        ]
        script = " && ".join(["mount --make-rprivate /proc", *binds, "exec " + shlex.join(kubelet)])
        # nsenter changes the network namespace only (``ip netns exec`` would also make every
        # mount a slave, and the kubelet's volume mounts would no longer reach containerd).
        self._proc(
            "kubelet",
            [
                "nsenter", f"--net=/var/run/netns/{self.net.netns}",
                "unshare", "-m", "--propagation", "unchanged", "sh", "-c", script,
            ],
        )  # fmt: skip

    def restart_apiserver(self, down_s: float = 0.0, timeout: float = 60.0) -> None:
        """Stop kube-apiserver, stay down ``down_s`` seconds, start it again on the same port."""
        p = self.procs["kube-apiserver"]
        p.stop()
        time.sleep(down_s)
        p.start()
        self._record()
        self.wait_apiserver_ready(timeout)

    def stop_control_plane(self, down_s: float = 30.0, timeout: float = 60.0) -> None:
        """kube-apiserver and etcd down for ``down_s`` seconds (the controllers, the scheduler and
        the kubelet keep running and must ride it out), then both started again on their ports."""
        api, etcd = self.procs["kube-apiserver"], self.procs["etcd"]
        api.stop()
        etcd.stop()
        time.sleep(down_s)
        etcd.start()
        api.start()
        self._record()
        self.wait_apiserver_ready(timeout)

    def reboot_node(self, timeout: float = 90.0) -> None:
        """What a node's reboot does to its processes: the kubelet, containerd, every shim and every
        container process are SIGKILLed at once, then containerd and the kubelet start again on
        their disk state (containerd's root and state, the kubelet's root dir, hostPath volumes
        such as the driver's store). The pods' network namespaces stay: a veth, unlike a NIC,
        would die with its namespace instead of returning to the host."""
        from dev.cluster.containerd import _kill_shims

        assert self.containerd is not None
        self.procs["kubelet"].kill()
        self.containerd.kill()
        _kill_shims(self.containerd.grpc_socket)
        self.containerd.start(timeout=60)
        self._start_kubelet()
        deadline = time.monotonic() + timeout
        while not self._kubelet_healthy():
            self.procs["kubelet"].check()
            if time.monotonic() > deadline:
                raise ClusterError(f"kubelet not healthy in {timeout}s:\n{self.procs['kubelet'].log_tail()}")
            time.sleep(0.2)
        self.wait_node_ready(timeout)

    def wait_apiserver_ready(self, timeout: float = 60.0) -> None:
        """Until kube-apiserver answers /readyz; ClusterError with its log if it (or etcd) exits."""
        deadline = time.monotonic() + timeout
        while True:
            self.procs["etcd"].check()
            self.procs["kube-apiserver"].check()
            with contextlib.suppress(OSError, ClusterError, http.client.HTTPException):
                self.api.call("GET", "/readyz")
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"kube-apiserver not ready in {timeout}s:\n{self.procs['kube-apiserver'].log_tail()}"
                )
            time.sleep(0.2)

    def restart_kubelet(self, kill: bool = False, timeout: float = 60.0) -> None:
        """Stop (or SIGKILL) the kubelet and start it again; returns once the new one answers
        its healthz and the Node is Ready (the Node stays Ready from the old one for a while,
        so Ready alone says nothing)."""
        p = self.procs["kubelet"]
        p.kill() if kill else p.stop()
        self._start_kubelet()
        deadline = time.monotonic() + timeout
        while not self._kubelet_healthy():
            self.procs["kubelet"].check()
            if time.monotonic() > deadline:
                raise ClusterError(f"kubelet not healthy in {timeout}s:\n{self.procs['kubelet'].log_tail()}")
            time.sleep(0.2)
        self.wait_node_ready(timeout)

    def _kubelet_healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.net.node_ip, self.kubelet_healthz, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def wait_node_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name in ("kube-apiserver", "kubelet"):
                if name in self.procs:  # a SecondNode has a kubelet only
                    self.procs[name].check()
            node = self.api.call("GET", f"/api/v1/nodes/{self.node_name}", ok=(200, 404))
            status = node.get("status") if node.get("kind") == "Node" else None  # 404: a Status
            conds = {c["type"]: c["status"] for c in (status or {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"node {self.node_name} not Ready in {timeout}s:\n{self.procs['kubelet'].log_tail()}"
                )
            time.sleep(0.25)

    def _remove_var_lib_kubelet(self) -> None:
        marker = LOCK_DIR / "var-lib-kubelet.created"
        if not marker.exists():
            return
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                exe = (proc / "exe").resolve() if proc.name.isdigit() else None
                if exe is not None and exe.name == "kubelet" and exe.is_relative_to(CACHE):
                    return  # another cluster's kubelet (of any version) still runs
        shutil.rmtree(VAR_LIB_KUBELET, ignore_errors=True)
        marker.unlink(missing_ok=True)

    def _remove_container_log_links(self) -> None:
        if not CONTAINER_LOGS.is_dir():
            return
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.state)):
                    link.unlink()
        if not self._container_logs_existed:
            with contextlib.suppress(OSError):
                CONTAINER_LOGS.rmdir()

    def _check_host_sysctls(self) -> None:
        now = read_host_sysctls()
        if now != self.host_sysctls:
            raise ClusterError(f"host sysctls changed: {self.host_sysctls} -> {now}")

    def delete_pods(self, within: float = 90.0, namespaces_except: Sequence[str] = ()) -> None:
        """Delete the Pods and wait until the kubelet stopped them, so NRI's StopPodSandbox
        gives their devices back while attach runs: first those outside kube-system (where an
        installed driver runs), then, unless ``namespaces_except`` keeps them, the rest."""
        if self.rest is None or not self.procs.get("kubelet") or not self.procs["kubelet"].alive():
            return

        def pods(keep: Sequence[str]) -> list[dict[str, Any]]:
            items = self.api.get(f"/api/v1/pods{self._pods_selector}")["items"]
            return [p for p in items if p["metadata"]["namespace"] not in keep]

        with contextlib.suppress(Exception):
            for keep in (("kube-system", *namespaces_except), tuple(namespaces_except)):
                for pod in pods(keep):
                    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                    self.api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", ok=(200, 202, 404))
                deadline = time.monotonic() + within
                while pods(keep) and time.monotonic() < deadline:
                    time.sleep(0.5)

    def stop(self) -> None:
        """Everything in reverse order; leaves no process, mount, namespace or cgroup behind."""
        self.delete_pods()
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            p = self.procs.get(name)
            if p is not None:
                p.stop()
        if self.containerd is not None:
            try:
                self.containerd.close()
            except Exception as exc:  # keep going: the rest must still be undone
                print(f"[cluster] stopping containerd failed: {exc}", flush=True)
        _umount_tree(self.kubelet_dir)
        self._kubelet_bind = False
        for d in _cgroup_dirs(self.cgroup_name):
            _remove_cgroup_tree(d)
        self._remove_container_log_links()
        self._remove_var_lib_kubelet()
        self.net.delete()
        (self.state / "cluster.json").unlink(missing_ok=True)
        if self._own_state and not _mounts_under(self.state):
            shutil.rmtree(self.state, ignore_errors=True)
        if self.host_sysctls:
            self._check_host_sysctls()

    # -- identities ----------------------------------------------------------------------------------

    def apply(self, manifest: str) -> str:
        return self.kubectl("apply", "-f", "-", input=manifest)

    def service_identity(self, service: str, namespace: str = "kube-system", rbac: str | None = None) -> Path:
        """A ServiceAccount ``dranet-<service>`` bound to the chart's ClusterRole (or to the
        ServiceAccount, role and binding of ``rbac``, YAML), and a kubeconfig holding a token for
        it (the identity the service has in the DaemonSet).

        The token is bound to this cluster's Node, as the DaemonSet pod's projected token is
        (through its Pod): the API server then sees the same ``authentication.kubernetes.io/
        node-name`` extra, which the per-driver status authorization of 1.36+
        (DRAResourceClaimGranularStatusAuthorization: ``associated-node:patch`` on
        ``resourceclaims/driver``) checks. Unbound when there is no Node yet."""
        from dev.cluster import chart

        self.apply(rbac if rbac is not None else chart.rbac_for(f"dranet-{service}", namespace))
        spec: dict[str, Any] = {"expirationSeconds": 86400}
        node = self.api.call("GET", f"/api/v1/nodes/{self.node_name}", ok=(200, 404))
        if node.get("kind") == "Node":
            ref = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node["metadata"]["uid"]}
            spec["boundObjectRef"] = ref
        resp = self.api.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/dranet-{service}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return write_kubeconfig(
            self.state / f"{service}.kubeconfig", self.server, self.pki.ca_crt, f"dranet-{service}",
            token=resp["status"]["token"],
        )  # fmt: skip

    def dump_logs(self, n: int = 3000) -> str:
        return "\n".join(f"--- {name} ---\n{p.log_tail(n)}" for name, p in self.procs.items())


@contextlib.contextmanager
def cluster(state_dir: str | None = None, **kw: Any) -> Iterator[KubeCluster]:
    with KubeCluster(state_dir, **kw) as c:
        yield c
