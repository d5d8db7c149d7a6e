"""OpenAPI v3 documents (``/openapi/v3`` and one per group version).

kubectl needs them: before ``apply``/``create`` it reads the document of the object's group
version to learn whether PATCH accepts ``fieldValidation`` (then it leaves validation to
the server), and it computes strategic merge patches for built-in kinds from the
``x-kubernetes-patch-*`` extensions of the schemas. The schemas are the real definitions
shipped by kubernetes-validate, rewritten from JSON Schema back into OpenAPI form.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from typing import Any

from .resources import RESOURCES, Resource
from .schema import schema_dir

JSON = dict[str, Any]

_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
_PARAM_DESCRIPTIONS = {
    "dryRun": "When present, indicates that modifications should not be persisted.",
    "fieldManager": "fieldManager is a name associated with the actor or entity that is making these changes.",
    "fieldValidation": "fieldValidation instructs the server on how to handle objects in the request containing "
    "unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
    "force": 'Force is going to "force" Apply requests. It means user will re-acquire conflicting fields owned '
    "by other people.",
    "labelSelector": "A selector to restrict the list of returned objects by their labels.",
    "fieldSelector": "A selector to restrict the list of returned objects by their fields.",
    "resourceVersion": "resourceVersion sets a constraint on what resource versions a request may be served from.",
    "watch": "Watch for changes to the described resources and return them as a stream of add, update, and "
    "remove notifications.",
    "limit": "limit is a maximum number of responses to return for a list call.",
    "continue": "The continue option should be set when retrieving more results from the server.",
    "gracePeriodSeconds": "The duration in seconds before the object should be deleted.",
    "propagationPolicy": "Whether and how garbage collection will be performed.",
}
_INT_PARAMS = {"limit", "gracePeriodSeconds"}
_BOOL_PARAMS = {"force", "watch"}


def _param(name: str, where: str = "query") -> JSON:
    typ = "integer" if name in _INT_PARAMS else "boolean" if name in _BOOL_PARAMS else "string"
    p: JSON = {
        "name": name,
        "in": where,
        "description": _PARAM_DESCRIPTIONS.get(name, name),
        "schema": {"type": typ},
    }
    if where == "path":
        p["required"] = True
    return p


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def _convert(s: Any) -> Any:
    """JSON Schema (as converted by kubernetes-validate) back to OpenAPI v3 schema objects."""
    if isinstance(s, list):
        return [_convert(v) for v in s]
    if not isinstance(s, dict):
        return s
    out: JSON = {}
    for k, v in s.items():
        if k == "$ref" and isinstance(v, str):
            out[k] = "#/components/schemas/" + v.rsplit("/", 1)[-1]
        elif k == "type" and isinstance(v, list):
            non_null = [t for t in v if t != "null"]
            out[k] = non_null[0] if len(non_null) == 1 else non_null
        elif k in ("properties",):
            out[k] = {pk: _convert(pv) for pk, pv in v.items()}
        else:
            out[k] = _convert(v)
    return out


@cache
def _definitions(version: str) -> dict[str, JSON]:
    with open(os.path.join(schema_dir(version, strict=False), "_definitions.json"), encoding="utf-8") as f:
        defs: dict[str, JSON] = json.load(f)["$defs"]
    out = {name: _convert(d) for name, d in defs.items()}
    out["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {
        "description": "Quantity is a fixed-point representation of a number.",
        "type": "string",
    }
    out["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {
        "description": "IntOrString is a type that can hold an int32 or a string.",
        "type": "string",
        "format": "int-or-string",
    }
    return out


def _closure(defs: dict[str, JSON], roots: list[str]) -> dict[str, JSON]:
    seen: dict[str, JSON] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen[name] = defs[name]
        stack: list[Any] = [defs[name]]
        while stack:
            cur = stack.pop()
            if isinstance(cur, dict):
                ref = cur.get("$ref")
                if isinstance(ref, str):
                    todo.append(ref.rsplit("/", 1)[-1])
                stack.extend(cur.values())
            elif isinstance(cur, list):
                stack.extend(cur)
    return dict(sorted(seen.items()))


def _def_name(defs: dict[str, JSON], group: str, version: str, kind: str) -> str:
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", ()):
            if (gvk.get("group"), gvk.get("version"), gvk.get("kind")) == (group, version, kind):
                return name
    raise KeyError(f"no definition for {group}/{version} {kind}")


def _operation(
    res: Resource, action: str, op_id: str, schema: str, params: list[JSON], kind: str = ""
) -> JSON:
    op: JSON = {
        "description": f"{action} {res.kind}",
        "operationId": op_id,
        "parameters": params,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}}
        },
        "tags": [
            res.group.replace(".k8s.io", "").replace(".", "") + "_" + res.version if res.group else "core_v1"
        ],
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {
            "group": res.group,
            "version": res.version,
            "kind": kind or res.kind,
        },
    }
    return op


def _body(schema: str, types: tuple[str, ...] = ("*/*",)) -> JSON:
    return {"content": {t: {"schema": _ref(schema)} for t in types}, "required": True}


_PATCH_TYPES = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)


def _paths(res: Resource, schema: str, list_schema: str) -> JSON:
    base = res.prefix
    coll = f"{base}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{base}/{res.plural}"
    ns_param = [_param("namespace", "path")] if res.namespaced else []
    name_param = [_param("name", "path")]
    list_params = [
        _param(p) for p in ("labelSelector", "fieldSelector", "resourceVersion", "limit", "continue", "watch")
    ]
    write = [_param(p) for p in _WRITE_PARAMS]
    suffix = f"Namespaced{res.kind}" if res.namespaced else res.kind
    verb_prefix = "".join(
        p.capitalize() for p in (res.group.split(".")[0] if res.group else "core", res.version)
    )
    paths: JSON = {}
    coll_ops: JSON = {
        "get": _operation(res, "list", f"list{verb_prefix}{suffix}", list_schema, ns_param + list_params),
        "post": {
            **_operation(res, "post", f"create{verb_prefix}{suffix}", schema, ns_param + write),
            "requestBody": _body(schema),
        },
        "delete": _operation(
            res,
            "deletecollection",
            f"deleteCollection{verb_prefix}{suffix}",
            "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
            ns_param
            + [
                _param(p)
                for p in (
                    "labelSelector",
                    "fieldSelector",
                    "gracePeriodSeconds",
                    "propagationPolicy",
                    "dryRun",
                )
            ],
        ),
    }
    paths[coll] = coll_ops
    item_ops: JSON = {
        "get": _operation(res, "get", f"read{verb_prefix}{suffix}", schema, ns_param + name_param),
        "put": {
            **_operation(res, "put", f"replace{verb_prefix}{suffix}", schema, ns_param + name_param + write),
            "requestBody": _body(schema),
        },
        "patch": {
            **_operation(
                res,
                "patch",
                f"patch{verb_prefix}{suffix}",
                schema,
                ns_param + name_param + write + [_param("force")],
            ),
            "requestBody": _body("io.k8s.apimachinery.pkg.apis.meta.v1.Patch", _PATCH_TYPES),
        },
        "delete": _operation(
            res,
            "delete",
            f"delete{verb_prefix}{suffix}",
            schema,
            ns_param
            + name_param
            + [_param(p) for p in ("gracePeriodSeconds", "propagationPolicy", "dryRun")],
        ),
    }
    paths[f"{coll}/{{name}}"] = item_ops
    if "status" in res.subresources:
        paths[f"{coll}/{{name}}/status"] = {
            "get": _operation(res, "get", f"read{verb_prefix}{suffix}Status", schema, ns_param + name_param),
            "put": {
                **_operation(
                    res, "put", f"replace{verb_prefix}{suffix}Status", schema, ns_param + name_param + write
                ),
                "requestBody": _body(schema),
            },
            "patch": {
                **_operation(
                    res,
                    "patch",
                    f"patch{verb_prefix}{suffix}Status",
                    schema,
                    ns_param + name_param + write + [_param("force")],
                ),
                "requestBody": _body("io.k8s.apimachinery.pkg.apis.meta.v1.Patch", _PATCH_TYPES),
            },
        }
    if res.namespaced:
        paths[f"{base}/{res.plural}"] = {
            "get": _operation(
                res, "list", f"list{verb_prefix}{res.kind}ForAllNamespaces", list_schema, list_params
            )
        }
    return paths


def gv_key(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@cache
def document(group: str, version: str, kube_version: str, schema_version: str) -> bytes:
    """The OpenAPI v3 document of one group version, as bytes (it is served often, built once)."""
    defs = _definitions(schema_version)
    paths: JSON = {}
    roots = [
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
        "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
    ]
    for res in RESOURCES:
        if (res.group, res.version) != (group, version) or "list" not in res.verbs:
            continue
        schema = _def_name(defs, res.group, res.version, res.kind)
        list_schema = _def_name(defs, res.group, res.version, res.kind + "List")
        roots += [schema, list_schema]
        paths.update(_paths(res, schema, list_schema))
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": kube_version},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": _closure(defs, roots)},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def digest(data: bytes) -> str:
    return hashlib.sha512(data).hexdigest().upper()
