"""The kubelet emulator runs pods on the real containerd: claims prepared first, sandbox and
containers through CRI with a real network namespace, and the reverse on deletion.

The API side here is ``MemApi``, an in-memory stand-in with the calls the emulator makes (pod list
and watch events, claims, status, delete, events, slice deletion). The end-to-end test against the
development API server is in test_kubelet_apiserver.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from services.devcluster.containerd import Containerd
from services.devcluster.cri import CriClient
from services.devcluster.kubelet import POD_UID_LABEL, Kubelet
from tests.fixtures_runtime import DraCall, FakeDraPlugin, exists, is_netns_mount

pytestmark = [pytest.mark.containerd, pytest.mark.root]

MakeKubelet = Callable[..., Awaitable[Kubelet]]
MakePlugin = Callable[..., Awaitable[FakeDraPlugin]]
NODE = "node-1"


class MemApi:
    """The API calls the kubelet makes, over dicts in memory; pod changes become watch events."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.deleted: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.slice_deletions: list[str] = []
        self._watchers: list[asyncio.Queue[tuple[str, dict[str, Any]]]] = []
        self.rv = 1

    def _send(self, typ: str, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        for q in self._watchers:
            q.put_nowait((typ, pod))

    def put_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        uid = pod["metadata"]["uid"]
        typ = "MODIFIED" if uid in self.pods else "ADDED"
        self.pods[uid] = pod
        self._send(typ, pod)
        return pod

    def mark_deleted(self, pod: dict[str, Any]) -> None:
        """What the API server does on `kubectl delete pod`: set deletionTimestamp, wait for the kubelet."""
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        self.put_pod(pod)

    def put_claim(self, claim: dict[str, Any]) -> None:
        m = claim["metadata"]
        self.claims[(m["namespace"], m["name"])] = claim

    async def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        return [p for p in self.pods.values() if p["spec"].get("nodeName") == node], str(self.rv)

    async def watch_pods(self, node: str, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        q: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._watchers.append(q)
        try:
            while True:
                typ, pod = await q.get()
                if pod["spec"].get("nodeName") == node:
                    yield typ, pod
        finally:
            self._watchers.remove(q)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    async def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        pod = next(p for p in self.pods.values() if p["metadata"]["name"] == name)
        self.status_patches.append((pod["metadata"]["uid"], status))
        pod["status"] = {**pod.get("status", {}), **status}
        self._send("MODIFIED", pod)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        self.deleted.append(uid)
        if pod is not None:
            self._send("DELETED", pod)

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        self.events.append(event)

    async def delete_slices(self, field_selector: str) -> None:
        self.slice_deletions.append(field_selector)


def make_pod(name: str, claims: list[dict[str, Any]] | None = None, containers: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4()), "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": claims or [],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "registry.example/app:1",
                    "resources": {"claims": [{"name": c["name"]} for c in claims or []]},
                }
                for i in range(containers)
            ],
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


def make_claim(
    name: str, pods: list[dict[str, Any]], allocated: bool = True, driver: str = "dra.net"
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [{"request": "nic", "driver": driver, "pool": NODE, "device": f"dev-{name}"}]
            }
        }
        status["reservedFor"] = [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}-{uuid.uuid4().hex[:6]}"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet"}}]}},
        "status": status,
    }


def uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


async def registered(kubelet: Kubelet, fake_dra_plugin: MakePlugin, **kw: Any) -> FakeDraPlugin:
    """A started fake plugin that ``kubelet`` has registered."""
    plugin = await fake_dra_plugin(**kw)
    await kubelet.plugins.wait_for_plugin(plugin.driver, within=5)
    return plugin


@pytest.fixture
def api() -> MemApi:
    return MemApi()


@pytest.fixture
async def kubelet(make_kubelet: MakeKubelet, cri_client: CriClient, api: MemApi) -> Kubelet:
    return await make_kubelet(cri_client, api=api, backoff_initial=0.1, backoff_max=0.5, wipe_delay=0.3)


async def test_pod_without_claims_runs_and_stops(
    containerd: Containerd, cri_client: CriClient, api: MemApi, kubelet: Kubelet
) -> None:
    pod = api.put_pod(make_pod("plain", containers=2))
    t0 = time.monotonic()
    st = await kubelet.wait_running(uid(pod), within=20)
    started = time.monotonic() - t0
    netns = kubelet.netns_path(uid(pod))
    assert netns and is_netns_mount(netns)
    sid = kubelet.sandbox_id(uid(pod))
    sandboxes = await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: uid(pod)})
    assert [s.id for s in sandboxes] == [sid] and sandboxes[0].labels["app"] == "plain"
    containers = await cri_client.list_containers(sid or "")
    assert sorted((c.name, c.state) for c in containers) == [
        ("c0", "CONTAINER_RUNNING"),
        ("c1", "CONTAINER_RUNNING"),
    ]
    assert set(st.containers) == {"c0", "c1"}
    status = api.pods[uid(pod)]["status"]
    assert status["phase"] == "Running"
    assert ipaddress.ip_address(status["podIP"]) in containerd.cni_subnet
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert [c["containerID"] for c in status["containerStatuses"]] == [
        f"containerd://{st.containers['c0']}",
        f"containerd://{st.containers['c1']}",
    ]

    t0 = time.monotonic()
    api.mark_deleted(pod)
    await kubelet.wait_gone(uid(pod), within=20)
    stopped = time.monotonic() - t0
    assert not exists(netns)
    assert await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: uid(pod)}) == []
    assert api.deleted == [uid(pod)] and uid(pod) not in api.pods
    print(f"\nkubelet emulator: pod start {started:.3f}s, stop+remove+delete {stopped:.3f}s")


