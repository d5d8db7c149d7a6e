"""The store's metrics: every operation counted and timed by name and gRPC status,
and gauges read at scrape time (records, revision, map size, open streams)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import FAST_BUCKETS, NAMESPACE, REGISTRY

OPERATIONS = Counter(
    f"{NAMESPACE}_store_operations_total",
    "Store operations (unary calls and session requests) by op and gRPC status code name.",
    ["op", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    f"{NAMESPACE}_store_operations_latency_seconds",
    "Store operation latency in seconds, from request to answer (writes include the fsync).",
    ["op"],
    buckets=FAST_BUCKETS,
    registry=REGISTRY,
)
REVISION = Gauge(f"{NAMESPACE}_store_revision", "The store's last committed revision.", registry=REGISTRY)
RECORDS = Gauge(f"{NAMESPACE}_store_records", "Records held, by table.", ["table"], registry=REGISTRY)
MAP_SIZE = Gauge(
    f"{NAMESPACE}_store_map_size_bytes",
    "The LMDB map size; it doubles when full, up to --max-map-size.",
    registry=REGISTRY,
)
STREAMS = Gauge(
    f"{NAMESPACE}_store_open_streams",
    "Open Watch, Session and ReportLiveness streams.",
    registry=REGISTRY,
)
ATTACH_CONNECTED = Gauge(
    f"{NAMESPACE}_store_attach_connected",
    "1 while an attach service reports it is connected to the runtime's NRI (prepare's gate).",
    registry=REGISTRY,
)

# Children by label values: .labels() costs more than the increment it serves.
_counts: dict[tuple[str, str], Any] = {}
_latencies: dict[str, Any] = {}


def record(op: str, status: str, seconds: float) -> None:
    """Count one operation and observe its latency."""
    counter = _counts.get((op, status))
    if counter is None:
        counter = _counts[(op, status)] = OPERATIONS.labels(op, status)
    counter.inc()
    hist = _latencies.get(op)
    if hist is None:
        hist = _latencies[op] = LATENCY.labels(op)
    hist.observe(seconds)


def bind(
    revision: Callable[[], float],
    records: Callable[[], dict[Any, int]],
    map_size: Callable[[], float],
    streams: Callable[[], float],
    attach_connected: Callable[[], bool],
) -> None:
    """Read the gauges from the serving store at scrape time (the last one bound wins)."""
    REVISION.set_function(revision)
    MAP_SIZE.set_function(map_size)
    STREAMS.set_function(streams)
    ATTACH_CONNECTED.set_function(lambda: 1.0 if attach_connected() else 0.0)
    for table in ("devices", "results", "activity", "kept"):
        RECORDS.labels(table).set_function(_count_of(records, table))


def _count_of(records: Callable[[], dict[Any, int]], table: str) -> Callable[[], float]:
    return lambda: records().get(table, 0)
