"""The checks that let a name from the API become part of a path the kubelet plugin writes (the
paths themselves are :class:`dra_bridge.api.nodepaths.NodePaths`'s).

Claim namespaces, names, uids, request and device names come from API objects (or the
kubelet): a ``../`` or an absolute path in any of them must never steer a write. Every such
name is checked against the rule the API server itself enforces (DNS-1123 label or
subdomain, UUID) before anything is made, paths are built only from checked parts, and the
result must still resolve below its root (:func:`contained`).
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_bridge.api.k8sname import is_dns_label, is_dns_subdomain

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class UnsafeName(ValueError):
    """A name from the API that must not become (part of) a path; the message names the field."""


def _fail(field: str, value: object, rule: str) -> UnsafeName:
    return UnsafeName(f"{field} {value!r} is not {rule}")


def check_uid(value: object, field: str = "claim uid") -> str:
    if not isinstance(value, str) or not _UUID.match(value):
        raise _fail(field, value, "a UUID (lower-case 8-4-4-4-12 hex)")
    return value


def check_namespace(value: object, field: str = "claim namespace") -> str:
    if not isinstance(value, str) or not is_dns_label(value):
        raise _fail(field, value, "a DNS-1123 label")
    return value


def check_name(value: object, field: str = "claim name") -> str:
    if not isinstance(value, str) or not is_dns_subdomain(value):
        raise _fail(field, value, "a DNS-1123 subdomain")
    return value


def check_label(value: object, field: str) -> str:
    """Device names, pod claim names: DNS-1123 labels."""
    if not isinstance(value, str) or not is_dns_label(value):
        raise _fail(field, value, "a DNS-1123 label")
    return value


def check_request(value: object, field: str = "request") -> str:
    """A request name, or ``request/sub-request`` (firstAvailable): one or two DNS-1123 labels."""
    parts = value.split("/") if isinstance(value, str) else []
    if not 1 <= len(parts) <= 2 or not all(is_dns_label(p) for p in parts):
        raise _fail(field, value, "a request name (a DNS-1123 label, or label/label)")
    assert isinstance(value, str)  # parts came from it
    return value


def contained(root: Path, path: Path) -> Path:
    """``path`` when it resolves (symlinks followed) to ``root`` or below it, else UnsafeName."""
    if not Path(path).resolve().is_relative_to(Path(root).resolve()):
        raise UnsafeName(f"path {str(path)!r} leaves {str(root)!r}")
    return Path(path)
