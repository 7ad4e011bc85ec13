"""The driver's published names: what clusters, VMs and manifests depend on (see ``schema.md``).

One place for every name another component reads: the DRA driver and its DeviceClasses, the
labels on nodes and ResourceSlices, device and counter-set names, and the classic device
plugin's extended resources. Classic resource names follow NVIDIA's
kubevirt-gpu-device-plugin so that existing VMs keep working after a migration:

* a vGPU type: ``nvidia.com/<type name, spaces -> _>`` (``GRID T4-1Q`` -> ``nvidia.com/GRID_T4-1Q``);
* a passthrough GPU: ``nvidia.com/<pci.ids device name, upper-cased, whitespace, '/' and '.'
  -> _, anything else outside [A-Z0-9_] dropped>`` (``TU104GL [Tesla T4]`` ->
  ``nvidia.com/TU104GL_TESLA_T4``);

and KubeVirt hands the devices to virt-launcher through ``PCI_RESOURCE_<R>`` /
``MDEV_PCI_RESOURCE_<R>`` (:func:`resource_env_var`). Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from dra_bridge.api import DEFAULT_DRIVER as DEFAULT_DRIVER  # defined there: light for the CLI's -h
from dra_bridge.api.k8sname import fit_dns_label, is_dns_subdomain
from mdev_manager.names import is_mig_backed, short_type_name

if TYPE_CHECKING:
    from mdev_manager.models import VgpuType

# --------------------------------------------------------------------------- DRA driver

#: DeviceClass of every vGPU the driver publishes (attribute ``type == "vgpu"``).
VGPU_CLASS = "vgpu.kubevirt.io"
#: DeviceClass of every whole GPU the driver offers for vfio-pci passthrough (``type == "passthrough"``).
PASSTHROUGH_CLASS = "passthrough.vgpu.kubevirt.io"

# --------------------------------------------------------------------------- labels

#: Node label naming the layout (a key of the layouts ConfigMap) the node agent applies.
#: Where deploy/ installs the agent (the doctor's fixes name them; tests/system/test_deploy.py checks)
DEPLOY_NAMESPACE = "vgpuctl-system"
AGENT_SELECTOR = "app.kubernetes.io/name=vgpuctl-agent"

LABEL_CONFIG = "vgpu.kubevirt.io/config"
#: Node label the agent sets: ``pending``, ``success`` or ``failed``.
LABEL_CONFIG_STATE = "vgpu.kubevirt.io/config.state"
#: Node label the agent sets to the host vGPU manager's version (NVML's driver version): KubeVirt's
#: vGPU live migration (VEP 109, beta planned for 1.10) takes only nodes with the same value as targets.
LABEL_VGPU_HOST_DRIVER = "vgpu-host-driver-version.kubevirt.io/nvidia"
#: Node annotation the agent sets while any GPU is unhealthy: ``<address>: <problem>; ...`` (kubectl vgpu shows it).
ANNOTATION_HEALTH = "vgpu.kubevirt.io/health"
#: NVIDIA vgpu-device-manager's equivalents, for migration.
NVIDIA_LABEL_CONFIG = "nvidia.com/vgpu.config"
NVIDIA_LABEL_CONFIG_STATE = "nvidia.com/vgpu.config.state"
#: Node annotation the agent sets while the state label reads ``pending`` because devices in use
#: keep the node from its layout: which devices, held by whom, blocking what (removed on success).
ANNOTATION_CONFIG_REASON = "vgpu.kubevirt.io/config.reason"
#: Node annotation ``vgpuctl cordon`` writes and the agent reads (a watch of its Node): which GPUs of
#: the node (PCI address, or ``*`` for all) take no new allocation (``dra_bridge/pool/cordon.py``).
ANNOTATION_CORDON = "vgpu.kubevirt.io/cordon"
#: Node annotation the agent sets once its slices publish a cordon: the cordon annotation's value it
#: acted on (absent: none), so ``vgpuctl cordon`` and ``uncordon`` know when the change took effect.
ANNOTATION_CORDON_APPLIED = "vgpu.kubevirt.io/cordon.applied"
#: The device taint key of a cordoned GPU's devices, and of the DeviceTaintRule of a cordoned node;
#: a claim tolerating it may still use the GPU (a test workload after a driver upgrade).
TAINT_KEY_CORDON = "vgpu.kubevirt.io/cordon"
#: KubeVirt's label on a virt-launcher pod naming its VM (``kubevirtv1.VirtualMachineNameLabel``).
LABEL_VM_NAME = "vm.kubevirt.io/name"

#: ResourceSlice labels: a publisher finds its own slices by them.
LABEL_DRIVER = "vgpu.kubevirt.io/driver"
LABEL_NODE = "vgpu.kubevirt.io/node"
LABEL_POOL = "vgpu.kubevirt.io/pool"
LABEL_ROLE = "vgpu.kubevirt.io/slice-role"  # combined | counters | devices
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "vgpuctl"

# --------------------------------------------------------------------------- DRA devices


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-counter-set"


def passthrough_device_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-passthrough"


def vgpu_device_name(gpu_index: int, type_part: str, k: int) -> str:
    """The ``k``-th device of a vGPU type on a GPU (``gpu-0-vgpu-t4-1q-3``), cut to a DNS label."""
    return fit_dns_label(f"gpu-{gpu_index}-vgpu-", type_part, f"-{k}")


def mig_device_name(gpu_index: int, profile: str, profile_id: int, start: int) -> str:
    """A MIG-backed vGPU's placement, named as NVIDIA's DRA driver names MIG devices
    (kubernetes-sigs/dra-driver-nvidia-gpu, ``MigSpecTuple.ToCanonicalName``):
    ``gpu-<i>-mig-<profile without dots, '+' as '-'>-<GI profile id>-<placement start>``
    (``gpu-0-mig-3g20gb-9-4``); the id tells ``+me`` and ``-me`` profiles apart."""
    pname = re.sub(r"[^a-z0-9-]+", "-", profile.lower().replace(".", "")).strip("-")
    return fit_dns_label(f"gpu-{gpu_index}-mig-", pname, f"-{profile_id}-{start}")


def mixed_device_name(gpu_index: int, fb_mib: int, placement: int) -> str:
    """A vGPU placement of a GPU in mixed-size mode: ``gpu-<i>-vgpu-<size>-at-<placement id>``, the
    size as size slots write it (``8gb``, ``512mb``) and the id the first 1 GiB slot it holds
    (``gpu-0-vgpu-8gb-at-16``): the name says where it sits, and ``-at-`` keeps it apart from the
    size slots' ``gpu-<i>-vgpu-<size>-<k>`` of an equal-size GPU."""
    size = f"{fb_mib // 1024}gb" if fb_mib % 1024 == 0 else f"{fb_mib}mb"
    return fit_dns_label(f"gpu-{gpu_index}-vgpu-", size, f"-at-{placement}")