async def test_claims_prepared_before_sandbox_and_unprepared_after_it(
    cri_client: CriClient, api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, fake_dra_plugin)
    pod = make_pod("nic-user", claims=[{"name": "net", "resourceClaimName": "nic-1"}])
    claim = make_claim("nic-1", [pod])
    api.put_claim(claim)
    netns_at_unprepare: list[bool] = []

    def look(call: DraCall) -> None:
        if call.method == "NodeUnprepareResources":
            netns_at_unprepare.append(exists(netns))

    plugin.on_call = look
    api.put_pod(pod)
    await kubelet.wait_running(uid(pod), within=20)
    netns = kubelet.netns_path(uid(pod)) or ""
    (prep,) = plugin.calls_of("NodePrepareResources")
    assert prep.claims == (("default", "nic-1", claim["metadata"]["uid"]),)
    sandbox = await cri_client.pod_sandbox_status(kubelet.sandbox_id(uid(pod)) or "")
    assert prep.at_ns < sandbox.created_at_ns, "NodePrepareResources must come before RunPodSandbox"
    assert set(kubelet.prepared_claims()) == {claim["metadata"]["uid"]}

    api.mark_deleted(pod)
    await kubelet.wait_gone(uid(pod), within=20)
    (unprep,) = plugin.calls_of("NodeUnprepareResources")
    assert unprep.claims == prep.claims
    assert netns_at_unprepare == [False], "NodeUnprepareResources must come after the sandbox is gone"
    assert kubelet.prepared_claims() == {} and plugin.prepared == set()


async def test_shared_claim_is_prepared_once_and_unprepared_with_the_last_pod(
    api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, fake_dra_plugin)
    a = make_pod("a", claims=[{"name": "net", "resourceClaimName": "shared"}])
    b = make_pod("b", claims=[{"name": "net", "resourceClaimName": "shared"}])
    api.put_claim(make_claim("shared", [a, b]))
    api.put_pod(a)
    await kubelet.wait_running(uid(a), within=20)
    api.put_pod(b)
    await kubelet.wait_running(uid(b), within=20)
    assert len(plugin.calls_of("NodePrepareResources")) == 1

    api.mark_deleted(a)
    await kubelet.wait_gone(uid(a), within=20)
    assert plugin.calls_of("NodeUnprepareResources") == []
    api.mark_deleted(b)
    await kubelet.wait_gone(uid(b), within=20)
    assert len(plugin.calls_of("NodeUnprepareResources")) == 1


async def test_pod_waits_for_template_claim_name_allocation_and_reservation(
    api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, fake_dra_plugin)
    pod = make_pod("tmpl", claims=[{"name": "net", "resourceClaimTemplateName": "nic-template"}])
    api.put_pod(pod)
    await kubelet.wait_until(
        lambda: "status.resourceClaimStatuses" in (kubelet.last_error(uid(pod)) or ""), 10
    )

    claim = make_claim("tmpl-net-abcde", [pod], allocated=False)
    api.put_claim(claim)
    pod["status"]["resourceClaimStatuses"] = [{"name": "net", "resourceClaimName": "tmpl-net-abcde"}]
    api.put_pod(pod)
    await kubelet.wait_until(lambda: "is not allocated" in (kubelet.last_error(uid(pod)) or ""), 10)

    allocated = make_claim("tmpl-net-abcde", [], allocated=True)
    claim["status"] = {"allocation": allocated["status"]["allocation"], "reservedFor": []}
    await kubelet.wait_until(lambda: "not in status.reservedFor" in (kubelet.last_error(uid(pod)) or ""), 10)
    assert plugin.calls == [] and kubelet.sandbox_id(uid(pod)) is None

    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "tmpl", "uid": uid(pod)}]
    await kubelet.wait_running(uid(pod), within=20)  # picked up by the backoff retry
    assert plugin.calls_of("NodePrepareResources")[0].claims[0][1] == "tmpl-net-abcde"


