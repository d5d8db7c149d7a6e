"""The kubelet-facing gRPC surface: plugin registration and DRAPlugin v1/v1beta1.

The registration socket lives in <kubelet-root>/plugins_registry and answers
GetInfo for the whole life of the process (newer kubelets probe it every 10 s).
The DRA socket serves both API versions; calls are serialised, as the
kubeletplugin helper does by default, so retries of the same claim never race.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from prometheus_client import Counter, Histogram

from proto.kubelet.dra.v1 import dra_pb2 as v1
from proto.kubelet.dra.v1 import dra_pb2_grpc as v1_grpc
from proto.kubelet.dra.v1beta1 import dra_pb2 as v1beta1
from proto.kubelet.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from proto.kubelet.pluginregistration.v1 import registration_pb2 as reg
from proto.kubelet.pluginregistration.v1 import registration_pb2_grpc as reg_grpc
from services.prepare.pipeline import ClaimRef, ClaimResult, Preparer
from shared.metrics import DRIVER_SUBSYSTEM, NAMESPACE, REGISTRY, STATUS_FAILED, STATUS_SUCCESS

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Mapping[str, Any])

# dranet's method label values (pkg/driver/metrics.go), for both API versions.
METHOD_PREPARE = "PrepareResourceClaims"
METHOD_UNPREPARE = "UnprepareResourceClaims"
# dranet's names, help texts, labels and (default) buckets.
DRA_REQUESTS = Counter(
    "dra_plugin_requests_total",
    "Total number of DRA plugin requests.",
    ["method", "status"],
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)
DRA_LATENCY = Histogram(
    "dra_plugin_requests_latency_seconds",
    "DRA plugin request latency in seconds.",
    ["method"],
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)
# Ours: a request carries any number of claims; this counts them one by one.
CLAIMS = Counter(
    f"{NAMESPACE}_prepare_claims_total",
    "Claims in NodePrepareResources/NodeUnprepareResources requests, by method and outcome.",
    ["method", "status"],
    registry=REGISTRY,
)

PLUGIN_TYPE = "DRAPlugin"
# Newest first: the kubelet takes the first entry it supports.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registered.set()
            self.last_error = ""
            log.info("registered with the kubelet", extra={"endpoint": self.endpoint})
        else:
            self.registered.clear()
            self.last_error = request.error
            log.error("the kubelet refused the registration", extra={"error": request.error})
        return reg.RegistrationStatusResponse()

    def register(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self, server)


class DraService:
    """One implementation behind both API versions (v1beta1 is v1 without share_id)."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer
        self._lock = asyncio.Lock()

    async def prepare(self, claims: list[ClaimRef]) -> dict[str, ClaimResult]:
        async with self._lock:
            return await _measured(
                METHOD_PREPARE, lambda: self.preparer.prepare(claims), lambda r: bool(r.error)
            )

    async def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        async with self._lock:
            return await _measured(METHOD_UNPREPARE, lambda: self.preparer.unprepare(claims), bool)


async def _measured(method: str, call: Callable[[], Awaitable[R]], failed: Callable[[Any], bool]) -> R:
    """dranet's accounting: the latency of every call, and the call counted failed
    when it raised or any claim in it failed."""
    started = time.perf_counter()
    try:
        results = await call()
    except BaseException:
        DRA_REQUESTS.labels(method, STATUS_FAILED).inc()
        raise
    finally:
        DRA_LATENCY.labels(method).observe(time.perf_counter() - started)
    bad = sum(1 for r in results.values() if failed(r))
    DRA_REQUESTS.labels(method, STATUS_FAILED if bad else STATUS_SUCCESS).inc()
    if bad:
        CLAIMS.labels(method, STATUS_FAILED).inc(bad)
    if len(results) > bad:
        CLAIMS.labels(method, STATUS_SUCCESS).inc(len(results) - bad)
    return results


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


def _prepare_response(api: Any, results: dict[str, ClaimResult]) -> Any:
    resp = api.NodePrepareResourcesResponse()
    for uid, res in results.items():
        entry = resp.claims[uid]
        entry.error = res.error
        for d in res.devices:
            # The kubelet wants the request, not "request/subrequest".
            entry.devices.add(
                request_names=[d.request.split("/", 1)[0]], pool_name=d.pool, device_name=d.device
            )
    return resp


def _unprepare_response(api: Any, results: dict[str, str]) -> Any:
    resp = api.NodeUnprepareResourcesResponse()
    for uid, err in results.items():
        resp.claims[uid].error = err
    return resp


class DraV1(v1_grpc.DRAPluginServicer):
    def __init__(self, dra: DraService) -> None:
        self.dra = dra

    async def NodePrepareResources(self, request: Any, context: Any) -> v1.NodePrepareResourcesResponse:
        return _prepare_response(v1, await self.dra.prepare(_refs(request.claims)))

    async def NodeUnprepareResources(self, request: Any, context: Any) -> v1.NodeUnprepareResourcesResponse:
        return _unprepare_response(v1, await self.dra.unprepare(_refs(request.claims)))

    def register(self, server: grpc.aio.Server) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(self, server)


class DraV1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, dra: DraService) -> None:
        self.dra = dra

    async def NodePrepareResources(self, request: Any, context: Any) -> v1beta1.NodePrepareResourcesResponse:
        return _prepare_response(v1beta1, await self.dra.prepare(_refs(request.claims)))

    async def NodeUnprepareResources(
        self, request: Any, context: Any
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        return _unprepare_response(v1beta1, await self.dra.unprepare(_refs(request.claims)))

    def register(self, server: grpc.aio.Server) -> None:
        v1beta1_grpc.add_DRAPluginServicer_to_server(self, server)
