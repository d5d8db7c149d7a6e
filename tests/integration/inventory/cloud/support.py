"""Helpers for the cloud provider tests: fake sysfs/procfs trees, network
namespaces, polling."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path


class FakeHost:
    """A sysfs/procfs tree laid out like the kernel's (relative symlinks included)."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.sys.mkdir(parents=True)
        self.proc.mkdir(parents=True)

    def _pci_dir(self, pci: str) -> Path:
        d = self.sys / "devices" / "pci0000:00" / pci
        d.mkdir(parents=True, exist_ok=True)
        link = self.sys / "bus" / "pci" / "devices" / pci
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(d, link.parent))
        return d

    def netdev(self, ifname: str, *, pci: str = "", arphrd: int = 1) -> None:
        """/sys/class/net/<if> (type file) and, with a PCI address, its device/net entry."""
        if pci:
            base = self._pci_dir(pci) / "net" / ifname
        else:
            base = self.sys / "devices" / "virtual" / "net" / ifname
        base.mkdir(parents=True, exist_ok=True)
        (base / "type").write_text(f"{arphrd}\n")
        link = self.sys / "class" / "net" / ifname
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(base, link.parent))

    def driver(self, pci: str, driver: str) -> None:
        drv = self.sys / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        d = self._pci_dir(pci)
        (d / "driver").symlink_to(os.path.relpath(drv, d))

    def rdma(self, name: str, pci: str, *, link_layer: str = "Ethernet") -> None:
        """/sys/class/infiniband/<name> -> the PCI function's infiniband/<name>."""
        d = self._pci_dir(pci)
        dev = d / "infiniband" / name
        (dev / "ports" / "1").mkdir(parents=True)
        (dev / "ports" / "1" / "link_layer").write_text(f"{link_layer}\n")
        # The kernel's link names the PCI function ("../../../0000:00:0b.0"), not "../..".
        (dev / "device").symlink_to(os.path.join(os.path.relpath(d.parent, dev), d.name))
        link = self.sys / "class" / "infiniband" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(dev, link.parent))

    def netns_mode(self, value: str) -> None:
        p = self.sys / "module" / "ib_core" / "parameters"
        p.mkdir(parents=True, exist_ok=True)
        (p / "netns_mode").write_text(f"{value}\n")

    def sysctl(self, ifname: str, setting: str, value: int) -> None:
        p = self.proc / "sys" / "net" / "ipv4" / "conf" / ifname
        p.mkdir(parents=True, exist_ok=True)
        (p / setting).write_text(f"{value}\n")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Netns:
    """A named network namespace the test owns; links are veth pairs (this kernel
    has no dummy driver), created inside it."""

    def __init__(self) -> None:
        self.name = f"dncloud-{uuid.uuid4().hex[:8]}"
        self.path = f"/var/run/netns/{self.name}"
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")

    def link(self, ifname: str, *addresses: str) -> None:
        peer = f"p{uuid.uuid4().hex[:10]}"
        _ip("-n", self.name, "link", "add", ifname, "type", "veth", "peer", "name", peer)
        _ip("-n", self.name, "link", "set", peer, "up")
        _ip("-n", self.name, "link", "set", ifname, "up")
        for addr in addresses:
            family = "-6" if ":" in addr else "-4"
            extra = ["nodad"] if family == "-6" else []
            _ip("-n", self.name, family, "addr", "add", addr, "dev", ifname, *extra)

    def run(self, *args: str) -> None:
        _ip("-n", self.name, *args)

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)


async def eventually(check: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    """Poll ``check`` until it holds, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {within}s")
        await asyncio.sleep(0.05)
