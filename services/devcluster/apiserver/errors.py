"""Kubernetes API errors: ``metav1.Status`` bodies shaped as the real apiserver writes them.

The messages follow apimachinery's ``api/errors`` and ``util/validation/field`` formats,
because kubectl prints them verbatim ("Error from server (NotFound): pods "x" not found")
and clients branch on ``reason`` and ``code``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

# field.ErrorType -> (text in the message, StatusCause reason)
_FIELD_TYPES: dict[str, tuple[str, str]] = {
    "NotFound": ("Not found", "FieldValueNotFound"),
    "Required": ("Required value", "FieldValueRequired"),
    "Duplicate": ("Duplicate value", "FieldValueDuplicate"),
    "Invalid": ("Invalid value", "FieldValueInvalid"),
    "NotSupported": ("Unsupported value", "FieldValueNotSupported"),
    "Forbidden": ("Forbidden", "FieldValueForbidden"),
    "TooLong": ("Too long", "FieldValueTooLong"),
    "TooMany": ("Too many", "FieldValueTooMany"),
    "Internal": ("Internal error", "InternalError"),
    "TypeInvalid": ("Invalid value", "FieldValueTypeInvalid"),
}
# Error types whose body never shows the bad value (apimachinery ErrorBody).
_NO_VALUE = {"Required", "Forbidden", "TooLong", "Internal"}
_OMIT = object()


def _render_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: a path such as ``spec.devices[3].name``, a type, a value, a detail."""

    type: str
    field: str
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        text, _ = _FIELD_TYPES[self.type]
        if self.type in _NO_VALUE or self.value is _OMIT:
            s = text
        else:
            s = f"{text}: {_render_value(self.value)}"
        if self.detail:
            s += f": {self.detail}"
        return s

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def cause(self) -> JSON:
        return {"reason": _FIELD_TYPES[self.type][1], "message": self.body(), "field": self.field}


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("Required", path, _OMIT, detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("Invalid", path, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("Forbidden", path, _OMIT, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("Duplicate", path, value)


def not_supported(path: str, value: Any, allowed: list[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(a) for a in allowed) if allowed else ""
    return FieldError("NotSupported", path, value, detail)


def too_long(path: str, max_len: int) -> FieldError:
    return FieldError("TooLong", path, _OMIT, f"may not be more than {max_len} bytes")


def too_many(path: str, actual: int, max_items: int) -> FieldError:
    return FieldError("TooMany", path, actual, f"must have at most {max_items} items")


def immutable(path: str, value: Any) -> FieldError:
    return FieldError("Invalid", path, value, "field is immutable")


@dataclass
class ApiError(Exception):
    """An error answered as a ``kind: Status`` body with HTTP ``code``."""

    code: int
    reason: str
    message: str
    details: JSON | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def qualified(resource: str, group: str) -> str:
    """``resourceclaims.resource.k8s.io`` or ``pods``: schema.GroupResource.String()."""
    return f"{resource}.{group}" if group else resource


def qualified_kind(kind: str, group: str) -> str:
    return f"{kind}.{group}" if group else kind


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource},
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    details = {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}
    return ApiError(409, "AlreadyExists", f'{qualified(resource, group)} "{name}" already exists', details)


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    details = {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        details,
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid_object(kind: str, group: str, name: str, errs: list[FieldError]) -> ApiError:
    """422 Invalid with one cause per field error, as ``errors.NewInvalid``."""
    agg = str(errs[0]) if len(errs) == 1 else "[" + ", ".join(str(e) for e in errs) + "]"
    details: JSON = {"name": name, "group": group, "kind": kind} if group else {"name": name, "kind": kind}
    details["causes"] = [e.cause() for e in errs]
    return ApiError(422, "Invalid", f'{qualified_kind(kind, group)} "{name}" is invalid: {agg}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}",
        {},
    )


def forbidden_error(resource: str, group: str, name: str, why: str) -> ApiError:
    details = {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}
    target = f'{qualified(resource, group)} "{name}"' if name else qualified(resource, group)
    return ApiError(403, "Forbidden", f"{target} is forbidden: {why}", details)


def timeout(message: str, causes: list[JSON] | None = None) -> ApiError:
    return ApiError(504, "Timeout", message, {"causes": causes} if causes else {})


def internal(message: str) -> ApiError:
    return ApiError(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )
