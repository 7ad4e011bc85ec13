"""Names shared by the templates, the manifests in ``deploy/`` and the device plugin.

Classic resource names follow NVIDIA's kubevirt-gpu-device-plugin so that existing VMs keep
working after a migration:

* a vGPU type: ``nvidia.com/<type name, spaces -> _>`` (``GRID T4-1Q`` -> ``nvidia.com/GRID_T4-1Q``);
* a passthrough GPU: ``nvidia.com/<pci.ids device name, upper-cased, whitespace, '/' and '.'
  -> _, anything else outside [A-Z0-9_] dropped>`` (``TU104GL [Tesla T4]`` ->
  ``nvidia.com/TU104GL_TESLA_T4``).

The name parts come from :mod:`dra_bridge.deviceplugin.manager` (the device plugin that advertises
them), so the KubeVirt CR permits exactly what the plugin advertises; KubeVirt passes the
devices to virt-launcher through ``PCI_RESOURCE_<R>`` / ``MDEV_PCI_RESOURCE_<R>``
(:func:`kubevirt_env_name`).
"""

from __future__ import annotations

import re

from dra_bridge.deviceplugin.manager import DEFAULT_RESOURCE_PREFIX, normalize_prefix, passthrough_name, vgpu_type_name
from dra_bridge.pool.devices import DEFAULT_DRIVER, dns_safe, fit_dns_label, is_dns_subdomain

DRIVER = DEFAULT_DRIVER  # vgpu.kubevirt.io
#: DeviceClass of every vGPU the driver publishes (attribute ``type == "vgpu"``).
VGPU_CLASS = "vgpu.kubevirt.io"
#: DeviceClass of every whole GPU the driver offers for vfio-pci passthrough (``type == "passthrough"``).
PASSTHROUGH_CLASS = "passthrough.vgpu.kubevirt.io"

#: Node label naming the layout (a key of the layouts ConfigMap) the node agent applies.
LABEL_CONFIG = "vgpu.kubevirt.io/config"
#: Node label the agent sets: ``pending``, ``success`` or ``failed``.
LABEL_CONFIG_STATE = "vgpu.kubevirt.io/config.state"
#: NVIDIA vgpu-device-manager's equivalents, for migration.
NVIDIA_LABEL_CONFIG = "nvidia.com/vgpu.config"
NVIDIA_LABEL_CONFIG_STATE = "nvidia.com/vgpu.config.state"

#: Domain of the classic resources (the device plugin's default prefix).
RESOURCE_DOMAIN = DEFAULT_RESOURCE_PREFIX.rstrip("/")

_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _hex(v: str) -> str:
    v = v.strip().lower()
    v = v[2:] if v.startswith("0x") else v
    return v.zfill(4)


def check_resource_name(name: str) -> str:
    """``domain/name`` as Kubernetes accepts an extended resource name; ValueError otherwise."""
    domain, sep, ident = name.partition("/")
    if not sep or not is_dns_subdomain(domain) or not _RESOURCE_NAME.match(ident) or len(ident) > 63:
        raise ValueError(
            f"{name!r} is not a valid extended resource name (domain/name, name <= 63 characters "
            "of letters, digits, '-', '_', '.', starting and ending alphanumeric)"
        )
    return name


def resource_name_for_type(type_name: str, domain: str = RESOURCE_DOMAIN) -> str:
    """The classic resource of a vGPU type: ``GRID T4-1Q`` -> ``nvidia.com/GRID_T4-1Q``."""
    return check_resource_name(normalize_prefix(domain) + vgpu_type_name(type_name))


def resource_name_for_pci(device_name: str | None, domain: str = RESOURCE_DOMAIN, device_id: str = "") -> str:
    """The classic resource of a passthrough GPU, from its pci.ids device name:
    ``TU104GL [Tesla T4]`` -> ``nvidia.com/TU104GL_TESLA_T4`` (the hex device id without a name)."""
    return check_resource_name(normalize_prefix(domain) + passthrough_name(device_name, device_id))


def pci_vendor_selector(vendor_id: str, device_id: str) -> str:
    """KubeVirt's ``pciVendorSelector``: ``0x10de``, ``0x1eb8`` -> ``10DE:1EB8``."""
    return f"{_hex(vendor_id)}:{_hex(device_id)}".upper()


def kubevirt_env_name(resource_name: str, *, mdev: bool) -> str:
    """The variable virt-launcher reads for a classic resource:
    ``nvidia.com/GRID_T4-1Q`` -> ``MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q``."""
    r = resource_name.upper().replace("/", "_").replace(".", "_")
    return ("MDEV_PCI_RESOURCE_" if mdev else "PCI_RESOURCE_") + r


def profile_of(type_name: str) -> str:
    """The DRA ``profile`` attribute of a type: its short name (``NVIDIA A100-4C`` -> ``A100-4C``)."""
    parts = type_name.split()
    return parts[-1] if parts else type_name


def dns_name(prefix: str, middle: str, suffix: str = "") -> str:
    """A DNS label built from free text (cut and hashed when too long)."""
    return fit_dns_label(prefix, middle, suffix)


__all__ = [
    "DRIVER",
    "LABEL_CONFIG",
    "LABEL_CONFIG_STATE",
    "NVIDIA_LABEL_CONFIG",
    "NVIDIA_LABEL_CONFIG_STATE",
    "PASSTHROUGH_CLASS",
    "RESOURCE_DOMAIN",
    "VGPU_CLASS",
    "check_resource_name",
    "dns_name",
    "dns_safe",
    "kubevirt_env_name",
    "pci_vendor_selector",
    "profile_of",
    "resource_name_for_pci",
    "resource_name_for_type",
]
