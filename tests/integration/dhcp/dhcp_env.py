"""A DHCP test world on the host kernel: a real dnsmasq in a server netns, on one end of a
veth pair whose other end (the "NIC") sits in a node netns, as in the dev harness where
the NICs live in the node's netns and prepare runs outside it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"


def sh(*args: str, check: bool = True) -> str:
    res = subprocess.run(args, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def ipj(ns: str | None, *args: str) -> Any:
    """``ip -j`` output in netns ``ns`` (a name under /var/run/netns; None: this one)."""
    base = ["ip", "-n", ns] if ns else ["ip"]
    out = sh(*base, "-j", *args)
    return json.loads(out) if out.strip() else []


def addrs(ns: str | None, name: str) -> list[str]:
    return sorted(
        f"{a['local']}/{a['prefixlen']}"
        for entry in ipj(ns, "addr", "show", "dev", name)
        for a in entry.get("addr_info", [])
        if a.get("family") == "inet"
    )


def routes(ns: str, name: str) -> set[tuple[str, str, str]]:
    """(destination, gateway, scope) of the IPv4 main-table routes through ``name``, as ip
    prints them ("default" for 0.0.0.0/0), without the kernel's own connected route."""
    out = set()
    for r in ipj(ns, "-4", "route", "show", "dev", name):
        if r.get("protocol") == "kernel":
            continue
        dst = r["dst"]
        if dst != "default" and "/" not in dst:
            dst += "/32"
        out.add((dst, r.get("gateway", ""), r.get("scope", "global")))
    return out


@dataclass
class Dnsmasq:
    """dnsmasq, DHCP only, on ``iface`` in netns ``ns``, which has ``prefix``.1/24; its
    lease database and log (--log-dhcp) in ``workdir``."""

    ns: str
    iface: str
    prefix: str  # "10.233.7"
    workdir: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def server_ip(self) -> str:
        return f"{self.prefix}.1"

    @property
    def leasefile(self) -> Path:
        return self.workdir / f"dnsmasq-{self.tag}.leases"

    @property
    def logfile(self) -> Path:
        return self.workdir / f"dnsmasq-{self.tag}.log"

    def serve(
        self, options: Sequence[str] = (), lease: str = "1h", first: int = 100, last: int = 150
    ) -> None:
        """Hand out .first-.last with ``options`` (dnsmasq --dhcp-option values, e.g.
        "3,10.0.0.1" or "121,192.0.2.0/24,10.0.0.254")."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.leasefile.touch()
        cmd = [
            "ip", "netns", "exec", self.ns, DNSMASQ,
            "--keep-in-foreground", "--conf-file=/dev/null", "--user=root", "--group=root",
            "--port=0", "--no-resolv", "--no-hosts", "--no-ping", "--log-dhcp",
            f"--log-facility={self.logfile}", f"--dhcp-leasefile={self.leasefile}", "--pid-file=",
            f"--interface={self.iface}", "--bind-interfaces",
            f"--dhcp-range={self.prefix}.{first},{self.prefix}.{last},255.255.255.0,{lease}",
            *(f"--dhcp-option={o}" for o in options),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while "DHCP, sockets bound" not in self.log():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"dnsmasq exited with {self.proc.returncode}: {err}\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"dnsmasq not ready: {self.log()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def count(self, message: str) -> int:
        """How many DHCP messages of a kind ("DHCPDISCOVER", "DHCPACK", "DHCPRELEASE") dnsmasq logged."""
        return sum(1 for line in self.log().splitlines() if f" {message}(" in line)

    def leases(self) -> list[str]:
        """The addresses in dnsmasq's lease database."""
        try:
            return [line.split()[2] for line in self.leasefile.read_text().splitlines() if line.strip()]
        except FileNotFoundError:
            return []


def server_netns(ns: str, iface: str, prefix: str) -> None:
    """Make netns ``ns`` and give ``iface`` (already moved there) ``prefix``.1/24, up."""
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "addr", "add", f"{prefix}.1/24", "dev", iface)
    sh("ip", "-n", ns, "link", "set", iface, "up")


@dataclass
class DhcpNet:
    """Node netns ``node_ns`` with the NIC ``nic``; server netns ``srv_ns`` with its peer
    ``srv_if`` at 10.233.<net>.1/24 and, once ``serve`` ran, dnsmasq on it."""

    workdir: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    net: int = field(default_factory=lambda: secrets.randbelow(250) + 1)
    extra_ns: list[str] = field(default_factory=list)
    server: Dnsmasq | None = None

    @property
    def node_ns(self) -> str:
        return f"dhn{self.tag}"

    @property
    def srv_ns(self) -> str:
        return f"dhs{self.tag}"

    @property
    def node_path(self) -> str:
        return f"/var/run/netns/{self.node_ns}"

    @property
    def nic(self) -> str:
        return f"dh{self.tag}n"

    @property
    def srv_if(self) -> str:
        return f"dh{self.tag}s"

    @property
    def prefix(self) -> str:
        return f"10.233.{self.net}"

    @property
    def server_ip(self) -> str:
        return f"{self.prefix}.1"

    @property
    def dnsmasq(self) -> Dnsmasq:
        if self.server is None:
            self.server = Dnsmasq(self.srv_ns, self.srv_if, self.prefix, self.workdir, tag=self.tag)
        return self.server

    def create(self, nic_up: bool = True) -> DhcpNet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for ns in (self.node_ns, self.srv_ns):
            sh("ip", "netns", "add", ns)
        sh("ip", "-n", self.node_ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.node_ns, "link", "add", self.nic, "type", "veth", "peer", "name", self.srv_if)
        sh("ip", "-n", self.node_ns, "link", "set", self.srv_if, "netns", self.srv_ns)
        server_netns(self.srv_ns, self.srv_if, self.prefix)
        if nic_up:
            sh("ip", "-n", self.node_ns, "link", "set", self.nic, "up")
        return self

    def pod_ns(self) -> str:
        """A fresh netns standing in for a Pod's (``ip netns add``); its name."""
        name = f"dhp{self.tag}{len(self.extra_ns)}"
        sh("ip", "netns", "add", name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        self.extra_ns.append(name)
        return name

    def serve(self, options: Sequence[str] = (), lease: str = "1h") -> None:
        self.dnsmasq.serve(options, lease)

    def count(self, message: str) -> int:
        return self.dnsmasq.count(message)

    def leases(self) -> list[str]:
        return self.dnsmasq.leases()

    def cleanup(self) -> None:
        if self.server is not None:
            self.server.stop()
        for ns in (*self.extra_ns, self.node_ns, self.srv_ns):
            sh("ip", "netns", "del", ns, check=False)


@contextlib.contextmanager
def dhcp_net(workdir: Path, nic_up: bool = True) -> Iterator[DhcpNet]:
    net = DhcpNet(workdir)
    try:
        yield net.create(nic_up=nic_up)
    finally:
        net.cleanup()
