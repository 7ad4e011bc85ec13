"""Which DRA fields the API server keeps, read from its answers to our own writes (by effect).

kube-apiserver silently drops the fields of a disabled feature gate when it stores an object
(``dropDisabledFields`` in pkg/registry/resource/resourceslice/strategy.go): with
``DRAPartitionableDevices`` off (the default on 1.34 and 1.35) ``sharedCounters`` and
``consumesCounters`` vanish, with ``DRADeviceCompatibilityGroups`` off (alpha on 1.37)
``compatibilityGroups`` do, with ``DRADeviceBindingConditions`` off the binding fields, with
``DRADeviceTaints`` off (1.34, 1.35) the device taints a cordon would use. A
version number cannot tell: gates are per cluster. Comparing what we sent with what the server
answered can, on every write, so a cluster whose gates change is seen at its next write.
"""

from __future__ import annotations

import dataclasses
import uuid

from kubernetes import client

from dra_bridge.api.compat import COMPATIBILITY_GROUPS_SINCE, SPLIT_LAYOUT_SINCE, KeptFields
from dra_bridge.apiclient import resource
from dra_bridge.apiclient.objects import raw

__all__ = ["ANNOTATION_DRA_FIELDS", "KeptFields", "observe", "probe_kept"]

PROBE_DRIVER = "doctor.vgpuctl.kubevirt.io"  # the doctor's probes: never a driver that publishes

#: Node annotation the agent sets: which DRA field families the API server keeps.
ANNOTATION_DRA_FIELDS = "vgpu.kubevirt.io/dra-fields"


def _devices(obj: dict) -> list[dict]:
    return (obj.get("spec") or {}).get("devices") or []


def _has_counters(obj: dict) -> bool:
    return bool((obj.get("spec") or {}).get("sharedCounters")) or any(d.get("consumesCounters") for d in _devices(obj))


def _has_groups(obj: dict) -> bool:
    return any(c.get("compatibilityGroups") for d in _devices(obj) for c in d.get("consumesCounters") or [])


def _has_binding(obj: dict) -> bool:
    return any(d.get("bindingConditions") for d in _devices(obj))


def _has_taints(obj: dict) -> bool:
    return any(d.get("taints") for d in _devices(obj))


def observe(kept: KeptFields, sent: dict, answer: dict) -> KeptFields:
    """``kept`` updated by one write: a family we sent is kept iff the server's answer still has it."""
    out = dataclasses.replace(kept)
    for field, has in (("counters", _has_counters), ("compatibility_groups", _has_groups),
                       ("binding_conditions", _has_binding), ("taints", _has_taints)):
        if has(sent):
            setattr(out, field, has(answer))
    return out


def _probe_slices(version: tuple[int, int], node: str, driver: str = PROBE_DRIVER) -> list[dict]:
    """Probe slices valid on ``version``: 1.34 puts counters and the devices consuming them in one
    slice; 1.35+ allows only one of the two per slice (dra.md, KEP-4815)."""
    name = f"vgpuctl-doctor-{uuid.uuid4().hex[:8]}"
    pool = {"name": name, "generation": 1, "resourceSliceCount": 1 if version < SPLIT_LAYOUT_SINCE else 2}
    counters = [{"name": "probe", "counters": {"memory": {"value": "1Gi"}}}]
    consume = {"counterSet": "probe", "counters": {"memory": {"value": "1Gi"}}}
    if version >= COMPATIBILITY_GROUPS_SINCE:
        consume["compatibilityGroups"] = ["probe"]
    device = {"name": "probe-0", "consumesCounters": [consume],
              "bindingConditions": ["vgpu.kubevirt.io/probe"], "bindingFailureConditions": ["vgpu.kubevirt.io/probe-failed"],
              "taints": [{"key": "vgpu.kubevirt.io/probe", "effect": "NoSchedule"}]}

    def body(suffix: str, spec: dict) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name + suffix},
                "spec": {"driver": driver, "nodeName": node, "pool": pool, **spec}}

    if version < SPLIT_LAYOUT_SINCE:
        return [body("", {"sharedCounters": counters, "devices": [device]})]
    return [body("-c", {"sharedCounters": counters}), body("-d", {"devices": [device]})]


def probe_kept(api_client: client.ApiClient, version: tuple[int, int], node: str = "vgpuctl-doctor-probe",
               driver: str = PROBE_DRIVER) -> KeptFields:
    """Which DRA field families the server keeps, by dry-run creates (nothing is stored). The agent
    probes as its own driver and node, the only slices its admission policy lets it write."""
    api = resource.ResourceV1Api(api_client)
    kept = KeptFields()
    for body in _probe_slices(version, node, driver):
        kept = observe(kept, body, raw(api.create_resource_slice, body, dry_run="All"))
    return kept
