"""A private, real containerd 1.7 with NRI and CRI, for tests and the local run.

Each ``Containerd`` owns one work directory (root, state, sockets, CNI config, logs), one private
Linux bridge and one private /24 for its pods. Nothing of the host's own container setup is used or
touched: the daemon's gRPC, ttrpc and NRI sockets, runc's state, the CNI IPAM store and the stream
server port are all private, so several instances (tests of several engineers) can run at once.

The binaries and the pause image come from the runtime cache built by ``install_runtime.sh``
(default ``/var/cache/dranet-dev/runtime``, or ``$DRANET_RUNTIME_CACHE``).

The methods here block (subprocesses, netlink, a blocking gRPC channel); from asyncio code use the
``a*`` variants, which run them in a worker thread.

    python -m dev.cluster.containerd install [--cache DIR]   # = install_runtime.sh
    python -m dev.cluster.containerd run [--workdir DIR]      # start one, print its sockets
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dev.cluster import cri
from dev.cluster.cri_install import CNI_BIN_DIR, INSTALL_SCRIPT, PAUSE_IMAGE, RUNC, RuntimeCache

log = logging.getLogger(__name__)

# Pod subnets come from the benchmarking range (RFC 2544), which real networks do not route;
# each instance additionally checks the host's routes and addresses before taking one.
POD_SUBNETS = ipaddress.IPv4Network("198.18.0.0/15")
# Instances on this host claim a subnet index here; a claim whose owner died is reclaimed.
CLAIMS_DIR = Path("/run/dranet-devcluster/runtimes")
BRIDGE_PREFIX = "dncni"
K8S_NAMESPACE = "k8s.io"

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class RuntimeError_(RuntimeError):
    """containerd did not start, did not become ready, or an install step is missing."""


def install(cache: RuntimeCache | None = None) -> None:
    """Run the install script (idempotent; about 50 ms when everything is in place)."""
    cache = cache or RuntimeCache.default()
    subprocess.run([str(INSTALL_SCRIPT), str(cache.dir)], check=True)


# ----------------------------------------------------------------------------------------------
# Host network facts and the subnet claim


def _host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the host routes or holds an address in, in any routing table."""
    from pyroute2 import IPRoute  # a worker-thread/sync context: no running event loop here

    nets: list[ipaddress.IPv4Network] = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=socket.AF_INET, table=0):
            dst = r.get_attr("RTA_DST") or "0.0.0.0"
            if r["dst_len"] == 0:
                continue  # a default route overlaps everything and says nothing
            nets.append(ipaddress.IPv4Network(f"{dst}/{r['dst_len']}", strict=False))
        for a in ipr.get_addr(family=socket.AF_INET):
            nets.append(ipaddress.IPv4Network(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}", strict=False))
    return nets


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself contain ") ".
    return stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@dataclass(frozen=True)
class _Claim:
    index: int
    subnet: ipaddress.IPv4Network
    bridge: str
    path: Path


def _claim_subnet(workdir: Path, grpc_socket: Path, cache: RuntimeCache) -> _Claim:
    """Take a free /24 and bridge name for this instance, reaping instances whose owner died."""
    CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLAIMS_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken: set[int] = set()
        for f in CLAIMS_DIR.iterdir():
            if not f.name.isdigit():
                continue
            try:
                rec = json.loads(f.read_text())
            except (OSError, ValueError):
                f.unlink(missing_ok=True)
                continue
            if _pid_alive(int(rec["owner_pid"])):
                taken.add(int(f.name))
                continue
            log.warning(
                "reaping containerd instance of a dead process", extra={"workdir": rec.get("workdir")}
            )
            _reap(rec)
            f.unlink(missing_ok=True)
        host = _host_networks()
        subnets = list(POD_SUBNETS.subnets(new_prefix=24))
        for i, net in enumerate(subnets):
            if i in taken or any(net.overlaps(h) for h in host):
                continue
            bridge = f"{BRIDGE_PREFIX}{i}"
            path = CLAIMS_DIR / str(i)
            path.write_text(
                json.dumps(
                    {
                        "owner_pid": os.getpid(),
                        "workdir": str(workdir),
                        "grpc_socket": str(grpc_socket),
                        "cache": str(cache.dir),
                        "bridge": bridge,
                        "containerd_pid": None,
                    }
                )
            )
            return _Claim(i, net, bridge, path)
    raise RuntimeError_(f"no free /24 left in {POD_SUBNETS} for a containerd instance")


# ----------------------------------------------------------------------------------------------
# Teardown helpers (also used to reap instances whose owner died)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _descendants(pid: int) -> list[int]:
    seen: list[int] = []
    stack = _children(pid)
    while stack:
        p = stack.pop()
        seen.append(p)
        stack += _children(p)
    return seen


def _shim_pids(grpc_socket: Path) -> list[int]:
    """Shims started by the containerd listening on ``grpc_socket`` (they outlive the daemon)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        args = _cmdline(int(d.name))
        if args and args[0].endswith("containerd-shim-runc-v2") and str(grpc_socket) in args:
            pids.append(int(d.name))
    return pids


def _kill_shims(grpc_socket: Path) -> int:
    """SIGKILL leftover shims of this instance and the container processes under them."""
    shims = _shim_pids(grpc_socket)
    for shim in shims:
        for pid in [*_descendants(shim), shim]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return len(shims)


def _mounts_under(prefixes: list[str]) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].replace("\\040", " ")
            if any(mnt == p or mnt.startswith(p.rstrip("/") + "/") for p in prefixes):
                out.append(mnt)
    return out


def _umount(path: str) -> None:
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            log.warning("umount failed", extra={"path": path, "error": os.strerror(err)})


def _unmount_all(prefixes: list[str]) -> None:
    # Deepest first, so a parent mount is not busy because of a child.
    for mnt in sorted(_mounts_under(prefixes), key=len, reverse=True):
        _umount(mnt)


def _remove_netns(path: str) -> None:
    _umount(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _delete_link(name: str, netns: str | None = None) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    if netns and not Path(f"/var/run/netns/{netns}").exists():
        return  # gone with its namespace
    with IPRoute(netns=netns) if netns else IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=name)
        if idx:
            with contextlib.suppress(NetlinkError):
                ipr.link("del", index=idx[0])


def _stop_process(pid: int, expect_in_cmdline: str, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; only if ``pid`` still runs the expected command."""
    if expect_in_cmdline not in " ".join(_cmdline(pid)):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _remove_pods_via_cri(grpc_socket: Path, cache: RuntimeCache, on_netns: Callable[[str], None]) -> int:
    """Stop and remove every pod sandbox of the containerd on ``grpc_socket``; each pod's netns
    path goes to ``on_netns`` first. Returns how many pods there were."""
    pb, pb_grpc = cri.stubs(cache)
    with grpc.insecure_channel(f"unix:{grpc_socket}") as ch:
        stub = pb_grpc.RuntimeServiceStub(ch)
        sandboxes = stub.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
        for sb in sandboxes:
            with contextlib.suppress(grpc.RpcError):
                st = stub.PodSandboxStatus(
                    pb.PodSandboxStatusRequest(pod_sandbox_id=sb.id, verbose=True), timeout=10
                )
                on_netns(cri.netns_from_info(st.info))
            stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sb.id), timeout=30)
            stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id), timeout=30)
        return len(sandboxes)


