"""The pod endpoint's merge of every service's exposition (shared/metrics.py)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import Scrape, exposition, merge, ready_family


def service_text(requests: int, gauge_type: str = "gauge") -> str:
    """A service's exposition as its AdminServicer renders it: process_*, python_info and own families."""
    reg = CollectorRegistry()
    reg.register(PROCESS_COLLECTOR)
    reg.register(PLATFORM_COLLECTOR)
    c = Counter(
        "dranet_driver_nri_plugin_requests_total", "NRI requests.", ["method", "status"], registry=reg
    )
    c.labels("RunPodSandbox", "success").inc(requests)
    h = Histogram("dranet_x_latency_seconds", "Latency.", ["method"], registry=reg)
    h.labels("RunPodSandbox").observe(0.2)
    if gauge_type == "gauge":
        Gauge("dranet_thing", "A gauge.", registry=reg).set(requests)
    else:
        Counter("dranet_thing", "A counter now.", registry=reg).inc()
    return exposition([ready_family(True)], source=reg).decode()


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


def test_every_sample_gets_the_service_label_and_families_appear_once() -> None:
    out = merge([Scrape("store", service_text(1)), Scrape("attach", service_text(5))]).decode()
    for fam in text_string_to_metric_families(out):
        for s in fam.samples:
            assert s.labels.get("service") in {"store", "attach"}, s
    # One HELP and one TYPE line per family name, however many services have it.
    helps = re.findall(r"^# HELP (\S+)", out, re.M)
    types = re.findall(r"^# TYPE (\S+)", out, re.M)
    assert len(helps) == len(set(helps)) and len(types) == len(set(types))
    assert "process_start_time_seconds" in helps and "dranet_driver_nri_plugin_requests_total" in helps
    starts = samples(out, "process_start_time_seconds")
    assert sorted(labels["service"] for labels, _ in starts) == ["attach", "store"]
    assert sorted(
        (labels["service"], v) for labels, v in samples(out, "dranet_driver_nri_plugin_requests_total")
    ) == [("attach", 5.0), ("store", 1.0)]
    # Histograms keep their buckets, with le and the original labels beside service.
    buckets = samples(out, "dranet_x_latency_seconds_bucket")
    assert {"le": "+Inf", "method": "RunPodSandbox", "service": "store"} in [lb for lb, _ in buckets]
    assert samples(out, "dranet_service_ready") == [
        ({"service": "store"}, 1.0),
        ({"service": "attach"}, 1.0),
    ]


def test_the_merge_parses_as_the_prometheus_client_does_and_round_trips() -> None:
    out = merge([Scrape("store", service_text(2)), Scrape("inventory", service_text(3))]).decode()
    fams = families(out)
    assert fams["dranet_driver_nri_plugin_requests"].type == "counter"  # type: ignore[attr-defined]
    assert fams["dranet_x_latency_seconds"].type == "histogram"  # type: ignore[attr-defined]
    # Merging the merge again changes nothing but nothing breaks: it is a valid exposition.
    again = merge([Scrape("all", out)]).decode()
    assert samples(again, "dranet_driver_nri_plugin_requests_total")[0][0]["service"] == "all"


@pytest.mark.parametrize(
    ("scrape", "up"),
    [
        (Scrape("prepare", None, "UNAVAILABLE: connect failed", 0.001), 0.0),
        (Scrape("prepare", "this is { not an exposition", "", 0.001), 0.0),
        (Scrape("prepare", service_text(1), "", 0.001), 1.0),
    ],
    ids=["no-answer", "garbage", "answered"],
)
def test_scrape_up_per_service(scrape: Scrape, up: float) -> None:
    out = merge([Scrape("store", service_text(1)), scrape]).decode()
    ups = dict((labels["service"], v) for labels, v in samples(out, "dranet_scrape_up"))
    assert ups == {"store": 1.0, "prepare": up}
    assert {lb["service"] for lb, _ in samples(out, "dranet_scrape_duration_seconds")} == {"store", "prepare"}
    # The services that answered are all there.
    starts = {lb["service"] for lb, _ in samples(out, "process_start_time_seconds")}
    assert starts == ({"store", "prepare"} if up else {"store"})


def test_a_family_with_another_type_in_a_later_service_is_dropped_not_duplicated() -> None:
    out = merge(
        [Scrape("store", service_text(1)), Scrape("attach", service_text(1, gauge_type="counter"))]
    ).decode()
    assert out.count("# TYPE dranet_thing ") == 1 and "# TYPE dranet_thing gauge" in out
    assert [lb["service"] for lb, _ in samples(out, "dranet_thing")] == ["store"]
    assert "dranet_thing_total" not in out


def test_no_created_series_as_in_go() -> None:
    reg = CollectorRegistry()
    Counter("c_total", "c", registry=reg).inc()
    Histogram("h_seconds", "h", registry=reg).observe(1)
    assert "_created" not in generate_latest(reg).decode()
