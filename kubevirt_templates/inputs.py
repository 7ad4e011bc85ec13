"""Typed inputs of the templates: a wrong value fails here, naming the field and the fix."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from dra_bridge.api.k8sname import is_dns_label, is_dns_subdomain
from dra_bridge.api.names import (
    DEFAULT_DRIVER,
    PASSTHROUGH_CLASS,
    RESOURCE_DOMAIN,
    VGPU_CLASS,
    check_resource_name,
    normalize_prefix,
    profile_of,
)
from dra_bridge.api.quantity import parse_quantity
from kubevirt_templates.names import shared_type_problem
from mdev_manager.catalog import known_type, namesakes
from mdev_manager.models import Inventory

DEFAULT_IMAGE = "quay.io/containerdisks/fedora:latest"
DEFAULT_POD_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
MAX_FIRST_AVAILABLE = 8  # sub-requests per request (API limit)

# A profile is a vGPU type's short name (T4-1Q, A100-4C, GVTg_V5_4) or its full name.
_PROFILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}$")
# A product is a pci.ids device name (TU104GL [Tesla T4]).
_PRODUCT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+,:/()\[\]-]{0,63}$")
_ENV_FEATURE_GATE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def _dns_label(v: str, field: str) -> str:
    if not is_dns_label(v):
        raise ValueError(
            f"{field}: {v!r} is not a DNS label (lower-case letters, digits and '-', at most 63, "
            "starting and ending with a letter or digit)"
        )
    return v


def _dns_subdomain(v: str, field: str) -> str:
    if not is_dns_subdomain(v) or len(v) > 63:
        raise ValueError(f"{field}: {v!r} is not a DNS subdomain of at most 63 characters")
    return v


def _profile(v: str, field: str) -> str:
    if not isinstance(v, str) or not _PROFILE.match(v):
        raise ValueError(
            f"{field}: {v!r} is not a vGPU profile; use a type's short name such as A100-4C or T4-1Q "
            "(letters, digits, ' ', '.', '_', '+', '-')"
        )
    return profile_of(v)


def _type_ref(v: str, field: str) -> str:
    """A profile as given: a full type name kept whole, as a device-plugin resource is named after it."""
    _profile(v, field)
    return v


def _quantity(v: str, field: str, *, positive: bool = True) -> str:
    try:
        q = parse_quantity(str(v))
    except ValueError:
        raise ValueError(f"{field}: {v!r} is not a Kubernetes quantity; write e.g. 8Gi or 4096Mi") from None
    if positive and q <= 0:
        raise ValueError(f"{field}: {v!r} must be greater than zero")
    return str(v)


def _resource_domain(v: str) -> str:
    try:
        return normalize_prefix(v).rstrip("/")
    except ValueError as exc:
        raise ValueError(f"resource_domain: {exc}") from None


def _product(v: str, field: str) -> str:
    if not _PRODUCT.match(v):
        raise ValueError(f"{field}: {v!r} is not a GPU product name such as 'TU104GL [Tesla T4]'")
    return v


# Strings checked where they are declared; each error names its field (pydantic's info.field_name).
DnsLabel = Annotated[str, AfterValidator(lambda v, info: _dns_label(v, info.field_name))]
DnsSubdomain = Annotated[str, AfterValidator(lambda v, info: _dns_subdomain(v, info.field_name))]
Profile = Annotated[str, AfterValidator(lambda v, info: _profile(v, info.field_name))]
TypeRef = Annotated[str, AfterValidator(lambda v, info: _type_ref(v, info.field_name))]
Quantity = Annotated[str, AfterValidator(lambda v, info: _quantity(v, info.field_name))]
Product = Annotated[str, AfterValidator(lambda v, info: _product(v, info.field_name))]
ResourceDomain = Annotated[str, AfterValidator(_resource_domain)]


class DraNames(_Input):
    """Which driver and DeviceClasses DRA objects refer to."""

    driver: DnsSubdomain = Field(DEFAULT_DRIVER, description="DRA driver name")
    vgpu_class: DnsSubdomain = Field(VGPU_CLASS, description="DeviceClass selecting the driver's vGPUs")
    passthrough_class: DnsSubdomain = Field(PASSTHROUGH_CLASS, description="DeviceClass selecting whole GPUs for passthrough")


class DeviceClassesInput(DraNames):
    """The two DeviceClasses of the driver, and one per vGPU type listed in ``profiles``
    (``vgpu-t4-2q``): its slots, and the opaque VgpuConfig that makes a slot that type, so a
    claim that names the class needs no selector and no config of its own."""

    profiles: list[TypeRef] = Field([], description="vGPU types to give a DeviceClass each (short names, e.g. T4-2Q; "
                                    "a GPU-instance profile such as 1g.5gb too; with extended_resources, a name two "
                                    "boards share (DC-8C) as the driver's full name, or with --inventory)")
    products: list[Product] = Field([], description="GPU products to give a whole-GPU DeviceClass each (pci.ids "
                                    "names, e.g. 'TU104GL [Tesla T4]')")
    extended_resources: bool = Field(False, description=(
        "map each per-type and per-product class to the classic resource name (KEP-5004 extendedResourceName, "
        "Kubernetes 1.36+: nvidia.com/GRID_T4-2Q, nvidia.com/TU104GL_TESLA_T4) and the whole-GPU class to "
        "vfio_resource; VMs with gpus[].deviceName and pods asking for those resources are then served by DRA, "
        "on the same counters"))
    resource_domain: ResourceDomain = Field(RESOURCE_DOMAIN, description="the classic resources' prefix")
    vfio_resource: str = Field("vfio-device", description="extended_resources: the name (under resource_domain) "
                               "of any whole GPU")

    @model_validator(mode="after")
    def _classic_names(self) -> DeviceClassesInput:
        if self.extended_resources:
            named: dict[str, str] = {}  # the class (short name) -> the full name its resource is named after
            for p in self.profiles:
                full, short = classic_type_name(p, "profiles"), profile_of(p)
                if named.setdefault(short, full) != full:
                    raise ValueError(f"profiles: {named[short]!r} and {full!r} are both {short}, one DeviceClass "
                                     "mapped to one device-plugin resource; list one of them")
            check_resource_name(f"{self.resource_domain}/{self.vfio_resource}")
        return self


class ClaimTemplateInput(DraNames):
    """A ResourceClaimTemplate for one device: a vGPU by profile, by minimum memory, the first
    available of several profiles, or a whole GPU for passthrough (optionally of one product)."""

    name: DnsLabel | None = Field(None, description="the template's name; unset: from the selection "
                                  "(vgpu-a100-4c, vgpu-min-8gi, ...)")
    namespace: DnsLabel = Field("default", description="namespace of the template")
    profile: Profile | None = Field(None, description="select a vGPU of this type (short name, e.g. A100-4C; "
                                    "checked against the catalog or the node), or by any profile a device publishes: "
                                    "a GPU-instance profile (1g.5gb) its MIG placements, a GPU model that whole GPU")
    min_memory: Quantity | None = Field(None, description="select any vGPU with at least this framebuffer, e.g. 8Gi")
    first_available: list[str] | None = Field(None, description="select the first available of these vGPU types, "
                                              f"in order of preference (at most {MAX_FIRST_AVAILABLE})")
    gpu_memory: StrictInt | None = Field(None, gt=0, description=(
        "KAI Scheduler's gpu-memory: MiB of framebuffer; the smallest vGPU with at least that much, by "
        "firstAvailable over the sizes in ascending order (the hypervisor enforces it, unlike a fraction of a "
        "shared GPU)"))
    gpu_fraction: float | None = Field(None, gt=0, le=1, description=(
        "KAI Scheduler's gpu-fraction: this share of the framebuffer of a GPU of `product` (needs product), "
        "then as gpu_memory"))
    passthrough: bool = Field(False, description="select a whole GPU (vfio-pci) instead of a vGPU")
    product: Product | None = Field(None, description="passthrough, gpu_memory or gpu_fraction: the GPU's pci.ids "
                                    "name, e.g. 'TU104GL [Tesla T4]'; unset: any GPU")
    request_name: DnsLabel | None = Field(None, description="the request's name (a VM's requestName); unset: vgpu, "
                                          "or gpu for passthrough")

    @field_validator("first_available")
    @classmethod
    def _first(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if not 1 <= len(v) <= MAX_FIRST_AVAILABLE:
            raise ValueError(f"first_available: list at least 1 and at most {MAX_FIRST_AVAILABLE} profiles (got {len(v)})")
        out = [_profile(p, f"first_available[{i}]") for i, p in enumerate(v)]
        if len(set(out)) != len(out):
            raise ValueError(f"first_available: profiles repeat: {out}")
        return out

    @model_validator(mode="after")
    def _one(self) -> ClaimTemplateInput:
        chosen = [k for k in ("profile", "min_memory", "first_available", "gpu_memory", "gpu_fraction")
                  if getattr(self, k) is not None]
        chosen += ["passthrough"] if self.passthrough else []
        if len(chosen) != 1:
            raise ValueError(
                "choose exactly one of profile, min_memory, first_available, gpu_memory, gpu_fraction or "
                "passthrough: true" + (f" (got {', '.join(chosen)})" if chosen else "")
            )
        if self.product is not None and not (self.passthrough or chosen[0] in ("gpu_memory", "gpu_fraction")):
            raise ValueError("product: only passthrough, gpu_memory and gpu_fraction claims select by product; "
                             "use profile for vGPUs")
        if self.gpu_fraction is not None and self.product is None:
            raise ValueError("gpu_fraction: a fraction of which GPU? set product (e.g. 'AD102GL [L40S]'), "
                             "or give gpu_memory in MiB")
        return self


class VmInput(DraNames):
    """A VirtualMachine with vGPUs and/or a passthrough GPU, booting a containerDisk with cloud-init."""

    name: DnsLabel = Field(description="the VM's name (a DNS label)")
    namespace: DnsLabel = Field("default", description="namespace of the VM (and its claim templates)")
    mode: Literal["classic", "dra"] = Field(
        "classic", description="classic: device-plugin resources (gpus[].deviceName); dra: resource claims"
    )
    gpus: dict[str, StrictInt] = Field(
        default_factory=dict, json_schema_extra={"key": "TYPE"},
        description="how many vGPUs of this type (gpus.A100-4C=1; any case; checked against the catalog, or "
        "the node's types with --simulate / --inventory)")
    passthrough: str | None = Field(
        None,
        description="a whole GPU: its pci.ids name ('TU104GL [Tesla T4]'); in classic mode a resource "
        "name (nvidia.com/TU104GL_TESLA_T4) works too",
    )
    passthrough_count: int = Field(1, ge=1, le=8, description="how many such whole GPUs (1-8)")
    display: bool | None = Field(
        None, description="true: a display on every vGPU, the boot framebuffer (ramfb) on the first only "
        "(KubeVirt allows one); false: none; unset: KubeVirt's default (display and ramfb on the first vGPU)")
    ramfb: bool | None = Field(
        None, description="the boot framebuffer (ramFB), on the first vGPU's display only, as KubeVirt refuses "
        "it on more than one; unset: KubeVirt's default (on)")
    cpus: int = Field(2, ge=1, le=512, description="virtual CPU cores (1-512)")
    memory: Quantity = Field("4Gi", description="guest memory (a Kubernetes quantity)")
    image: str = Field(DEFAULT_IMAGE, description="containerDisk image the VM boots")
    user_data: str | None = Field(None, description="cloud-init user data; unset: a #cloud-config listing the GPUs")
    ssh_authorized_keys: list[str] = Field(default_factory=list, description="SSH public keys for the default user")
    password: str | None = Field(None, description="password of the image's default user (console login)")
    run_strategy: Literal["Always", "Halted", "Manual", "RerunOnFailure", "Once"] = Field(
        "Always", description="the VM's runStrategy")
    resource_domain: ResourceDomain = Field(RESOURCE_DOMAIN, description="classic mode: the device plugin's resource prefix")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: dict[str, int]) -> dict[str, int]:
        for profile, n in v.items():
            _profile(profile, f"gpus.{profile}")
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 16:
                raise ValueError(f"gpus.{profile}: count {n!r} must be a whole number from 1 to 16")
        return v

    @field_validator("passthrough")
    @classmethod
    def _pt(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if "/" in v and " " not in v and "[" not in v:
            check_resource_name(v)
            return v
        return _product(v, "passthrough")

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError(f"image: {v!r} is not a container image reference")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> VmInput:
        if not self.gpus and not self.passthrough:
            raise ValueError("gpus or passthrough: the VM needs at least one vGPU or a passthrough GPU")
        if (self.display is not None or self.ramfb is not None) and not self.gpus:
            raise ValueError("display/ramfb: these options apply to vGPUs (gpus), and the VM has none")
        if self.ramfb and self.display is False:
            raise ValueError("ramfb: the boot framebuffer needs the vGPU display; set display: true or drop ramfb")
        if self.mode == "dra" and self.passthrough and "/" in self.passthrough and "[" not in self.passthrough:
            raise ValueError(
                f"passthrough: {self.passthrough!r} is a device-plugin resource name; in dra mode give the "
                "GPU's product name (the productName attribute), e.g. 'TU104GL [Tesla T4]'"
            )
        if self.mode == "classic":
            for profile in self.gpus:
                classic_type_name(profile, "gpus")
        return self


def classic_type_name(profile: str, field: str = "gpus") -> str:
    """The full type name a classic resource is named after (``T4-1Q`` -> ``GRID T4-1Q``), from the
    catalog: no GPU is known here, so a short name two boards share is refused (the render's check
    against a node's inventory writes it as that node's full name first)."""
    if " " in profile:
        return profile
    shared = namesakes(profile)
    if len({t.name for _, t in shared}) > 1:
        raise ValueError(shared_type_problem(f"{field}.{profile}", profile,
                                             [(f"{b.key} (PCI device {b.device_id})", t.name) for b, t in shared],
                                             "in vgpuctl's catalog", inventory=True))
    t = known_type(profile)
    if t is not None:
        return t.name
    if "_" in profile:  # Intel GVT-g names (GVTg_V5_4) are their own full name
        return profile
    raise ValueError(
        f"{field}.{profile}: the device-plugin resource is named after the full type name, which is "
        f"not known for {profile!r}; write it as the driver prints it (mdev_type/name), e.g. 'GRID T4-1Q'"
    )


class PassthroughPodInput(DraNames):
    """A Pod that gets a whole GPU bound to vfio-pci through a claim (a DPDK-style user-space driver)."""

    name: DnsLabel = Field("vfio-gpu", description="the Pod's name")
    namespace: DnsLabel = Field("default", description="namespace of the Pod (and its claim template)")
    image: str = Field(DEFAULT_POD_IMAGE, description="the container's image")
    product: Product | None = Field(None, description="pci.ids name of the GPU; unset: any passthrough GPU")
    claim_template: DnsLabel | None = Field(None, description="an existing ResourceClaimTemplate; unset: render one")
    command: list[str] = Field(
        description="the container's command", json_schema_extra={"shown_default": "list /dev/vfio and the "
                                                                   "device metadata, then sleep"},
        default_factory=lambda: [
            "sh", "-c",
            "ls -l /dev/vfio; cat /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/*/*/*-metadata.json; "
            "sleep 3600",
        ]
    )


class KubeVirtCrInput(_Input):
    """KubeVirt CR settings for GPUs managed by vgpuctl, from the inventories of the GPU nodes."""

    name: DnsLabel = Field("kubevirt", description="the KubeVirt CR's name")
    namespace: DnsLabel = Field("kubevirt", description="the KubeVirt CR's namespace")
    inventories: list[Inventory] = Field(default_factory=list, description="`vgpuctl discover -o yaml` of each GPU "
                                         "node (give them with --inventory FILE, or --simulate)")
    classic: bool = Field(True, description="permit the device-plugin resources (permittedHostDevices)")
    dra: bool = Field(False, description="enable the DRA feature gates (GPUsWithDRA, HostDevicesWithDRA)")
    passthrough: bool = Field(True, description="permit whole GPUs (pciHostDevices)")
    vgpus: bool = Field(True, description="permit vGPU types (mediatedDevices; vendor-VFIO types as pciHostDevices)")
    types: list[str] | None = Field(None, description="only these vGPU types (id, full or short name); unset: all")
    include_mig_backed: bool = Field(False, description="also permit MIG-backed vGPU types (need MIG on the GPU)")
    vgpu_live_migration: bool = Field(False, description=(
        "enable KubeVirt's vGPU live migration (VGPULiveMigration, alpha in 1.9, with TargetSideMigrationHooks): "
        "mdev vGPUs of the device-plugin path only, one per VM; DRA-allocated devices cannot migrate yet (VEP 10). "
        "Without inventories the patch leaves permittedHostDevices as the CR has them"))
    extra_feature_gates: list[str] = Field(default_factory=list, description="gates already enabled that must stay")
    resource_domain: ResourceDomain = Field(RESOURCE_DOMAIN, description="the device plugin's resource prefix")

    @field_validator("extra_feature_gates")
    @classmethod
    def _gates(cls, v: list[str]) -> list[str]:
        for g in v:
            if not _ENV_FEATURE_GATE.match(g):
                raise ValueError(f"extra_feature_gates: {g!r} is not a feature gate name (CamelCase)")
        return v

    @model_validator(mode="after")
    def _some(self) -> KubeVirtCrInput:
        if not self.classic and not self.dra:
            raise ValueError("classic or dra: enable at least one way for VMs to get GPUs")
        if self.vgpu_live_migration and not self.classic:
            raise ValueError("vgpu_live_migration: KubeVirt migrates vGPUs of the device-plugin path (classic) only; "
                             "DRA-allocated devices cannot migrate yet (KubeVirt VEP 10): set classic: true")
        # turning live migration on in a CR already set up (a merge patch: without inventories it carries
        # no permittedHostDevices and keeps the CR's own) needs no inventory; setting classic up does
        if self.classic and not self.inventories and not self.vgpu_live_migration:
            raise ValueError(
                "inventories: classic resources are generated from the GPU nodes' inventories; pass "
                "`vgpuctl discover -o yaml` output (or --simulate), or set classic: false"
            )
        return self


__all__ = [
    "ClaimTemplateInput",
    "DEFAULT_IMAGE",
    "DEFAULT_POD_IMAGE",
    "DeviceClassesInput",
    "DraNames",
    "KubeVirtCrInput",
    "PassthroughPodInput",
    "VmInput",
    "classic_type_name",
]
