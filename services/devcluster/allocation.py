"""Structured-parameters device allocation, as the kube-scheduler's DRA plugin does it, over plain
resource.k8s.io/v1 dicts. Pure: no I/O, no clock; the controller in allocator.py feeds it.

For one pod: the claims still to allocate are solved together on one node, with an exhaustive
search in the real allocator's order (claims, then requests, then devices; the first complete
solution wins): a device must match its DeviceClass selectors and the request selectors, be free
(not allocated to another claim unless it allows multiple allocations), tolerate its taints, and
satisfy the claim's constraints. Only the newest generation of each pool counts, and a pool whose
``resourceSliceCount`` slices are not all present is skipped (and fails an ``All`` request), as
in ``GatherPools``. The result has the shape Kubernetes writes to ``status.allocation``.

What a real scheduler also does and this does not: scoring (the first fitting node in name order
wins), node taints and resource fit, counters of partitionable devices (devices that consume
counters are never picked, as with the feature off), consumed capacity accounting for shared
devices, binding conditions (devices with them are skipped, as with the feature off), and
extended resources backed by DRA.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from shared import cel

FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_RESULTS_PER_CLAIM = 32
_TAINT_EFFECTS = ("NoSchedule", "NoExecute")

Obj = Mapping[str, Any]


class Unsatisfiable(Exception):
    """The claims cannot be allocated (on this node); the pod stays pending and is retried later."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class AllocationAborted(Exception):
    """Allocation must stop: a CEL error, a missing class, an unsupported request.

    Kubernetes returns these as errors from the scheduler's filter, which aborts the scheduling
    attempt for the pod; it is retried when something changes.
    """


