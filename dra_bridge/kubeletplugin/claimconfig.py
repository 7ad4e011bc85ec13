"""Which vGPU type a claim asks for: its opaque device configuration (``VgpuConfig``).

A time-sliced device is a size slot that several types share (``T4-2A``, ``T4-2B``, ``T4-2Q``);
the claim picks one with an opaque configuration for this driver, which the scheduler copies into
``status.allocation.devices.config`` (from the claim, and from its DeviceClass):

    config:
      - requests: [vgpu]            # or [vgpu/t4-2a] for one firstAvailable alternative; none: all
        opaque:
          driver: vgpu.kubevirt.io
          parameters: {apiVersion: vgpu.kubevirt.io/v1alpha1, kind: VgpuConfig, vgpuType: T4-2A}

``resourceName`` (a DeviceClass with ``extendedResourceName`` carries it) names the classic
resource the devices stand for, for the environment variable virt-launcher reads.
Entries apply in order and a later one wins, as for every DRA driver (KEP-4381: class config
first, then the claim's). Without one, the slot's default type (its ``profile``) is made. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator

from dra_bridge.api.names import check_resource_name

VGPU_CONFIG_API = "vgpu.kubevirt.io/v1alpha1"
VGPU_CONFIG_KIND = "VgpuConfig"


class VgpuConfigError(ValueError):
    """An opaque configuration for this driver that is not a VgpuConfig this driver reads."""


def _params(claim: dict, request: str, driver: str) -> Iterator[tuple[str, dict]]:
    """(where, parameters) of each allocated VgpuConfig for ``request``, in order (a later one wins)."""
    configs = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("config")) or []
    parent = request.split("/", 1)[0]
    for i, c in enumerate(configs):
        opaque = (c or {}).get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = c.get("requests") or []
        if requests and request not in requests and parent not in requests:
            continue
        params = opaque.get("parameters") or {}
        where = f"status.allocation.devices.config[{i}].opaque.parameters"
        if params.get("kind") != VGPU_CONFIG_KIND or params.get("apiVersion") != VGPU_CONFIG_API:
            raise VgpuConfigError(f"{where}: this driver reads apiVersion {VGPU_CONFIG_API}, kind {VGPU_CONFIG_KIND}; "
                                  f"got {params.get('apiVersion')!r}, {params.get('kind')!r}")
        extra = sorted(set(params) - {"apiVersion", "kind", "vgpuType", "resourceName"})
        if extra:
            raise VgpuConfigError(f"{where}: unknown field {extra[0]!r} (VgpuConfig has vgpuType and resourceName)")
        for key in ("vgpuType", "resourceName"):
            if key in params and (not isinstance(params[key], str) or not params[key]):
                raise VgpuConfigError(f"{where}.{key}: " + ("name the vGPU type, e.g. T4-2Q" if key == "vgpuType"
                                                            else "name the extended resource, e.g. nvidia.com/GRID_T4-2Q"))
        if "vgpuType" not in params and "resourceName" not in params:
            raise VgpuConfigError(f"{where}.vgpuType: name the vGPU type, e.g. T4-2Q")
        yield where, params


def requested_type(claim: dict, request: str, driver: str) -> str | None:
    """The ``vgpuType`` the allocated config gives ``request`` (``vgpu`` or ``vgpu/t4-2a``), or None."""
    chosen = None
    for _, params in _params(claim, request, driver):
        chosen = params.get("vgpuType", chosen)
    return chosen


def requested_resource(claim: dict, request: str, driver: str) -> str | None:
    """The classic extended resource name (``nvidia.com/GRID_T4-2Q``) the config says ``request``'s
    devices stand for: a DeviceClass mapping that name (KEP-5004 ``extendedResourceName``) carries
    it, so prepare can set the variable KubeVirt's virt-launcher reads for it."""
    chosen = None
    for where, params in _params(claim, request, driver):
        if "resourceName" in params:
            try:
                chosen = check_resource_name(params["resourceName"])
            except ValueError as exc:
                raise VgpuConfigError(f"{where}.resourceName: {exc}") from None
    return chosen


def pick_type(choices: dict[str, str], default: str, wanted: str | None, device: str) -> str:
    """The type id to make on a slot: ``wanted`` (short name, full name or id) among ``choices``."""
    if wanted is None:
        return default
    low = wanted.lower()
    for short, tid in choices.items():
        if low in (short.lower(), tid.lower()) or low.endswith(" " + short.lower()):
            return tid
    offered = ", ".join(choices) or "its default type only"
    raise VgpuConfigError(f"vgpuType {wanted!r} is not offered by device {device}; it offers {offered}")
