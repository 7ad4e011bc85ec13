"""The API calls of GPU maintenance (``vgpuctl cordon | drain | uncordon``, ``kubectl vgpu``), made
with the user's own credentials: what the cluster holds on its GPUs, the cordon annotation,
DeviceTaintRules, evictions. The agent never loads this module.

DeviceTaintRule is served at the API version :data:`~dra_bridge.api.compat.TAINT_RULE_API` names for
the server's version, and only where its gate is on; whether it is, is found by effect (a dry-run
create), as :mod:`.kept` finds the slice fields. KubeVirt's VirtualMachineInstances are read where
KubeVirt is installed (none elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from dra_bridge.api.compat import taint_rule_api
from dra_bridge.api.names import ANNOTATION_CORDON, ANNOTATION_CORDON_APPLIED, ANNOTATION_HEALTH
from dra_bridge.apiclient.errors import api_exception
from dra_bridge.apiclient.objects import raw

if TYPE_CHECKING:
    from dra_bridge.apiclient.reader import Reader

_RULE_APIS = {"v1alpha3": "ResourceV1alpha3Api", "v1beta2": "ResourceV1beta2Api", "v1": "ResourceV1Api"}


@dataclass
class ClusterState:
    """What a GPU view is built from, as the server sent it (plain JSON)."""

    slices: list[dict] = field(default_factory=list)
    claims: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    vmis: list[dict] = field(default_factory=list)
    rules: list[dict] = field(default_factory=list)
    cordons: dict[str, str] = field(default_factory=dict)  # node -> its cordon annotation
    applied: dict[str, str] = field(default_factory=dict)  # node -> the cordon its agent published
    healths: dict[str, str] = field(default_factory=dict)  # node -> its agent's health annotation
    nodes: list[str] = field(default_factory=list)
    node_objects: list[dict] = field(default_factory=list)  # the Nodes (labels, allocatable: the classic path)


def migration_object(namespace: str, vmi: str) -> dict:
    """A live migration of VMI ``vmi`` away from its node (KubeVirt picks the target), as ``vgpuctl drain
    --migrate`` creates it; the label names who asked."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"generateName": f"{vmi[:40]}-drain-", "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "vgpuctl-drain"}},
            "spec": {"vmiName": vmi}}


def read_state(reader: Reader, rule_api_version: str) -> ClusterState:
    """Slices, claims and pods of every namespace (capacity counts them all), VMIs (none where KubeVirt
    is not installed or not readable), taint rules (none where not served), every node's cordon: one
    LIST each, as plain JSON."""
    def items(path: str, missing: tuple[int, ...] = ()) -> list[dict]:
        answer = reader.get(path, missing)
        return list((answer or {}).get("items") or [])

    st = ClusterState(slices=items("/apis/resource.k8s.io/v1/resourceslices"))
    st.claims = items("/apis/resource.k8s.io/v1/resourceclaims")
    st.pods = items("/api/v1/pods")
    st.vmis = items("/apis/kubevirt.io/v1/virtualmachineinstances", (403, 404))
    st.rules = items(f"/apis/{rule_api_version}/devicetaintrules", (404,))
    st.node_objects = items("/api/v1/nodes")
    for n in st.node_objects:
        meta = n.get("metadata") or {}
        st.nodes.append(meta.get("name", ""))
        notes = meta.get("annotations") or {}
        for key, out in ((ANNOTATION_CORDON, st.cordons), (ANNOTATION_CORDON_APPLIED, st.applied),
                         (ANNOTATION_HEALTH, st.healths)):
            if notes.get(key):
                out[meta.get("name", "")] = notes[key]
    return st


