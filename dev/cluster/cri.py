"""An async CRI client (runtime.v1 RuntimeService over grpc.aio) for the kubelet emulator and tests.

The protobuf stubs are generated at install time into the runtime cache (never committed; see
``cri_install.py``) and imported from there, so their messages are typed ``Any`` here. The client
speaks in frozen dataclasses: ``SandboxConfig`` and ``ContainerConfig`` in, ``SandboxStatus`` and
``ContainerStatus`` out.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from dev.cluster.cri_install import PAUSE_IMAGE, STUB_PACKAGE, RuntimeCache

__all__ = [
    "PAUSE_IMAGE",
    "ContainerConfig",
    "ContainerStatus",
    "CriClient",
    "SandboxConfig",
    "SandboxStatus",
    "netns_from_info",
    "stubs",
]

_lock = threading.Lock()
_loaded: dict[Path, tuple[ModuleType, ModuleType]] = {}


def stubs(cache: RuntimeCache | None = None) -> tuple[Any, Any]:
    """The generated ``(api_pb2, api_pb2_grpc)`` modules from the runtime cache."""
    top = (cache or RuntimeCache.default()).stubs_dir.resolve()
    with _lock:
        if top not in _loaded:
            if not (top / STUB_PACKAGE / "api_pb2.py").exists():
                raise FileNotFoundError(f"CRI stubs missing under {top}; run dev/cluster/install_runtime.sh")
            if str(top) not in sys.path:
                sys.path.append(str(top))
            pb = importlib.import_module(f"{STUB_PACKAGE}.api_pb2")
            pb_grpc = importlib.import_module(f"{STUB_PACKAGE}.api_pb2_grpc")
            _loaded[top] = (pb, pb_grpc)
        return _loaded[top]


def netns_from_info(info: Mapping[str, str]) -> str:
    """The network namespace path in a verbose PodSandboxStatus ``info`` map ('' if none).

    containerd puts the sandbox's OCI runtime spec under info["info"]; its network namespace entry
    carries the bind-mounted path (``/var/run/netns/cni-<uuid>``).
    """
    raw = info.get("info")
    if not raw:
        return ""
    doc = json.loads(raw)
    for ns in doc.get("runtimeSpec", {}).get("linux", {}).get("namespaces", []):
        if ns.get("type") == "network":
            return str(ns.get("path", ""))
    return ""


@dataclass(frozen=True)
class SandboxConfig:
    """What RunPodSandbox needs to know about a pod."""

    name: str
    uid: str
    namespace: str
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    hostname: str = ""
    log_directory: str = ""
    cgroup_parent: str = ""
    host_network: bool = False
    privileged: bool = False
    sysctls: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerConfig:
    """One container of a pod; by default it runs the pause image."""

    name: str
    image: str = PAUSE_IMAGE
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 0
    privileged: bool = False
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxStatus:
    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    ready: bool
    ip: str
    netns_path: str
    created_at_ns: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class SandboxSummary:
    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    ready: bool
    labels: Mapping[str, str]


@dataclass(frozen=True)
class ContainerStatus:
    id: str
    sandbox_id: str
    name: str
    attempt: int
    state: str  # CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED, CONTAINER_UNKNOWN
    image: str
    image_ref: str
    started_at_ns: int
    finished_at_ns: int
    exit_code: int
    reason: str
    message: str


@dataclass(frozen=True)
class Timing:
    """Seconds each CRI call took, for benchmarks and reports."""

    method: str
    seconds: float


class CriClient:
    """runtime.v1 RuntimeService client on the Unix socket ``socket``; ``await close()`` when done."""

    def __init__(
        self, socket: str | os.PathLike[str], cache: RuntimeCache | None = None, timeout: float = 60.0
    ):
        self.pb, pb_grpc = stubs(cache)
        self.socket = Path(socket)
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(f"unix:{self.socket}")
        self._rt = pb_grpc.RuntimeServiceStub(self._channel)
        self.timings: list[Timing] = []

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> CriClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await getattr(self._rt, method)(request, timeout=self.timeout)
        finally:
            self.timings.append(Timing(method, time.monotonic() - t0))

    # -- runtime -----------------------------------------------------------------------------

    async def version(self) -> tuple[str, str]:
        """(runtime name, runtime version), e.g. ("containerd", "1.7.24~ds1")."""
        r = await self._call("Version", self.pb.VersionRequest(version="v1"))
        return r.runtime_name, r.runtime_version

    async def ready(self) -> bool:
        """True when the runtime reports RuntimeReady and NetworkReady."""
        r = await self._call("Status", self.pb.StatusRequest())
        conds = {c.type: c.status for c in r.status.conditions}
        return bool(conds.get("RuntimeReady")) and bool(conds.get("NetworkReady"))

    # -- sandboxes ---------------------------------------------------------------------------

    def _namespace_mode(self, host: bool) -> Any:
        return self.pb.NODE if host else self.pb.POD

    def sandbox_config(self, cfg: SandboxConfig) -> Any:
        """The CRI PodSandboxConfig message for ``cfg`` (also needed by CreateContainer)."""
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(
                name=cfg.name, uid=cfg.uid, namespace=cfg.namespace, attempt=cfg.attempt
            ),
            hostname=cfg.hostname or cfg.name,
            log_directory=cfg.log_directory,
            labels=dict(cfg.labels),
            annotations=dict(cfg.annotations),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cfg.cgroup_parent,
                sysctls=dict(cfg.sysctls),
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(
                        network=self._namespace_mode(cfg.host_network),
                        pid=pb.CONTAINER,
                        ipc=pb.POD,
                    ),
                    privileged=cfg.privileged,
                ),
            ),
        )

    async def run_pod_sandbox(self, cfg: SandboxConfig) -> str:
        """RunPodSandbox; returns the sandbox id."""
        if cfg.log_directory:
            os.makedirs(cfg.log_directory, exist_ok=True)
        r = await self._call("RunPodSandbox", self.pb.RunPodSandboxRequest(config=self.sandbox_config(cfg)))
        return str(r.pod_sandbox_id)

    async def pod_sandbox_status(self, sandbox_id: str) -> SandboxStatus:
        """Verbose PodSandboxStatus, with the pod's network namespace path."""
        r = await self._call(
            "PodSandboxStatus", self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        )
        s = r.status
        return SandboxStatus(
            id=s.id,
            name=s.metadata.name,
            namespace=s.metadata.namespace,
            uid=s.metadata.uid,
            attempt=s.metadata.attempt,
            ready=s.state == self.pb.SANDBOX_READY,
            ip=s.network.ip,
            netns_path=netns_from_info(r.info),
            created_at_ns=s.created_at,
            labels=dict(s.labels),
            annotations=dict(s.annotations),
        )

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call("StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call("RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id))

    async def list_pod_sandboxes(
        self, labels: Mapping[str, str] | None = None, ready_only: bool = False
    ) -> list[SandboxSummary]:
        pb = self.pb
        flt = pb.PodSandboxFilter(label_selector=dict(labels or {}))
        if ready_only:
            flt.state.CopyFrom(pb.PodSandboxStateValue(state=pb.SANDBOX_READY))
        r = await self._call("ListPodSandbox", pb.ListPodSandboxRequest(filter=flt))
        return [
            SandboxSummary(
                id=i.id,
                name=i.metadata.name,
                namespace=i.metadata.namespace,
                uid=i.metadata.uid,
                attempt=i.metadata.attempt,
                ready=i.state == pb.SANDBOX_READY,
                labels=dict(i.labels),
            )
            for i in r.items
        ]

    # -- containers --------------------------------------------------------------------------

    async def create_container(self, sandbox_id: str, sandbox: SandboxConfig, c: ContainerConfig) -> str:
        """CreateContainer in ``sandbox_id``; returns the container id."""
        pb = self.pb
        req = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            sandbox_config=self.sandbox_config(sandbox),
            config=pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=c.name, attempt=c.attempt),
                image=pb.ImageSpec(image=c.image, user_specified_image=c.image),
                command=list(c.command),
                args=list(c.args),
                envs=[pb.KeyValue(key=k, value=v) for k, v in c.env.items()],
                labels=dict(c.labels),
                annotations=dict(c.annotations),
                log_path=f"{c.name}/{c.attempt}.log" if sandbox.log_directory else "",
                linux=pb.LinuxContainerConfig(
                    security_context=pb.LinuxContainerSecurityContext(
                        privileged=c.privileged,
                        namespace_options=pb.NamespaceOption(
                            network=self._namespace_mode(sandbox.host_network), pid=pb.CONTAINER, ipc=pb.POD
                        ),
                    )
                ),
                CDI_devices=[pb.CDIDevice(name=d) for d in c.cdi_devices],
            ),
        )
        r = await self._call("CreateContainer", req)
        return str(r.container_id)

    async def start_container(self, container_id: str) -> None:
        await self._call("StartContainer", self.pb.StartContainerRequest(container_id=container_id))

    async def stop_container(self, container_id: str, grace_seconds: int = 0) -> None:
        await self._call(
            "StopContainer", self.pb.StopContainerRequest(container_id=container_id, timeout=grace_seconds)
        )

    async def remove_container(self, container_id: str) -> None:
        await self._call("RemoveContainer", self.pb.RemoveContainerRequest(container_id=container_id))

    async def container_status(self, container_id: str) -> ContainerStatus:
        r = await self._call("ContainerStatus", self.pb.ContainerStatusRequest(container_id=container_id))
        return self._container_status(r.status, "")

    def _container_status(self, s: Any, sandbox_id: str) -> ContainerStatus:
        return ContainerStatus(
            id=s.id,
            sandbox_id=sandbox_id,
            name=s.metadata.name,
            attempt=s.metadata.attempt,
            state=self.pb.ContainerState.Name(s.state),
            image=s.image.image,
            image_ref=s.image_ref,
            started_at_ns=s.started_at,
            finished_at_ns=s.finished_at,
            exit_code=s.exit_code,
            reason=s.reason,
            message=s.message,
        )

    async def list_containers(self, sandbox_id: str = "") -> list[ContainerStatus]:
        """Containers (of one sandbox, if given) with their state."""
        pb = self.pb
        r = await self._call(
            "ListContainers", pb.ListContainersRequest(filter=pb.ContainerFilter(pod_sandbox_id=sandbox_id))
        )
        out = []
        for c in r.containers:
            out.append(
                ContainerStatus(
                    id=c.id,
                    sandbox_id=c.pod_sandbox_id,
                    name=c.metadata.name,
                    attempt=c.metadata.attempt,
                    state=pb.ContainerState.Name(c.state),
                    image=c.image.image,
                    image_ref=c.image_ref,
                    started_at_ns=0,
                    finished_at_ns=0,
                    exit_code=0,
                    reason="",
                    message="",
                )
            )
        return out