@dataclass(frozen=True, order=True)
class DeviceID:
    """A device as allocation results name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


def claim_key(claim: Obj) -> str:
    """namespace/name of an object."""
    meta = claim.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def in_use_devices(claims: Iterable[Obj]) -> frozenset[DeviceID]:
    """Devices allocated to claims, ignoring admin-access results (they do not take a device)."""
    used = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue
            used.add(DeviceID(result["driver"], result["pool"], result["device"]))
    return frozenset(used)


# ------------------------------------------------------------------------------------------
# Node selection.


def _requirement_matches(requirement: Obj, values_of: Callable[[str], str | None]) -> bool:
    value = values_of(requirement.get("key", ""))
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def node_selector_matches(selector: Obj | None, node: Obj) -> bool:
    """core/v1 NodeSelector semantics: terms are ORed; an empty term or selector matches nothing."""
    if selector is None:
        return True
    meta = node.get("metadata", {})
    labels = meta.get("labels") or {}
    fields = {"metadata.name": meta.get("name")}
    for term in selector.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        field_reqs = term.get("matchFields") or []
        if not expressions and not field_reqs:
            continue
        if all(_requirement_matches(r, labels.get) for r in expressions) and all(
            _requirement_matches(r, fields.get) for r in field_reqs
        ):
            return True
    return False


def _placement_matches(spec: Obj, node: Obj) -> bool | None:
    """nodeName / allNodes / nodeSelector of a slice or device; None when none is set."""
    node_name = spec.get("nodeName")
    if node_name:
        return bool(node_name == node.get("metadata", {}).get("name"))
    if spec.get("allNodes"):
        return True
    if spec.get("nodeSelector") is not None:
        return node_selector_matches(spec["nodeSelector"], node)
    return None


# ------------------------------------------------------------------------------------------
# Pools.


@dataclass
class Pool:
    """One driver's pool as seen from a node: its newest generation's slices that target the node."""

    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[Obj] = field(default_factory=list)
    incomplete: bool = False
    invalid: str | None = None

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.name}"


def _pool_id(slice_: Obj) -> tuple[str, str]:
    spec = slice_["spec"]
    return spec["driver"], spec["pool"]["name"]


def gather_pools(slices: Sequence[Obj], node: Obj) -> list[Pool]:
    """The pools with devices reachable from ``node``, newest generation only, completeness marked."""
    pools: dict[tuple[str, str], Pool] = {}
    for slice_ in slices:
        spec = slice_["spec"]
        if spec.get("sharedCounters"):
            # Counter sets belong to partitionable devices, which this allocator does not pick.
            continue
        placement = _placement_matches(spec, node)
        if placement is None and spec.get("perDeviceNodeSelection"):
            placement = any(_placement_matches(d, node) for d in spec.get("devices") or [])
        if not placement:
            continue
        pool_spec = spec["pool"]
        key = _pool_id(slice_)
        generation = int(pool_spec.get("generation", 0))
        current = pools.get(key)
        if current is None or generation > current.generation:
            pools[key] = Pool(
                key[0], key[1], generation, int(pool_spec.get("resourceSliceCount", 1)), [slice_]
            )
        elif generation == current.generation:
            current.slices.append(slice_)
    result = []
    for key in sorted(pools):
        pool = pools[key]
        if len(pool.slices) != pool.slice_count:
            # Slices of this generation that do not target the node still count toward completeness;
            # a newer generation anywhere means this one is being replaced.
            same = [
                s
                for s in slices
                if _pool_id(s) == key and s["spec"]["pool"].get("generation", 0) == pool.generation
            ]
            if any(
                _pool_id(s) == key and s["spec"]["pool"].get("generation", 0) > pool.generation
                for s in slices
            ):
                continue
            if len(same) != pool.slice_count:
                pool.incomplete = True
        pool.slices.sort(key=lambda s: s.get("metadata", {}).get("name", ""))
        if not pool.incomplete:
            seen: set[str] = set()
            for s in pool.slices:
                for device in s["spec"].get("devices") or []:
                    if device["name"] in seen:
                        pool.invalid = f"duplicate device name {device['name']}"
                    seen.add(device["name"])
        result.append(pool)
    return result


# ------------------------------------------------------------------------------------------
# Requests.


@dataclass(frozen=True, eq=False)
class _Request:
    """An ``exactly`` request or one ``firstAvailable`` subrequest; compared by identity."""

    claim_index: int
    name: str
    parent: str | None
    class_name: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    admin_access: bool | None
    tolerations: tuple[Obj, ...]

    @property
    def full_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name


def _request(claim_index: int, body: Obj, name: str, parent: str | None) -> _Request:
    selectors = []
    for i, selector in enumerate(body.get("selectors") or []):
        expression = (selector.get("cel") or {}).get("expression")
        if expression is None:
            raise AllocationAborted(
                f"request {name}, selector #{i}: CEL expression empty (unsupported selector type?)"
            )
        selectors.append(expression)
    return _Request(
        claim_index=claim_index,
        name=name,
        parent=parent,
        class_name=body.get("deviceClassName", ""),
        selectors=tuple(selectors),
        mode=body.get("allocationMode") or "ExactCount",
        count=int(body.get("count", 1)),
        admin_access=body.get("adminAccess"),
        tolerations=tuple(body.get("tolerations") or []),
    )


def _alternatives(claim_index: int, request: Obj) -> list[_Request]:
    """What may satisfy one request: itself, or its subrequests in order."""
    name = request["name"]
    if request.get("firstAvailable"):
        return [_request(claim_index, sub, sub["name"], name) for sub in request["firstAvailable"]]
    if "exactly" in request:
        return [_request(claim_index, request["exactly"], name, None)]
    raise AllocationAborted(
        f"request {name}: neither exactly nor firstAvailable is set (unsupported request type?)"
    )


def _tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("key") and toleration["key"] != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and toleration.get("value", "") == taint.get("value", "")
        ):
            return True
    return False


def _lookup_attribute(device: Obj, driver: str, qualified: str) -> Obj | None:
    attributes = device.get("attributes") or {}
    if qualified in attributes:
        return attributes[qualified]
    domain, _, ident = qualified.partition("/")
    if domain == driver and ident in attributes:
        return attributes[ident]
    return None


def _attribute_value(attribute: Obj) -> tuple[str, Any] | None:
    for kind in ("string", "int", "bool", "version"):
        if kind in attribute:
            return kind, attribute[kind]
    return None


class _Constraint:
    """matchAttribute (all devices share the value) or distinctAttribute (no two share it)."""

    def __init__(self, requests: Sequence[str], attribute: str, distinct: bool):
        self.requests = frozenset(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.values: list[tuple[str, Any]] = []

    def applies(self, request: _Request) -> bool:
        if not self.requests:
            return True
        return bool({request.full_name, request.parent or request.name} & self.requests)

    def add(self, request: _Request, candidate: _Candidate) -> bool:
        if not self.applies(request):
            return True
        attribute = _lookup_attribute(candidate.device, candidate.id.driver, self.attribute)
        value = _attribute_value(attribute) if attribute is not None else None
        if value is None:
            return False
        if self.distinct and value in self.values:
            return False
        if not self.distinct and self.values and value != self.values[0]:
            return False
        self.values.append(value)
        return True

    def remove(self, request: _Request) -> None:
        if self.applies(request):
            self.values.pop()


@dataclass(frozen=True)
class _Candidate:
    id: DeviceID
    device: Obj
    slice: Obj
    pool: Pool


@dataclass
class _Chosen:
    request: _Request
    candidate: _Candidate


# ------------------------------------------------------------------------------------------
# The allocator.


class Allocator:
    """Allocates claims against one snapshot of slices, classes and in-use devices.

    Reusable across nodes and pods of the same snapshot; CEL variables of devices are built once.
    """

    def __init__(
        self,
        slices: Sequence[Obj],
        classes: Mapping[str, Obj],
        in_use: Set[DeviceID],
        *,
        new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ):
        self.slices = list(slices)
        self.classes = classes
        self.in_use = in_use
        self._new_share_id = new_share_id
        self._variables: dict[tuple[DeviceID, int], dict[str, Any]] = {}

    # -- device matching ------------------------------------------------------------------

    def _device_variables(self, candidate: _Candidate) -> dict[str, Any]:
        key = (candidate.id, id(candidate.device))
        variables = self._variables.get(key)
        if variables is None:
            variables = cel.dra_device_variables(candidate.device, candidate.id.driver)
            self._variables[key] = variables
        return variables

    def _selectors_match(self, candidate: _Candidate, selectors: Sequence[str], owner: str) -> bool:
        for i, expression in enumerate(selectors):
            try:
                program = cel.cached_expression(expression)
            except cel.CelCompileError as ex:
                raise AllocationAborted(f"{owner}: selector #{i}: CEL compile error: {ex}") from None
            try:
                if not program.matches(self._device_variables(candidate)):
                    return False
            except cel.CelEvalError as ex:
                raise AllocationAborted(
                    f"{owner}: selector #{i} on device {candidate.id}: CEL runtime error: {ex}"
                ) from None
        return True

    def _class(self, claim: Obj, request: _Request) -> Obj:
        if not request.class_name:
            raise AllocationAborted(
                f"claim {claim_key(claim)}, request {request.full_name}: missing device class name"
            )
        device_class = self.classes.get(request.class_name)
        if device_class is None:
            raise Unsatisfiable(
                f"claim {claim_key(claim)}, request {request.full_name}: device class {request.class_name} does not exist"
            )
        return device_class

    def _selectable(
        self, claim: Obj, request: _Request, candidate: _Candidate, cache: dict[Any, bool]
    ) -> bool:
        key = (request, candidate.id)
        hit = cache.get(key)
        if hit is not None:
            return hit
        device = candidate.device
        # Binding conditions and counters belong to features this allocator leaves off.
        ok = not device.get("bindingConditions") and not device.get("consumesCounters")
        if ok:
            device_class = self._class(claim, request)
            ok = self._selectors_match(
                candidate, _class_selectors(device_class), f"class {request.class_name}"
            ) and self._selectors_match(candidate, request.selectors, f"claim {claim_key(claim)}")
        cache[key] = ok
        return ok

    def _free(self, request: _Request, candidate: _Candidate, taking: dict[DeviceID, set[int]]) -> bool:
        holders = taking.get(candidate.id, set())
        if request.admin_access or candidate.device.get("allowMultipleAllocations"):
            # Admin access may look at a device in use, and a shareable device may be shared,
            # but neither twice within the same claim.
            if request.claim_index in holders:
                return False
        elif candidate.id in self.in_use or holders:
            return False
        for taint in candidate.device.get("taints") or []:
            if taint.get("effect") in _TAINT_EFFECTS and not _tolerates(request.tolerations, taint):
                return False
        return True

    # -- one node ---------------------------------------------------------------------------

    def allocate(self, node: Obj, claims: Sequence[Obj]) -> list[dict[str, Any]]:
        """Allocate all ``claims`` on ``node``; one ``status.allocation`` per claim, in order.

        Raises Unsatisfiable with a reason naming the claim and request, or AllocationAborted.
        """
        node_name = node.get("metadata", {}).get("name", "")
        pools = gather_pools(self.slices, node)
        candidates = [
            _Candidate(DeviceID(p.driver, p.name, d["name"]), d, s, p)
            for p in pools
            if not p.incomplete and p.invalid is None
            for s in p.slices
            for d in s["spec"].get("devices") or []
            if not s["spec"].get("perDeviceNodeSelection") or _placement_matches(d, node)
        ]
        cache: dict[Any, bool] = {}
        plan: list[list[list[_Request]]] = []
        constraints: list[list[_Constraint]] = []
        all_devices: dict[_Request, list[_Candidate]] = {}
        for ci, claim in enumerate(claims):
            requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
            try:
                alternatives = [_alternatives(ci, r) for r in requests]
            except AllocationAborted as ex:
                raise AllocationAborted(f"claim {claim_key(claim)}, {ex}") from None
            plan.append(alternatives)
            for alts in alternatives:
                for request in alts:
                    self._class(claim, request)
                    if request.mode == "All":
                        blocked = [p for p in pools if p.incomplete or p.invalid is not None]
                        if blocked:
                            state = (
                                "currently being updated" if blocked[0].incomplete else "currently invalid"
                            )
                            raise Unsatisfiable(
                                f"claim {claim_key(claim)}, request {request.full_name}: asks for all devices, "
                                f"but resource pool {blocked[0].label} is {state}"
                            )
                        all_devices[request] = [
                            c for c in candidates if self._selectable(claim, request, c, cache)
                        ]
                    elif request.mode != "ExactCount":
                        raise AllocationAborted(
                            f"claim {claim_key(claim)}, request {request.full_name}: "
                            f"unsupported allocation mode {request.mode}"
                        )
            minimum = sum(
                min(len(all_devices[r]) if r.mode == "All" else r.count for r in alts)
                for alts in alternatives
            )
            if minimum > MAX_RESULTS_PER_CLAIM:
                raise Unsatisfiable(
                    f"claim {claim_key(claim)}: number of requested devices {minimum} exceeds "
                    f"the claim limit of {MAX_RESULTS_PER_CLAIM}"
                )
            constraints.append(_constraints(claim))

        chosen: list[list[_Chosen]] = [[] for _ in claims]
        taking: dict[DeviceID, set[int]] = {}
        selected: dict[tuple[int, int], _Request] = {}

        def needed(request: _Request) -> int:
            return len(all_devices[request]) if request.mode == "All" else request.count

        def take(request: _Request, candidate: _Candidate) -> bool:
            ci = request.claim_index
            if not self._free(request, candidate, taking):
                return False
            added: list[_Constraint] = []
            for constraint in constraints[ci]:
                if not constraint.add(request, candidate):
                    for c in added:
                        c.remove(request)
                    return False
                added.append(constraint)
            taking.setdefault(candidate.id, set()).add(ci)
            chosen[ci].append(_Chosen(request, candidate))
            return True

        def release(request: _Request, candidate: _Candidate) -> None:
            ci = request.claim_index
            for constraint in constraints[ci]:
                constraint.remove(request)
            taking[candidate.id].discard(ci)
            chosen[ci].pop()

        def solve(ci: int, ri: int) -> bool:
            if ci == len(claims):
                return True
            if ri == len(plan[ci]):
                return solve(ci + 1, 0)
            for request in plan[ci][ri]:
                if request.mode == "All" and not all_devices[request]:
                    continue
                if len(chosen[ci]) + needed(request) > MAX_RESULTS_PER_CLAIM:
                    continue
                if fill(request, ri, 0):
                    selected[(ci, ri)] = request
                    return True
            return False

        def fill(request: _Request, ri: int, k: int) -> bool:
            if k == needed(request):
                return solve(request.claim_index, ri + 1)
            claim = claims[request.claim_index]
            if request.mode == "All":
                candidate = all_devices[request][k]
                if not take(request, candidate):
                    return False
                if fill(request, ri, k + 1):
                    return True
                release(request, candidate)
                return False
            for candidate in candidates:
                if not self._selectable(claim, request, candidate, cache):
                    continue
                if not take(request, candidate):
                    continue
                if fill(request, ri, k + 1):
                    return True
                release(request, candidate)
            return False

        if not solve(0, 0):
            raise Unsatisfiable(self._explain(node_name, claims, plan, candidates, pools, cache, all_devices))
        return [
            self._result(claim, plan[ci], [selected[(ci, ri)] for ri in range(len(plan[ci]))], chosen[ci])
            for ci, claim in enumerate(claims)
        ]

    # -- results ------------------------------------------------------------------------------

    def _result(
        self, claim: Obj, plan: list[list[_Request]], selected: list[_Request], chosen: list[_Chosen]
    ) -> dict[str, Any]:
        results = []
        for item in chosen:
            result: dict[str, Any] = {
                "request": item.request.full_name,
                "driver": item.candidate.id.driver,
                "pool": item.candidate.id.pool,
                "device": item.candidate.id.device,
            }
            if item.request.admin_access:
                result["adminAccess"] = True
            if item.request.tolerations:
                result["tolerations"] = [dict(t) for t in item.request.tolerations]
            if item.candidate.device.get("allowMultipleAllocations") and not item.request.admin_access:
                result["shareID"] = self._new_share_id()
            results.append(result)

        configs: list[dict[str, Any]] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for request in selected:
            if request.class_name in class_ranges:
                start, end = class_ranges[request.class_name]
                for entry in configs[start:end]:
                    entry["requests"].append(request.full_name)
                continue
            start = len(configs)
            for entry in (self.classes[request.class_name].get("spec") or {}).get("config") or []:
                configs.append(
                    {"source": "FromClass", "requests": [request.full_name], **_device_configuration(entry)}
                )
            class_ranges[request.class_name] = (start, len(configs))
        names = [r.parent or r.name for r in selected]
        full_names = [r.full_name for r in selected]
        for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            wanted = entry.get("requests") or []
            if not wanted or any(n in wanted or f in wanted for n, f in zip(names, full_names, strict=True)):
                configs.append(
                    {"source": "FromClaim", "requests": list(wanted), **_device_configuration(entry)}
                )
        for entry in configs:
            # A config that names every request applies to all: Kubernetes drops the list then.
            if entry["requests"] and all(
                n in entry["requests"] or f in entry["requests"]
                for n, f in zip(names, full_names, strict=True)
            ):
                entry["requests"] = []
            if not entry["requests"]:
                del entry["requests"]

        devices: dict[str, Any] = {}
        if results:
            devices["results"] = results
        if configs:
            devices["config"] = configs
        allocation: dict[str, Any] = {"devices": devices}
        node_selector = _node_selector(chosen)
        if node_selector is not None:
            allocation["nodeSelector"] = node_selector
        return allocation

    # -- diagnostics ----------------------------------------------------------------------------

    def _explain(
        self,
        node_name: str,
        claims: Sequence[Obj],
        plan: list[list[list[_Request]]],
        candidates: list[_Candidate],
        pools: list[Pool],
        cache: dict[Any, bool],
        all_devices: Mapping[_Request, list[_Candidate]],
    ) -> str:
        notes = []
        for pool in pools:
            if pool.incomplete:
                notes.append(
                    f"resource pool {pool.label} is incomplete (slices of generation {pool.generation} missing)"
                )
            elif pool.invalid:
                notes.append(f"resource pool {pool.label} is invalid: {pool.invalid}")
        suffix = f" ({'; '.join(notes)})" if notes else ""
        for ci, claim in enumerate(claims):
            for alts in plan[ci]:
                problems = []
                for request in alts:
                    matching = [c for c in candidates if self._selectable(claim, request, c, cache)]
                    free = [c for c in matching if self._free(request, c, {})]
                    want = len(all_devices[request]) if request.mode == "All" else request.count
                    if request.mode == "All" and not matching:
                        problems.append(
                            f"request {request.full_name}: asks for all devices of class {request.class_name} "
                            f"and its selectors, and node {node_name} has none"
                        )
                    elif len(free) < want:
                        problems.append(
                            f"request {request.full_name}: needs {want} device(s) of class {request.class_name}; "
                            f"{len(matching)} of {len(candidates)} device(s) on node {node_name} match the class "
                            f"and request selectors, {len(matching) - len(free)} of them already allocated or tainted"
                        )
                if len(problems) == len(alts):
                    return f"claim {claim_key(claim)}, {'; '.join(problems)}{suffix}"
        names = ", ".join(claim_key(c) for c in claims)
        return (
            f"claims {names} cannot be satisfied together on node {node_name}: the matching devices are too "
            f"few for all requests at once, or a constraint rules out every combination{suffix}"
        )


def _class_selectors(device_class: Obj) -> list[str]:
    out = []
    for i, selector in enumerate((device_class.get("spec") or {}).get("selectors") or []):
        expression = (selector.get("cel") or {}).get("expression")
        if expression is None:
            name = device_class.get("metadata", {}).get("name")
            raise AllocationAborted(
                f"class {name}, selector #{i}: CEL expression empty (unsupported selector type?)"
            )
        out.append(expression)
    return out


def _device_configuration(entry: Obj) -> dict[str, Any]:
    """The DeviceConfiguration members of a class or claim config entry (``opaque`` today)."""
    return {k: v for k, v in entry.items() if k != "requests"}


def _constraints(claim: Obj) -> list[_Constraint]:
    out = []
    for i, constraint in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []):
        requests = constraint.get("requests") or []
        if constraint.get("matchAttribute"):
            out.append(_Constraint(requests, constraint["matchAttribute"], distinct=False))
        elif constraint.get("distinctAttribute"):
            out.append(_Constraint(requests, constraint["distinctAttribute"], distinct=True))
        else:
            raise AllocationAborted(
                f"claim {claim_key(claim)}, constraint #{i}: empty constraint (unsupported constraint type?)"
            )
    return out


def _node_selector(chosen: Sequence[_Chosen]) -> dict[str, Any] | None:
    """The allocation's node selector, built like the real allocator's createNodeSelector."""
    fields: list[Obj] = []
    expressions: list[Obj] = []
    for item in chosen:
        spec = item.candidate.slice["spec"]
        source = item.candidate.device if spec.get("perDeviceNodeSelection") else spec
        if source.get("nodeName"):
            return {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [source["nodeName"]]}
                        ]
                    }
                ]
            }
        selector = source.get("nodeSelector")
        if selector is not None:
            terms = selector.get("nodeSelectorTerms") or []
            if len(terms) > 1:
                raise AllocationAborted(f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
            if terms:
                for requirement in terms[0].get("matchFields") or []:
                    if not any(_same_requirement(requirement, r) for r in fields):
                        fields.append(requirement)
                for requirement in terms[0].get("matchExpressions") or []:
                    if not any(_same_requirement(requirement, r) for r in expressions):
                        expressions.append(requirement)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = [dict(r) for r in expressions]
    if fields:
        term["matchFields"] = [dict(r) for r in fields]
    return {"nodeSelectorTerms": [term]}


def _same_requirement(a: Obj, b: Obj) -> bool:
    return (
        a.get("key") == b.get("key")
        and a.get("operator") == b.get("operator")
        and set(a.get("values") or []) == set(b.get("values") or [])
    )


# ------------------------------------------------------------------------------------------
# Choosing a node for a pod.


@dataclass(frozen=True)
class Placement:
    """Where a pod goes and what its unallocated claims get there."""

    node: str
    allocations: tuple[dict[str, Any], ...]


def pod_fits_node(pod: Obj, node: Obj) -> str | None:
    """Why the pod's own placement rules exclude ``node``, or None when they allow it."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata", {})
    name = meta.get("name")
    if spec.get("nodeName") and spec["nodeName"] != name:
        return f"pod is bound to node {spec['nodeName']}"
    if (node.get("spec") or {}).get("unschedulable") and not spec.get("nodeName"):
        return "node is unschedulable"
    labels = meta.get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node does not match the pod's nodeSelector {key}={value}"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not node_selector_matches(required, node):
        return "node does not match the pod's node affinity"
    return None


