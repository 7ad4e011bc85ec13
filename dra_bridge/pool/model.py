"""The DRA pool's data: per-GPU policy, counter sets, devices, and the small helpers that
format their attributes and quantities. Shared by :mod:`.devices` (time-sliced GPUs, the
builder) and :mod:`.mig` (GPUs in MIG mode). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dra_bridge.api.attributes import ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT  # noqa: F401  (re-exported)
from dra_bridge.api.k8sname import truncate_utf8
from dra_bridge.api.names import type_is_mig_backed
from mdev_manager.models import Gpu, MigPlacement, VgpuType
from mdev_manager.names import check_pci_address, framebuffer_mib_from_name, short_type_name

AttrKey = Literal["string", "int", "bool", "version"]
#: A device attribute value: exactly one of ``{"string": s}``, ``{"int": i}``, ``{"bool": b}``,
#: ``{"version": semver}`` (the ResourceSlice wire form).
AttrValue = dict[AttrKey, str | int | bool]


#: NVIDIA's chip-name prefixes (the first word of the PCI database's product name, ``GA100``)
#: and the architecture NVML reports for them, spelled as NVIDIA's DRA driver publishes its
#: ``architecture`` attribute (NVIDIA/go-nvlib ``pkg/nvlib/device``: ``GetArchitectureAsString``).
NVIDIA_ARCHITECTURES = {"GK": "Kepler", "GM": "Maxwell", "GP": "Pascal", "GV": "Volta", "TU": "Turing",
                        "GA": "Ampere", "AD": "Ada Lovelace", "GH": "Hopper", "GB": "Blackwell"}


def nvidia_architecture(vendor_id: str | None, product_name: str | None) -> str | None:
    """The architecture of an NVIDIA GPU from its chip name (``GH100 [H100 PCIe]`` -> Hopper);
    None when the name does not start with a known chip (a card without a pci.ids entry)."""
    if (vendor_id or "").lower() not in ("0x10de", "10de") or not product_name:
        return None
    chip = product_name.split()[0]
    if len(chip) < 4 or not chip[2:5].rstrip("GLM").isdigit():
        return None
    return NVIDIA_ARCHITECTURES.get(chip[:2])


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- policy


class GpuPolicy(_Model):
    """What one physical GPU offers through DRA."""

    passthrough: bool = Field(
        True,
        description="offer the whole GPU (vfio-pci passthrough); it consumes all of the GPU's "
        "counters, so it is only allocatable while no vGPU of that GPU is allocated",
    )
    vgpu_types: list[str] | None = Field(
        None,
        description="types to offer, by id, full name or short name (in priority order); "
        "None = every type of the GPU's mode (time-sliced, or MIG-backed in MIG mode); [] = no vGPUs",
    )
    equal_size_fb_mib: int | None = Field(
        None,
        gt=0,
        description="framebuffer size (MiB) the node manager configured the GPU for; on servers "
        "< 1.37 only types of this size are published",
    )
    mixed_size: bool = Field(
        False,
        description="the GPU runs in mixed-size mode: vGPUs of different framebuffer sizes may "
        "share it (no equal-size restriction, no compatibility groups)",
    )
    outside_vgpus: list[str] = Field(
        default_factory=list,
        description="ids of the time-sliced vGPUs on the GPU that no prepared claim holds (made by hand, "
        "or in use where the layout wanted them gone): they consume the GPU's counters as an allocated "
        "slot of their type would (their slots, in mixed-size mode), so the scheduler never allocates "
        "their room",
    )
    mig_auto: bool = Field(
        False,
        description="a MIG-capable GPU offers its MIG-backed and its time-sliced vGPUs at once, "
        "kept apart by compatibility groups (servers that keep them; else its current mode only); "
        "the first claim prepared on the empty GPU sets its MIG mode",
    )


class PoolPolicy(_Model):
    """Per-GPU offer, keyed by the GPU's PCI address; ``others`` applies to unlisted GPUs."""

    gpus: dict[str, GpuPolicy] = Field(default_factory=dict)
    others: GpuPolicy | None = Field(None, description="policy for GPUs not in `gpus`; None = not offered")

    @field_validator("gpus")
    @classmethod
    def _normalise_addresses(cls, v: dict[str, GpuPolicy]) -> dict[str, GpuPolicy]:
        out: dict[str, GpuPolicy] = {}
        for addr, pol in v.items():
            key = check_pci_address(addr, "gpus")
            if key in out:
                raise ValueError(f"gpus: {addr!r} listed twice")
            out[key] = pol
        return out

    @classmethod
    def default(cls, *, passthrough: bool = True) -> PoolPolicy:
        """Offer everything: every GPU, every time-sliced type, and (unless turned off) passthrough.

        Passthrough is a flag, not inferred from the vGPUs present: the GPU's counter set already
        keeps the scheduler from allocating the whole GPU while any of its vGPUs is allocated,
        and inferring it would make the published pool flap as claims come and go.
        """
        return cls(others=GpuPolicy(passthrough=passthrough))

    def for_gpu(self, address: str) -> GpuPolicy | None:
        return self.gpus.get(address.lower(), self.others)


# --------------------------------------------------------------------------- pool


class CounterSet(_Model):
    name: str
    counters: dict[str, int | str]


class Consumption(_Model):
    counter_set: str
    counters: dict[str, str]
    compatibility_groups: list[str] = Field(
        default_factory=list, description="published only to servers >= 1.37 (at most 2)"
    )