def _reap(rec: dict[str, Any]) -> None:
    """Clean up what a dead owner left: its pods, containerd, shims, mounts, bridge, work directory."""
    workdir = Path(rec["workdir"])
    netns: set[str] = set(rec.get("netns", []))
    pid = rec.get("containerd_pid")
    if pid and str(workdir) in " ".join(_cmdline(int(pid))):
        # The daemon outlived its owner: let it remove its pods (and their netns) properly.
        try:
            _remove_pods_via_cri(Path(rec["grpc_socket"]), RuntimeCache(Path(rec["cache"])), netns.add)
        except Exception as e:
            log.warning("removing pods of a dead owner through CRI failed", extra={"error": str(e)})
        _stop_process(int(pid), str(workdir), timeout=2)
    _kill_shims(Path(rec["grpc_socket"]))
    for ns in netns:
        if ns:
            _remove_netns(ns)
    _unmount_all([str(workdir)])
    _delete_link(rec["bridge"])
    shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------------------------


def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))  # a JSON string is a valid TOML basic string


class Containerd:
    """One private containerd with CRI and NRI; ``start``/``stop``/``restart``/``close``.

    Attributes for peers: ``grpc_socket`` (containerd API and CRI), ``nri_socket`` (NRI plugins
    dial it), ``cni_subnet``, ``bridge``, ``version`` (e.g. ``1.7.24``), ``log_path``.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        cache: RuntimeCache | None = None,
        netns: str | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        self.cache = cache or RuntimeCache.default()
        # Where ``containerd`` and its ``containerd-shim-runc-v2`` come from: the runtime cache's
        # 1.7 by default, or a 2.x build (``dev/build-containerd.sh``: ``containerd2_bin_dir()``),
        # which gets a config of version 3. ``ctr``, runc, CNI and the pause image stay the cache's.
        self.bin_dir = bin_dir or self.cache.bin_dir
        self.containerd_bin = self.bin_dir / "containerd"
        # A named network namespace (``ip netns``) to run the daemon in: its hostNetwork pods,
        # CNI bridge and pods' veths are then that namespace's, as on a node of their own.
        self.netns = netns
        self.cache.check()
        # Under /tmp: AF_UNIX paths must stay below 108 bytes, including the shim's own sockets.
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="dnctrd-", dir="/tmp")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root = self.workdir / "root"
        self.state = self.workdir / "state"
        self.grpc_socket = self.workdir / "containerd.sock"
        self.nri_socket = self.workdir / "nri" / "nri.sock"  # a directory of its own: mountable alone
        self.cni_conf_dir = self.workdir / "cni" / "net.d"
        self.cni_ipam_dir = self.workdir / "cni" / "ipam"
        self.pod_log_dir = self.workdir / "pods"
        self.config_path = self.workdir / "config.toml"
        self.log_path = self.workdir / "containerd.log"
        # Known after the first start (netlink and subprocess work; the constructor does none,
        # so it may be called on an event loop).
        self.version_string = ""
        self.version = ""
        self._claim_: _Claim | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._image_imported = False
        self._netns_seen: set[str] = set()
        self._closed = False
        self.start_seconds: float | None = None

    @property
    def _claim(self) -> _Claim:
        if self._claim_ is None:
            raise RuntimeError_(f"containerd in {self.workdir} was never started")
        return self._claim_

    @property
    def cni_subnet(self) -> ipaddress.IPv4Network:
        """The private /24 the pods get their eth0 address from."""
        return self._claim.subnet

    @property
    def bridge(self) -> str:
        """The private Linux bridge the pods' veths are attached to."""
        return self._claim.bridge

    @property
    def network_name(self) -> str:
        return f"dranet-devcluster-{self._claim.index}"

    def _setup(self) -> None:
        self.version_string = self._read_version()
        self.version = self.version_string.split("~")[0].split("+")[0].lstrip("v")
        self._claim_ = _claim_subnet(self.workdir, self.grpc_socket, self.cache)
        # A bridge left by an earlier instance that held this index and died is ours to remove.
        _delete_link(self.bridge)
        if self.netns:
            _delete_link(self.bridge, self.netns)
        self._write_config()

    # -- configuration --------------------------------------------------------------------------

    def _read_version(self) -> str:
        out = subprocess.run(
            [str(self.containerd_bin), "--version"], check=True, capture_output=True, text=True
        )
        # "containerd github.com/containerd/containerd 1.7.24~ds1" (Debian's 1.7),
        # "containerd github.com/containerd/containerd/v2 v2.2.9 module" (dev/build-containerd.sh)
        return out.stdout.split()[2]

    @property
    def major(self) -> int:
        """The daemon's major version (1 or 2), known after the first start."""
        return int(self.version.split(".")[0])

    def _write_config(self) -> None:
        for d in (
            self.root,
            self.state,
            self.cni_conf_dir,
            self.cni_ipam_dir,
            self.pod_log_dir,
            self.nri_socket.parent,
        ):
            d.mkdir(parents=True, exist_ok=True)
        gateway = next(self.cni_subnet.hosts())
        conflist = {
            "cniVersion": "1.0.0",
            "name": self.network_name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    # No gateway and no masquerading: the plugin then leaves the host's
                    # ip_forward sysctl and iptables alone. Pods reach each other on the bridge.
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.cni_ipam_dir),
                        "ranges": [[{"subnet": str(self.cni_subnet), "rangeStart": str(gateway + 1)}]],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.cni_conf_dir / "10-dranet-devcluster.conflist").write_text(json.dumps(conflist, indent=2))
        if self.major >= 2:
            self.config_path.write_text("\n".join(self._config_v3()) + "\n")
            return
        cri_plugin = '[plugins."io.containerd.grpc.v1.cri"'
        runc_rt = f"{cri_plugin}.containerd.runtimes.runc"
        lines = [
            "version = 2",
            # Plugins the CRI and NRI path never uses; skipping them makes the start faster.
            "disabled_plugins = ["
            + ", ".join(
                json.dumps(p)
                for p in (
                    "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing",
                )
            )
            + "]",
            *self._common_config(),
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml_str(self.workdir / 'opt')}",
            f"{cri_plugin}]",
            f"  sandbox_image = {_toml_str(PAUSE_IMAGE)}",
            # Without it runc fails to write /proc/self/oom_score_adj on these machines
            # (no CAP_SYS_RESOURCE in the VM): "can't get final child's PID from pipe: EOF".
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  enable_selinux = false",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"{cri_plugin}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"{runc_rt}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{runc_rt}.options]",
            f"  BinaryName = {_toml_str(RUNC)}",
            # runc's state would default to /run/containerd/runc, shared with any host containerd.
            f"  Root = {_toml_str(self.state / 'runc')}",
            "  SystemdCgroup = false",
            f"{cri_plugin}.cni]",
            f"  bin_dir = {_toml_str(CNI_BIN_DIR)}",
            f"  conf_dir = {_toml_str(self.cni_conf_dir)}",
            "  max_conf_num = 1",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _common_config(self) -> list[str]:
        """The part of the config both versions read the same way: root, state, sockets, NRI."""
        return [
            f"root = {_toml_str(self.root)}",
            f"state = {_toml_str(self.state)}",
            "[grpc]",
            f"  address = {_toml_str(self.grpc_socket)}",
            "[ttrpc]",
            f"  address = {_toml_str(str(self.grpc_socket) + '.ttrpc')}",
            "[debug]",
            '  level = "info"',
            '[plugins."io.containerd.nri.v1.nri"]',
            "  disable = false",
            "  disable_connections = false",
            f"  socket_path = {_toml_str(self.nri_socket)}",
            f"  plugin_path = {_toml_str(self.workdir / 'nri' / 'plugins')}",
            f"  plugin_config_path = {_toml_str(self.workdir / 'nri' / 'conf.d')}",
            '  plugin_registration_timeout = "5s"',
            '  plugin_request_timeout = "2s"',
        ]

    def _config_v3(self) -> list[str]:
        """containerd 2.x: config version 3, where the CRI plugin is split into
        ``io.containerd.cri.v1.runtime`` (runtimes, CNI), ``io.containerd.cri.v1.images``
        (snapshotter, the pinned sandbox image) and ``io.containerd.grpc.v1.cri`` (the stream
        server); the same settings as the 1.7 config below, in their new places."""
        rt = '[plugins."io.containerd.cri.v1.runtime"'
        runc_rt = f"{rt}.containerd.runtimes.runc"
        images = '[plugins."io.containerd.cri.v1.images"'
        return [
            "version = 3",
            *self._common_config(),
            f"{rt}]",
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  enable_selinux = false",
            f"{rt}.containerd]",
            '  default_runtime_name = "runc"',
            f"{runc_rt}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{runc_rt}.options]",
            f"  BinaryName = {_toml_str(RUNC)}",
            f"  Root = {_toml_str(self.state / 'runc')}",
            "  SystemdCgroup = false",
            f"{rt}.cni]",
            f"  bin_dirs = [{_toml_str(CNI_BIN_DIR)}]",
            f"  conf_dir = {_toml_str(self.cni_conf_dir)}",
            "  max_conf_num = 1",
            f"{images}]",
            '  snapshotter = "overlayfs"',
            f"{images}.pinned_images]",
            f"  sandbox = {_toml_str(PAUSE_IMAGE)}",
            '[plugins."io.containerd.grpc.v1.cri"]',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
        ]

    def _record_claim(self) -> None:
        rec = json.loads(self._claim.path.read_text())
        rec["containerd_pid"] = self._proc.pid if self._proc else None
        rec["netns"] = sorted(self._netns_seen)
        tmp = self._claim.path.with_name(f".{self._claim.path.name}.tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self._claim.path)

    # -- life cycle -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    def start(self, timeout: float = 20.0) -> float:
        """Start the daemon, import the pause image once, wait until CRI reports ready.

        Returns the seconds it took. Blocks; call ``astart`` from asyncio code.
        """
        if self._closed:
            raise RuntimeError_(f"containerd in {self.workdir} was closed")
        if self.running:
            return 0.0
        t0 = time.monotonic()
        if self._claim_ is None:
            self._setup()
        env = {
            # The shim is found on PATH: the one built with this daemon first.
            "PATH": f"{self.bin_dir}:{self.cache.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.workdir),
            "LANG": "C.UTF-8",
        }
        logf = open(self.log_path, "ab")  # the child inherits it; ours is closed right below
        try:
            enter = ["nsenter", f"--net=/var/run/netns/{self.netns}"] if self.netns else []
            self._proc = subprocess.Popen(
                [*enter, str(self.containerd_bin), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                # Its own session: a Ctrl-C aimed at the test run must not kill it before teardown.
                start_new_session=True,
            )
        finally:
            logf.close()
        self._record_claim()
        try:
            self._wait_ready(t0 + timeout)
            if not self._image_imported:
                self._import_pause_image(t0 + timeout)
                self._image_imported = True
            self._wait_image(t0 + timeout)
        except BaseException:
            self._terminate()
            raise
        self.start_seconds = time.monotonic() - t0
        log.info(
            "containerd ready",
            extra={
                "workdir": str(self.workdir),
                "seconds": round(self.start_seconds, 3),
                "version": self.version,
            },
        )
        return self.start_seconds

    def _fail(self, why: str) -> RuntimeError_:
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        return RuntimeError_(f"containerd in {self.workdir}: {why}\n--- {self.log_path} (tail) ---\n{tail}")

    def _wait_ready(self, deadline: float) -> None:
        pb, pb_grpc = cri.stubs(self.cache)
        while not self.grpc_socket.exists():
            if not self.running:
                raise self._fail("exited during start")
            if time.monotonic() > deadline:
                raise self._fail(f"no socket {self.grpc_socket}")
            time.sleep(0.01)
        with grpc.insecure_channel(f"unix:{self.grpc_socket}") as ch:
            stub = pb_grpc.RuntimeServiceStub(ch)
            last = "no answer"
            while True:
                if not self.running:
                    raise self._fail("exited during start")
                try:
                    resp = stub.Status(pb.StatusRequest(), timeout=1)
                    conds = {c.type: (c.status, c.reason, c.message) for c in resp.status.conditions}
                    if all(conds.get(k, (False,))[0] for k in ("RuntimeReady", "NetworkReady")):
                        return
                    last = str(conds)
                except grpc.RpcError as e:
                    last = f"{e.code().name}: {e.details()}"
                if time.monotonic() > deadline:
                    raise self._fail(f"CRI not ready: {last}")
                time.sleep(0.02)

    def _import_pause_image(self, deadline: float) -> None:
        res = subprocess.run(
            [
                str(self.cache.ctr),
                "--address",
                str(self.grpc_socket),
                "--namespace",
                K8S_NAMESPACE,
                "images",
                "import",
                "--all-platforms",
                "--no-unpack",
                str(self.cache.pause_tar),
            ],
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        if res.returncode != 0:
            raise self._fail(f"importing {self.cache.pause_tar} failed: {res.stderr.strip()}")

    def _wait_image(self, deadline: float) -> None:
        """Until CRI knows the pause image: its image store learns of an import from an event,
        after ``ctr import`` has returned, and RunPodSandbox would try to pull what it misses."""
        pb, pb_grpc = cri.stubs(self.cache)
        with grpc.insecure_channel(f"unix:{self.grpc_socket}") as ch:
            stub = pb_grpc.ImageServiceStub(ch)
            while True:
                resp = stub.ImageStatus(
                    pb.ImageStatusRequest(image=pb.ImageSpec(image=PAUSE_IMAGE)), timeout=5
                )
                if resp.image.id:
                    return
                if time.monotonic() > deadline:
                    raise self._fail(f"CRI does not list the imported image {PAUSE_IMAGE}")
                time.sleep(0.01)

    def _terminate(self, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the daemon only (SIGTERM, SIGKILL after ``timeout``): pods and shims keep running,
        as with a runtime restart on a real node."""
        self._terminate(timeout)

    def kill(self) -> None:
        """SIGKILL the daemon (a crash); pods and shims keep running."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self, timeout: float = 20.0) -> float:
        """Stop and start again on the same root and state; returns the start seconds."""
        self.stop()
        return self.start(timeout)

    def note_netns(self, path: str) -> None:
        """Remember a pod netns this instance created, so teardown removes it even after a crash."""
        if path and path not in self._netns_seen and not self._closed:
            self._netns_seen.add(path)
            if self._claim_ is not None:
                self._record_claim()

    def remove_all_pods(self) -> int:
        """Stop and remove every pod sandbox (and so every container); returns how many."""
        return _remove_pods_via_cri(self.grpc_socket, self.cache, self.note_netns)

    def close(self) -> None:
        """Tear everything down: pods, daemon, leftover shims, mounts, netns, bridge, work dir."""
        if self._closed:
            return
        if self._claim_ is None:
            self._closed = True
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            return
        shims_before = _shim_pids(self.grpc_socket)
        try:
            try:
                # A daemon the test stopped is started again: only it knows how to remove its pods.
                if not self.running:
                    self.start()
                self.remove_all_pods()
            except Exception as e:  # teardown goes on with the forceful path
                log.warning("removing pods through CRI failed", extra={"error": str(e)})
            self._terminate()
            # Shims of removed pods exit on their own, a moment after the RemovePodSandbox call.
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(
                _pid_alive(p) for p in shims_before + _shim_pids(self.grpc_socket)
            ):
                time.sleep(0.02)
            killed = _kill_shims(self.grpc_socket)
            if killed:
                log.warning("killed leftover shims", extra={"count": killed})
            for ns in self._netns_seen:
                _remove_netns(ns)
            _unmount_all([str(self.workdir)])
            _delete_link(self.bridge, self.netns)
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            self._closed = True
            self._claim.path.unlink(missing_ok=True)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- asyncio wrappers -----------------------------------------------------------------------

    async def astart(self) -> float:
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    async def arestart(self) -> float:
        return await asyncio.to_thread(self.restart)

    async def akill(self) -> None:
        await asyncio.to_thread(self.kill)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


@contextlib.contextmanager
def running(workdir: Path | None = None, cache: RuntimeCache | None = None) -> Iterator[Containerd]:
    """A started ``Containerd`` that is torn down on exit."""
    c = Containerd(workdir, cache)
    try:
        c.start()
        yield c
    finally:
        c.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m dev.cluster.containerd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_inst = sub.add_parser("install", help="install containerd, runc, CNI plugins, CRI stubs, pause image")
    p_inst.add_argument("--cache", type=Path, default=RuntimeCache.default().dir)
    p_run = sub.add_parser("run", help="start a private containerd until interrupted")
    p_run.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "install":
        install(RuntimeCache(args.cache))
        return 0
    logging.basicConfig(level=logging.INFO)
    with running(args.workdir) as c:
        print(
            json.dumps(
                {
                    "grpc_socket": str(c.grpc_socket),
                    "nri_socket": str(c.nri_socket),
                    "version": c.version,
                    "subnet": str(c.cni_subnet),
                    "start_seconds": c.start_seconds,
                }
            ),
            flush=True,
        )
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
