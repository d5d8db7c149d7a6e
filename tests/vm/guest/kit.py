"""What the guest tests share: kernel helpers (ip -j, netns, in-netns calls, ICMP) and the
service stack wired in one process as production wires it across four.

``Stack`` runs, inside the pytest process and on the guest's real kernel:
- the store (services.store: StoreDB + StoreService behind its gRPC Unix socket),
- the inventory (services.inventory: Inventory + InventoryServicer behind its socket, the
  default publish filter, the RDMA netns mode read once at start),
- prepare (services.prepare.pipeline.Preparer) talking to both over gRPC, with the claims
  served by ``FakeKube`` (there is no API server in the guest),
- attach (services.attach.hooks.AttachHooks with the real netlink engine,
  services.attach.netdev.NetdevEngine, and the StoreWriter), driven with NRI PodSandbox
  messages as containerd would send them (there is no containerd in the guest).

One process, because every Python start costs about 25 s under TCG; the code paths are the
services' own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.hooks import AttachHooks, HookConfig
from services.attach.netdev import NetdevEngine
from services.attach.writer import StoreWriter
from services.inventory.cloud.base import Hint, Providers
from services.inventory.filter import DEFAULT_FILTER, DeviceFilter
from services.inventory.inventory import Inventory, InventoryConfig
from services.inventory.rdma import read_netns_mode
from services.inventory.server import InventoryServicer
from services.prepare.inventory_client import InventoryClient
from services.prepare.pipeline import ClaimRef, ClaimResult, Preparer
from services.store.db import StoreDB
from services.store.server import StoreService
from shared.netns import open_netns, setns
from shared.rpc import UdsServer
from shared.storeclient import StoreClient

T = TypeVar("T")
DRIVER = "dra.net"
NODE = "vm-node"


# --- the kernel ----------------------------------------------------------------------------------


def sh(*args: str, check: bool = True) -> str:
    res = subprocess.run(args, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def try_sh(*args: str) -> tuple[int, str]:
    """(exit code, stderr + stdout) without failing."""
    res = subprocess.run(args, capture_output=True, text=True)
    return res.returncode, (res.stderr + res.stdout).strip()


def ipj(ns: str | None, *args: str) -> Any:
    base = ["ip", "-n", ns] if ns else ["ip"]
    out = sh(*base, "-j", *args)
    return json.loads(out) if out.strip() else []


def link(ns: str | None, name: str) -> dict[str, Any] | None:
    for entry in ipj(ns, "-d", "link", "show"):
        if entry["ifname"] == name or name in entry.get("altnames", []):
            return dict(entry)
    return None


def addrs(ns: str | None, name: str) -> set[str]:
    out = set()
    for entry in ipj(ns, "addr", "show", "dev", name):
        for a in entry.get("addr_info", []):
            if a.get("scope") == "global":
                out.add(f"{a['local']}/{a['prefixlen']}")
    return out


def ip_batch(lines: list[str], ns: str | None = None) -> None:
    """Many ``ip`` commands in one process (``ip -batch``): one exec instead of N."""
    with tempfile.NamedTemporaryFile("w", suffix=".ip", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        sh("ip", *(["-n", ns] if ns else []), "-batch", f.name)
    finally:
        os.unlink(f.name)


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:5]}"


def netns_path(name: str) -> str:
    return f"/run/netns/{name}"


@contextlib.contextmanager
def netns(name: str | None = None) -> Iterator[str]:
    """A named netns for the duration (``ip netns add``/``del``); yields its name."""
    name = name or uid("dnpod")
    sh("ip", "netns", "add", name)
    try:
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread that entered the netns at ``path``."""
    box: dict[str, Any] = {}

    def body() -> None:
        fd = open_netns(path)
        try:
            setns(fd)
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def _csum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    t = sum(struct.unpack(f"!{len(b) // 2}H", b))
    t = (t >> 16) + (t & 0xFFFF)
    return ~(t + (t >> 16)) & 0xFFFF


