"""Validation the OpenAPI schema does not carry: the apiserver's own rules.

Ported in behaviour (not code) from Kubernetes 1.34 ``pkg/apis/resource/validation``,
``pkg/apis/core/validation`` and ``apimachinery/pkg/api/validation``, limited to what
matters for DRA and for the objects our services and tests write. Each rule names its
limit; every error is a field error with the real message shape.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any

from . import names
from .errors import (
    FieldError,
    duplicate,
    forbidden,
    immutable,
    invalid,
    not_supported,
    required,
    too_long,
    too_many,
)

JSON = dict[str, Any]
Errs = list[FieldError]

# -- resource.k8s.io limits (api resource/v1 types.go, 1.34) ----------------------------------
RESOURCE_SLICE_MAX_DEVICES = 128  # ResourceSliceMaxDevices
RESOURCE_SLICE_MAX_SHARED_COUNTERS = 32  # ResourceSliceMaxSharedCounters (1.34)
MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength (string and version)
DEVICE_MAX_DOMAIN_LENGTH = 63  # DeviceMaxDomainLength
DEVICE_MAX_ID_LENGTH = 32  # DeviceMaxIDLength (C identifier part of a qualified name)
DRIVER_NAME_MAX_LENGTH = 63  # DriverNameMaxLength (same as a CSI driver name)
POOL_NAME_MAX_LENGTH = 253  # PoolNameMaxLength
DEVICE_TAINTS_MAX_LENGTH = 4  # DeviceTaintsMaxLength (1.34)
DEVICE_REQUESTS_MAX_SIZE = 32  # DeviceRequestsMaxSize
DEVICE_CONSTRAINTS_MAX_SIZE = 32  # DeviceConstraintsMaxSize
DEVICE_CONFIG_MAX_SIZE = 32  # DeviceConfigMaxSize
DEVICE_SELECTORS_MAX_SIZE = 32  # DeviceSelectorsMaxSize
FIRST_AVAILABLE_MAX_SIZE = 8  # FirstAvailableDeviceRequestMaxSize
CEL_SELECTOR_EXPRESSION_MAX_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024  # OpaqueParametersMaxLength
ALLOCATION_RESULTS_MAX_SIZE = 32  # AllocationResultsMaxSize
RESERVED_FOR_MAX_SIZE = 256  # ResourceClaimReservedForMaxSize
ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS = 8  # AllocatedDeviceStatusMaxConditions
ALLOCATED_DEVICE_STATUS_DATA_MAX_LENGTH = 10 * 1024  # AllocatedDeviceStatusDataMaxLength
NETWORK_DEVICE_DATA_MAX_IPS = 16  # NetworkDeviceDataMaxIPs
NETWORK_DEVICE_DATA_INTERFACE_NAME_MAX_LENGTH = 256  # NetworkDeviceDataInterfaceNameMaxLength
NETWORK_DEVICE_DATA_HARDWARE_ADDRESS_MAX_LENGTH = 128  # NetworkDeviceDataHardwareAddressMaxLength
# -- metav1 / core limits ------------------------------------------------------------------------
ANNOTATIONS_TOTAL_MAX_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB
CONDITION_MESSAGE_MAX_LENGTH = 32 * 1024  # maxMessageLength in ValidateConditions
CONDITION_REASON_MAX_LENGTH = 1024  # maxReasonLength
STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}

_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
_CONDITION_REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def _msgs(path: str, value: Any, msgs: list[str]) -> Errs:
    return [invalid(path, value, m) for m in msgs]


def _required(value: str, path: str, check: Callable[[str], list[str]]) -> Errs:
    """A required string that must pass ``check`` (names.dns1123_label and the like)."""
    return _msgs(path, value, check(value)) if value else [required(path)]


def _bounded(items: list[JSON], max_size: int, path: str, check: Callable[[JSON, str], Errs]) -> Errs:
    """``check`` on every item at ``path[i]``; a list over ``max_size`` gets only the
    too-many error (the size check short-circuits)."""
    if len(items) > max_size:
        return [too_many(path, len(items), max_size)]
    errs: Errs = []
    for i, item in enumerate(items):
        errs += check(item, f"{path}[{i}]")
    return errs


# -- object metadata ---------------------------------------------------------------------------


def object_meta(obj: JSON, namespaced: bool, name_check: Callable[[str], list[str]]) -> Errs:
    """ValidateObjectMeta: name, namespace, labels, annotations, finalizers, ownerReferences."""
    meta = obj.get("metadata") or {}
    errs: Errs = []
    name = meta.get("name", "")
    if not name:
        errs.append(required("metadata.name", "name or generateName is required"))
    else:
        errs += _msgs("metadata.name", name, name_check(name))
    ns = meta.get("namespace", "")
    if namespaced:
        if not ns:
            errs.append(required("metadata.namespace"))
        else:
            errs += _msgs("metadata.namespace", ns, names.dns1123_label(ns))
    elif ns:
        errs.append(forbidden("metadata.namespace", "not allowed on this type"))
    for key, value in (meta.get("labels") or {}).items():
        errs += _msgs("metadata.labels", key, names.qualified_name(key))
        errs += _msgs("metadata.labels", value, names.label_value(value))
    total = 0
    for key, value in (meta.get("annotations") or {}).items():
        errs += _msgs("metadata.annotations", key, names.qualified_name(key.lower()))
        total += len(key) + len(value or "")
    if total > ANNOTATIONS_TOTAL_MAX_BYTES:
        errs.append(too_long("metadata.annotations", ANNOTATIONS_TOTAL_MAX_BYTES))
    finalizers = meta.get("finalizers") or []
    for i, fin in enumerate(finalizers):
        path = f"metadata.finalizers[{i}]"
        msgs = names.qualified_name(fin)
        errs += _msgs(path, fin, msgs)
        if not msgs and "/" not in fin and fin not in STANDARD_FINALIZERS:
            errs.append(
                invalid(path, fin, "name is neither a standard finalizer name nor is it fully qualified")
            )
    if "orphan" in finalizers and "foregroundDeletion" in finalizers:
        errs.append(
            invalid(
                "metadata.finalizers",
                finalizers,
                "finalizer orphan and foregroundDeletion cannot be both set",
            )
        )
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        path = f"metadata.ownerReferences[{i}]"
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errs.append(required(f"{path}.{key}"))
        if ref.get("controller"):
            controllers += 1
    if controllers > 1:
        errs.append(
            invalid(
                "metadata.ownerReferences", controllers, "Only one reference can have Controller set to true"
            )
        )
    return errs


def object_meta_update(new: JSON, old: JSON) -> Errs:
    """ValidateObjectMetaUpdate: identity is immutable; no new finalizers while deleting."""
    nm, om = new.get("metadata") or {}, old.get("metadata") or {}
    errs: Errs = []
    for key in ("name", "namespace", "uid", "creationTimestamp"):
        if nm.get(key, "") != om.get(key, ""):
            errs.append(immutable(f"metadata.{key}", nm.get(key, "")))
    if om.get("deletionTimestamp"):
        added = [f for f in nm.get("finalizers") or [] if f not in (om.get("finalizers") or [])]
        if added:
            errs.append(
                forbidden(
                    "metadata.finalizers",
                    f"no new finalizers can be added if the object is being deleted, found new finalizers "
                    f"{json.dumps(added)}",
                )
            )
    return errs


# -- resource.k8s.io helpers -------------------------------------------------------------------


def driver_name(value: str, path: str) -> Errs:
    """ValidateCSIDriverName: required, <= 63 bytes, a DNS subdomain once lower-cased."""
    if not value:
        return [required(path)]
    errs: Errs = []
    if len(value) > DRIVER_NAME_MAX_LENGTH:
        errs.append(too_long(path, DRIVER_NAME_MAX_LENGTH))
    errs += _msgs(path, value, names.dns1123_subdomain(value.lower()))
    return errs


def pool_name(value: str, path: str) -> Errs:
    """Pool names: <= 253 bytes, one or more DNS subdomains separated by '/'."""
    if not value:
        return [required(path)]
    errs: Errs = []
    if len(value) > POOL_NAME_MAX_LENGTH:
        errs.append(too_long(path, POOL_NAME_MAX_LENGTH))
    for part in value.split("/"):
        errs += _msgs(path, part, names.dns1123_subdomain(part))
    return errs


def device_name(value: str, path: str) -> Errs:
    return _required(value, path, names.dns1123_label)


def c_identifier(value: str, path: str) -> Errs:
    """The identifier part of a QualifiedName: a C identifier of at most 32 bytes."""
    errs: Errs = []
    if len(value) > DEVICE_MAX_ID_LENGTH:
        errs.append(too_long(path, DEVICE_MAX_ID_LENGTH))
    errs += _msgs(path, value, names.c_identifier(value))
    return errs


def qualified_attribute_name(name: str, path: str) -> Errs:
    """QualifiedName: a C identifier, or <domain>/<C identifier> with the domain a driver name."""
    parts = name.split("/")
    if len(parts) == 1:
        return c_identifier(parts[0], path)
    if len(parts) == 2:
        errs: Errs = []
        if not parts[0]:
            errs.append(invalid(path, "", "the domain must not be empty"))
        else:
            errs += driver_name(parts[0], path)
        if not parts[1]:
            errs.append(invalid(path, "", "the name must not be empty"))
        else:
            errs += c_identifier(parts[1], path)
        return errs
    return [invalid(path, name, "must not contain more than one slash")]


def fully_qualified_name(name: str, path: str) -> Errs:
    errs = qualified_attribute_name(name, path)
    if "/" not in name:
        errs.append(
            invalid(path, name, "a fully qualified name must be a domain and a name separated by a slash")
        )
    return errs


def _raw_extension(value: Any, path: str, max_len: int) -> Errs:
    if value is None:
        return [required(path)]
    if not isinstance(value, dict):
        return [invalid(path, "<value omitted>", "must be a valid JSON object")]
    if len(json.dumps(value, separators=(",", ":"))) > max_len:
        return [too_long(path, max_len)]
    return []


def _cel(expression: str, path: str) -> Errs:
    """CEL selector length (<= 10 KiB) and syntax; the type checks of the real compiler are not run."""
    if len(expression) > CEL_SELECTOR_EXPRESSION_MAX_LENGTH:
        return [too_long(path, CEL_SELECTOR_EXPRESSION_MAX_LENGTH)]
    if not expression.strip():
        return [required(path)]
    parser = _cel_parser()
    if parser is not None:
        try:
            parser(expression)
        except Exception as e:
            return [invalid(path, expression, f"compilation failed: {e}".splitlines()[0])]
    return []


_cel_parse: Callable[[str], Any] | None = None
_cel_tried = False


def _cel_parser() -> Callable[[str], Any] | None:
    # celpy is slow to import; only claims and classes need it, so load it on first use.
    global _cel_parse, _cel_tried
    if not _cel_tried:
        _cel_tried = True
        try:
            import celpy

            env = celpy.Environment()
            _cel_parse = env.compile
        except ImportError:
            _cel_parse = None
    return _cel_parse


def _selectors(selectors: list[JSON], path: str) -> Errs:
    if len(selectors) > DEVICE_SELECTORS_MAX_SIZE:
        return [too_many(path, len(selectors), DEVICE_SELECTORS_MAX_SIZE)]
    errs: Errs = []
    for i, sel in enumerate(selectors):
        cel = sel.get("cel")
        if cel is None:
            errs.append(required(f"{path}[{i}].cel"))
        else:
            errs += _cel(cel.get("expression", ""), f"{path}[{i}].cel.expression")
    return errs


def _opaque(config: JSON, path: str) -> Errs:
    opaque = config.get("opaque")
    if opaque is None:
        return [required(f"{path}.opaque")]
    errs = driver_name(opaque.get("driver", ""), f"{path}.opaque.driver")
    errs += _raw_extension(
        opaque.get("parameters"), f"{path}.opaque.parameters", OPAQUE_PARAMETERS_MAX_LENGTH
    )
    return errs


def _allocation_mode(req: JSON, path: str) -> Errs:
    mode, count = req.get("allocationMode", ""), req.get("count", 0)
    if mode == "All":
        if count:
            return [invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")]
        return []
    if mode == "ExactCount":
        if count <= 0:
            return [invalid(f"{path}.count", count, "must be greater than zero")]
        return []
    return [not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"])]


def _tolerations(tols: list[JSON], path: str) -> Errs:
    errs: Errs = []
    for i, t in enumerate(tols):
        p = f"{path}[{i}]"
        if t.get("key"):
            errs += _msgs(f"{p}.key", t["key"], names.qualified_name(t["key"]))
        op = t.get("operator", "")
        if op == "Exists":
            if t.get("value"):
                errs.append(invalid(f"{p}.value", t["value"], "must be empty for operator `Exists`"))
        elif op == "Equal":
            errs += _msgs(f"{p}.value", t.get("value", ""), names.label_value(t.get("value", "")))
        elif op == "":
            errs.append(required(f"{p}.operator"))
        else:
            errs.append(not_supported(f"{p}.operator", op, ["Equal", "Exists"]))
        if t.get("effect") and t["effect"] not in ("NoSchedule", "NoExecute", "None"):
            errs.append(not_supported(f"{p}.effect", t["effect"], ["NoExecute", "NoSchedule", "None"]))
    return errs


def _request_names(devices: JSON) -> dict[str, set[str] | None]:
    out: dict[str, set[str] | None] = {}
    for r in devices.get("requests") or []:
        subs = r.get("firstAvailable") or []
        out[r.get("name", "")] = {s.get("name", "") for s in subs} if subs else None
    return out


def _request_ref(name: str, path: str, known: dict[str, set[str] | None]) -> Errs:
    parts = name.split("/")
    msg = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
    if len(parts) > 2:
        return [invalid(path, name, msg)]
    errs: Errs = []
    for part in parts:
        errs += _required(part, path, names.dns1123_label)
    subs = known.get(parts[0], set()) if parts[0] in known else None
    ok = parts[0] in known and (len(parts) == 1 or (subs is not None and parts[1] in subs))
    if not ok:
        errs.append(invalid(path, name, msg))
    return errs


def _request_refs(holder: JSON, path: str, known: dict[str, set[str] | None]) -> Errs:
    """The ``requests`` list of a constraint or config: each names a request of the claim."""
    errs: Errs = []
    for j, ref in enumerate(holder.get("requests") or []):
        errs += _request_ref(ref, f"{path}.requests[{j}]", known)
    return errs


def _unique_list(items: list[Any], max_size: int, path: str, key: Callable[[Any], Any]) -> tuple[Errs, bool]:
    """validateSet's size check (short-circuits) and duplicate check."""
    if max_size >= 0 and len(items) > max_size:
        return [too_many(path, len(items), max_size)], False
    errs: Errs = []
    seen: set[Any] = set()
    for i, item in enumerate(items):
        k = key(item)
        if k in seen:
            errs.append(duplicate(f"{path}[{i}]", k))
        seen.add(k)
    return errs, True