def place_pod(
    pod: Obj,
    nodes: Sequence[Obj],
    to_allocate: Sequence[Obj],
    allocated: Sequence[Obj],
    allocator: Allocator,
) -> Placement:
    """Pick the first node (by name) where the pod fits and all ``to_allocate`` claims can be
    allocated; claims already ``allocated`` pin the pod to their node selectors.

    Raises Unsatisfiable with a reason per node, or AllocationAborted.
    """
    reasons: list[str] = []
    ordered = sorted(nodes, key=lambda n: n.get("metadata", {}).get("name", ""))
    for node in ordered:
        name = node.get("metadata", {}).get("name", "")
        why = pod_fits_node(pod, node)
        if why is None:
            for claim in allocated:
                selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
                if not node_selector_matches(selector, node):
                    why = f"claim {claim_key(claim)} is allocated on another node"
                    break
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        try:
            allocations = allocator.allocate(node, to_allocate) if to_allocate else []
        except Unsatisfiable as ex:
            reasons.append(f"{name}: {ex.reason}")
            continue
        return Placement(name, tuple(allocations))
    if not ordered:
        raise Unsatisfiable("0/0 nodes are available: no nodes")
    raise Unsatisfiable(f"0/{len(ordered)} nodes are available: " + "; ".join(reasons))