async def test_prepare_error_keeps_the_pod_from_starting_and_is_retried(
    cri_client: CriClient, api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, fake_dra_plugin)
    pod = make_pod("bad", claims=[{"name": "net", "resourceClaimName": "nic-bad"}])
    claim = make_claim("nic-bad", [pod])
    api.put_claim(claim)
    plugin.prepare_errors[claim["metadata"]["uid"]] = "interface eth9 not found"
    api.put_pod(pod)
    await kubelet.wait_until(lambda: len(plugin.calls_of("NodePrepareResources")) >= 2, 10)
    err = kubelet.last_prepare_error(uid(pod))
    assert err == "NodePrepareResources failed for ResourceClaim default/nic-bad: interface eth9 not found"
    assert await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: uid(pod)}) == []
    assert not kubelet.is_running(uid(pod)) and kubelet.prepared_claims() == {}
    ev = api.events[0]
    assert ev["reason"] == "FailedPrepareDynamicResources" and ev["type"] == "Warning"
    assert ev["involvedObject"]["uid"] == uid(pod) and "eth9" in ev["message"]

    plugin.prepare_errors.clear()
    await kubelet.wait_running(uid(pod), within=20)
    assert kubelet.last_prepare_error(uid(pod)) == ""


async def test_call_failure_and_missing_driver_are_errors(
    api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    pod = make_pod("early", claims=[{"name": "net", "resourceClaimName": "nic-e"}])
    api.put_claim(make_claim("nic-e", [pod]))
    api.put_pod(pod)
    await kubelet.wait_until(
        lambda: kubelet.last_prepare_error(uid(pod)) == "DRA driver dra.net is not registered", 10
    )

    plugin = await fake_dra_plugin()
    plugin.prepare_abort = grpc.StatusCode.UNAVAILABLE
    await kubelet.wait_until(
        lambda: (kubelet.last_prepare_error(uid(pod)) or "").startswith(
            "NodePrepareResources of driver dra.net failed: UNAVAILABLE"
        ),
        10,
    )
    plugin.prepare_abort = None
    await kubelet.wait_running(uid(pod), within=20)


async def test_unprepare_is_retried_until_it_succeeds(
    api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    plugin = await registered(kubelet, fake_dra_plugin)
    pod = make_pod("sticky", claims=[{"name": "net", "resourceClaimName": "nic-s"}])
    claim = make_claim("nic-s", [pod])
    api.put_claim(claim)
    api.put_pod(pod)
    await kubelet.wait_running(uid(pod), within=20)

    plugin.unprepare_errors[claim["metadata"]["uid"]] = "device busy"
    api.mark_deleted(pod)
    await kubelet.wait_until(lambda: len(plugin.calls_of("NodeUnprepareResources")) >= 2, 10)
    assert uid(pod) in kubelet.pods and api.deleted == []
    assert kubelet.sandbox_id(uid(pod)) is None  # the pod itself is already stopped
    plugin.unprepare_errors.clear()
    await kubelet.wait_gone(uid(pod), within=20)
    assert api.deleted == [uid(pod)] and plugin.prepared == set()


async def test_emulator_restart_re_prepares_and_adopts_the_running_pod(
    make_kubelet: MakeKubelet, cri_client: CriClient, api: MemApi, fake_dra_plugin: MakePlugin
) -> None:
    first = await make_kubelet(cri_client, api=api, backoff_initial=0.1, backoff_max=0.5)
    plugin = await registered(first, fake_dra_plugin)
    pod = make_pod("survivor", claims=[{"name": "net", "resourceClaimName": "nic-r"}])
    api.put_claim(make_claim("nic-r", [pod]))
    api.put_pod(pod)
    await first.wait_running(uid(pod), within=20)
    sid, netns = first.sandbox_id(uid(pod)), first.netns_path(uid(pod))
    await first.stop()  # like stopping the kubelet: pods keep running

    second = await make_kubelet(cri_client, api=api, backoff_initial=0.1, backoff_max=0.5)
    await second.plugins.wait_for_plugin("dra.net", within=5)
    await second.wait_running(uid(pod), within=20)
    assert len(plugin.calls_of("NodePrepareResources")) == 2  # prepared again after the restart
    assert second.sandbox_id(uid(pod)) == sid and second.netns_path(uid(pod)) == netns
    assert len(await cri_client.list_pod_sandboxes(labels={POD_UID_LABEL: uid(pod)})) == 1

    api.mark_deleted(pod)
    await second.wait_gone(uid(pod), within=20)
    assert len(plugin.calls_of("NodeUnprepareResources")) == 1


async def test_resource_slices_wiped_at_start_and_after_the_driver_left(
    api: MemApi, kubelet: Kubelet, fake_dra_plugin: MakePlugin
) -> None:
    assert api.slice_deletions == [f"spec.nodeName={NODE}"]
    plugin = await registered(kubelet, fake_dra_plugin)
    await plugin.stop_registration()
    await kubelet.wait_until(lambda: len(api.slice_deletions) == 2, 5)
    assert api.slice_deletions[1] == f"spec.nodeName={NODE},spec.driver=dra.net"

    # A driver that comes back within the delay keeps its slices.
    await plugin.start_registration()
    await kubelet.plugins.wait_for_plugin("dra.net", within=5)
    await plugin.stop_registration()
    await plugin.start_registration()
    await kubelet.plugins.wait_for_plugin("dra.net", within=5)
    await asyncio.sleep(0.5)  # longer than wipe_delay: proves the absence of a deletion
    assert len(api.slice_deletions) == 2
