"""The resources this API server serves and their per-type behaviour ("strategies").

Mirrors the apiserver's registry strategies for each type: what create resets, what an
update may change, when ``metadata.generation`` moves, which fields a field selector may
use (and the error for the others), how a delete answers, and the columns
``kubectl get`` shows (server-side printing).
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import names, validation
from .errors import FieldError

JSON = dict[str, Any]
Errs = list[FieldError]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
STATUS_VERBS = ("get", "patch", "update")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """apimachinery duration.HumanDuration, as ``kubectl get`` shows ages."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def age(obj: JSON) -> str:
    created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return "<unknown>" if created is None else human_duration(time.time() - created)


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    description: str
    format: str = ""
    priority: int = 0

    def definition(self) -> JSON:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


NAME_COLUMN = Column(
    "Name",
    "string",
    "Name must be unique within a namespace. Is required when creating resources, although some resources "
    "may allow a client to request the generation of an appropriate name automatically.",
    "name",
)
AGE_COLUMN = Column(
    "Age",
    "string",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
)


def _default_field_error(label: str) -> str:
    # runtime.DefaultMetaV1FieldSelectorConversion
    return f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'


class Strategy:
    """Generic behaviour; types override what differs."""

    has_generation = False
    return_deleted = True
    allow_create_on_update = False
    field_labels: tuple[str, ...] = ("metadata.name", "metadata.namespace")
    # Fields a status update may not touch and a main-resource update may not touch.
    columns: tuple[Column, ...] = (NAME_COLUMN, AGE_COLUMN)

    def field_error(self, label: str) -> str:
        return _default_field_error(label)

    def name_check(self, name: str) -> list[str]:
        return names.dns1123_subdomain(name)

    def fields(self, obj: JSON) -> dict[str, str]:
        return {}

    def default(self, obj: JSON) -> None:
        """Scheme defaulting: runs on every decoded object (create, update, patch result)."""

    def prepare_create(self, obj: JSON) -> None:
        """PrepareForCreate (and create-only admission)."""

    def prepare_update(self, new: JSON, old: JSON) -> None:
        """PrepareForUpdate on the main resource: status changes are ignored there."""
        if "status" in old:
            new["status"] = old["status"]
        else:
            new.pop("status", None)

    def prepare_status_update(self, new: JSON, old: JSON) -> None:
        """Status subresource: only status changes; spec and most metadata stay as they were."""
        for key in list(new):
            if key not in ("apiVersion", "kind", "metadata", "status"):
                del new[key]
        for key, value in old.items():
            if key not in ("metadata", "status"):
                new[key] = value
        reset_meta_for_status(new, old)

    def validate(self, obj: JSON) -> Errs:
        return []

    def validate_update(self, new: JSON, old: JSON) -> Errs:
        return self.validate(new)

    def validate_status_update(self, new: JSON, old: JSON) -> Errs:
        return []

    def spec_changed(self, new: JSON, old: JSON) -> bool:
        return new.get("spec") != old.get("spec")

    def row(self, obj: JSON) -> list[Any]:
        return [obj["metadata"]["name"], age(obj)]


def reset_meta_for_status(new: JSON, old: JSON) -> None:
    """metav1.ResetObjectMetaForStatus: a status write keeps the old labels, annotations,
    finalizers, owner references and deletion fields."""
    nm = new.setdefault("metadata", {})
    om = old.get("metadata") or {}
    for key in (
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generateName",
    ):
        if key in om:
            nm[key] = om[key]
        else:
            nm.pop(key, None)


# -- core v1 ------------------------------------------------------------------------------------


class CoreStrategy(Strategy):
    """core/v1 kinds: their own field label conversion, whose error names only the label."""

    def field_error(self, label: str) -> str:
        return f"field label not supported: {label}"