def icmp_echo(dst: str, bind_dev: str = "", timeout: float = 5.0) -> bool:
    """One ICMP echo exchange from the calling thread's netns (a raw socket, in process:
    a ping binary costs an exec). ``bind_dev``: SO_BINDTODEVICE (a VRF device selects
    its routing table)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    try:
        if bind_dev:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, bind_dev.encode())
        s.settimeout(0.3)
        ident = (os.getpid() + threading.get_ident()) & 0xFFFF
        deadline, seq = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            seq += 1
            pkt = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"dranet-vm"
            try:
                s.sendto(pkt[:2] + struct.pack("!H", _csum(pkt)) + pkt[4:], (dst, 0))
            except OSError:
                time.sleep(0.2)
                continue
            try:
                while True:
                    data, addr = s.recvfrom(1500)
                    ihl = (data[0] & 0xF) * 4
                    kind, _, _, rid, _ = struct.unpack("!BBHHH", data[ihl : ihl + 8])
                    if kind == 0 and rid == ident and addr[0] == dst:
                        return True
            except TimeoutError:
                pass
        return False
    finally:
        s.close()


def wait_until(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@dataclass
class Uplink:
    """A veth "NIC" on the host whose peer (the gateway, 198.18.<net>.1) sits in its own
    netns: traffic from the pod side really leaves through it."""

    host: str
    peer_ns: str
    net: int
    mac: str

    @property
    def host_ip(self) -> str:
        return f"198.18.{self.net}.2/24"

    @property
    def gw(self) -> str:
        return f"198.18.{self.net}.1"


def make_uplink(net: int, mtu: int = 1500) -> Uplink:
    sfx = uuid.uuid4().hex[:4]
    up = Uplink(host=f"up{sfx}", peer_ns=f"gw{sfx}", net=net, mac=f"02:dd:{sfx[:2]}:{sfx[2:]}:00:01")
    sh("ip", "netns", "add", up.peer_ns)
    ip_batch(
        [
            f"link add {up.host} address {up.mac} mtu {mtu} type veth peer name gw{sfx}p mtu {mtu}",
            f"link set gw{sfx}p netns {up.peer_ns} name gw0",
            f"addr add {up.host_ip} dev {up.host}",
            f"link set {up.host} up",
        ]
    )
    sh("ip", "-n", up.peer_ns, "addr", "add", f"{up.gw}/24", "dev", "gw0")
    sh("ip", "-n", up.peer_ns, "link", "set", "gw0", "up")
    return up


def drop_uplink(up: Uplink) -> None:
    sh("ip", "netns", "del", up.peer_ns, check=False)
    sh("ip", "link", "del", up.host, check=False)


def record(name: str, **values: Any) -> None:
    """A measurement for the run's report: one JSON line in $DRANET_VM_OUT/metrics.jsonl
    (tests/vm/test_vm_tier.py prints them)."""
    out = os.environ.get("DRANET_VM_OUT")
    if out:
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"name": name, **values}) + "\n")


def kernel_log_since(mark: int) -> list[str]:
    """Kernel log lines after the ``mark``-th (``len(kernel_log_since(0))`` is a mark)."""
    return sh("dmesg").splitlines()[mark:]


# --- RDMA netns mode ----------------------------------------------------------------------------


def set_rdma_netns_mode(mode: str, timeout: float = 30.0) -> None:
    """``rdma system set netns MODE``. The kernel refuses a change while any network
    namespace besides init_net exists (EBUSY, "Device or resource busy"); a netns that was
    just deleted lingers until its cleanup work ran, so retry until then."""
    deadline = time.monotonic() + timeout
    while True:
        rc, out = try_sh("rdma", "system", "set", "netns", mode)
        if rc == 0:
            return
        if "busy" not in out.lower() or time.monotonic() > deadline:
            raise AssertionError(f"rdma system set netns {mode}: {out}")
        time.sleep(0.2)


# --- the API server's part: claims -------------------------------------------------------------


@dataclass
class FakeKube:
    """What Preparer reads from the API server: ResourceClaims by namespace/name."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    def add(
        self,
        device: str,
        params: dict[str, Any] | None,
        pod: st.PodRef,
        *,
        namespace: str = "default",
        request: str = "nic",
    ) -> ClaimRef:
        """An allocated claim for ``device`` on this node reserved for ``pod``, with
        ``params`` as its dra.net opaque config (None: no config)."""
        ref = ClaimRef(namespace=namespace, name=f"claim-{uuid.uuid4().hex[:6]}", uid=str(uuid.uuid4()))
        config = []
        if params is not None:
            config.append(
                {
                    "source": "FromClaim",
                    "requests": [request],
                    "opaque": {"driver": DRIVER, "parameters": params},
                }
            )
        self.claims[(namespace, ref.name)] = {
            "metadata": {"namespace": namespace, "name": ref.name, "uid": ref.uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": request, "driver": DRIVER, "pool": NODE, "device": device}],
                        "config": config,
                    }
                },
                "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
            },
        }
        return ref


# --- the ResourceSlice part: an in-memory API server for the real Publisher ----------------------


