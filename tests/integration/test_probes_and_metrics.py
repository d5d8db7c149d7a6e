"""The four services as real processes in one run dir, as in the pod: grpc.health.v1
on each Unix socket and TCP port, dranet.admin.v1 Metrics, and the inventory's HTTP
endpoint merging all four. The inventory runs --no-publish (no API server), prepare
with a kubeconfig it never needs to use and a kubelet root dir of its own (the test
plays the kubelet's registration), attach with no NRI socket at all."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from dev.cluster.procs import ServiceProcess
from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from proto.kubelet.dra.v1 import dra_pb2 as dra_v1
from proto.kubelet.dra.v1 import dra_pb2_grpc as dra_v1_grpc
from proto.kubelet.dra.v1beta1 import dra_pb2 as dra_v1beta1
from proto.kubelet.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_grpc
from proto.kubelet.pluginregistration.v1 import registration_pb2 as reg
from proto.kubelet.pluginregistration.v1 import registration_pb2_grpc as reg_grpc

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("store", "inventory", "prepare", "attach")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pod:
    dir: Path
    run: Path
    health_ports: dict[str, int]
    metrics_port: int
    procs: dict[str, ServiceProcess]

    def sock(self, service: str) -> str:
        return str(self.run / f"{service}.sock")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{path}"

    @property
    def registration_socket(self) -> str:
        return str(self.dir / "kubelet" / "plugins_registry" / "dra.net-reg.sock")

    @property
    def dra_socket(self) -> str:
        return str(self.dir / "kubelet" / "plugins" / "dra.net" / "dra.sock")


def wait_until(check: object, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()  # type: ignore[operator]
            if last:
                return
        except (OSError, grpc.RpcError) as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} not reached within {timeout_s}s (last: {last!r})")


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def check(target: str, name: str) -> int:
    with grpc.insecure_channel(target) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
    return int(resp.status)


def admin_metrics(path: str) -> admin_pb2.MetricsResponse:
    with grpc.insecure_channel(f"unix:{path}") as ch:
        resp: admin_pb2.MetricsResponse = admin_pb2_grpc.AdminStub(ch).Metrics(
            admin_pb2.MetricsRequest(), timeout=5
        )
    return resp


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


def start_attach(pod: Pod) -> ServiceProcess:
    proc = ServiceProcess(
        "services.attach",
        [
            "--run-dir",
            str(pod.run),
            "--nri-socket",
            str(pod.dir / "no-nri" / "nri.sock"),
            "--health-port",
            str(pod.health_ports["attach"]),
            "--drain-timeout",
            "1",
        ],
        socket=pod.run / "attach.sock",
        log_path=pod.dir / "attach.log",
    )
    pod.procs["attach"] = proc
    return proc.start(timeout=30)


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    # Short: Unix socket paths must stay under 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="pm-"))
    (d / "kubeconfig").write_text(KUBECONFIG)
    pod = Pod(d, d / "run", {s: free_port() for s in SERVICES}, free_port(), {})

    def proc(service: str, *args: str) -> ServiceProcess:
        p = ServiceProcess(
            f"services.{service}",
            ["--run-dir", str(pod.run), "--health-port", str(pod.health_ports[service]), *args],
            socket=pod.run / f"{service}.sock",
            log_path=d / f"{service}.log",
        )
        pod.procs[service] = p
        return p

    try:
        proc("store", "--db-dir", str(d / "db")).start()
        proc(
            "inventory",
            "--no-publish",
            "--node-name",
            "node-pm",
            "--cloud-provider-hint",
            "NONE",
            "--metrics-port",
            str(pod.metrics_port),
            "--metrics-address",
            "127.0.0.1",
        ).start(timeout=60)
        proc(
            "prepare",
            "--kubeconfig",
            str(d / "kubeconfig"),
            "--kubelet-root-dir",
            str(d / "kubelet"),
            "--node-name",
            "node-pm",
        ).start(timeout=60)
        start_attach(pod)
        for s in SERVICES:
            wait_until(lambda s=s: check(f"127.0.0.1:{pod.health_ports[s]}", "liveness") == SERVING, what=s)
        wait_until(lambda: http(pod.url("/healthz"))[0] == 200, what="the HTTP endpoint")
        yield pod
    finally:
        for p in reversed(pod.procs.values()):
            with contextlib.suppress(Exception):
                p.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_grpc_health_on_the_unix_socket_and_on_tcp(pod: Pod) -> None:
    ready = {"store": SERVING, "inventory": SERVING, "attach": NOT_SERVING}
    for service in SERVICES:
        for target in (f"unix:{pod.sock(service)}", f"127.0.0.1:{pod.health_ports[service]}"):
            # Not ready is no reason to restart: liveness answers SERVING regardless.
            assert check(target, "liveness") == SERVING, (service, target)
            if service in ready:
                assert check(target, "") == ready[service], (service, target)
                assert check(target, f"dranet.{service}") == ready[service], (service, target)
            with pytest.raises(grpc.RpcError) as err:
                check(target, "dranet.nothing")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_attach_not_on_nri_warns_how_to_enable_it_once(pod: Pod) -> None:
    wait_until(lambda: "not connected to NRI" in pod.procs["attach"].log(), what="the NRI warning")
    lines = [json.loads(line) for line in pod.procs["attach"].log().splitlines() if line.startswith("{")]
    warnings = [x["msg"] for x in lines if x["level"] == "WARNING" and "not connected to NRI" in x["msg"]]
    assert len(warnings) == 1, warnings
    assert (
        'plugins."io.containerd.nri.v1.nri"' in warnings[0] and "/etc/containerd/config.toml" in warnings[0]
    )
    with grpc.insecure_channel(f"unix:{pod.sock('attach')}") as ch:
        h = admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=5)
    assert not h.ready and "not connected to NRI" in h.detail


def test_prepare_is_ready_once_the_kubelet_registered_it(pod: Pod) -> None:
    tcp = f"127.0.0.1:{pod.health_ports['prepare']}"
    with grpc.insecure_channel(f"unix:{pod.registration_socket}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        assert info.name == "dra.net"
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="no"), timeout=5)
        assert check(tcp, "dranet.prepare") == NOT_SERVING
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
    assert check(tcp, "dranet.prepare") == SERVING and check(tcp, "") == SERVING


def test_admin_metrics_rpc_gives_each_process_its_own(pod: Pod) -> None:
    for service in SERVICES:
        resp = admin_metrics(pod.sock(service))
        assert resp.service == service and resp.content_type.startswith("text/plain")
        # No service label yet: the endpoint adds it when merging.
        ((labels, value),) = samples(resp.exposition.decode(), "process_start_time_seconds")
        assert labels == {} and value > 0
    assert samples(admin_metrics(pod.sock("store")).exposition.decode(), "dranet_store_records")


def test_prepare_counts_dra_requests_as_dranet(pod: Pod) -> None:
    claim = {"namespace": "default", "name": "c1", "uid": "uid-pm-1"}
    with grpc.insecure_channel(f"unix:{pod.dra_socket}") as ch:
        # Refused by the safety gate (attach is not on NRI): a failed request.
        resp = dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_v1.NodePrepareResourcesRequest(claims=[dra_v1.Claim(**claim)]), timeout=10
        )
        assert resp.claims["uid-pm-1"].error
        dra_v1beta1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            dra_v1beta1.NodeUnprepareResourcesRequest(claims=[dra_v1beta1.Claim(**claim)]), timeout=10
        )
    text = admin_metrics(pod.sock("prepare")).exposition.decode()
    got = {
        (lb["method"], lb["status"]): v for lb, v in samples(text, "dranet_driver_dra_plugin_requests_total")
    }
    assert got[("PrepareResourceClaims", "failed")] >= 1
    assert got[("UnprepareResourceClaims", "success")] >= 1
    counts = {
        lb["method"]: v for lb, v in samples(text, "dranet_driver_dra_plugin_requests_latency_seconds_count")
    }
    assert counts["PrepareResourceClaims"] >= 1 and counts["UnprepareResourceClaims"] >= 1
    # The store counted the unprepare's list and delete_claim.
    store = admin_metrics(pod.sock("store")).exposition.decode()
    ops = {(lb["op"], lb["status"]) for lb, _ in samples(store, "dranet_store_operations_total")}
    assert {("list", "OK"), ("delete_claim", "OK")} <= ops


def test_the_endpoint_merges_all_four_services(pod: Pod) -> None:
    status, text = http(pod.url("/metrics"))
    assert status == 200
    starts = samples(text, "process_start_time_seconds")
    assert sorted(lb["service"] for lb, _ in starts) == sorted(SERVICES)
    assert text.count("# TYPE process_start_time_seconds gauge") == 1
    assert {lb["service"]: v for lb, v in samples(text, "dranet_scrape_up")} == dict.fromkeys(SERVICES, 1.0)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "dranet_store_operations",
        "dranet_driver_dra_plugin_requests",
        "dranet_driver_nri_plugin_requests",
        "dranet_driver_published_devices_total",
        "dranet_inventory_scans",
        "dranet_attach_nri_connected",
    } <= names
    assert http(pod.url("/healthz"))[0] == 200
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert http(pod.url(path))[0] == 404


def test_readyz_and_scrape_up_name_a_service_that_is_down(pod: Pod) -> None:
    status, body = http(pod.url("/readyz"))
    assert status == 503
    ready = json.loads(body)
    assert "attach" in ready["not_ready"] and "not connected to NRI" in ready["not_ready"]["attach"]
    assert ready["services"]["store"] == {"ready": True, "detail": ""}
    pod.procs["attach"].kill()
    try:
        status, text = http(pod.url("/metrics"))
        assert status == 200
        ups = {lb["service"]: v for lb, v in samples(text, "dranet_scrape_up")}
        assert ups["attach"] == 0.0 and ups["store"] == 1.0
        assert "attach" not in {lb["service"] for lb, _ in samples(text, "process_start_time_seconds")}
        status, body = http(pod.url("/readyz"))
        assert status == 503 and "no answer" in json.loads(body)["not_ready"]["attach"]
    finally:
        start_attach(pod)


def test_dranet_admin_cli(pod: Pod) -> None:
    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shared.adminctl", "--run-dir", str(pod.run), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )

    out = ctl("health")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["service"] for r in rows] == list(SERVICES)
    assert out.returncode == (0 if all(r["ready"] for r in rows) else 1)
    assert not {r["service"]: r for r in rows}["attach"]["ready"]
    ok = ctl("health", "store", "inventory")
    assert ok.returncode == 0, ok.stdout
    m = ctl("metrics", "store")
    assert m.returncode == 0 and samples(m.stdout, "process_start_time_seconds")
    assert ctl("metrics", "nothing-here").returncode == 2