class MaintenanceApi:
    """The calls; ``kubernetes`` is imported when one is made."""

    def __init__(self, api_client: Any, version: tuple[int, int]) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.version = version
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.rule_api_version = taint_rule_api(version)
        self.rules_api = getattr(client, _RULE_APIS[self.rule_api_version.split("/")[1]])(api_client)

    # ------------------------------------------------------------ reading
    def state(self) -> ClusterState:
        """:func:`read_state` through this client."""
        from dra_bridge.apiclient.reader import ClientReader

        return read_state(ClientReader(self.api_client), self.rule_api_version)

    def node_cordon(self, node: str) -> str | None:
        """The node's cordon annotation (a missing node: ValueError, a name to fix)."""
        try:
            meta = raw(self.core.read_node, node).get("metadata") or {}
        except api_exception() as exc:
            if exc.status == 404:
                raise ValueError(f"node {node!r} not found") from None
            raise
        return (meta.get("annotations") or {}).get(ANNOTATION_CORDON)

    # ------------------------------------------------------------ writing
    def set_cordon(self, node: str, text: str | None) -> None:
        """Set (None: remove) the node's cordon annotation with a merge patch."""
        self.core.patch_node(node, {"metadata": {"annotations": {ANNOTATION_CORDON: text}}})

    def taint_rules(self) -> list[dict]:
        """Every DeviceTaintRule ([] where the server does not serve them)."""
        try:
            return raw(self.rules_api.list_device_taint_rule)["items"]
        except api_exception() as exc:
            if exc.status == 404:
                return []
            raise

    def rules_served(self, probe: dict) -> bool:
        """Whether the server serves DeviceTaintRule and keeps its taint: a dry-run create of ``probe``."""
        try:
            answer = raw(self.rules_api.create_device_taint_rule, probe, dry_run="All")
        except api_exception() as exc:
            if exc.status in (404, 405):
                return False
            raise
        return bool((answer.get("spec") or {}).get("taint"))

    def put_rule(self, rule: dict) -> None:
        """Create the rule, or replace the one of its name."""
        try:
            self.rules_api.create_device_taint_rule(rule)
        except api_exception() as exc:
            if exc.status != 409:
                raise
            old = raw(self.rules_api.read_device_taint_rule, rule["metadata"]["name"])
            rule = {**rule, "metadata": {**rule["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]}}
            self.rules_api.replace_device_taint_rule(rule["metadata"]["name"], rule)

    def delete_rule(self, name: str) -> bool:
        try:
            self.rules_api.delete_device_taint_rule(name)
        except api_exception() as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def migrate(self, namespace: str, vmi: str) -> tuple[str | None, str | None]:
        """Create a ``VirtualMachineInstanceMigration`` (kubevirt.io/v1) of the VMI: (its name, None), or
        (None, the server's refusal)."""
        body = migration_object(namespace, vmi)
        try:
            made = cast(dict[str, Any], self.custom.create_namespaced_custom_object(
                "kubevirt.io", "v1", namespace, "virtualmachineinstancemigrations", body))
        except api_exception() as exc:
            from dra_bridge.apiclient.errors import brief

            return None, brief(exc)
        return made["metadata"]["name"], None

    def migration(self, namespace: str, name: str) -> dict | None:
        """The migration as it is now (None: gone)."""
        return self._kubevirt_object(namespace, "virtualmachineinstancemigrations", name)

    def vmi(self, namespace: str, name: str) -> dict | None:
        return self._kubevirt_object(namespace, "virtualmachineinstances", name)

    def _kubevirt_object(self, namespace: str, plural: str, name: str) -> dict | None:
        try:
            obj = cast(dict[str, Any], self.custom.get_namespaced_custom_object(
                "kubevirt.io", "v1", namespace, plural, name))
        except api_exception() as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def evict(self, namespace: str, pod: str) -> str | None:
        """Ask for the pod's eviction (policy/v1, so PodDisruptionBudgets and KubeVirt's eviction
        webhook decide); None when accepted, else the server's refusal (429: a budget or a VM's
        migration; 404: gone already counts as done)."""
        from kubernetes import client

        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
        try:
            self.core.create_namespaced_pod_eviction(pod, namespace, body)
        except api_exception() as exc:
            if exc.status == 404:
                return None
            from dra_bridge.apiclient.errors import brief

            return brief(exc)
        return None
