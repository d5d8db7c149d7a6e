"""The device store and the rescan loop (dranet pkg/inventory DB.Run).

A scan reads the host (in a worker thread), adds the cloud provider's attributes
and config, keeps at most 32 attributes per device, merges in the devices kept for
Pods (PersistentResourceSliceAttributes, before the filter, as dranet), runs the
publish filter and hands the published devices on. Scans are paced by a token bucket (--min-poll-
interval, --poll-burst) and happen at least every --max-poll-interval; netlink
link and address notifications wake the loop early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from services.inventory import attributes as A
from services.inventory import discovery, rtnl
from services.inventory.bpf import TcxQuery
from services.inventory.cloud.base import DeviceInfo, Providers, advertised_profiles
from services.inventory.discovery import Device, ScanOptions
from services.inventory.filter import DeviceFilter, apply_filter
from services.inventory.kept import KeptDevices
from services.inventory.pciids import PciIds, find_database
from services.inventory.sysfs import Sysfs
from shared import slicemerge

log = logging.getLogger(__name__)

DEFAULT_MIN_POLL_INTERVAL = 2.0
DEFAULT_MAX_POLL_INTERVAL = 60.0
DEFAULT_POLL_BURST = 5


@dataclass(frozen=True)
class InventoryConfig:
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    pci_ids: str = ""
    move_ib_interfaces: bool = True
    min_poll_interval: float = DEFAULT_MIN_POLL_INTERVAL
    max_poll_interval: float = DEFAULT_MAX_POLL_INTERVAL
    poll_burst: int = DEFAULT_POLL_BURST
    # DRAListTypeAttributes: resource.kubernetes.io/numaNode as an int list.
    list_numa_attributes: bool = False


class RateLimiter:
    """A token bucket like golang.org/x/time/rate: ``burst`` scans at once, then one
    every ``interval`` seconds."""

    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = max(interval, 0.0)
        self.burst = max(burst, 1)
        self.clock = clock
        self.tokens = float(self.burst)
        self.last = clock()

    def _refill(self) -> None:
        now = self.clock()
        if self.interval > 0:
            self.tokens = min(self.burst, self.tokens + (now - self.last) / self.interval)
        else:
            self.tokens = float(self.burst)
        self.last = now

    def delay(self) -> float:
        """Take a token; the seconds to wait before using it (0 when one was there)."""
        self._refill()
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens * self.interval

    async def wait(self) -> None:
        d = self.delay()
        if d > 0:
            await asyncio.sleep(d)


class LinkEvents:
    """Sets ``event`` on every rtnetlink link (and address) notification."""

    GROUPS = rtnl.RTMGRP_LINK | rtnl.RTMGRP_IPV4_IFADDR | rtnl.RTMGRP_IPV6_IFADDR

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event
        self.nl: rtnl.Netlink | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> bool:
        try:
            self.nl = rtnl.Netlink(groups=self.GROUPS)
        except OSError as exc:
            log.error("cannot subscribe to netlink link events; scanning on the poll interval only: %s", exc)
            return False
        self.nl.sock.setblocking(False)
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.nl.fileno(), self._readable)
        return True

    def _readable(self) -> None:
        assert self.nl is not None
        try:
            n = self.nl.drain()
        except OSError as exc:
            log.warning("netlink event socket failed: %s", exc)
            n = 1
        if n:
            self.event.set()

    def close(self) -> None:
        if self.nl is not None:
            if self.loop is not None:
                self.loop.remove_reader(self.nl.fileno())
            self.nl.close()
            self.nl = None


PublishCallback = Callable[[Sequence[Device]], None]


def merge_kept(live: Sequence[Device], kept: Sequence[Device]) -> tuple[list[Device], dict[str, list[str]]]:
    """``live`` with the ``kept`` devices merged in (shared.slicemerge: a kept device the
    host no longer shows is published as kept, one it shows gets the attributes only the
    kept copy has), sorted by name; and, per device, the attributes dropped to stay within
    the API's 32. (dranet does not cut here; a device over the limit makes the API server
    refuse the whole slice, so the same keep-order as a scan's applies.)"""
    if not kept:
        return list(live), {}
    by_name = {d.name: d for d in live}
    names = {k.name for k in kept}
    entries = slicemerge.merge_devices(
        [by_name[n].slice_entry() for n in sorted(names) if n in by_name], [k.slice_entry() for k in kept]
    )
    out = dict(by_name)
    dropped: dict[str, list[str]] = {}
    for entry in entries:
        merged = Device.from_slice_entry(entry)
        attrs, cut = A.limit_attributes(merged.attributes)
        if cut:
            dropped[merged.name] = cut
        base = by_name.get(merged.name)
        # A live device keeps what lookups need (ifname, PCI address, ...).
        out[merged.name] = replace(base or merged, attributes=attrs, capacity=merged.capacity)
    return [out[n] for n in sorted(out)], dropped


