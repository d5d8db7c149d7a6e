"""Node-local IP allocation for profiles that hand out addresses (GCE IPvlan
children): one lease per (device, claim), kept in a JSON file so an inventory
restart neither forgets nor duplicates an address.

dranet keeps its allocator in memory and seeds it from the driver checkpoint at
start; keying the lease by claim makes a repeated resolution return the same
addresses, which is what keeps a retried NodePrepareResources from leaking one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import random
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_FILE_VERSION = 1


class IPAMError(Exception):
    """An allocation failed; the message names the range or the address."""


@dataclass(frozen=True)
class IPRange:
    """An inclusive range of one family."""

    start: IPAddress
    end: IPAddress

    def __post_init__(self) -> None:
        if self.start.version != self.end.version or int(self.start) > int(self.end):
            raise IPAMError(f"invalid range {self.start}-{self.end}")

    @property
    def size(self) -> int:
        return int(self.end) - int(self.start) + 1

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def range_from_cidr(cidr: str, start_reserved: int = 0, end_reserved: int = 0) -> IPRange:
    """The allocatable range of a CIDR: the network and last addresses are always
    excluded (as dranet's IPRangeFromCIDR does for both families), plus
    ``start_reserved``/``end_reserved`` more at each end."""
    if start_reserved < 0 or end_reserved < 0:
        raise IPAMError(f"reserved counts must be non-negative (start={start_reserved}, end={end_reserved})")
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise IPAMError(f"invalid CIDR {cidr!r}: {exc}") from None
    first = int(net.network_address) + 1 + start_reserved
    last = int(net.broadcast_address) - 1 - end_reserved
    if first > last:
        raise IPAMError(
            f"CIDR {cidr} is too small to reserve {start_reserved} start and {end_reserved} end addresses"
            " (network and last address are also excluded)"
        )
    # ip_address(int) would guess IPv4 for small IPv6 values; build the right family.
    make = ipaddress.IPv4Address if net.version == 4 else ipaddress.IPv6Address
    return IPRange(make(first), make(last))


def host_prefix(addr: IPAddress) -> str:
    return f"{addr}/{addr.max_prefixlen}"


class LeaseStore:
    """Leases keyed by "<device>/<claim uid>", each a tuple of host CIDRs.

    ``path`` "" keeps leases in memory only. Writes go to a temp file, fsync,
    rename, so a crash leaves either the old or the new file.
    """

    def __init__(self, path: str = "") -> None:
        self.path = path
        self._leases: dict[str, tuple[str, ...]] = {}
        self._lock = asyncio.Lock()
        self._loaded = False

    @staticmethod
    def key(device: str, claim_uid: str) -> str:
        return f"{device}/{claim_uid}"

    def _load_sync(self) -> dict[str, tuple[str, ...]]:
        if not self.path or not os.path.exists(self.path):
            return {}
        with open(self.path, encoding="utf-8") as f:
            raw = json.load(f)
        if (
            not isinstance(raw, dict)
            or raw.get("version") != _FILE_VERSION
            or not isinstance(raw.get("leases"), dict)
        ):
            raise IPAMError(f"lease file {self.path} has an unknown format")
        out: dict[str, tuple[str, ...]] = {}
        for key, addrs in raw["leases"].items():
            if isinstance(key, str) and isinstance(addrs, list) and all(isinstance(a, str) for a in addrs):
                out[key] = tuple(addrs)
        return out

    def _save_sync(self, leases: dict[str, tuple[str, ...]]) -> None:
        if not self.path:
            return
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".leases-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": _FILE_VERSION, "leases": {k: list(v) for k, v in leases.items()}}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    async def _ensure_loaded(self) -> None:
        if not self._loaded:
            try:
                self._leases = await asyncio.to_thread(self._load_sync)
            except (OSError, ValueError) as exc:
                raise IPAMError(f"cannot read lease file {self.path}: {exc}") from None
            self._loaded = True

    async def _commit(self, leases: dict[str, tuple[str, ...]]) -> None:
        # Disk first, memory second: a failed write leaves the in-memory view unchanged.
        try:
            await asyncio.to_thread(self._save_sync, leases)
        except OSError as exc:
            raise IPAMError(f"cannot write lease file {self.path}: {exc}") from None
        self._leases = leases

    def _in_use(self, except_key: str = "") -> set[IPAddress]:
        used: set[IPAddress] = set()
        for key, addrs in self._leases.items():
            if key == except_key:
                continue
            for a in addrs:
                used.add(ipaddress.ip_interface(a).ip)
        return used

    async def get(self, key: str) -> tuple[str, ...] | None:
        async with self._lock:
            await self._ensure_loaded()
            return self._leases.get(key)

    async def allocate(self, key: str, ranges: Sequence[IPRange]) -> tuple[str, ...]:
        """One address from each range (one range per family), as host CIDRs.
        The same key gets the same addresses back."""
        async with self._lock:
            await self._ensure_loaded()
            existing = self._leases.get(key)
            if existing is not None:
                return existing
            families = [r.start.version for r in ranges]
            if len(set(families)) != len(families):
                raise IPAMError("at most one range per IP family")
            used = self._in_use()
            chosen: list[str] = []
            for rng in sorted(ranges, key=lambda r: r.start.version):
                addr = _pick(rng, used)
                if addr is None:
                    raise IPAMError(f"no free address left in {rng}")
                used.add(addr)
                chosen.append(host_prefix(addr))
            leases = dict(self._leases)
            leases[key] = tuple(chosen)
            await self._commit(leases)
            return leases[key]

    async def reserve(self, key: str, addresses: Iterable[str]) -> None:
        """Record addresses the claim chose itself, so they are not handed out again.
        IPAMError when another claim holds one of them."""
        wanted = tuple(addresses)
        async with self._lock:
            await self._ensure_loaded()
            used_elsewhere = self._in_use(except_key=key)
            for a in wanted:
                try:
                    ip = ipaddress.ip_interface(a).ip
                except ValueError:
                    raise IPAMError(f"invalid address {a!r}") from None
                if ip in used_elsewhere:
                    raise IPAMError(f"address {ip} is already allocated to another claim on this node")
            if self._leases.get(key) == wanted:
                return
            leases = dict(self._leases)
            leases[key] = wanted
            await self._commit(leases)

    async def release(self, key: str) -> tuple[str, ...]:
        """Free the key's addresses; returns them (empty when there was no lease)."""
        async with self._lock:
            await self._ensure_loaded()
            if key not in self._leases:
                return ()
            leases = dict(self._leases)
            freed = leases.pop(key)
            await self._commit(leases)
            return freed


def _pick(rng: IPRange, used: set[IPAddress]) -> IPAddress | None:
    """A free address of ``rng``, scanning from a random offset (like kindnet's
    allocator) so restarts and neighbours do not all start at the same address."""
    make = ipaddress.IPv4Address if rng.start.version == 4 else ipaddress.IPv6Address
    start = int(rng.start)
    size = rng.size
    offset = random.randrange(size)
    # Bounded scan: a huge IPv6 range is never walked in full.
    for i in range(min(size, 65536)):
        candidate = make(start + (offset + i) % size)
        if candidate not in used:
            return candidate
    return None
