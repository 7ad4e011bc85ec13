"""Kubernetes ``Status`` errors, shaped like the real API server's.

Every failure the local API server returns is an :class:`ApiError`, rendered as a
``meta/v1 Status`` object so that the official Python client raises
``kubernetes.client.ApiException`` with the right ``.status`` and a body that
``json.loads`` into the usual ``{"kind": "Status", "reason": ..., "code": ...}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HTTP status -> default machine-readable reason (k8s.io/apimachinery metav1.StatusReason*).
DEFAULT_REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class FieldError:
    """One ``field.Error``: a path such as ``spec.devices[3].name`` and what is wrong."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}  # upstream's ErrorBody


@dataclass
class ApiError(Exception):
    code: int
    message: str
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reason:
            self.reason = DEFAULT_REASONS.get(self.code, "Unknown")
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def qualified_resource(plural: str, group: str) -> str:
    """``resourceslices.resource.k8s.io``; core resources are just ``pods``."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        f'{qualified_resource(plural, group)} "{name}" not found',
        details={"name": name, "group": group, "kind": plural},
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'{qualified_resource(plural, group)} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "group": group, "kind": plural},
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified_resource(plural, group)} "{name}": {why}',
        reason="Conflict",
        details={"name": name, "group": group, "kind": plural},
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    qualified_kind = f"{kind}.{group}" if group else kind
    rendered = [str(e) for e in errors]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    return ApiError(
        422,
        f'{qualified_kind} "{name}" is invalid: {summary}',
        reason="Invalid",
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [e.cause() for e in errors],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, reason="BadRequest")


def gone(message: str) -> ApiError:
    return ApiError(410, message, reason="Expired")
