"""The attach service's test world: a real store process, a real attach process on a
real containerd's NRI socket, veth "NICs" whose far end sits in a peer netns, and
`ip -j` to look at the result. Used by the attach integration and e2e tests and by
tests/bench/attach.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import json
import os
import secrets
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.cluster.containerd import Containerd
from dev.cluster.cri import CriClient, SandboxConfig
from dev.cluster.procs import ServiceProcess
from proto.dranet.store.v1 import store_pb2 as st
from shared.netconfig import InterfaceConfig, NetworkConfig, parse_network_config
from shared.storeclient import StoreClient

DRIVER = "dra.net"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
POOL = "node-1"


# -- processes ----------------------------------------------------------------------------


def store_process(workdir: Path) -> ServiceProcess:
    run = workdir / "run"
    return ServiceProcess(
        "services.store",
        ["--db-dir", str(workdir / "db"), "--run-dir", str(run)],
        socket=run / "store.sock",
        log_path=workdir / "store.log",
    )


def attach_process(
    workdir: Path, nri_socket: str | os.PathLike[str], *extra: str, netns: str | None = None
) -> ServiceProcess:
    """``python -m services.attach`` on ``nri_socket`` (inside ``netns`` when given) with
    short graceful-stop timings unless ``extra`` overrides them (argparse keeps the last)."""
    run = workdir / "run"
    return ServiceProcess(
        "services.attach",
        [
            "--run-dir",
            str(run),
            "--nri-socket",
            os.fspath(nri_socket),
            "--log-level",
            "DEBUG",
            "--drain-quiet",
            "1",
            "--drain-poll",
            "0.2",
            "--drain-timeout",
            "20",
            *extra,
        ],
        socket=run / "attach.sock",
        log_path=workdir / "attach.log",
        netns=netns,
    )


async def wait_for(
    check: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition", interval_s: float = 0.05
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    last: Any = None
    while True:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        if loop.time() > end:
            raise TimeoutError(f"{what} not reached within {timeout_s}s (last: {last!r})")
        await asyncio.sleep(interval_s)


async def wait_liveness(
    store: StoreClient, connected: bool, draining: bool | None = None, timeout_s: float = 20.0
) -> st.AttachLiveness:
    async def check() -> st.AttachLiveness | None:
        live = await store.get_liveness()
        if live.connected == connected and (draining is None or live.draining == draining):
            return live
        return None

    result: st.AttachLiveness = await wait_for(
        check, timeout_s, f"liveness connected={connected} draining={draining}"
    )
    return result


# -- ip(8) ---------------------------------------------------------------------------------


def ip_json(netns: str | None, *args: str) -> Any:
    """``ip -j [-n netns] args`` as Python data."""
    cmd = ["ip", "-j"] + (["-n", netns_name(netns)] if netns else []) + list(args)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else []


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def netns_name(path: str) -> str:
    """`ip -n` takes a name under /var/run/netns (where containerd mounts pod netns)."""
    return os.path.basename(path)


def link(netns: str | None, name: str) -> dict[str, Any] | None:
    """The link ``name`` (None if absent, or if the netns itself is gone)."""
    if netns and netns.startswith("/") and not os.path.exists(netns):
        return None
    for entry in ip_json(netns, "link", "show"):
        if entry.get("ifname") == name:
            return dict(entry)
    return None


def addresses(netns: str | None, name: str) -> list[str]:
    out = []
    for entry in ip_json(netns, "addr", "show", "dev", name):
        for a in entry.get("addr_info", []):
            if a.get("scope") == "global":
                out.append(f"{a['local']}/{a['prefixlen']}")
    return out


def routes(netns: str, *args: str) -> list[dict[str, Any]]:
    return list(ip_json(netns, "route", "show", *args))


def rules(netns: str) -> list[dict[str, Any]]:
    return list(ip_json(netns, "rule", "show"))


def neighbors(netns: str, name: str) -> list[dict[str, Any]]:
    return list(ip_json(netns, "neigh", "show", "dev", name))


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _ping_in_netns(netns: str, address: str, count: int, timeout_s: float) -> int:
    """ICMP echo from inside ``netns`` (this thread enters it); how many replies came.
    The machine has no ping(8); a raw ICMP socket does the same."""
    fd = os.open(netns, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)
    ident = secrets.randbits(16)
    replies = 0
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.settimeout(timeout_s)
        for seq in range(count):
            body = struct.pack("!HH", ident, seq) + b"dranet-attach-test"
            header = struct.pack("!BBH", 8, 0, 0)
            packet = struct.pack("!BBH", 8, 0, _checksum(header + body)) + body
            s.sendto(packet, (address, 0))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    data, peer = s.recvfrom(2048)
                except TimeoutError:
                    break
                ihl = (data[0] & 0x0F) * 4
                kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
                if peer[0] == address and kind == 0 and (rid, rseq) == (ident, seq):
                    replies += 1
                    break
    return replies


def ping(netns: str, address: str, count: int = 2, timeout_s: float = 2.0) -> bool:
    """True when ``address`` answers every ICMP echo sent from ``netns``."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # A fresh thread: setns() changes the calling thread for good.
        return pool.submit(_ping_in_netns, netns, address, count, timeout_s).result() == count


def mac_of(netns: str | None, name: str) -> str:
    entry = link(netns, name)
    return str(entry["address"]) if entry else ""


# -- veth "NICs" ---------------------------------------------------------------------------


@dataclass
class VethNic:
    """A veth pair standing in for a NIC: ``name`` on the host (the device a claim
    names), its peer ``peer_name`` in the netns ``peer_ns`` with ``peer_cidr``."""

    name: str
    peer_name: str
    peer_ns: str
    peer_cidr: str
    peer_mac: str = ""

    @property
    def peer_ip(self) -> str:
        return self.peer_cidr.split("/")[0]

    def address(self, host: int) -> str:
        """An address on the NIC's /24 (the peer is .1)."""
        return f"{self.peer_ip.rsplit('.', 1)[0]}.{host}/24"

    def on_host(self) -> bool:
        return Path(f"/sys/class/net/{self.name}").exists()


@dataclass
class NicFactory:
    """Creates veth NICs and removes every one of them (and their peer netns) at the end."""

    prefix: str = field(default_factory=lambda: "dn" + secrets.token_hex(2))
    made: list[VethNic] = field(default_factory=list)

    def make(self, subnet_index: int) -> VethNic:
        i = len(self.made)
        nic = VethNic(
            name=f"{self.prefix}n{i}",
            peer_name=f"{self.prefix}p{i}",
            peer_ns=f"{self.prefix}-peer{i}",
            peer_cidr=f"10.{200 + subnet_index // 250}.{subnet_index % 250}.1/24",
        )
        self.made.append(nic)
        ip("netns", "add", nic.peer_ns)
        ip("link", "add", nic.name, "type", "veth", "peer", "name", nic.peer_name)
        ip("link", "set", nic.peer_name, "netns", nic.peer_ns)
        ip("-n", nic.peer_ns, "addr", "add", nic.peer_cidr, "dev", nic.peer_name)
        ip("-n", nic.peer_ns, "link", "set", nic.peer_name, "up")
        ip("-n", nic.peer_ns, "link", "set", "lo", "up")
        ip("link", "set", nic.name, "up")
        nic.peer_mac = mac_of(nic.peer_ns, nic.peer_name)
        return nic

    def cleanup(self) -> None:
        for nic in self.made:
            # Deleting the peer's netns destroys the pair wherever the NIC end is.
            ip("netns", "del", nic.peer_ns, check=False)
            ip("link", "del", nic.name, check=False)


@contextlib.contextmanager
def nics() -> Iterator[NicFactory]:
    f = NicFactory()
    try:
        yield f
    finally:
        f.cleanup()


# -- configs and pods ----------------------------------------------------------------------


@dataclass(frozen=True)
class PodId:
    name: str
    uid: str
    namespace: str = "attach-test"

    @staticmethod
    def new(name: str) -> PodId:
        return PodId(name=name, uid=str(uuid.uuid4()))

    def sandbox(self, **kw: Any) -> SandboxConfig:
        return SandboxConfig(name=self.name, uid=self.uid, namespace=self.namespace, **kw)

    def ref(self) -> st.PodRef:
        return st.PodRef(uid=self.uid, namespace=self.namespace, name=self.name)


def device_config(
    pod: PodId,
    nic: VethNic,
    config: NetworkConfig,
    device: str | None = None,
    claim: str = "",
    rdma: st.RdmaConfig | None = None,
) -> st.DeviceConfig:
    """A DeviceConfig as prepare stores it for the veth ``nic``."""
    claim_name = claim or f"claim-{nic.name}"
    host = NetworkConfig(interface=InterfaceConfig(name=nic.name))
    return st.DeviceConfig(
        pod=pod.ref(),
        device=device or nic.name,
        claim=st.ClaimRef(uid=f"uid-{claim_name}-{pod.uid[:8]}", namespace=pod.namespace, name=claim_name),
        request="nic",
        driver=DRIVER,
        pool=POOL,
        host_ifname=nic.name,
        pod_config_json=config.to_json(),
        host_config_json=host.to_json(),
        rdma=rdma or st.RdmaConfig(),
        rdma_netns_mode="shared",
    )


async def run_pod(cri: CriClient, ctrd: Containerd, pod: PodId, **kw: Any) -> tuple[str, str]:
    """RunPodSandbox through CRI; (sandbox id, netns path)."""
    sid = await cri.run_pod_sandbox(pod.sandbox(**kw))
    netns = (await cri.pod_sandbox_status(sid)).netns_path
    ctrd.note_netns(netns)
    return sid, netns


async def stop_pod(cri: CriClient, sid: str, remove: bool = True) -> None:
    await cri.stop_pod_sandbox(sid)
    if remove:
        await cri.remove_pod_sandbox(sid)


@dataclass
class World:
    """One test's running attach world: a containerd, CRI on it, the store and attach
    processes with a client on the store, and the veth NICs it made."""

    tmp: Path
    ctrd: Containerd
    cri: CriClient
    store_proc: ServiceProcess
    store: StoreClient
    attach: ServiceProcess
    nics: NicFactory = field(default_factory=NicFactory)

    async def put(self, pod: PodId, nic: VethNic, config: dict[str, Any], **kw: Any) -> st.DeviceConfig:
        """Store the DeviceConfig prepare would store for ``nic`` with ``config``."""
        cfg = parse_network_config(config)
        assert cfg is not None
        stored = device_config(pod, nic, cfg, **kw)
        await self.store.put_devices([stored])
        return stored

    async def result(self, pod: PodId, device: str) -> st.AttachResult | None:
        state = await self.store.get_pod(pod.uid)
        return results_by_device(state).get(device)


def attach_log_lines(proc: ServiceProcess) -> list[dict[str, Any]]:
    out = []
    for line in proc.log().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def results_by_device(state: st.PodState) -> dict[str, st.AttachResult]:
    return {r.device: r for r in state.results}


def names(entries: Sequence[dict[str, Any]], key: str = "ifname") -> list[str]:
    return [str(e.get(key)) for e in entries]