def compatibility_group(fb_mib: int) -> str:
    """The equal-size group of a vGPU type: one group per framebuffer size."""
    return f"fb-{fb_mib}"


def profile_of(type_name: str) -> str:
    """The DRA ``profile`` attribute of a type: its short name (``NVIDIA A100-4C`` -> ``A100-4C``)."""
    return short_type_name(type_name)


def type_is_mig_backed(t: VgpuType) -> bool:
    """A MIG-backed type takes a GPU instance whole: published only as a MIG placement (never as a
    time-sliced slot), by the driver's word or NVIDIA's name grammar (``A100-3-20C``)."""
    return t.mig_backed or is_mig_backed(t.name)


# --------------------------------------------------------------------------- classic device plugin

DEFAULT_RESOURCE_PREFIX = "nvidia.com/"
#: Domain of the classic resources (the device plugin's default prefix).
RESOURCE_DOMAIN = DEFAULT_RESOURCE_PREFIX.rstrip("/")
MDEV_ENV_PREFIX = "MDEV_PCI_RESOURCE_"
PCI_ENV_PREFIX = "PCI_RESOURCE_"

ResourceKind = Literal["mdev", "pci"]  # which environment variable virt-launcher reads

_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def normalize_prefix(prefix: str) -> str:
    """``nvidia.com`` or ``nvidia.com/`` -> ``nvidia.com/``; ValueError unless a DNS subdomain."""
    domain = prefix.strip().removesuffix("/")
    if not domain or not is_dns_subdomain(domain):
        raise ValueError(f"resource prefix {prefix!r}: expected a DNS domain such as nvidia.com/")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain == "k8s.io" or domain.endswith(".k8s.io"):
        raise ValueError(f"resource prefix {prefix!r}: extended resources cannot use the {domain} domain")
    return domain + "/"


