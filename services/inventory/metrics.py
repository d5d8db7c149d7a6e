"""The inventory's metrics: dranet's published_devices_total and
last_published_time_seconds, and gauges and counters read at scrape time from
the scanner and the publisher."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.inventory.attributes import RDMA
from shared.metrics import DRIVER_SUBSYSTEM, NAMESPACE, REGISTRY

if TYPE_CHECKING:
    from services.inventory.inventory import Inventory
    from services.inventory.publisher import Publisher

# dranet's names, help texts and labels (pkg/driver/metrics.go).
PUBLISHED_DEVICES = Gauge(
    "published_devices_total",
    "Total number of published devices.",
    ["feature"],
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)
LAST_PUBLISHED = Gauge(
    "last_published_time_seconds",
    "The timestamp of the last successful resource publication.",
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)


def devices_to_publish(devices: Sequence[dict[str, Any]]) -> None:
    """As dranet: the devices handed to the publisher, all ("total") and RDMA-capable ("rdma")."""
    rdma = sum(1 for d in devices if (d.get("attributes") or {}).get(RDMA) == {"bool": True})
    PUBLISHED_DEVICES.labels("rdma").set(rdma)
    PUBLISHED_DEVICES.labels("total").set(len(devices))


def published() -> None:
    """A publication succeeded (the API server holds the latest device list)."""
    LAST_PUBLISHED.set_to_current_time()


class InventoryCollector(Collector):
    """Scan and publish counters of the running inventory."""

    def __init__(self, inventory: Inventory, publisher: Publisher | None) -> None:
        self.inventory = inventory
        self.publisher = publisher

    def collect(self) -> Iterator[Metric]:
        inv = self.inventory
        yield CounterMetricFamily(f"{NAMESPACE}_inventory_scans", "Host scans done.", value=inv.scans)
        yield GaugeMetricFamily(
            f"{NAMESPACE}_inventory_last_scan_duration_seconds",
            "How long the last host scan took.",
            value=inv.last_scan_seconds,
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_inventory_devices",
            "Devices found by the last scan, before the --filter (published or not).",
            value=len(inv.devices),
        )
        pub = self.publisher
        if pub is None:
            return
        writes = CounterMetricFamily(
            f"{NAMESPACE}_inventory_slice_writes",
            "ResourceSlice writes to the API server, by operation.",
            labels=["op"],
        )
        writes.add_metric(["create"], pub.stats.creates)
        writes.add_metric(["update"], pub.stats.updates)
        writes.add_metric(["delete"], pub.stats.deletes)
        yield writes
        yield CounterMetricFamily(
            f"{NAMESPACE}_inventory_publish_errors",
            "Publications that failed (each is retried with backoff).",
            value=pub.stats.errors,
        )
        yield CounterMetricFamily(
            f"{NAMESPACE}_inventory_publish_throttled",
            "Of the failed publications, those the API server refused with 429 (its Retry-After "
            "is waited; the cache of what it holds is kept).",
            value=pub.stats.throttled,
        )