class PoolDevice(_Model):
    name: str
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    capacity: dict[str, str] = Field(default_factory=dict)
    consumes: list[Consumption] = Field(default_factory=list)
    gpu: str = Field(description="PCI address of the physical GPU (PF)")
    kind: Literal["vgpu", "passthrough"]
    type_id: str | None = None
    type_choices: dict[str, str] = Field(default_factory=dict, description=(
        "vGPU: the types a claim may ask for on this slot (short name -> type id); type_id is the default"))
    gpu_instance_profile: int | None = Field(None, description="MIG-backed: the NVML profile id of its GPU instance")
    placement: MigPlacement | None = Field(None, description="MIG-backed: where its GPU instance is created")
    profile_instances: int | None = Field(None, description="MIG-backed: most instances of its profile per GPU")
    inside: MigPlacement | None = Field(None, description=(
        "MIG time-slicing (GB20x): its vGPU's placement inside the GPU instance (placement id, slots)"))
    slots: MigPlacement | None = Field(None, description=(
        "mixed-size mode: the 1 GiB slots it holds (start = the placement id prepare moves its vGPU to)"))
    binding_conditions: list[str] = Field(default_factory=list, description=(
        "KEP-5007: conditions the agent sets True in the claim's status.devices before the scheduler binds"))
    binding_failure_conditions: list[str] = Field(default_factory=list, description=(
        "KEP-5007: a True one makes the scheduler drop the allocation and try again"))
    taints: list[dict[str, str]] = Field(default_factory=list, description=(
        "KEP-5055: devices[].taints as published (key, value, effect, timeAdded): a cordoned GPU's"))


class Pool(_Model):
    counter_sets: list[CounterSet] = Field(default_factory=list)
    devices: list[PoolDevice] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="what was left out, and why")

    def device(self, name: str) -> PoolDevice | None:
        return next((d for d in self.devices if d.name == name), None)

    def counter_set(self, name: str) -> CounterSet | None:
        return next((c for c in self.counter_sets if c.name == name), None)

    def devices_of(self, counter_set: str) -> list[PoolDevice]:
        return [d for d in self.devices if any(c.counter_set == counter_set for c in d.consumes)]


# --------------------------------------------------------------------------- helpers


def _hex_id(value: str) -> str:
    v = value.strip().lower()
    v = v[2:] if v.startswith("0x") else v
    return "0x" + v.zfill(4)


def format_mib(mib: int) -> str:
    """A framebuffer size as a binary Quantity: ``16Gi``, ``1536Mi``."""
    return format_kib(mib * 1024)


def format_kib(kib: int) -> str:
    if kib % (1024 * 1024) == 0:
        return f"{kib // (1024 * 1024)}Gi"
    if kib % 1024 == 0:
        return f"{kib // 1024}Mi"
    return f"{kib}Ki"


def attr_string(v: str) -> AttrValue:
    return {"string": truncate_utf8(v)}


def attr_int(v: int) -> AttrValue:
    return {"int": int(v)}


def attr_bool(v: bool) -> AttrValue:
    return {"bool": bool(v)}


def attr_version(v: str) -> AttrValue:
    return {"version": v}


#: Which type of a size a slot is by default (its ``profile``): NVIDIA's series, most asked for first.
SERIES_ORDER = {"Q": 0, "C": 1, "B": 2, "A": 3}


def vgpu_types_attr(types: Iterable[VgpuType]) -> str:
    """The ``vgpuTypes`` attribute: the short names, space-separated with a space at each end, so
    ``vgpuTypes.contains(" T4-2Q ")`` matches one whole name."""
    return " " + " ".join(t.short_name or short_type_name(t.name) for t in types) + " "


def type_framebuffer_mib(t: VgpuType) -> int | None:
    return t.framebuffer_mib or framebuffer_mib_from_name(t.name)


def gpu_framebuffer_mib(gpu: Gpu) -> int | None:
    """The GPU's framebuffer, from its types (the inventory has no field for it).

    The largest of ``framebuffer_mib`` and ``framebuffer_mib * max_instances`` over every type
    the GPU lists (MIG-backed ones count only by their own size): the full-size type (max 1) carries the whole
    framebuffer, and no type can pack more than the board has. Taking the product alone would
    under-count boards whose instance cap is below framebuffer / size (L40S-1Q: 32 x 1 GiB on 48 GiB).
    """
    best: int | None = None
    for t in gpu.types:
        fb = type_framebuffer_mib(t)
        if not fb:
            continue
        packed = fb if type_is_mig_backed(t) else fb * (t.max_instances or 1)
        best = max(best or 0, fb, packed)
    return best


def type_max_instances(t: VgpuType, gpu_fb_mib: int | None) -> int | None:
    if t.max_instances:
        return t.max_instances
    fb = type_framebuffer_mib(t)
    if fb and gpu_fb_mib:
        return gpu_fb_mib // fb or None
    return None


def gpu_vgpu_limit(gpu: Gpu) -> int:
    """How many vGPUs the board admits at once: the largest ``max_instances`` of any type,
    capped by the VF count on SR-IOV boards (one VF per vGPU)."""
    most = max((t.max_instances or 0 for t in gpu.types), default=0)
    if gpu.framework in ("mdev-sriov", "vendor-vfio") and gpu.sriov_total_vfs:
        most = min(most, gpu.sriov_total_vfs) if most else gpu.sriov_total_vfs
    return max(most, 1)


def _is_nvidia(gpu: Gpu) -> bool:
    return _hex_id(gpu.vendor_id) == "0x10de"