def device_claim(devices: JSON, path: str) -> Errs:
    """DeviceClaim: requests (<= 32, unique names), constraints (<= 32), config (<= 32)."""
    errs: Errs = []
    known = _request_names(devices)
    requests = devices.get("requests") or []
    e, ok = _unique_list(requests, DEVICE_REQUESTS_MAX_SIZE, f"{path}.requests", lambda r: r.get("name", ""))
    if ok:
        for i, r in enumerate(requests):
            errs += _device_request(r, f"{path}.requests[{i}]")
    errs += e
    errs += _bounded(
        devices.get("constraints") or [],
        DEVICE_CONSTRAINTS_MAX_SIZE,
        f"{path}.constraints",
        lambda c, p: _constraint(c, p, known),
    )
    errs += _bounded(
        devices.get("config") or [],
        DEVICE_CONFIG_MAX_SIZE,
        f"{path}.config",
        lambda c, p: _request_refs(c, p, known) + _opaque(c, p),
    )
    return errs


def _constraint(c: JSON, path: str, known: dict[str, set[str] | None]) -> Errs:
    errs = _request_refs(c, path, known)
    if c.get("matchAttribute") is not None:
        errs += fully_qualified_name(c["matchAttribute"], f"{path}.matchAttribute")
    elif c.get("distinctAttribute") is not None:
        errs += fully_qualified_name(c["distinctAttribute"], f"{path}.distinctAttribute")
    else:
        errs.append(required(f"{path}.matchAttribute"))
    return errs


