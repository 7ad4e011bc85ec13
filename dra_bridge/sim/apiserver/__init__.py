"""A local Kubernetes API server: real HTTP, Kubernetes REST semantics (see :mod:`.server`).

Used by ``vgpuctl demo`` / ``vgpuctl conformance`` (an in-process cluster API), by
``vgpuctl sim apiserver`` (a process kubectl can talk to) and by the tests. Feature gates
(:mod:`.featuregates`) decide which fields a write keeps, as in kube-apiserver. OpenAPI schema
validation needs the optional ``kubernetes-validate`` package (``validation.HAVE_SCHEMAS``);
the DRA rules are always enforced.
"""

from dra_bridge.sim.apiserver.errors import ApiError, FieldError
from dra_bridge.sim.apiserver.resources import DEFAULT_RESOURCES, ResourceType
from dra_bridge.sim.apiserver.server import Injection, LocalApiServer, RequestRecord, Write
from dra_bridge.sim.apiserver.validation import HAVE_SCHEMAS

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