def device_info(d: Device) -> DeviceInfo:
    """What cloud providers match their metadata on."""
    return DeviceInfo(
        name=d.name,
        ifname=d.ifname,
        mac=d.mac,
        pci_address=d.pci_address,
        rdma=bool(d.rdma_device),
        rdma_device=d.rdma_device,
    )


class Inventory:
    """The node's devices as of the last scan, and the loop that keeps them fresh."""

    def __init__(
        self,
        config: InventoryConfig,
        *,
        providers: Providers | None = None,
        device_filter: DeviceFilter | None = None,
        on_publish: PublishCallback | None = None,
        kept: KeptDevices | None = None,
    ) -> None:
        self.config = config
        self.providers = providers
        self.filter = device_filter
        self.on_publish = on_publish
        # PersistentResourceSliceAttributes: None when the gate is off.
        self.kept = kept
        self.sysfs = Sysfs(config.sysfs_root, config.dev_root)
        db = find_database(config.pci_ids)
        if db is None:
            log.warning("no pci.ids database found; dra.net/pciVendor and pciDevice carry hex IDs")
        self.pciids = PciIds(db)
        self.tcx = TcxQuery()
        self.options = ScanOptions(
            move_ib_interfaces=config.move_ib_interfaces, list_numa_attributes=config.list_numa_attributes
        )
        self.devices: dict[str, Device] = {}
        self.published: frozenset[str] = frozenset()
        self.scans = 0
        self.last_scan_seconds = 0.0
        self._had_devices = False
        self._scan_lock = asyncio.Lock()
        self._scanned = asyncio.Condition()
        self._wake = asyncio.Event()
        self._warned: set[tuple[str, tuple[str, ...]]] = set()
        self._told_waiting = False
        self.ready = False

    async def start(self) -> None:
        """Read what dranet reads once at start: the uplinks to leave out."""
        excluded = await asyncio.to_thread(discovery.excluded_uplinks)
        if excluded:
            log.info(
                "leaving out default-gateway uplinks and their enslaved links",
                extra={"interfaces": sorted(excluded)},
            )
        self.options = replace(self.options, excluded_interfaces=excluded)
        if self.providers is not None and self.providers.cloud is not None:
            self.providers.cloud.add_listener(self.request_rescan)

    # --- scanning --------------------------------------------------------------------------------

    def _scan_host(self) -> list[Device]:
        facts = discovery.gather(self.sysfs, self.tcx, numa_topology=self.options.list_numa_attributes)
        return discovery.build_devices(facts, self.options, self.pciids)

    async def scan(self) -> list[Device]:
        """Scan now; returns every device found (published or not)."""
        async with self._scan_lock:
            started = time.perf_counter()
            found = await asyncio.to_thread(self._scan_host)
            devices = await self._enrich(found)
            self.devices = {d.name: d for d in devices}
            published = await self._publish(devices)
            self.last_scan_seconds = time.perf_counter() - started
            self.ready = True
            log.debug(
                "scan done",
                extra={
                    "devices": len(devices),
                    "published": len(published),
                    "seconds": self.last_scan_seconds,
                },
            )
            async with self._scanned:
                self.scans += 1
                self._scanned.notify_all()
            return devices

    async def republish(self) -> None:
        """Publish again from the last scan, without scanning: the kept devices changed."""
        async with self._scan_lock:
            if not self.ready:
                return  # the first scan, still to come, publishes
            await self._publish(list(self.devices.values()))

    async def _publish(self, devices: Sequence[Device]) -> list[Device]:
        """Merge the kept devices in, filter, hand the result on; the published devices.
        Called with the scan lock held."""
        candidates = list(devices)
        hold = False
        if self.kept is not None:
            if self.kept.synced.is_set():
                candidates, dropped = merge_kept(candidates, self.kept.devices())
                self._warn_dropped(dropped)
            else:
                # Publishing now would drop every device that is in a Pod.
                hold = True
                if not self._told_waiting:
                    self._told_waiting = True
                    log.info("not publishing until the store's kept devices are loaded")
        published = await apply_filter(self.filter, candidates)
        self.published = frozenset(d.name for d in published)
        if not hold and self.on_publish is not None and (published or self._had_devices):
            self._had_devices = True
            self.on_publish(published)
        return published

    def _warn_dropped(self, dropped: dict[str, list[str]]) -> None:
        for name, cut in dropped.items():
            key = (name, tuple(cut))
            if key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "a kept device merged with the host's has more attributes than a ResourceSlice "
                    "allows; dropping some",
                    extra={"device": name, "limit": A.MAX_ATTRIBUTES_PER_DEVICE, "dropped": cut},
                )

    async def _enrich(self, devices: list[Device]) -> list[Device]:
        views = {}
        if self.providers is not None and self.providers.cloud is not None:
            views = await self.providers.describe([device_info(d) for d in devices])
        out = []
        for d in devices:
            attrs = dict(d.attributes)
            view = views.get(d.name)
            if view is not None:
                attrs.update(view.attributes)  # a provider's value wins, as maps.Copy in dranet
            kept, dropped = A.limit_attributes(attrs)
            if dropped:
                key = (d.name, tuple(dropped))
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning(
                        "device has more attributes than a ResourceSlice allows; dropping some",
                        extra={"device": d.name, "limit": A.MAX_ATTRIBUTES_PER_DEVICE, "dropped": dropped},
                    )
            cfg = view.config if view is not None else None
            out.append(replace(d, attributes=kept, provider_config=cfg, profiles=advertised_profiles(cfg)))
        return out

    # --- loop ------------------------------------------------------------------------------------

    @property
    def scanning(self) -> bool:
        return self._scan_lock.locked()

    def request_rescan(self) -> None:
        """Scan again soon (still paced by the rate limiter)."""
        self._wake.set()

    async def wait_scan_after(self, seq: int, within: float) -> bool:
        """Wait until a scan numbered above ``seq`` has finished."""

        async def done() -> None:
            async with self._scanned:
                await self._scanned.wait_for(lambda: self.scans > seq)

        try:
            await asyncio.wait_for(done(), within)
        except TimeoutError:
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Scan, publish, wait for a link event / rescan request / the max interval."""
        limiter = RateLimiter(self.config.min_poll_interval, self.config.poll_burst)
        events = LinkEvents(self._wake)
        events.start()
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                pause = limiter.delay()
                if pause > 0:
                    await asyncio.wait({stopper}, timeout=pause)
                    if stop.is_set():
                        return
                self._wake.clear()
                try:
                    await self.scan()
                except Exception:
                    log.exception("scan failed")
                waker = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait(
                    {waker, stopper},
                    timeout=self.config.max_poll_interval,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waker.cancel()
        finally:
            stopper.cancel()
            events.close()

    # --- lookups ---------------------------------------------------------------------------------

    def get(self, name: str) -> Device | None:
        return self.devices.get(name)

    async def lookup(self, name: str) -> Device | None:
        """``name`` from the last scan, or after one more scan (a device can just
        have come back from a Pod), as dranet's GetNetInterfaceName does."""
        device = self.devices.get(name)
        if device is None:
            await self.scan()
            device = self.devices.get(name)
        return device
