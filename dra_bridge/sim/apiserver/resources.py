"""The table of resources the local API server serves.

Adding a kind is one :class:`ResourceType` entry (or pass ``extra_resources=`` to
``LocalApiServer``): routing, discovery, storage, selectors, watch and schema
validation (by ``kind`` + ``apiVersion`` through ``kubernetes-validate``) follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMMON_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    # PUT/PATCH .../{name}/status exists; the main endpoint then ignores status changes
    status_subresource: bool = False
    # metadata.generation is set to 1 on create and bumped whenever spec changes
    has_generation: bool = False
    # with a status subresource: status replaced by this on create (None keeps the body's)
    initial_status: Any = None
    # field selector keys accepted besides metadata.name / metadata.namespace
    field_selectors: tuple[str, ...] = ()
    # the whole spec may not change after creation
    immutable_spec: bool = False
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = (
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    )
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def key(self) -> str:
        """``resourceslices.resource.k8s.io`` (``pods`` for core): unique per table."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def allowed_field_selectors(self) -> tuple[str, ...]:
        return COMMON_FIELDS + self.field_selectors

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base


RESOURCE = "resource.k8s.io"
RBAC = "rbac.authorization.k8s.io"
ADMISSION = "admissionregistration.k8s.io"

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    # resource.k8s.io/v1 (DRA)
    ResourceType(RESOURCE, "v1", "resourceslices", "ResourceSlice", namespaced=False,
                 singular="resourceslice", has_generation=True,
                 field_selectors=("spec.nodeName", "spec.driver")),
    ResourceType(RESOURCE, "v1", "deviceclasses", "DeviceClass", namespaced=False,
                 singular="deviceclass", has_generation=True),
    ResourceType(RESOURCE, "v1", "resourceclaims", "ResourceClaim", namespaced=True,
                 singular="resourceclaim", has_generation=True, status_subresource=True,
                 initial_status={}, immutable_spec=True),
    ResourceType(RESOURCE, "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
                 namespaced=True, singular="resourceclaimtemplate", has_generation=True,
                 immutable_spec=True),
    # core/v1
    ResourceType("", "v1", "nodes", "Node", namespaced=False, singular="node",
                 status_subresource=True, field_selectors=("spec.unschedulable",),
                 short_names=("no",)),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, singular="namespace",
                 status_subresource=True, initial_status={"phase": "Active"},
                 field_selectors=("status.phase",), short_names=("ns",),
                 verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    ResourceType("", "v1", "pods", "Pod", namespaced=True, singular="pod",
                 status_subresource=True, has_generation=True,
                 initial_status={"phase": "Pending"},
                 field_selectors=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                                  "spec.serviceAccountName", "spec.hostNetwork",
                                  "status.phase", "status.podIP", "status.nominatedNodeName"),
                 short_names=("po",)),
    ResourceType("", "v1", "events", "Event", namespaced=True, singular="event",
                 field_selectors=("involvedObject.kind", "involvedObject.namespace",
                                  "involvedObject.name", "involvedObject.uid",
                                  "involvedObject.apiVersion", "involvedObject.resourceVersion",
                                  "involvedObject.fieldPath", "reason", "reportingComponent",
                                  "source", "type"),
                 short_names=("ev",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True, singular="serviceaccount",
                 short_names=("sa",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, singular="configmap",
                 short_names=("cm",)),
    # what deploy/ installs besides: RBAC, the agent's DaemonSet, its admission policies
    ResourceType(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False, singular="clusterrole"),
    ResourceType(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False,
                 singular="clusterrolebinding"),
    ResourceType(RBAC, "v1", "roles", "Role", namespaced=True, singular="role"),
    ResourceType(RBAC, "v1", "rolebindings", "RoleBinding", namespaced=True, singular="rolebinding"),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", namespaced=True, singular="daemonset",
                 status_subresource=True, has_generation=True, short_names=("ds",),
                 initial_status={"currentNumberScheduled": 0, "desiredNumberScheduled": 0,
                                 "numberMisscheduled": 0, "numberReady": 0}),
    ResourceType(ADMISSION, "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 namespaced=False, singular="validatingadmissionpolicy", status_subresource=True,
                 has_generation=True, initial_status={}),
    ResourceType(ADMISSION, "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                 namespaced=False, singular="validatingadmissionpolicybinding", has_generation=True),
    # events.k8s.io/v1 (what EventsV1Api / client-go's new recorder write)
    ResourceType("events.k8s.io", "v1", "events", "Event", namespaced=True, singular="event",
                 field_selectors=("reason", "regarding.kind", "regarding.namespace",
                                  "regarding.name", "regarding.uid", "reportingController",
                                  "type"),
                 short_names=("ev",)),
)


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string a field selector compares against (``""`` when unset)."""
    if path == "source":  # core events: source.component
        path = "source.component"
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return ""
        cur = cur[part]
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def taint_rule_resource(version: str) -> ResourceType:
    """DeviceTaintRule at the API version ``version`` serves it (``dra_bridge.api.compat.TAINT_RULE_API``);
    the server adds it only where its gate is on. Simplified: one version served, not every one."""
    from dra_bridge.api.compat import taint_rule_api

    return ResourceType(RESOURCE, taint_rule_api(version).split("/")[1], "devicetaintrules", "DeviceTaintRule",
                        namespaced=False, singular="devicetaintrule", has_generation=True,
                        status_subresource=version != "1.34")  # 1.35 added its status