class PodStrategy(CoreStrategy):
    has_generation = True  # PodObservedGenerationTracking, on by default in 1.34
    field_labels = (
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    )
    columns = (
        NAME_COLUMN,
        Column("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
        Column("Status", "string", "The aggregate status of the containers in this pod."),
        Column("Restarts", "string", "The number of times the containers in this pod have been restarted."),
        AGE_COLUMN,
        Column("IP", "string", "IP address allocated to the pod.", priority=1),
        Column("Node", "string", "Name of the node this pod is assigned to.", priority=1),
        Column("Nominated Node", "string", "Name of the node this pod is nominated to run on.", priority=1),
        Column("Readiness Gates", "string", "The readiness gates of the pod.", priority=1),
    )

    def fields(self, obj: JSON) -> dict[str, str]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        return {
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.restartPolicy": spec.get("restartPolicy", ""),
            "spec.schedulerName": spec.get("schedulerName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "spec.hostNetwork": "true" if spec.get("hostNetwork") else "false",
            "status.phase": status.get("phase", ""),
            "status.podIP": status.get("podIP", ""),
            "status.podIPs": ",".join(p.get("ip", "") for p in status.get("podIPs") or []),
            "status.nominatedNodeName": status.get("nominatedNodeName", ""),
        }

    def default(self, obj: JSON) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("securityContext", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("enableServiceLinks", True)
        if "serviceAccountName" in spec:
            spec.setdefault("serviceAccount", spec["serviceAccountName"])
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                c.setdefault("resources", {})
                c.setdefault("terminationMessagePath", "/dev/termination-log")
                c.setdefault("terminationMessagePolicy", "File")
                image = c.get("image", "")
                tag = image.rsplit("/", 1)[-1]
                latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
                c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
                for port in c.get("ports") or []:
                    port.setdefault("protocol", "TCP")

    def prepare_create(self, obj: JSON) -> None:
        spec = obj.setdefault("spec", {})
        # Priority and ServiceAccount admission.
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        if "serviceAccountName" not in spec:
            spec["serviceAccountName"] = spec.get("serviceAccount", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        # DefaultTolerationSeconds admission: ride out 300 s of not-ready / unreachable nodes.
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append(
                    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                )
        obj["status"] = {"phase": "Pending", "qosClass": _qos(spec)}

    def validate(self, obj: JSON) -> Errs:
        return validation.pod(obj)

    def validate_update(self, new: JSON, old: JSON) -> Errs:
        return validation.pod(new) + validation.pod_update(new, old)

    def row(self, obj: JSON) -> list[Any]:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        containers = spec.get("containers") or []
        statuses = status.get("containerStatuses") or []
        ready = sum(1 for s in statuses if s.get("ready"))
        restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
        reason = status.get("reason") or status.get("phase") or ""
        running = False
        for s in reversed(statuses):
            state = s.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif (state.get("terminated") or {}).get("reason"):
                reason = state["terminated"]["reason"]
            elif "terminated" in state:
                t = state["terminated"]
                reason = f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode', 0)}"
            elif s.get("ready") and "running" in state:
                running = True
        if reason == "Completed" and running:
            reason = "Running"
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
        gates = spec.get("readinessGates") or []
        return [
            obj["metadata"]["name"],
            f"{ready}/{len(containers)}",
            reason,
            str(restarts),
            age(obj),
            status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>",
            f"{len(gates)}/{len(gates)}" if gates else "<none>",
        ]


def _qos(spec: JSON) -> str:
    requests = limits = False
    guaranteed = True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        requests = requests or bool(req)
        limits = limits or bool(lim)
        if (
            not lim
            or any(k not in lim for k in ("cpu", "memory"))
            or any(req.get(k, lim[k]) != lim[k] for k in lim)
        ):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class NodeStrategy(CoreStrategy):
    return_deleted = False
    field_labels = ("metadata.name", "spec.unschedulable")
    columns = (
        NAME_COLUMN,
        Column("Status", "string", "The status of the node"),
        Column("Roles", "string", "The roles of the node"),
        AGE_COLUMN,
        Column("Version", "string", "Kubelet Version reported by the node."),
        Column("Internal-IP", "string", "List of internal IPs for the node.", priority=1),
        Column("External-IP", "string", "List of external IPs for the node.", priority=1),
        Column("OS-Image", "string", "OS Image reported by the node from /etc/os-release.", priority=1),
        Column("Kernel-Version", "string", "Kernel Version reported by the node.", priority=1),
        Column("Container-Runtime", "string", "Container Runtime Version reported by the node.", priority=1),
    )

    def fields(self, obj: JSON) -> dict[str, str]:
        return {"spec.unschedulable": "true" if (obj.get("spec") or {}).get("unschedulable") else "false"}

    def row(self, obj: JSON) -> list[Any]:
        status = obj.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        states = ["Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")]
        if (obj.get("spec") or {}).get("unschedulable"):
            states.append("SchedulingDisabled")
        roles = sorted(
            k.split("/", 1)[1]
            for k in ((obj.get("metadata") or {}).get("labels") or {})
            if k.startswith("node-role.kubernetes.io/")
        )
        info = status.get("nodeInfo") or {}

        def addr(kind: str) -> str:
            return next(
                (a["address"] for a in status.get("addresses") or [] if a.get("type") == kind), "<none>"
            )

        return [
            obj["metadata"]["name"],
            ",".join(states),
            ",".join(roles) or "<none>",
            age(obj),
            info.get("kubeletVersion", ""),
            addr("InternalIP"),
            addr("ExternalIP"),
            info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>",
        ]


class NamespaceStrategy(CoreStrategy):
    return_deleted = True
    field_labels = ("metadata.name", "status.phase")
    columns = (NAME_COLUMN, Column("Status", "string", "The status of the namespace"), AGE_COLUMN)

    def name_check(self, name: str) -> list[str]:
        return names.dns1123_label(name)

    def fields(self, obj: JSON) -> dict[str, str]:
        return {"status.phase": (obj.get("status") or {}).get("phase", "")}

    def prepare_create(self, obj: JSON) -> None:
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]

    def prepare_update(self, new: JSON, old: JSON) -> None:
        super().prepare_update(new, old)
        # spec.finalizers only change through the finalize subresource.
        new["spec"] = old.get("spec", {})
        new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = new["metadata"]["name"]

    def row(self, obj: JSON) -> list[Any]:
        return [obj["metadata"]["name"], (obj.get("status") or {}).get("phase", ""), age(obj)]


class EventStrategy(CoreStrategy):
    return_deleted = False
    allow_create_on_update = True
    field_labels = (
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    )
    columns = (
        Column("Last Seen", "string", "Time when this Event was last seen"),
        Column(
            "Type", "string", "Type of this event (Normal, Warning), new types could be added in the future."
        ),
        Column("Reason", "string", "Reason why this event was generated"),
        Column("Object", "string", "The object this Event is about."),
        Column("Subobject", "string", "The subobject this Event is about.", priority=1),
        Column("Source", "string", "The component reporting this event.", priority=1),
        Column("Message", "string", "A human-readable description of the status of this operation."),
        Column("First Seen", "string", "Time when this Event was first seen", priority=1),
        Column("Count", "string", "Number of times this event has occurred", priority=1),
        Column("Name", "string", "Name of the event", "name", priority=1),
    )

    def name_check(self, name: str) -> list[str]:
        return names.dns1123_subdomain(name)

    def fields(self, obj: JSON) -> dict[str, str]:
        inv = obj.get("involvedObject") or {}
        src = obj.get("source") or {}
        return {
            "involvedObject.kind": inv.get("kind", ""),
            "involvedObject.namespace": inv.get("namespace", ""),
            "involvedObject.name": inv.get("name", ""),
            "involvedObject.uid": inv.get("uid", ""),
            "involvedObject.apiVersion": inv.get("apiVersion", ""),
            "involvedObject.resourceVersion": inv.get("resourceVersion", ""),
            "involvedObject.fieldPath": inv.get("fieldPath", ""),
            "reason": obj.get("reason", ""),
            "reportingComponent": obj.get("reportingComponent", ""),
            "source": src.get("component", "") or obj.get("reportingComponent", ""),
            "type": obj.get("type", ""),
        }

    def prepare_update(self, new: JSON, old: JSON) -> None:
        """Events have no status."""

    def spec_changed(self, new: JSON, old: JSON) -> bool:
        return False

    def row(self, obj: JSON) -> list[Any]:
        inv = obj.get("involvedObject") or {}
        last = parse_time(
            obj.get("lastTimestamp") or obj.get("eventTime") or obj["metadata"].get("creationTimestamp")
        )
        first = parse_time(obj.get("firstTimestamp") or obj["metadata"].get("creationTimestamp"))
        src = obj.get("source") or {}
        source = src.get("component", "") or obj.get("reportingComponent", "")
        if src.get("host"):
            source += ", " + src["host"]
        return [
            "<unknown>" if last is None else human_duration(time.time() - last),
            obj.get("type", ""),
            obj.get("reason", ""),
            f"{inv.get('kind', '').lower()}/{inv.get('name', '')}",
            inv.get("fieldPath", ""),
            source,
            obj.get("message", "").strip(),
            "<unknown>" if first is None else human_duration(time.time() - first),
            str(obj.get("count", 1)),
            obj["metadata"]["name"],
        ]


# -- resource.k8s.io/v1 ------------------------------------------------------------------------


class DeviceClassStrategy(Strategy):
    has_generation = True

    def validate(self, obj: JSON) -> Errs:
        return validation.device_class(obj)


class ResourceClaimStrategy(Strategy):
    columns = (
        NAME_COLUMN,
        Column("State", "string", "A summary of the current state (allocated, pending, reserved, etc.)."),
        AGE_COLUMN,
    )

    def default(self, obj: JSON) -> None:
        validation.default_claim_spec(obj.setdefault("spec", {}))

    def prepare_create(self, obj: JSON) -> None:
        obj.pop("status", None)  # status must not be set by the user on create

    def prepare_status_update(self, new: JSON, old: JSON) -> None:
        super().prepare_status_update(new, old)
        validation.drop_deallocated_status_devices(new, old)

    def validate(self, obj: JSON) -> Errs:
        return validation.resource_claim(obj)

    def validate_update(self, new: JSON, old: JSON) -> Errs:
        return validation.spec_immutable(new, old)

    def validate_status_update(self, new: JSON, old: JSON) -> Errs:
        return validation.resource_claim_status(new, old)

    def row(self, obj: JSON) -> list[Any]:
        status = obj.get("status") or {}
        states = []
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            states.append("deleted")
        if status.get("allocation") is None:
            if not states:
                states.append("pending")
        else:
            states.append("allocated")
            if status.get("reservedFor"):
                states.append("reserved")
        return [obj["metadata"]["name"], ",".join(states), age(obj)]


class ResourceClaimTemplateStrategy(Strategy):
    def default(self, obj: JSON) -> None:
        validation.default_claim_spec((obj.setdefault("spec", {})).setdefault("spec", {}))

    def prepare_update(self, new: JSON, old: JSON) -> None:
        """Templates have no status."""

    def validate(self, obj: JSON) -> Errs:
        return validation.resource_claim_template(obj)

    def validate_update(self, new: JSON, old: JSON) -> Errs:
        return validation.spec_immutable(new, old)


class ResourceSliceStrategy(Strategy):
    has_generation = True
    field_labels = ("metadata.name", "spec.nodeName", "spec.driver")
    columns = (
        NAME_COLUMN,
        Column("Node", "string", "The node providing the resources in this slice."),
        Column("Driver", "string", "The driver providing the resources in this slice."),
        Column("Pool", "string", "The pool containing the resources in this slice."),
        AGE_COLUMN,
    )

    def field_error(self, label: str) -> str:
        return f"field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: {label}"

    def fields(self, obj: JSON) -> dict[str, str]:
        spec = obj.get("spec") or {}
        return {"spec.nodeName": spec.get("nodeName") or "", "spec.driver": spec.get("driver", "")}

    def prepare_update(self, new: JSON, old: JSON) -> None:
        """Slices have no status."""

    def validate(self, obj: JSON) -> Errs:
        return validation.resource_slice(obj)

    def validate_update(self, new: JSON, old: JSON) -> Errs:
        return validation.resource_slice(new, old)

    def row(self, obj: JSON) -> list[Any]:
        spec = obj.get("spec") or {}
        return [
            obj["metadata"]["name"],
            spec.get("nodeName") or "",
            spec.get("driver", ""),
            (spec.get("pool") or {}).get("name", ""),
            age(obj),
        ]


# -- the table of resources -------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives, what it is called, and its strategy."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    strategy: Strategy
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def storage_version_hash(self) -> str:
        digest = hashlib.sha256(f"{self.group}/{self.version}/{self.kind}".encode()).digest()
        return base64.b64encode(digest[:8]).decode()

    def discovery(self) -> list[JSON]:
        """APIResource entries: the resource and its subresources."""
        main: JSON = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        if "list" in self.verbs:
            main["storageVersionHash"] = self.storage_version_hash()
        out = [main]
        for sub in self.subresources:
            if sub == "status":
                out.append(
                    {
                        "name": f"{self.plural}/status",
                        "singularName": "",
                        "namespaced": self.namespaced,
                        "kind": self.kind,
                        "verbs": list(STATUS_VERBS),
                    }
                )
            elif sub == "binding":
                out.append(
                    {
                        "name": f"{self.plural}/binding",
                        "singularName": "",
                        "namespaced": self.namespaced,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
            elif sub == "finalize":
                out.append(
                    {
                        "name": f"{self.plural}/finalize",
                        "singularName": "",
                        "namespaced": self.namespaced,
                        "kind": self.kind,
                        "verbs": ["update"],
                    }
                )
        return out


RESOURCES: tuple[Resource, ...] = (
    # POST-only: the older way of binding a pod (the pods/binding subresource is the other).
    Resource("", "v1", "bindings", "binding", "Binding", True, Strategy(), verbs=("create",)),
    Resource("", "v1", "events", "event", "Event", True, EventStrategy(), short_names=("ev",)),
    Resource(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        False,
        NamespaceStrategy(),
        short_names=("ns",),
        subresources=("finalize", "status"),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    ),
    Resource(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        False,
        NodeStrategy(),
        short_names=("no",),
        subresources=("status",),
    ),
    Resource(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        True,
        PodStrategy(),
        short_names=("po",),
        categories=("all",),
        subresources=("binding", "status"),
    ),
    Resource(
        "resource.k8s.io", "v1", "deviceclasses", "deviceclass", "DeviceClass", False, DeviceClassStrategy()
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "resourceclaim",
        "ResourceClaim",
        True,
        ResourceClaimStrategy(),
        subresources=("status",),
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "resourceclaimtemplate",
        "ResourceClaimTemplate",
        True,
        ResourceClaimTemplateStrategy(),
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "resourceslice",
        "ResourceSlice",
        False,
        ResourceSliceStrategy(),
    ),
)

BY_PATH: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_PLURAL: dict[str, Resource] = {r.plural: r for r in RESOURCES}
GROUP_VERSIONS: tuple[tuple[str, str], ...] = tuple(dict.fromkeys((r.group, r.version) for r in RESOURCES))


def selectable_fields(res: Resource, obj: JSON) -> dict[str, str]:
    """The field set a field selector matches against (GetAttrs)."""
    meta = obj.get("metadata") or {}
    out = {"metadata.name": meta.get("name", "")}
    if res.namespaced:
        out["metadata.namespace"] = meta.get("namespace", "")
    out.update(res.strategy.fields(obj))
    return out
