"""A local Kubernetes API server: real HTTP, Kubernetes REST semantics (see :mod:`.server`).

Used by ``vgpuctl demo`` / ``vgpuctl conformance`` (an in-process cluster API) and by the
tests. OpenAPI schema validation needs the optional ``kubernetes-validate`` package
(``validation.HAVE_SCHEMAS``); the DRA rules are always enforced.
"""

from .errors import ApiError, FieldError
from .resources import DEFAULT_RESOURCES, ResourceType
from .server import Injection, LocalApiServer, RequestRecord, Write
from .validation import HAVE_SCHEMAS

__all__ = [
    "ApiError",
    "DEFAULT_RESOURCES",
    "FieldError",
    "HAVE_SCHEMAS",
    "Injection",
    "LocalApiServer",
    "RequestRecord",
    "ResourceType",
    "Write",
]