def is_valid_name_part(name: str) -> bool:
    """The part after ``/`` of an extended resource name (a qualified name's name part)."""
    return bool(_NAME_PART.match(name))


def _tidy(name: str) -> str:
    """Make a name part valid: other characters to ``_``, ends trimmed, at most 63 characters."""
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    s = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", s)
    s = re.sub(r"[^A-Za-z0-9]+$", "", s[:63])
    return s


def nvidia_device_name(pci_ids_name: str) -> str:
    """A pci.ids device name as NVIDIA's kubevirt plugin turns it into a resource name.

    Upper-cased; ``/`` and ``.`` become ``_``; each run of whitespace one ``_``; then
    every character other than ``A-Z``, ``0-9``, ``_`` is dropped (brackets, dashes,
    parentheses): ``TU104GL [Tesla T4]`` -> ``TU104GL_TESLA_T4``,
    ``GA100 [A100 PCIe 40GB]`` -> ``GA100_A100_PCIE_40GB``.
    """
    s = pci_ids_name.strip().upper().replace("/", "_").replace(".", "_")
    s = re.sub(r"\s+", "_", s)
    return re.sub(r"[^A-Z0-9_]+", "", s)


def passthrough_name(product_name: str | None, device_id: str) -> str:
    """Name part for a passthrough GPU model; the hex device id (``1eb8``) without a usable name."""
    hex_id = device_id.strip().lower().removeprefix("0x")
    if product_name:
        name = nvidia_device_name(product_name)
        if not is_valid_name_part(name):
            name = _tidy(name)
        if name:
            return name
    return hex_id


def vgpu_type_name(type_name: str) -> str:
    """Name part for a vGPU type: runs of whitespace to ``_`` (``GRID T4-1Q`` -> ``GRID_T4-1Q``).

    Anything still invalid in a resource name becomes ``_`` (NVIDIA's plugin would fail
    to register such a name, so no existing VM can depend on it).
    """
    name = re.sub(r"\s+", "_", type_name.strip())
    return name if is_valid_name_part(name) else _tidy(name)


def resource_env_var(resource_name: str, kind: ResourceKind) -> str:
    """``nvidia.com/GRID_T4-1Q`` -> ``MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q`` (kind mdev),
    ``nvidia.com/TU104GL_TESLA_T4`` -> ``PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4`` (kind pci):
    upper-cased, ``/`` and ``.`` to ``_``, dashes kept, as KubeVirt builds the name."""
    suffix = resource_name.upper().replace("/", "_").replace(".", "_")
    return (MDEV_ENV_PREFIX if kind == "mdev" else PCI_ENV_PREFIX) + suffix


def check_resource_name(name: str) -> str:
    """``domain/name`` as Kubernetes accepts an extended resource name; ValueError otherwise."""
    domain, sep, ident = name.partition("/")
    if not sep or not is_dns_subdomain(domain) or not is_valid_name_part(ident):
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
