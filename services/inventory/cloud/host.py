"""The few host facts providers read themselves: sysfs and procfs files under a
configurable root (so tests build a fake tree from real layouts) and netlink
lookups in a configurable network namespace.

sysfs/procfs reads are small in-memory pseudo files; they do not block on disk,
so they are read directly. Netlink goes through pyroute2's AsyncIPRoute (imported on first use).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyroute2 import AsyncIPRoute

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
RT_TABLE_MAIN = 254


@dataclass(frozen=True)
class HostProbe:
    """Where to read host facts. ``netns`` is a netns path for netlink lookups
    (None: this process's namespace, the host's in the DaemonSet)."""

    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    netns: str | None = None

    def sys_path(self, *parts: str) -> Path:
        return Path(self.sysfs_root, *parts)

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    def read_sys(self, *parts: str) -> str | None:
        """A sysfs file's stripped content, or None when it cannot be read."""
        return self._read(self.sys_path(*parts))

    def interfaces(self) -> list[str]:
        """Interface names under /sys/class/net, sorted."""
        try:
            return sorted(os.listdir(self.sys_path("class", "net")))
        except OSError:
            return []

    def interface_type(self, ifname: str) -> int | None:
        """The ARPHRD type of ``ifname`` (1 Ethernet, 32 InfiniBand), or None."""
        value = self.read_sys("class", "net", ifname, "type")
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def interface_for_pci(self, pci_address: str) -> str:
        """The one netdev of a PCI function; ValueError says why there is none."""
        if not pci_address:
            raise ValueError("device has no PCI address")
        directory = self.sys_path("bus", "pci", "devices", pci_address, "net")
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise ValueError(
                f"cannot read network interfaces of PCI device {pci_address}: {exc.strerror}"
            ) from None
        if len(names) != 1:
            raise ValueError(
                f"expected one network interface for PCI device {pci_address}, found {len(names)}"
            )
        return names[0]

    def pci_driver(self, pci_address: str) -> str | None:
        """The kernel driver bound to a PCI function (basename of its driver link)."""
        if not pci_address:
            return None
        try:
            return os.path.basename(
                os.readlink(self.sys_path("bus", "pci", "devices", pci_address, "driver"))
            )
        except OSError:
            return None

    def rdma_devices(self) -> dict[str, str]:
        """RDMA device name -> PCI address (basename of /sys/class/infiniband/<dev>/device)."""
        base = self.sys_path("class", "infiniband")
        out: dict[str, str] = {}
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return out
        for name in names:
            try:
                out[name] = os.path.basename(os.readlink(base / name / "device"))
            except OSError:
                continue
        return out

    def infiniband_device_for_pci(self, pci_address: str) -> str:
        """The first RDMA device (lexical order) of a PCI function that has a port whose
        link layer is InfiniBand, or ""."""
        if not pci_address:
            return ""
        base = self.sys_path("bus", "pci", "devices", pci_address, "infiniband")
        try:
            devices = sorted(os.listdir(base))
        except OSError:
            return ""
        for dev in devices:
            try:
                ports = sorted(os.listdir(base / dev / "ports"))
            except OSError:
                continue
            for port in ports:
                if self._read(base / dev / "ports" / port / "link_layer") == "InfiniBand":
                    return dev
        return ""

    def rdma_exclusive_netns_mode(self) -> bool:
        """True when ib_core says exclusive netns mode; unreadable counts as shared."""
        return self.read_sys("module", "ib_core", "parameters", "netns_mode") in ("0", "N")

    def arp_sysctl(self, ifname: str, setting: str) -> int | None:
        """net.ipv4.conf.<ifname>.<setting> (arp_ignore, arp_announce); None when absent.
        ValueError when present but unparsable."""
        path = Path(self.procfs_root, "sys", "net", "ipv4", "conf", ifname, setting)
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"cannot parse {path}: {text!r}") from None

    def _netlink(self) -> AsyncIPRoute:
        # Imported on first use: only the cloud providers read addresses, and pyroute2 costs
        # about 24 MiB in every inventory that never does.
        from pyroute2 import AsyncIPRoute

        if self.netns:
            # flags=0: never create the namespace by accident (pyroute2 defaults to O_CREAT).
            return AsyncIPRoute(netns=self.netns, flags=0)
        return AsyncIPRoute()

    async def _addresses(
        self, ifname: str, family: int
    ) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
        async with self._netlink() as ipr:
            indexes = await ipr.link_lookup(ifname=ifname)
            if not indexes:
                raise ValueError(f"interface {ifname} not found")
            out: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = []
            async for msg in await ipr.get_addr(index=indexes[0], family=family):
                addr = msg.get("IFA_ADDRESS")
                if addr:
                    out.append(ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}"))
            return out

    async def ipv4_addresses(self, ifname: str) -> list[ipaddress.IPv4Interface]:
        """The IPv4 addresses of ``ifname`` that are not link-local. ValueError if no such link."""
        addrs = await self._addresses(ifname, socket.AF_INET)
        return [a for a in addrs if isinstance(a, ipaddress.IPv4Interface) and not a.ip.is_link_local]

    async def ipv6_default_gateway(self, ifname: str) -> str | None:
        """The gateway of the IPv6 default route through ``ifname`` in the main table."""
        async with self._netlink() as ipr:
            indexes = await ipr.link_lookup(ifname=ifname)
            if not indexes:
                return None
            async for route in await ipr.get_routes(
                family=socket.AF_INET6, oif=indexes[0], table=RT_TABLE_MAIN
            ):
                if route["dst_len"] != 0:
                    continue
                gateway = route.get("RTA_GATEWAY")
                if gateway:
                    return str(gateway)
        return None