class FakeSliceClient:
    """SliceClient's calls against a dict: counts every write the Publisher makes."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.writes: list[tuple[str, str]] = []

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        return obj

    async def node_uid(self, name: str) -> str:
        return f"uid-{name}"

    async def list_slices(self, node_name: str, driver: str) -> tuple[list[dict[str, Any]], str]:
        return [json.loads(json.dumps(o)) for o in self.slices.values()], str(self.version)

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["generateName"] + uuid.uuid4().hex[:5]
        obj = self._stamp(obj)
        obj["metadata"].update(name=name, uid=str(uuid.uuid4()))
        self.slices[name] = obj
        self.writes.append(("create", name))
        return obj

    async def replace_slice(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = self._stamp(obj)
        self.slices[name] = obj
        self.writes.append(("update", name))
        return obj

    async def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        self.slices.pop(name, None)
        self.writes.append(("delete", name))


# --- the services, wired -----------------------------------------------------------------------


def pod_sandbox(pod: st.PodRef, netns: str, sandbox: str = "") -> nri_pb2.PodSandbox:
    """The NRI PodSandbox containerd sends for ``pod`` with its netns path."""
    p = nri_pb2.PodSandbox(id=sandbox or f"sb-{pod.uid}", uid=pod.uid, name=pod.name, namespace=pod.namespace)
    p.linux.namespaces.add(type="network", path=netns)
    return p


def new_pod(name: str = "") -> st.PodRef:
    return st.PodRef(uid=str(uuid.uuid4()), namespace="default", name=name or uid("pod-"))


class SlowKernelInventoryClient(InventoryClient):
    """prepare's inventory client with a longer call deadline: under TCG everything runs
    about 20 times slower than on hardware, and GetDevice with its snapshot (which reads
    every RDMA device's whole GID table, 1,024 sysfs files per rxe port) can take longer
    than the production deadline of 5 s."""

    async def _call(self, method: str, request: object, deadline_s: float = 60.0) -> object:
        return await super()._call(method, request, max(deadline_s, 60.0))


class Stack:
    """Store, inventory, prepare and attach in this process (see the module docstring)."""

    def __init__(self, workdir: Path, inventory_config: InventoryConfig | None = None) -> None:
        self.dir = workdir
        self.inventory_config = inventory_config or InventoryConfig()
        self.kube = FakeKube()
        self.rdma_netns_mode = ""
        self._servers: list[UdsServer] = []
        self._closers: list[Callable[[], Any]] = []

    async def start(self) -> Stack:
        self.db = StoreDB(str(self.dir / "db"))
        self.db.open()
        self.store_service = StoreService(self.db)
        store_sock = self.dir / "store.sock"
        await self._serve(UdsServer(store_sock).add(self.store_service.register))

        # As services.inventory.__main__.run: the RDMA mode is read once, at start.
        self.rdma_netns_mode = await asyncio.to_thread(read_netns_mode)
        self.inventory = Inventory(self.inventory_config, device_filter=DeviceFilter(DEFAULT_FILTER))
        await self.inventory.start()
        await self.inventory.scan()
        providers = Providers(hint=Hint.NONE, cloud=None, profiles=None)
        servicer = InventoryServicer(
            self.inventory, node_name=NODE, rdma_netns_mode=self.rdma_netns_mode, providers=providers
        )
        inv_sock = self.dir / "inventory.sock"
        await self._serve(UdsServer(inv_sock).add(servicer.register))

        self.store = StoreClient(store_sock)
        self.inventory_client = SlowKernelInventoryClient(inv_sock)
        self.preparer = Preparer(
            DRIVER, NODE, self.kube, self.inventory_client, self.store, require_attach=False
        )
        self.engine = NetdevEngine()
        self.writer = StoreWriter(self.store)
        self.writer.start()
        self.hooks = AttachHooks(self.store, self.engine, self.writer, HookConfig(stop_budget_s=30))
        return self

    async def _serve(self, server: UdsServer) -> None:
        await server.start()
        self._servers.append(server)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.hooks.close()
        with contextlib.suppress(Exception):
            await self.writer.close()
        self.engine.close()
        await self.store.close()
        await self.inventory_client.close()
        await self.store_service.end_streams()
        for s in reversed(self._servers):
            await s.stop(grace=0.5)
        self.store_service.close()
        self.db.close()

    # -- the steps of a Pod's life ----------------------------------------------------------------

    async def prepare(
        self, device: str, params: dict[str, Any] | None, pod: st.PodRef
    ) -> tuple[ClaimRef, ClaimResult]:
        """NodePrepareResources for one claim on ``device`` (a rescan first, as the
        devices were just made)."""
        await self.inventory.scan()
        ref = self.kube.add(device, params, pod)
        result = (await self.preparer.prepare([ref]))[ref.uid]
        return ref, result

    async def stored(self, pod: st.PodRef) -> st.PodState:
        await self.writer.flush(10)
        return await self.store.get_pod(pod.uid)


@contextlib.asynccontextmanager
async def running_stack(inventory_config: InventoryConfig | None = None) -> AsyncIterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="dnvm-") as tmp:
        stack = await Stack(Path(tmp), inventory_config).start()
        try:
            yield stack
        finally:
            await stack.close()
