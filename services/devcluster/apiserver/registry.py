"""The generic registry: what the apiserver does between decoding a request and storage.

Create, update, patch (merge, strategic, JSON, apply), delete (preconditions, graceful pod
deletion, finalizers, propagation policy), deletecollection, list (selectors, limit and
continue on a consistent snapshot) -- plus the two controllers whose absence a client would
notice at once: the garbage collector (owner references) and the namespace lifecycle
(deleting a namespace deletes its content, then the namespace).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

from . import errors, validation
from .errors import ApiError, FieldError, bad_request
from .fieldmanager import FieldManager
from .names import generate_name
from .patch import StrategicMerge, json_patch, merge_patch
from .resources import BY_PLURAL, Resource, now_rfc3339, selectable_fields
from .schema import Schemas
from .selectors import FieldSelector, LabelSelector, check_supported
from .store import Key, Storage

JSON = dict[str, Any]
log = logging.getLogger(__name__)

PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
UNDELETABLE_NAMESPACES = ("default", "kube-system", "kube-public")
GC_FINALIZERS = ("orphan", "foregroundDeletion")
TOO_LARGE_WAIT = 3.0


@dataclass
class WriteContext:
    """Per-request knobs: field manager, dry run, field validation, and warnings to return."""

    manager: str
    dry_run: bool = False
    field_validation: str = "Strict"
    warnings: list[str] = field(default_factory=list)


def _uid() -> str:
    return str(uuid.uuid4())


def _key(res: Resource, namespace: str, name: str) -> Key:
    return (namespace if res.namespaced else "", name)


def _ns_of(res: Resource, namespace: str) -> str:
    return namespace if res.namespaced else ""


class Registry:
    def __init__(self, storage: Storage, schemas: Schemas) -> None:
        self.storage = storage
        self.schemas = schemas
        self.smp = StrategicMerge(schemas)
        self.fields = FieldManager(schemas)
        self._reconcile_scheduled = False
        storage.listeners.append(self._on_event)

    # -- helpers ----------------------------------------------------------------------------

    def root(self, res: Resource) -> Any:
        return self.schemas.root(res.group, res.version, res.kind)

    def _get_or_404(self, res: Resource, namespace: str, name: str) -> JSON:
        obj = self.storage.get(res.plural, _key(res, namespace, name))
        if obj is None:
            raise errors.not_found(res.plural, res.group, name)
        return obj

    def _decode_check(
        self, res: Resource, obj: JSON, ctx: WriteContext, apply: bool = False
    ) -> list[FieldError]:
        """Schema walk: unknown fields per fieldValidation, decode errors as 400; returns the
        422-type schema errors (missing required fields) for the caller to merge with validation."""
        result = self.schemas.check(obj, self.root(res))
        if result.decode:
            raise bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: '
                + "; ".join(result.decode)
            )
        if result.unknown:
            if apply:
                raise bad_request(
                    f"failed to create typed patch object ({res.api_version}, Kind={res.kind}): "
                    + "; ".join(f".{p}: field not declared in schema" for p, _, _ in result.unknown)
                )
            if ctx.field_validation == "Strict":
                raise bad_request(
                    f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: strict decoding error: '
                    + ", ".join(f'unknown field "{p}"' for p, _, _ in result.unknown)
                )
            for p, parent, key in result.unknown:
                parent.pop(key, None)
                if ctx.field_validation == "Warn":
                    ctx.warnings.append(f'unknown field "{p}"')
        return result.invalid

    def _decode_body(self, res: Resource, namespace: str, body: Any) -> JSON:
        """A create or update body as a checked copy (see ``_check_target``)."""
        if not isinstance(body, dict):
            raise bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: not an object'
            )
        obj = copy.deepcopy(body)
        self._check_target(res, obj, namespace)
        return obj

    def _check_target(self, res: Resource, obj: JSON, namespace: str) -> None:
        """The object is of ``res`` and in the request's namespace (filled in where unset)."""
        self._check_type(res, obj)
        self._check_namespace(res, obj, namespace)

    def _check_type(self, res: Resource, obj: JSON) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != res.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({res.api_version})"
            )
        if kind and kind != res.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({res.kind})")
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind

    def _check_namespace(self, res: Resource, obj: JSON, namespace: str) -> None:
        """EnsureObjectNamespaceMatchesRequestNamespace."""
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: metadata'
            )
        have = meta.get("namespace", "")
        want = _ns_of(res, namespace)
        if have == want:
            return
        if not have:
            if want:
                meta["namespace"] = want
            return
        if not want:
            meta.pop("namespace", None)
            return
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )

    def _admit_namespace(self, res: Resource, namespace: str, name: str) -> None:
        """NamespaceLifecycle admission: the namespace exists and is not terminating."""
        if not res.namespaced:
            return
        ns = self.storage.get("namespaces", ("", namespace))
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        # Events may still be written while a namespace terminates (they explain why).
        if (ns.get("metadata") or {}).get("deletionTimestamp") and res.plural != "events":
            raise errors.forbidden_error(
                res.plural,
                res.group,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )

    def _invalid(self, res: Resource, obj: JSON, errs: list[FieldError]) -> None:
        if errs:
            raise errors.invalid_object(
                res.kind, res.group, (obj.get("metadata") or {}).get("name", ""), errs
            )

    # -- read ---------------------------------------------------------------------------------

    def get(self, res: Resource, namespace: str, name: str) -> JSON:
        return self._get_or_404(res, namespace, name)

    async def list_collection(
        self,
        res: Resource,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        limit: int = 0,
        continue_token: str = "",
        resource_version: str = "",
        rv_match: str = "",
    ) -> JSON:
        check_supported(fields, res.strategy.field_labels, res.strategy.field_error)
        _check_rv_match(resource_version, rv_match)
        ns = namespace if res.namespaced and namespace else None
        start = ""
        if continue_token:
            if resource_version not in ("", "0") and rv_match:
                raise bad_request("specifying resource version is not allowed when using continue")
            snap_rv, start = _decode_continue(continue_token)
            try:
                snapshot = self.storage.snapshot(res.plural, snap_rv)
            except ApiError:
                raise errors.expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start "
                    "a new list without the continue parameter, or use the continue token in this response to "
                    "retrieve the remainder of the results. Continuing with the provided token results in an "
                    "inconsistent list - objects that were created, modified, or deleted between the time the first "
                    "chunk was returned and now may show up in the list."
                ) from None
            list_rv = snap_rv
            items = sorted(snapshot.items())
        elif rv_match == "Exact":
            rv = _parse_rv(resource_version)
            snapshot = self.storage.snapshot(res.plural, rv)
            list_rv = rv
            items = sorted(snapshot.items())
        else:
            if resource_version not in ("", "0"):
                await self.wait_for_rv(_parse_rv(resource_version))
            list_rv = self.storage.rv
            items = self.storage.items(res.plural)
        out: list[JSON] = []
        remaining = 0
        last_key = ""
        filtered = not labels.empty or not fields.empty
        for key, obj in items:
            if ns is not None and key[0] != ns:
                continue
            token = _key_token(key)
            if start and token <= start:
                continue
            meta = obj.get("metadata") or {}
            if not labels.empty and not labels.matches(meta.get("labels")):
                continue
            if not fields.empty and not fields.matches(selectable_fields(res, obj)):
                continue
            if limit and len(out) >= limit:
                remaining += 1
                continue
            out.append({k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
            last_key = token
        list_meta: JSON = {"resourceVersion": str(list_rv)}
        if limit and remaining:
            list_meta["continue"] = _encode_continue(list_rv, last_key)
            if not filtered:
                list_meta["remainingItemCount"] = remaining
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": list_meta, "items": out}

    async def wait_for_rv(self, rv: int) -> None:
        """A read at a version from the future waits up to 3 s, then 504 as the watch cache does."""
        deadline = time.monotonic() + TOO_LARGE_WAIT
        while self.storage.rv < rv:
            if time.monotonic() >= deadline:
                raise errors.timeout(
                    f"Too large resource version: {rv}, current: {self.storage.rv}",
                    [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                )
            await asyncio.sleep(0.05)

    # -- create -------------------------------------------------------------------------------

    def create(self, res: Resource, namespace: str, body: Any, ctx: WriteContext) -> JSON:
        obj = self._decode_body(res, namespace, body)
        schema_errs = self._decode_check(res, obj, ctx)
        res.strategy.default(obj)
        return self._create(res, obj, ctx, schema_errs, None)

    def _create(
        self, res: Resource, obj: JSON, ctx: WriteContext, schema_errs: list[FieldError], applied: JSON | None
    ) -> JSON:
        meta = obj.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(meta["generateName"])
        name = meta.get("name", "")
        namespace = meta.get("namespace", "")
        self._admit_namespace(res, namespace, name)
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = _uid()
        meta["creationTimestamp"] = now_rfc3339()
        if res.strategy.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        res.strategy.prepare_create(obj)
        errs = schema_errs + validation.object_meta(obj, res.namespaced, res.strategy.name_check)
        errs += res.strategy.validate(obj)
        self._invalid(res, obj, errs)
        if self.storage.get(res.plural, _key(res, namespace, name)) is not None:
            raise errors.already_exists(res.plural, res.group, name)
        if applied is None:
            meta.pop("managedFields", None)
            self.fields.record_update(
                None, obj, self.root(res), ctx.manager, "", res.api_version, now_rfc3339()
            )
        meta["resourceVersion"] = ""  # keeps its place in the field order; storage fills it in
        obj = _ordered(obj)
        if ctx.dry_run:
            obj["metadata"].pop("resourceVersion")
            return obj
        return self.storage.create(res.plural, _key(res, namespace, name), obj)

    # -- update -------------------------------------------------------------------------------

    def update(
        self, res: Resource, namespace: str, name: str, body: Any, ctx: WriteContext, subresource: str = ""
    ) -> tuple[JSON, bool]:
        obj = self._decode_body(res, namespace, body)
        meta = obj["metadata"]
        if meta.get("name", "") != name:
            raise _name_mismatch(meta.get("name", ""), name)
        schema_errs = self._decode_check(res, obj, ctx)
        res.strategy.default(obj)
        old = self.storage.get(res.plural, _key(res, namespace, name))
        if old is None:
            if res.strategy.allow_create_on_update and not subresource:
                meta.pop("resourceVersion", None)
                return self._create(res, obj, ctx, schema_errs, None), True
            raise errors.not_found(res.plural, res.group, name)
        return self._update(res, obj, old, ctx, subresource, schema_errs, applied=False), False

    def _update(
        self,
        res: Resource,
        obj: JSON,
        old: JSON,
        ctx: WriteContext,
        subresource: str,
        schema_errs: list[FieldError],
        applied: bool,
    ) -> JSON:
        meta, old_meta = obj["metadata"], old["metadata"]
        name = old_meta["name"]
        rv = meta.get("resourceVersion", "")
        if rv and rv != old_meta.get("resourceVersion"):
            raise errors.conflict(res.plural, res.group, name, errors.STALE)
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            raise errors.conflict(
                res.plural,
                res.group,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old_meta.get('uid')}",
            )
        meta["uid"] = old_meta.get("uid")
        meta["creationTimestamp"] = old_meta.get("creationTimestamp")
        meta.pop("selfLink", None)
        for k in ("generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)
        if subresource == "status":
            res.strategy.prepare_status_update(obj, old)
            errs = schema_errs + validation.object_meta_update(obj, old)
            errs += res.strategy.validate_status_update(obj, old)
        else:
            res.strategy.prepare_update(obj, old)
            if res.strategy.has_generation and res.strategy.spec_changed(obj, old):
                meta["generation"] = int(old_meta.get("generation", 0)) + 1
            errs = schema_errs + validation.object_meta(obj, res.namespaced, res.strategy.name_check)
            errs += validation.object_meta_update(obj, old)
            errs += res.strategy.validate_update(obj, old)
        self._invalid(res, obj, errs)
        if not applied:
            self.fields.record_update(
                old, obj, self.root(res), ctx.manager, subresource, res.api_version, now_rfc3339()
            )
        obj = _ordered(obj)
        meta = obj["metadata"]
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if obj == old:
            return old  # a no-op write keeps the resourceVersion and sends no event
        if ctx.dry_run:
            return obj
        key = _key(res, old_meta.get("namespace", ""), name)
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            # The last finalizer went away on an object being deleted: it is deleted now.
            return self.storage.delete(res.plural, key, old)
        return self.storage.update(res.plural, key, obj, old)

    # -- patch --------------------------------------------------------------------------------

    def patch(
        self,
        res: Resource,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        ctx: WriteContext,
        subresource: str = "",
        force: bool = False,
    ) -> tuple[JSON, bool]:
        if content_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(content_type, list(PATCH_TYPES))
        try:
            if content_type == "application/apply-patch+yaml":
                patch = yaml.safe_load(raw.decode() or "{}")
            else:
                patch = json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"error decoding patch: {e}") from None
        if content_type == "application/apply-patch+yaml":
            return self._apply(res, namespace, name, patch, ctx, subresource, force)
        old = self._get_or_404(res, namespace, name)
        if content_type == "application/json-patch+json":
            patched = json_patch(old, patch)
        elif content_type == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise bad_request("merge patch must be a JSON object")
            # merge_patch shares untouched subtrees with its input; the stored object must stay intact.
            patched = merge_patch(copy.deepcopy(old), patch)
        else:
            patched = self.smp.apply(old, patch, self.root(res))
        if not isinstance(patched, dict):
            raise bad_request("the patched object is not a JSON object")
        meta = patched.setdefault("metadata", {})
        if meta.get("name") != name:
            raise _name_mismatch(meta.get("name"), name)
        self._check_target(res, patched, namespace)
        schema_errs = self._decode_check(res, patched, ctx)
        res.strategy.default(patched)
        return self._update(res, patched, old, ctx, subresource, schema_errs, applied=False), False

    def _apply(
        self,
        res: Resource,
        namespace: str,
        name: str,
        applied: Any,
        ctx: WriteContext,
        subresource: str,
        force: bool,
    ) -> tuple[JSON, bool]:
        if not ctx.manager or ctx.manager.startswith("\x00"):
            raise bad_request("PATCH, application/apply-patch+yaml requires fieldManager to be set")
        if not isinstance(applied, dict):
            raise bad_request("apply patch must be an object")
        applied = copy.deepcopy(applied)
        if not applied.get("apiVersion") or not applied.get("kind"):
            raise bad_request(
                f"failed to create typed patch object ({applied.get('apiVersion', '')}, "
                f"Kind={applied.get('kind', '')}): apiVersion and kind must be set"
            )
        self._check_target(res, applied, namespace)
        meta = applied.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise _name_mismatch(meta.get("name"), name)
        meta["name"] = name
        schema_errs = self._decode_check(res, applied, ctx, apply=True)
        old = self.storage.get(res.plural, _key(res, namespace, name))
        now = now_rfc3339()
        if old is None:
            if subresource:
                raise errors.not_found(res.plural, res.group, name)
            base: JSON = {"apiVersion": res.api_version, "kind": res.kind, "metadata": {"name": name}}
            if res.namespaced:
                base["metadata"]["namespace"] = namespace
            merged = self.fields.apply(
                base, applied, self.root(res), ctx.manager, force, "", res.api_version, now
            )
            merged["metadata"].pop("resourceVersion", None)
            res.strategy.default(merged)
            return self._create(res, merged, ctx, schema_errs, applied), True
        merged = self.fields.apply(
            old, applied, self.root(res), ctx.manager, force, subresource, res.api_version, now
        )
        if meta.get("resourceVersion"):
            merged["metadata"]["resourceVersion"] = meta["resourceVersion"]
        res.strategy.default(merged)
        return self._update(res, merged, old, ctx, subresource, schema_errs, applied=True), False

    # -- pods/binding, namespaces/finalize ----------------------------------------------------------

    def bind(self, namespace: str, name: str, body: Any, ctx: WriteContext) -> JSON:
        """pods/binding: set spec.nodeName once and mark the pod scheduled."""
        res = BY_PLURAL["pods"]
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise errors.invalid_object("Binding", "", name, [errors.required("target")])
        target = body["target"]
        node = target.get("name", "")
        if not node:
            raise errors.invalid_object("Binding", "", name, [errors.required("target.name")])
        if target.get("kind") not in (None, "", "Node"):
            raise errors.invalid_object(
                "Binding",
                "",
                name,
                [errors.invalid("target.kind", target["kind"], "must be empty or 'Node'")],
            )
        pod = self._get_or_404(res, namespace, name)
        if (pod["metadata"]).get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        if (pod.get("spec") or {}).get("nodeName"):
            raise errors.conflict(
                "pods/binding",
                "",
                name,
                f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        conds = [
            c
            for c in (new.setdefault("status", {}).get("conditions") or [])
            if c.get("type") != "PodScheduled"
        ]
        conds.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        new["status"]["conditions"] = conds
        old_meta = pod["metadata"]
        if res.strategy.has_generation:
            new["metadata"]["generation"] = int(old_meta.get("generation", 0)) + 1
        # The binding writes storage directly, as the real one does: no managedFields entry.
        if not ctx.dry_run:
            self.storage.update(res.plural, (namespace, name), _ordered(new), pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def finalize_namespace(self, name: str, body: Any, ctx: WriteContext) -> JSON:
        res = BY_PLURAL["namespaces"]
        old = self._get_or_404(res, "", name)
        if not isinstance(body, dict):
            raise bad_request("Namespace body must be an object")
        new = copy.deepcopy(old)
        new["spec"] = {"finalizers": list(((body.get("spec") or {}).get("finalizers")) or [])}
        if not new["spec"]["finalizers"]:
            new["spec"] = {}
        if new == old or ctx.dry_run:
            return old
        return self.storage.update(res.plural, ("", name), new, old)

    # -- delete -------------------------------------------------------------------------------

    def delete(
        self, res: Resource, namespace: str, name: str, options: JSON, ctx: WriteContext
    ) -> tuple[int, JSON]:
        old = self._get_or_404(res, namespace, name)
        meta = old["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise errors.conflict(
                res.plural,
                res.group,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise errors.conflict(
                res.plural,
                res.group,
                name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        if res.plural == "namespaces":
            return self._delete_namespace(old, ctx)
        policy = _propagation(options)
        new = copy.deepcopy(old)
        nmeta = new["metadata"]
        finalizers = [f for f in nmeta.get("finalizers") or [] if f not in GC_FINALIZERS]
        if policy == "Orphan":
            finalizers.append("orphan")
        elif policy == "Foreground":
            finalizers.append("foregroundDeletion")
        else:
            finalizers += [
                f
                for f in nmeta.get("finalizers") or []
                if f in GC_FINALIZERS and nmeta.get("deletionTimestamp")
            ]
        finalizers = list(dict.fromkeys(finalizers))

        grace = self._grace_period(res, old, options)
        if meta.get("deletionTimestamp"):
            current = meta.get("deletionGracePeriodSeconds")
            if current and grace is not None and grace < current:
                # Only a shorter grace period may be asked for while a graceful deletion is pending.
                started = _parse(meta["deletionTimestamp"]) - timedelta(seconds=current)
                if grace > 0:
                    nmeta["deletionTimestamp"] = _fmt(started + timedelta(seconds=grace))
                    nmeta["deletionGracePeriodSeconds"] = grace
                    return 200, self._store_update(res, new, old, ctx)
                nmeta["deletionGracePeriodSeconds"] = 0
            elif current:
                return 200, old  # graceful deletion pending, nothing changes
        elif grace is not None and grace > 0:
            nmeta["deletionTimestamp"] = _fmt(datetime.now(UTC) + timedelta(seconds=grace))
            nmeta["deletionGracePeriodSeconds"] = grace
            if nmeta.get("generation"):
                nmeta["generation"] = int(nmeta["generation"]) + 1
            if finalizers:
                nmeta["finalizers"] = finalizers
            return 200, self._store_update(res, new, old, ctx)
        if finalizers:
            nmeta["finalizers"] = finalizers
            if not nmeta.get("deletionTimestamp"):
                nmeta["deletionTimestamp"] = now_rfc3339()
                if nmeta.get("generation"):
                    nmeta["generation"] = int(nmeta["generation"]) + 1
            nmeta["deletionGracePeriodSeconds"] = 0
            stored = self._store_update(res, new, old, ctx)
            self._schedule_reconcile()
            return 200, stored
        if ctx.dry_run:
            return 200, self._deleted_body(res, old)
        final = self.storage.delete(res.plural, _key(res, namespace, name), old)
        return 200, self._deleted_body(res, final)

    def _store_update(self, res: Resource, new: JSON, old: JSON, ctx: WriteContext) -> JSON:
        if new == old or ctx.dry_run:
            return new
        meta = old["metadata"]
        return self.storage.update(res.plural, _key(res, meta.get("namespace", ""), meta["name"]), new, old)

    def _deleted_body(self, res: Resource, obj: JSON) -> JSON:
        if res.strategy.return_deleted:
            return obj
        details: JSON = {
            "name": obj["metadata"]["name"],
            "kind": res.plural,
            "uid": obj["metadata"].get("uid"),
        }
        if res.group:
            details["group"] = res.group
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _grace_period(self, res: Resource, obj: JSON, options: JSON) -> int | None:
        """CheckGracefulDelete: only pods delete gracefully -- with the requested period or the
        pod's terminationGracePeriodSeconds, and at once when unscheduled or already finished."""
        if res.plural != "pods":
            return None
        if options.get("gracePeriodSeconds") is not None:
            period = int(options["gracePeriodSeconds"])
        else:
            period = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds") or 0)
        if not (obj.get("spec") or {}).get("nodeName"):
            period = 0
        if (obj.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            period = 0
        return 1 if period < 0 else period

    def _delete_namespace(self, old: JSON, ctx: WriteContext) -> tuple[int, JSON]:
        name = old["metadata"]["name"]
        if name in UNDELETABLE_NAMESPACES:
            raise errors.forbidden_error("namespaces", "", name, "this namespace may not be deleted")
        if old["metadata"].get("deletionTimestamp"):
            return 200, old
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = now_rfc3339()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        if not (new.get("spec") or {}).get("finalizers") and not new["metadata"].get("finalizers"):
            if ctx.dry_run:
                return 200, old
            return 200, self.storage.delete("namespaces", ("", name), old)
        stored = self._store_update(BY_PLURAL["namespaces"], new, old, ctx)
        self._schedule_reconcile()
        return 200, stored

    def delete_collection(
        self,
        res: Resource,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        options: JSON,
        ctx: WriteContext,
    ) -> JSON:
        check_supported(fields, res.strategy.field_labels, res.strategy.field_error)
        ns = namespace if res.namespaced and namespace else None
        listed = []
        for key, obj in self.storage.items(res.plural, ns):
            meta = obj.get("metadata") or {}
            if not labels.empty and not labels.matches(meta.get("labels")):
                continue
            if not fields.empty and not fields.matches(selectable_fields(res, obj)):
                continue
            try:
                self.delete(
                    res, key[0], key[1], {k: v for k, v in options.items() if k != "preconditions"}, ctx
                )
            except ApiError as e:
                if e.code == 404:
                    continue
                raise
            listed.append({k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
        # The generic registry answers with the list of what it deleted, as it was listed.
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self.storage.rv)},
            "items": listed,
        }

    # -- controllers: garbage collector and namespace lifecycle ---------------------------------

    def _on_event(self, plural: str, ev: Any) -> None:
        if ev.type == "DELETED" or (ev.obj.get("metadata") or {}).get("ownerReferences"):
            self._schedule_reconcile()
        elif plural == "namespaces" and (ev.obj.get("metadata") or {}).get("deletionTimestamp"):
            self._schedule_reconcile()

    def _schedule_reconcile(self) -> None:
        if self._reconcile_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._reconcile_scheduled = True
        loop.call_soon(self._reconcile)

    def _reconcile(self) -> None:
        self._reconcile_scheduled = False
        ctx = WriteContext(manager="generic-garbage-collector")
        try:
            self._collect_garbage(ctx)
            self._terminate_namespaces(WriteContext(manager="namespace-controller"))
        except Exception:
            log.exception("garbage collection / namespace lifecycle failed")

    def _owner_exists(self, ref: JSON, dependent_ns: str) -> bool | None:
        """True/False for owners of kinds we serve; None when the kind is unknown (left alone)."""
        res = next(
            (
                r
                for r in BY_PLURAL.values()
                if r.kind == ref.get("kind") and r.api_version == ref.get("apiVersion")
            ),
            None,
        )
        if res is None:
            return None
        if res.namespaced and not dependent_ns:
            return None  # a cluster-scoped dependent cannot name a namespaced owner: never collected
        owner = self.storage.get(res.plural, _key(res, dependent_ns, ref.get("name", "")))
        return owner is not None and owner["metadata"].get("uid") == ref.get("uid")

    def _collect_garbage(self, ctx: WriteContext) -> None:
        # Owners being deleted with orphan/foreground policies.
        for plural, key, obj in list(self.storage.all_objects()):
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            fins = meta.get("finalizers") or []
            uid = meta.get("uid")
            if "orphan" in fins:
                for dplural, dkey, dep in list(self.storage.all_objects()):
                    refs = dep["metadata"].get("ownerReferences") or []
                    if any(r.get("uid") == uid for r in refs):
                        new = copy.deepcopy(dep)
                        new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                        if not new["metadata"]["ownerReferences"]:
                            del new["metadata"]["ownerReferences"]
                        self.storage.update(dplural, dkey, new, dep)
                self._drop_finalizer(plural, key, "orphan")
            elif "foregroundDeletion" in fins:
                waiting = False
                for dplural, dkey, dep in list(self.storage.all_objects()):
                    if any(r.get("uid") == uid for r in dep["metadata"].get("ownerReferences") or []):
                        waiting = True
                        if not dep["metadata"].get("deletionTimestamp"):
                            self._try_delete(BY_PLURAL[dplural], dkey, ctx)
                if not waiting:
                    self._drop_finalizer(plural, key, "foregroundDeletion")
        # Dependents whose owners are gone.
        for plural, key, obj in list(self.storage.all_objects()):
            refs = obj["metadata"].get("ownerReferences") or []
            if not refs or obj["metadata"].get("deletionTimestamp"):
                continue
            states = [(r, self._owner_exists(r, key[0])) for r in refs]
            if any(s is None for _, s in states):
                continue
            dangling = [r for r, s in states if s is False]
            if not dangling:
                continue
            current = self.storage.get(plural, key)
            if current is None:
                continue
            if len(dangling) == len(refs):
                log.info(
                    "garbage collector: deleting %s %s: no owner left (%s)",
                    plural,
                    "/".join(filter(None, key)),
                    ", ".join(f"{r.get('kind')} {r.get('name')} uid {r.get('uid')}" for r in dangling),
                )
                self._try_delete(BY_PLURAL[plural], key, ctx)
            else:
                new = copy.deepcopy(current)
                new["metadata"]["ownerReferences"] = [r for r, s in states if s]
                self.storage.update(plural, key, new, current)

    def _try_delete(self, res: Resource, key: Key, ctx: WriteContext) -> None:
        try:
            self.delete(res, key[0], key[1], {}, ctx)
        except ApiError as e:
            log.info("controller delete of %s %s/%s failed: %s", res.plural, key[0], key[1], e)

    def _drop_finalizer(self, plural: str, key: Key, finalizer: str) -> None:
        current = self.storage.get(plural, key)
        if current is None:
            return
        new = copy.deepcopy(current)
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
            if not new["metadata"].get("deletionGracePeriodSeconds"):
                self.storage.delete(plural, key, current)
                return
        self.storage.update(plural, key, new, current)

    def _terminate_namespaces(self, ctx: WriteContext) -> None:
        for _, ns in self.storage.items("namespaces"):
            meta = ns["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            name = meta["name"]
            remaining = 0
            for res in BY_PLURAL.values():
                if not res.namespaced:
                    continue
                for key, obj in self.storage.items(res.plural, name):
                    remaining += 1
                    if not obj["metadata"].get("deletionTimestamp"):
                        self._try_delete(res, key, ctx)
            if remaining:
                continue
            current = self.storage.get("namespaces", ("", name))
            if current is None:
                continue
            if (current.get("spec") or {}).get("finalizers"):
                current = self.finalize_namespace(name, {"spec": {"finalizers": []}}, ctx)
            if not current["metadata"].get("finalizers"):
                self.storage.delete("namespaces", ("", name), current)

    # -- bootstrap ----------------------------------------------------------------------------

    def ensure_system_namespaces(self) -> None:
        res = BY_PLURAL["namespaces"]
        for name in SYSTEM_NAMESPACES:
            if self.storage.get("namespaces", ("", name)) is None:
                ctx = WriteContext(manager="kube-apiserver")
                self.create(
                    res, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, ctx
                )


# -- small helpers ---------------------------------------------------------------------------------


def _name_mismatch(have: Any, name: str) -> ApiError:
    return bad_request(f"the name of the object ({have}) does not match the name on the URL ({name})")


def _propagation(options: JSON) -> str:
    policy = options.get("propagationPolicy")
    if policy in ("Orphan", "Foreground", "Background"):
        return str(policy)
    if policy:
        raise errors.invalid_object(
            "DeleteOptions",
            "",
            "",
            [
                errors.not_supported(
                    "propagationPolicy", policy, ["Foreground", "Background", "Orphan", "nil"]
                )
            ],
        )
    if options.get("orphanDependents") is True:
        return "Orphan"
    return "Background"


def _check_rv_match(resource_version: str, rv_match: str) -> None:
    """ValidateListOptions' rules for resourceVersionMatch."""
    if not rv_match:
        return

    def invalid(error: FieldError) -> ApiError:
        return errors.invalid_object("ListOptions", "meta.k8s.io", "", [error])

    if rv_match not in ("Exact", "NotOlderThan"):
        raise invalid(errors.not_supported("resourceVersionMatch", rv_match, ["Exact", "NotOlderThan", ""]))
    if not resource_version:
        raise invalid(
            errors.forbidden(
                "resourceVersionMatch", "resourceVersionMatch is forbidden unless resourceVersion is provided"
            )
        )
    if rv_match == "Exact" and resource_version == "0":
        raise invalid(
            errors.forbidden(
                "resourceVersionMatch", 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
            )
        )


def _parse_rv(value: str) -> int:
    try:
        rv = int(value)
        if rv < 0:
            raise ValueError
        return rv
    except ValueError:
        raise bad_request(f'invalid resource version "{value}"') from None


def _key_token(key: Key) -> str:
    return f"{key[0]}/{key[1]}\x00" if key[0] else f"{key[1]}\x00"


def _encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data.get("v") != "meta.k8s.io/v1":
            raise ValueError
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ) from None


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def _fmt(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_META_ORDER = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def _ordered(obj: JSON) -> JSON:
    """Field order as the Go encoder writes it: apiVersion, kind, metadata, then the rest."""
    out: JSON = {}
    for k in ("kind", "apiVersion"):
        if k in obj:
            out[k] = obj[k]
    meta = obj.get("metadata") or {}
    out["metadata"] = {k: meta[k] for k in _META_ORDER if k in meta}
    out["metadata"].update({k: v for k, v in meta.items() if k not in out["metadata"]})
    for k, v in obj.items():
        if k not in out:
            out[k] = v
    return out
