"""Kubernetes name rules (RFC 1123 labels and subdomains) and the fitting of free text into them.

Every object, device, counter and label this project publishes is checked or built here, so
one rule decides what the API server will accept.
"""

from __future__ import annotations

import hashlib
import re

from dra_bridge.api.compat import MAX_STRING_ATTRIBUTE_LENGTH

MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
#: A ResourceSlice string attribute's limit, in UTF-8 bytes (the API server counts bytes).
MAX_STRING_ATTR = MAX_STRING_ATTRIBUTE_LENGTH

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_dns_label(value: str) -> bool:
    return len(value) <= MAX_DNS_LABEL and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= MAX_DNS_SUBDOMAIN and bool(_DNS_SUBDOMAIN.match(value))


def dns_safe(value: str) -> str:
    """Lower-case, runs of anything outside ``[a-z0-9]`` become one ``-``, no dash at either end."""
    return re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")


def short_hash(value: str, n: int = 6) -> str:
    """``n`` hex digits of SHA-256: keeps a cut name unique and stable across runs."""
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def fit_dns_label(prefix: str, middle: str, suffix: str, *, limit: int = MAX_DNS_LABEL) -> str:
    """``prefix + middle + suffix`` as a DNS label; a too-long middle is cut and made unique by a hash."""
    mid = dns_safe(middle) or "x"
    name = f"{prefix}{mid}{suffix}"
    if len(name) <= limit:
        return name
    h = short_hash(middle)
    room = limit - len(prefix) - len(suffix) - len(h) - 1
    if room < 1:
        raise ValueError(f"cannot build a DNS label from {prefix!r}, {middle!r}, {suffix!r}")
    return f"{prefix}{mid[:room].rstrip('-')}-{h}{suffix}"


def truncate_utf8(value: str, limit: int = MAX_STRING_ATTR) -> str:
    """At most ``limit`` UTF-8 bytes (the API server counts bytes), never splitting a character."""
    value = "".join(c for c in value if c.isprintable())
    raw = value.encode()
    if len(raw) <= limit:
        return value
    return raw[:limit].decode(errors="ignore").rstrip()


__all__ = [
    "MAX_DNS_LABEL",
    "MAX_DNS_SUBDOMAIN",
    "MAX_STRING_ATTR",
    "dns_safe",
    "fit_dns_label",
    "is_dns_label",
    "is_dns_subdomain",
    "short_hash",
    "truncate_utf8",
]
