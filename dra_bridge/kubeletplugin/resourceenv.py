"""The environment variable KubeVirt's virt-launcher reads for a classic resource, set by CDI.

A VM written for device plugins (``gpus: [{deviceName: nvidia.com/GRID_T4-2Q}]``) makes
virt-launcher's pod ask for the extended resource ``nvidia.com/GRID_T4-2Q``; with a DeviceClass
that maps that name (KEP-5004 ``extendedResourceName``) the scheduler allocates it from our
devices, and virt-launcher then looks for the devices where a device plugin would have put them:
``MDEV_PCI_RESOURCE_<R>`` (mdev UUIDs) or ``PCI_RESOURCE_<R>`` (PCI addresses), comma-separated,
``<R>`` mangled as KubeVirt's ``ResourceNameToEnvVar`` (../shared/reference/kubevirt.md). Every
device of a resource in the claim carries the whole list, so the runtime's merge order does not
matter. Pure.
"""

from __future__ import annotations

from dra_bridge.api.names import resource_env_var
from dra_bridge.kubeletplugin.claimconfig import requested_resource
from dra_bridge.kubeletplugin.state import ClaimRecord

#: kube-scheduler's mark on the claim it makes for a pod's extended resources (KEP-5004).
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def resource_env(rec: ClaimRecord, claim: dict, driver: str) -> dict[str, list[str]]:
    """device name -> ``NAME=value`` entries, for the devices whose config names a classic resource,
    in a claim the scheduler made for extended resources (a DRA-native claim of the same class
    reads the KEP-5304 metadata instead, and gets no variable)."""
    if EXTENDED_RESOURCE_CLAIM not in ((claim.get("metadata") or {}).get("annotations") or {}):
        return {}
    by_var: dict[str, list[tuple[str, str]]] = {}  # variable -> (device, host id)
    for d in rec.devices:
        name = requested_resource(claim, d.request, driver)
        if name is None:
            continue
        mdev = d.kind == "vgpu" and d.framework == "mdev"
        host_id = d.vgpu_id if d.kind == "vgpu" else d.gpu  # an mdev's UUID, a VF's or a GPU's address
        if host_id:
            by_var.setdefault(resource_env_var(name, "mdev" if mdev else "pci"), []).append((d.device, host_id))
    out: dict[str, list[str]] = {}
    for var, pairs in sorted(by_var.items()):
        value = ",".join(h for _, h in pairs)
        for device, _ in pairs:
            out.setdefault(device, []).append(f"{var}={value}")
    return out
