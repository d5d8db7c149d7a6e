"""Prometheus metrics: one registry per service process, merged by the pod's endpoint.

Each of the four processes keeps its own ``REGISTRY`` (with ``process_*``,
``python_*`` and its own families) and hands it out as text over
dranet.admin.v1 ``Metrics``. The one HTTP endpoint of the pod (in the inventory
service, shared/httpendpoint.py) calls that RPC on every service's Unix socket at
scrape time and merges the answers with ``merge``. Why this and not
prometheus_client's multiprocess mode:

- multiprocess mode needs a directory of mmap files that every writer and the
  exporter share and that is wiped whenever any of them restarts (a dead pid's
  files otherwise stay in the totals); the four containers share no such
  volume, only the socket directory, and nothing would clean it after a crash;
- it cannot do ``ProcessCollector``: ``process_*`` (memory, CPU, fds, start
  time) is what operators want per container, and is meaningless summed;
- pulling costs nothing between scrapes, and a service that is down simply
  does not answer: it shows as ``dranet_scrape_up{service="x"} 0`` and the rest
  of the scrape still succeeds.

In the merged output every sample carries a ``service`` label (store,
inventory, prepare, attach) naming the process it came from; each family
appears once, with one HELP and one TYPE line.

Like the Go client, no ``*_created`` series are exported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# dranet's names (pkg/driver/metrics.go): namespace "dranet", subsystem "driver".
NAMESPACE = "dranet"
DRIVER_SUBSYSTEM = "driver"
# dranet's statuses for DRA and NRI requests.
STATUS_SUCCESS = "success"
STATUS_FAILED = "failed"
STATUS_NOOP = "noop"
# The label the merge adds to every sample.
SERVICE_LABEL = "service"
# What generate_latest writes, as prometheus_client's own HTTP handler labels it
# (Prometheus 2 and 3 both read it).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Sub-millisecond to seconds: store reads are answered from memory, writes fsync.
FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's registry: the service's own metrics are created with ``registry=REGISTRY``."""
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)


class _View(Collector):
    """Families of ``source`` plus some computed at the time of the call."""

    def __init__(self, source: Collector, extra: Iterable[Metric]) -> None:
        self.source = source
        self.extra = list(extra)

    def collect(self) -> Iterator[Metric]:
        yield from self.source.collect()
        yield from self.extra


def exposition(extra: Iterable[Metric] = (), source: Collector = REGISTRY) -> bytes:
    """The text exposition of ``source`` and the ``extra`` families, as /metrics serves it."""
    return generate_latest(_View(source, extra))


def ready_family(ready: bool) -> GaugeMetricFamily:
    """``dranet_service_ready``: 1 while the service reports ready (grpc.health.v1 SERVING)."""
    return GaugeMetricFamily(
        f"{NAMESPACE}_service_ready",
        "1 while this service reports ready (its grpc.health.v1 status is SERVING), else 0.",
        value=1.0 if ready else 0.0,
    )


@dataclass(frozen=True)
class Scrape:
    """What one service answered at scrape time: its exposition, or why there is none."""

    service: str
    text: str | None
    error: str = ""
    seconds: float = 0.0


class _Merged(Collector):
    """Families by name, in first-seen order, each with the samples of every service."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def add(self, service: str, family: Metric) -> None:
        have = self.families.get(family.name)
        if have is None:
            have = Metric(family.name, family.documentation, family.type, family.unit)
            self.families[family.name] = have
        elif have.type != family.type:
            # Two services disagree on what a name is: keep the first, the exposition stays valid.
            log.warning(
                "metric family has another type in another service; dropping it",
                extra={"family": family.name, "service": service, "type": family.type, "kept": have.type},
            )
            return
        have.samples.extend(s._replace(labels={**s.labels, SERVICE_LABEL: service}) for s in family.samples)

    def collect(self) -> Iterator[Metric]:
        yield from self.families.values()


def merge(scrapes: Sequence[Scrape]) -> bytes:
    """One valid exposition from every service's: a ``service`` label on each sample,
    each family once, plus ``dranet_scrape_up`` and ``dranet_scrape_duration_seconds``
    per service. An exposition that does not parse counts as a failed scrape."""
    merged = _Merged()
    up = GaugeMetricFamily(
        f"{NAMESPACE}_scrape_up",
        "1 if the service answered the metrics scrape of the pod's endpoint, else 0.",
        labels=[SERVICE_LABEL],
    )
    took = GaugeMetricFamily(
        f"{NAMESPACE}_scrape_duration_seconds",
        "How long the service took to answer the metrics scrape.",
        labels=[SERVICE_LABEL],
    )
    for scrape in scrapes:
        ok = scrape.text is not None
        if scrape.text is not None:
            try:
                families = list(text_string_to_metric_families(scrape.text))
            except ValueError as exc:
                log.warning(
                    "metrics of a service do not parse", extra={"service": scrape.service, "error": str(exc)}
                )
                families, ok = [], False
            for family in families:
                merged.add(scrape.service, family)
        elif scrape.error:
            log.debug("metrics scrape failed", extra={"service": scrape.service, "error": scrape.error})
        up.add_metric([scrape.service], 1.0 if ok else 0.0)
        took.add_metric([scrape.service], scrape.seconds)
    return exposition([up, took], source=merged)
