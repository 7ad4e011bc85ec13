"""What ``vgpuctl doctor`` reads from a cluster: the facts its (pure) checks judge.

The DRA fields the server keeps are found by effect, not from its version (:func:`.kept.probe_kept`:
dry-run probe slices). Every read that fails is recorded as a one-line reason instead of stopping
the others. The agent does not load this module (its RBAC is what its own code calls).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field

from dra_bridge.api.compat import OLDEST, counters_keyed_by_pool_name
from dra_bridge.api.names import ANNOTATION_CONFIG_REASON, LABEL_CONFIG, LABEL_CONFIG_STATE
from dra_bridge.apiclient.kept import ANNOTATION_DRA_FIELDS, KeptFields, probe_kept
from dra_bridge.apiclient.objects import raw
from dra_bridge.apiclient.publisher import server_version


class KubeVirtFacts(BaseModel):
    installed: bool = False
    version: str | None = None
    feature_gates: list[str] = []
    mdev_configuration: dict | None = Field(None, description="spec.configuration.mediatedDevicesConfiguration")
    error: str | None = None


class ClassFacts(BaseModel):
    name: str
    ours: bool = Field(description="its selectors name the driver")
    extended_resource_name: str | None = None


class NodeFacts(BaseModel):
    name: str
    layout: str | None = None
    state: str | None = None
    reason: str | None = None
    slices: int = 0
    devices: int = 0
    node_object: bool = True  # False: slices name a node the API server has no Node object for
    fields: str | None = None  # the agent's own report of what the server keeps (its node annotation)


class ClusterFacts(BaseModel):
    driver: str
    version: tuple[int, int] | None = None
    git_version: str | None = None
    kept: KeptFields = KeptFields()
    probe_error: str | None = None
    kubevirt: KubeVirtFacts = KubeVirtFacts()
    classes: list[ClassFacts] = []
    classes_error: str | None = None
    nodes: list[NodeFacts] = []
    nodes_error: str | None = None
    #: other drivers' pools with counter sets named as one of ours (``driver/pool``), read only where the
    #: server's allocator keys counters by pool name (compat.counters_keyed_by_pool_name)
    pool_name_clashes: list[str] = []


def _why(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    return f"HTTP {status} {reason}" if status else str(exc) or reason


def _kubevirt(api_client: client.ApiClient) -> KubeVirtFacts:
    try:
        items = raw(client.CustomObjectsApi(api_client).list_cluster_custom_object, "kubevirt.io", "v1", "kubevirts")["items"]
    except ApiException as exc:
        return KubeVirtFacts(error=None if exc.status == 404 else _why(exc))
    if not items:
        return KubeVirtFacts()
    kv = items[0]
    conf = (kv.get("spec") or {}).get("configuration") or {}
    status = kv.get("status") or {}
    return KubeVirtFacts(installed=True, version=status.get("observedKubeVirtVersion") or status.get("operatorVersion"),
                         feature_gates=list((conf.get("developerConfiguration") or {}).get("featureGates") or []),
                         mdev_configuration=conf.get("mediatedDevicesConfiguration"))


def _selects_driver(cls: dict[str, Any], driver: str) -> bool:
    exprs = [((s.get("cel") or {}).get("expression") or "") for s in (cls.get("spec") or {}).get("selectors") or []]
    return any(driver in e and "device.driver" in e for e in exprs)


def gather(api_client: client.ApiClient, driver: str) -> ClusterFacts:
    """Read everything the doctor judges; a read that fails leaves its reason in the facts."""
    facts = ClusterFacts(driver=driver)
    info = client.VersionApi(api_client).get_code()
    facts.git_version = info.git_version
    facts.version = server_version(api_client)
    if facts.version >= OLDEST:
        try:
            facts.kept = probe_kept(api_client, facts.version)
        except ApiException as exc:
            facts.probe_error = _why(exc)
    facts.kubevirt = _kubevirt(api_client)
    try:
        classes = raw(client.ResourceV1Api(api_client).list_device_class)["items"]
        facts.classes = [ClassFacts(name=c["metadata"]["name"], ours=_selects_driver(c, driver),
                                    extended_resource_name=(c.get("spec") or {}).get("extendedResourceName"))
                         for c in classes]
    except ApiException as exc:
        facts.classes_error = _why(exc)
    try:
        slices = raw(client.ResourceV1Api(api_client).list_resource_slice, field_selector=f"spec.driver={driver}")["items"]
        nodes = raw(client.CoreV1Api(api_client).list_node)["items"]
    except ApiException as exc:
        facts.nodes_error = _why(exc)
        return facts
    per_node: dict[str, list[dict]] = {}
    for s in slices:
        per_node.setdefault((s.get("spec") or {}).get("nodeName") or "", []).append(s)
    def devices(mine: list[dict]) -> int:
        return sum(len((s.get("spec") or {}).get("devices") or []) for s in mine)

    seen = set()
    for n in nodes:
        meta = n.get("metadata") or {}
        name, labels = meta.get("name", ""), meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        mine = per_node.get(name, [])
        if not mine and LABEL_CONFIG_STATE not in labels and LABEL_CONFIG not in labels \
                and ANNOTATION_DRA_FIELDS not in annotations:
            continue  # not a GPU node of this driver
        seen.add(name)
        facts.nodes.append(NodeFacts(name=name, layout=labels.get(LABEL_CONFIG), state=labels.get(LABEL_CONFIG_STATE),
                                     reason=annotations.get(ANNOTATION_CONFIG_REASON), slices=len(mine),
                                     devices=devices(mine), fields=annotations.get(ANNOTATION_DRA_FIELDS)))
    for name, mine in sorted(per_node.items()):  # slices of a node with no Node object (deleted, or renamed)
        if name and name not in seen:
            facts.nodes.append(NodeFacts(name=name, slices=len(mine), devices=devices(mine), node_object=False))
    if counters_keyed_by_pool_name(facts.git_version) and facts.kept.counters is not False:
        try:
            every = raw(client.ResourceV1Api(api_client).list_resource_slice)["items"]
        except ApiException as exc:
            facts.nodes_error = _why(exc)
            return facts
        facts.pool_name_clashes = pool_name_clashes(slices, every, driver)
    return facts


def pool_name_clashes(ours: list[dict], every: list[dict], driver: str) -> list[str]:
    """``driver/pool`` of each other driver's pool that publishes counter sets under a pool name of ours."""
    names = {(s.get("spec") or {}).get("pool", {}).get("name") for s in ours}
    clashes = set()
    for s in every:
        spec = s.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name")
        if spec.get("driver") != driver and pool in names and spec.get("sharedCounters"):
            clashes.add(f"{spec.get('driver')}/{pool}")
    return sorted(clashes)