def _device_request(r: JSON, path: str) -> Errs:
    name = r.get("name", "")
    errs = _required(name, f"{path}.name", names.dns1123_label)
    first = r.get("firstAvailable") or []
    exactly = r.get("exactly")
    if first and exactly is not None:
        errs.append(
            invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
            )
        )
    elif not first and exactly is None:
        errs.append(required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif exactly is not None:
        errs += _exact_request(exactly, f"{path}.exactly")
    else:
        e, ok = _unique_list(
            first, FIRST_AVAILABLE_MAX_SIZE, f"{path}.firstAvailable", lambda s: s.get("name", "")
        )
        errs += e
        if ok:
            for i, sub in enumerate(first):
                p = f"{path}.firstAvailable[{i}]"
                errs += _required(sub.get("name", ""), f"{p}.name", names.dns1123_label)
                errs += _exact_request(sub, p)
    return errs


def _exact_request(r: JSON, path: str) -> Errs:
    errs = _required(r.get("deviceClassName", ""), f"{path}.deviceClassName", names.dns1123_subdomain)
    errs += _selectors(r.get("selectors") or [], f"{path}.selectors")
    errs += _allocation_mode(r, path)
    errs += _tolerations(r.get("tolerations") or [], f"{path}.tolerations")
    return errs


def default_claim_spec(spec: JSON) -> None:
    """SetDefaults_ExactDeviceRequest / DeviceSubRequest / DeviceToleration."""
    for r in (spec.get("devices") or {}).get("requests") or []:
        targets = [r["exactly"]] if isinstance(r.get("exactly"), dict) else []
        targets += [s for s in r.get("firstAvailable") or [] if isinstance(s, dict)]
        for t in targets:
            t.setdefault("allocationMode", "ExactCount")
            if t["allocationMode"] == "ExactCount" and not t.get("count"):
                t["count"] = 1
            for tol in t.get("tolerations") or []:
                if isinstance(tol, dict):
                    tol.setdefault("operator", "Equal")


def resource_claim(obj: JSON) -> Errs:
    return device_claim((obj.get("spec") or {}).get("devices") or {}, "spec.devices")


def resource_claim_template(obj: JSON) -> Errs:
    spec = obj.get("spec") or {}
    errs: Errs = []
    for key, value in ((spec.get("metadata") or {}).get("labels") or {}).items():
        errs += _msgs("spec.metadata.labels", key, names.qualified_name(key))
        errs += _msgs("spec.metadata.labels", value, names.label_value(value))
    errs += device_claim(((spec.get("spec") or {}).get("devices")) or {}, "spec.spec.devices")
    return errs


def spec_immutable(new: JSON, old: JSON) -> Errs:
    if new.get("spec") != old.get("spec"):
        return [immutable("spec", new.get("spec"))]
    return []


def device_class(obj: JSON) -> Errs:
    spec = obj.get("spec") or {}
    errs = _selectors(spec.get("selectors") or [], "spec.selectors")
    errs += _bounded(spec.get("config") or [], DEVICE_CONFIG_MAX_SIZE, "spec.config", _opaque)
    return errs


def _node_selector(sel: JSON, path: str) -> Errs:
    terms = sel.get("nodeSelectorTerms") or []
    errs: Errs = []
    if not terms:
        errs.append(required(f"{path}.nodeSelectorTerms", "must have at least one node selector term"))
    for i, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for j, expr in enumerate(term.get(kind) or []):
                p = f"{path}.nodeSelectorTerms[{i}].{kind}[{j}]"
                op = expr.get("operator", "")
                values = expr.get("values") or []
                if op in ("In", "NotIn"):
                    if not values:
                        errs.append(
                            required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'")
                        )
                elif op in ("Exists", "DoesNotExist"):
                    if values:
                        errs.append(
                            forbidden(
                                f"{p}.values",
                                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                            )
                        )
                elif op in ("Gt", "Lt"):
                    if len(values) != 1:
                        errs.append(
                            required(
                                f"{p}.values",
                                "must be specified single value when `operator` is 'Lt' or 'Gt'",
                            )
                        )
                else:
                    errs.append(
                        not_supported(
                            f"{p}.operator", op, ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"]
                        )
                    )
                if kind == "matchExpressions":
                    errs += _msgs(f"{p}.key", expr.get("key", ""), names.qualified_name(expr.get("key", "")))
    return errs


def _node_selection(holder: JSON, path: str, with_per_device: bool) -> tuple[Errs, list[str]]:
    errs: Errs = []
    chosen: list[str] = []
    if "nodeName" in holder:
        if holder["nodeName"]:
            chosen.append("`nodeName`")
            errs += _msgs(f"{path}.nodeName", holder["nodeName"], names.dns1123_subdomain(holder["nodeName"]))
        else:
            errs.append(invalid(f"{path}.nodeName", "", "must be either unset or set to a non-empty string"))
    if "nodeSelector" in holder:
        chosen.append("`nodeSelector`")
        errs += _node_selector(holder["nodeSelector"] or {}, f"{path}.nodeSelector")
    if "allNodes" in holder:
        if holder["allNodes"]:
            chosen.append("`allNodes`")
        else:
            errs.append(invalid(f"{path}.allNodes", False, "must be either unset or set to true"))
    if with_per_device and "perDeviceNodeSelection" in holder:
        if holder["perDeviceNodeSelection"]:
            chosen.append("`perDeviceNodeSelection`")
        else:
            errs.append(
                invalid(f"{path}.perDeviceNodeSelection", False, "must be either unset or set to true")
            )
    return errs, chosen


def resource_slice(obj: JSON, old: JSON | None = None) -> Errs:
    """ValidateResourceSlice(Update) as of 1.34."""
    spec = obj.get("spec") or {}
    errs: Errs = []
    errs += driver_name(spec.get("driver", ""), "spec.driver")
    pool = spec.get("pool") or {}
    errs += pool_name(pool.get("name", ""), "spec.pool.name")
    # resourceSliceCount > 0 and generation >= 0 (validateResourcePool).
    if pool.get("resourceSliceCount", 0) <= 0:
        errs.append(
            invalid(
                "spec.pool.resourceSliceCount", pool.get("resourceSliceCount", 0), "must be greater than zero"
            )
        )
    if pool.get("generation", 0) < 0:
        errs.append(
            invalid("spec.pool.generation", pool["generation"], "must be greater than or equal to zero")
        )
    if old is not None:
        ospec = old.get("spec") or {}
        # Immutable once created: pool name, driver, node name.
        if pool.get("name") != (ospec.get("pool") or {}).get("name"):
            errs.append(immutable("spec.pool.name", pool.get("name")))
        if spec.get("driver") != ospec.get("driver"):
            errs.append(immutable("spec.driver", spec.get("driver")))
        if spec.get("nodeName") != ospec.get("nodeName"):
            errs.append(immutable("spec.nodeName", spec.get("nodeName")))

    # Exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection.
    e, chosen = _node_selection(spec, "spec", True)
    errs += e
    if "nodeSelector" in spec and len((spec["nodeSelector"] or {}).get("nodeSelectorTerms") or []) != 1:
        errs.append(
            invalid(
                "spec.nodeSelector.nodeSelectorTerms",
                (spec["nodeSelector"] or {}).get("nodeSelectorTerms"),
                "must have exactly one node selector term",
            )
        )
    one_of = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not chosen:
        errs.append(required("spec", one_of))
    elif len(chosen) > 1:
        errs.append(invalid("spec", "{" + ", ".join(chosen) + "}", one_of + ", but multiple fields are set"))
    per_device = bool(spec.get("perDeviceNodeSelection"))

    devices = spec.get("devices") or []
    # At most 128 devices per slice (ResourceSliceMaxDevices); the size check short-circuits.
    e, ok = _unique_list(devices, RESOURCE_SLICE_MAX_DEVICES, "spec.devices", lambda d: d.get("name", ""))
    if ok:
        for i, dev in enumerate(devices):
            errs += _device(dev, f"spec.devices[{i}]", per_device)
    errs += e
    counters = spec.get("sharedCounters") or []
    # At most 32 shared counter sets in 1.34 (ResourceSliceMaxSharedCounters), names unique DNS labels.
    e, ok = _unique_list(
        counters, RESOURCE_SLICE_MAX_SHARED_COUNTERS, "spec.sharedCounters", lambda c: c.get("name", "")
    )
    errs += e
    if ok:
        for i, cs in enumerate(counters):
            p = f"spec.sharedCounters[{i}]"
            errs += _required(cs.get("name", ""), f"{p}.name", names.dns1123_label)
            if not cs.get("counters"):
                errs.append(required(f"{p}.counters"))
            for key in cs.get("counters") or {}:
                errs += _msgs(f"{p}.counters", key, names.dns1123_label(key))
    return errs


def _device(dev: JSON, path: str, per_device: bool) -> Errs:
    errs = device_name(dev.get("name", ""), f"{path}.name")
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    # Attributes and capacities together: at most 32 per device.
    total = len(attrs) + len(caps)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        errs.append(
            invalid(
                path,
                total,
                f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE}",
            )
        )
    for key, attr in attrs.items():
        errs += qualified_attribute_name(key, f"{path}.attributes")
        errs += _attribute(attr or {}, f"{path}.attributes[{_truncate(key)}]")
    for key, cap in caps.items():
        errs += qualified_attribute_name(key, f"{path}.capacity")
        if (cap or {}).get("requestPolicy") is not None and not dev.get("allowMultipleAllocations"):
            errs.append(
                forbidden(
                    f"{path}.capacity[{_truncate(key)}].requestPolicy",
                    "allowMultipleAllocations must be true",
                )
            )
    # At most 4 taints per device in 1.34 (DeviceTaintsMaxLength).
    errs += _bounded(dev.get("taints") or [], DEVICE_TAINTS_MAX_LENGTH, f"{path}.taints", _taint)
    node_fields = [k for k in ("nodeName", "nodeSelector", "allNodes") if k in dev]
    if per_device:
        e, chosen = _node_selection(dev, path, False)
        errs += e
        msg = (
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` "
            "is set to true in the ResourceSlice spec"
        )
        if not chosen:
            errs.append(required(path, msg))
        elif len(chosen) > 1:
            errs.append(invalid(path, "{" + ", ".join(chosen) + "}", msg))
    elif node_fields:
        errs.append(
            invalid(
                path,
                None,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to "
                "true in the ResourceSlice spec",
            )
        )
    return errs


def _taint(t: JSON, p: str) -> Errs:
    errs = _required(t.get("key", ""), f"{p}.key", names.qualified_name)
    if t.get("value"):
        errs += _msgs(f"{p}.value", t["value"], names.label_value(t["value"]))
    effect = t.get("effect", "")
    if not effect:
        errs.append(required(f"{p}.effect"))
    elif effect not in ("NoSchedule", "NoExecute", "None"):
        errs.append(not_supported(f"{p}.effect", effect, ["NoExecute", "NoSchedule", "None"]))
    return errs


def _truncate(key: str, max_len: int = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH) -> str:
    """Long map keys are shortened in the middle in error paths (truncateIfTooLong)."""
    if len(key) <= max_len:
        return key
    remaining = max_len - 3
    return key[: (remaining + 1) // 2] + "..." + key[len(key) - remaining // 2 :]


def _attribute(attr: JSON, path: str) -> Errs:
    """Exactly one of bool/int/string/version; string and version at most 64 bytes; versions semver."""
    errs: Errs = []
    present = [k for k in ("bool", "int", "string", "version") if k in attr]
    if "string" in attr and len(attr["string"]) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
        errs.append(too_long(f"{path}.string", DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    if "version" in attr:
        v = attr["version"]
        if not _SEMVER_RE.match(v):
            errs.append(
                invalid(f"{path}.version", v, "must be a string compatible with semver.org spec 2.0.0")
            )
        if len(v) > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH:
            errs.append(too_long(f"{path}.version", DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH))
    if not present:
        errs.append(invalid(path, "", "exactly one value must be specified"))
    elif len(present) > 1:
        errs.append(invalid(path, attr, "exactly one value must be specified"))
    return errs


# -- ResourceClaim status ------------------------------------------------------------------------


def _device_id(d: JSON) -> str:
    ident = f"{d.get('driver', '')}/{d.get('pool', '')}/{d.get('device', '')}"
    return f"{ident}/{d['shareID']}" if d.get("shareID") else ident


def conditions(conds: list[JSON], path: str) -> Errs:
    """metav1 ValidateConditions: type a qualified name and unique, status True/False/Unknown,
    observedGeneration >= 0, lastTransitionTime set, reason CamelCase <= 1024, message <= 32 KiB."""
    errs: Errs = []
    seen: set[str] = set()
    for i, c in enumerate(conds):
        p = f"{path}[{i}]"
        ctype = c.get("type", "")
        if not ctype:
            errs.append(required(f"{p}.type"))
        else:
            errs += _msgs(f"{p}.type", ctype, names.qualified_name(ctype))
            if ctype in seen:
                errs.append(duplicate(f"{p}.type", ctype))
            seen.add(ctype)
        status = c.get("status", "")
        if status not in ("True", "False", "Unknown"):
            errs.append(not_supported(f"{p}.status", status, ["False", "True", "Unknown"]))
        if c.get("observedGeneration", 0) < 0:
            errs.append(
                invalid(
                    f"{p}.observedGeneration",
                    c["observedGeneration"],
                    "must be greater than or equal to zero",
                )
            )
        if not c.get("lastTransitionTime"):
            errs.append(required(f"{p}.lastTransitionTime", "must be set"))
        reason = c.get("reason", "")
        if not reason:
            errs.append(required(f"{p}.reason", "must be set"))
        else:
            if len(reason) > CONDITION_REASON_MAX_LENGTH:
                errs.append(too_long(f"{p}.reason", CONDITION_REASON_MAX_LENGTH))
            if not _CONDITION_REASON_RE.match(reason):
                errs.append(
                    invalid(
                        f"{p}.reason",
                        reason,
                        "a condition reason must start with alphabetic character, optionally followed by a string of "
                        "alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. "
                        "'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex "
                        "used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
                    )
                )
        if len(c.get("message", "")) > CONDITION_MESSAGE_MAX_LENGTH:
            errs.append(too_long(f"{p}.message", CONDITION_MESSAGE_MAX_LENGTH))
    return errs


def _interface_address(value: str, path: str) -> Errs:
    """IsValidInterfaceAddress: an address with prefix length, in canonical form."""
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        return [
            invalid(path, value, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)")
        ]
    if "/" not in value:
        return [
            invalid(path, value, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)")
        ]
    canonical = f"{iface.ip}/{iface.network.prefixlen}"
    if canonical != value:
        return [invalid(path, value, f'must be in canonical form ("{canonical}")')]
    return []


def _device_status(d: JSON, path: str, allocated: set[str]) -> Errs:
    errs = driver_name(d.get("driver", ""), f"{path}.driver")
    errs += pool_name(d.get("pool", ""), f"{path}.pool")
    errs += device_name(d.get("device", ""), f"{path}.device")
    # Status entries only for devices allocated to this claim.
    if _device_id(d) not in allocated:
        errs.append(invalid(path, _device_id(d), "must be an allocated device in the claim"))
    conds = d.get("conditions") or []
    # At most 8 conditions per device (AllocatedDeviceStatusMaxConditions).
    if len(conds) > ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS:
        errs.append(too_many(f"{path}.conditions", len(conds), ALLOCATED_DEVICE_STATUS_MAX_CONDITIONS))
    errs += conditions(conds, f"{path}.conditions")
    if "data" in d:
        # Driver data: a JSON object of at most 10 KiB.
        errs += _raw_extension(d["data"], f"{path}.data", ALLOCATED_DEVICE_STATUS_DATA_MAX_LENGTH)
    nd = d.get("networkData")
    if nd:
        # interfaceName <= 256, hardwareAddress <= 128, ips <= 16, unique, CIDR form.
        if len(nd.get("interfaceName", "")) > NETWORK_DEVICE_DATA_INTERFACE_NAME_MAX_LENGTH:
            errs.append(
                too_long(f"{path}.networkData.interfaceName", NETWORK_DEVICE_DATA_INTERFACE_NAME_MAX_LENGTH)
            )
        if len(nd.get("hardwareAddress", "")) > NETWORK_DEVICE_DATA_HARDWARE_ADDRESS_MAX_LENGTH:
            errs.append(
                too_long(
                    f"{path}.networkData.hardwareAddress", NETWORK_DEVICE_DATA_HARDWARE_ADDRESS_MAX_LENGTH
                )
            )
        ips = nd.get("ips") or []
        e, ok = _unique_list(ips, NETWORK_DEVICE_DATA_MAX_IPS, f"{path}.networkData.ips", lambda v: v)
        errs += e
        if ok:
            for i, ip in enumerate(ips):
                errs += _interface_address(ip, f"{path}.networkData.ips[{i}]")
    return errs


def _allocation(alloc: JSON, known: dict[str, set[str] | None]) -> Errs:
    devices = alloc.get("devices") or {}
    # At most 32 allocation results (AllocationResultsMaxSize).
    errs = _bounded(
        devices.get("results") or [],
        ALLOCATION_RESULTS_MAX_SIZE,
        "status.allocation.devices.results",
        lambda r, p: _allocation_result(r, p, known),
    )
    # Class configs plus claim configs: at most 2 x 32.
    errs += _bounded(
        devices.get("config") or [],
        2 * DEVICE_CONFIG_MAX_SIZE,
        "status.allocation.devices.config",
        lambda c, p: _allocation_config(c, p, known),
    )
    if alloc.get("nodeSelector") is not None:
        errs += _node_selector(alloc["nodeSelector"], "status.allocation.nodeSelector")
    return errs


def _allocation_result(r: JSON, path: str, known: dict[str, set[str] | None]) -> Errs:
    errs = _request_ref(r.get("request", ""), f"{path}.request", known)
    errs += driver_name(r.get("driver", ""), f"{path}.driver")
    errs += pool_name(r.get("pool", ""), f"{path}.pool")
    errs += device_name(r.get("device", ""), f"{path}.device")
    errs += _tolerations(r.get("tolerations") or [], f"{path}.tolerations")
    return errs


def _allocation_config(c: JSON, path: str, known: dict[str, set[str] | None]) -> Errs:
    errs: Errs = []
    source = c.get("source", "")
    if not source:
        errs.append(required(f"{path}.source"))
    elif source not in ("FromClaim", "FromClass"):
        errs.append(not_supported(f"{path}.source", source, ["FromClaim", "FromClass"]))
    return errs + _request_refs(c, path, known) + _opaque(c, path)


def resource_claim_status(new: JSON, old: JSON) -> Errs:
    """ValidateResourceClaimStatusUpdate."""
    status = new.get("status") or {}
    old_status = old.get("status") or {}
    errs: Errs = []
    reserved = status.get("reservedFor") or []
    # At most 256 consumers, unique by uid, each with resource, name and uid.
    e, ok = _unique_list(reserved, RESERVED_FOR_MAX_SIZE, "status.reservedFor", lambda r: r.get("uid", ""))
    errs += e
    if ok:
        for i, r in enumerate(reserved):
            for key in ("resource", "name", "uid"):
                if not r.get(key):
                    errs.append(required(f"status.reservedFor[{i}].{key}"))
    alloc = status.get("allocation")
    allocated = {_device_id(r) for r in ((alloc or {}).get("devices") or {}).get("results") or []}
    devices = status.get("devices") or []
    e, _ = _unique_list(devices, -1, "status.devices", _device_id)
    for i, d in enumerate(devices):
        errs += _device_status(d, f"status.devices[{i}]", allocated)
    errs += e
    if reserved:
        if alloc is None:
            errs.append(forbidden("status.reservedFor", "may not be specified when `allocated` is not set"))
        elif (new.get("metadata") or {}).get("deletionTimestamp"):
            old_uids = {r.get("uid") for r in old_status.get("reservedFor") or []}
            if any(r.get("uid") not in old_uids for r in reserved):
                errs.append(
                    forbidden(
                        "status.reservedFor",
                        "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set",
                    )
                )
    old_alloc = old_status.get("allocation")
    if old_alloc is not None and alloc is not None:
        # A populated allocation is immutable; it may only be removed.
        if alloc != old_alloc:
            errs.append(immutable("status.allocation", alloc))
    elif alloc is not None:
        errs += _allocation(alloc, _request_names(((new.get("spec") or {}).get("devices")) or {}))
    return errs


def drop_deallocated_status_devices(new: JSON, old: JSON) -> None:
    """Status entries of devices whose allocation went away are dropped (dropDeallocatedStatusDevices)."""
    gone = {
        _device_id({**r, "shareID": None})
        for r in (((old.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        or []
    }
    for r in (((new.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
        gone.discard(_device_id({**r, "shareID": None}))
    status = new.get("status")
    if not gone or not isinstance(status, dict) or not status.get("devices"):
        return
    kept = [d for d in status["devices"] if _device_id({**d, "shareID": None}) not in gone]
    if kept:
        status["devices"] = kept
    else:
        status.pop("devices")


# -- core v1 ---------------------------------------------------------------------------------------

_POD_MUTABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def pod(obj: JSON) -> Errs:
    """The pod rules the dev cluster needs: containers present, named, unique, with an image;
    resourceClaims named uniquely and pointing at a claim or a template."""
    spec = obj.get("spec") or {}
    errs: Errs = []
    containers = spec.get("containers") or []
    if not containers:
        errs.append(required("spec.containers"))
    seen: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            p = f"spec.{kind}[{i}]"
            name = c.get("name", "")
            if not name:
                errs.append(required(f"{p}.name"))
            else:
                errs += _msgs(f"{p}.name", name, names.dns1123_label(name))
                if name in seen:
                    errs.append(duplicate(f"{p}.name", name))
                seen.add(name)
            if not c.get("image"):
                errs.append(required(f"{p}.image"))
            for j, claim in enumerate((c.get("resources") or {}).get("claims") or []):
                if claim.get("name") not in {rc.get("name") for rc in spec.get("resourceClaims") or []}:
                    errs.append(
                        not_supported(
                            f"{p}.resources.claims[{j}].name",
                            claim.get("name"),
                            sorted(rc.get("name", "") for rc in spec.get("resourceClaims") or []),
                        )
                    )
    rc_seen: set[str] = set()
    for i, rc in enumerate(spec.get("resourceClaims") or []):
        p = f"spec.resourceClaims[{i}]"
        name = rc.get("name", "")
        errs += _required(name, f"{p}.name", names.dns1123_label)
        if name in rc_seen:
            errs.append(duplicate(f"{p}.name", name))
        rc_seen.add(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if rc.get(k)]
        if len(sources) != 1:
            errs.append(
                invalid(p, rc, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`")
                if not sources
                else invalid(
                    p,
                    rc,
                    "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified",
                )
            )
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        errs.append(not_supported("spec.restartPolicy", policy, ["Always", "Never", "OnFailure"]))
    return errs


def pod_update(new: JSON, old: JSON) -> Errs:
    """Pod specs are immutable apart from images, activeDeadlineSeconds, added tolerations and
    terminationGracePeriodSeconds; spec.nodeName is set only through the binding subresource."""
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    a, b = json.loads(json.dumps(ns)), json.loads(json.dumps(os_))
    for spec in (a, b):
        for kind in ("containers", "initContainers"):
            for c in spec.get(kind) or []:
                c.pop("image", None)
        spec.pop("activeDeadlineSeconds", None)
        spec.pop("terminationGracePeriodSeconds", None)
    old_tols = os_.get("tolerations") or []
    if all(t in (ns.get("tolerations") or []) for t in old_tols):
        a.pop("tolerations", None)
        b.pop("tolerations", None)
    gates_new = ns.get("schedulingGates") or []
    if all(g in (os_.get("schedulingGates") or []) for g in gates_new):
        a.pop("schedulingGates", None)
        b.pop("schedulingGates", None)
    if a != b:
        return [forbidden("spec", _POD_MUTABLE)]
    return []


def namespace_name(name: str) -> list[str]:
    return names.dns1123_label(name)
