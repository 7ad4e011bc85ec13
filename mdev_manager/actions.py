"""The steps a plan is made of. Each names the device it touches; the executor runs them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field


class _Action(BaseModel):
    gpu: str = Field(description="physical GPU the step belongs to")

    def describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


class EnableVfs(_Action):
    kind: Literal["enable_vfs"] = "enable_vfs"
    count: int

    def describe(self) -> str:
        return f"enable {self.count} SR-IOV VFs on {self.gpu}"


class DisableVfs(_Action):
    kind: Literal["disable_vfs"] = "disable_vfs"

    def describe(self) -> str:
        return f"disable SR-IOV VFs on {self.gpu}"


class BindDriver(_Action):
    """driver_override, unbind, drivers_probe: ``driver`` None returns the function to its native driver."""

    kind: Literal["bind_driver"] = "bind_driver"
    address: str
    driver: str | None

    def describe(self) -> str:
        return f"bind {self.address} to {self.driver or 'its native driver'}"


class SaveDefinition(_Action):
    """``start: manual`` on a mixed-size GPU: mdevctl must not start it at boot before the mode is
    set again and before the vGPUs that claim its slots; ``vgpuctl restore`` does, in order."""

    kind: Literal["save_definition"] = "save_definition"
    parent: str
    uuid: str
    type_id: str
    start: Literal["auto", "manual"] = "auto"

    def describe(self) -> str:
        return f"persist mdev {self.uuid} ({self.type_id}) on {self.parent}"


class CreateMdev(_Action):
    kind: Literal["create_mdev"] = "create_mdev"
    parent: str
    uuid: str
    type_id: str

    def describe(self) -> str:
        return f"create mdev {self.uuid} of type {self.type_id} on {self.parent}"


class RemoveMdev(_Action):
    kind: Literal["remove_mdev"] = "remove_mdev"
    parent: str
    uuid: str

    def describe(self) -> str:
        return f"remove mdev {self.uuid} from {self.parent}"


class RemoveDefinition(_Action):
    kind: Literal["remove_definition"] = "remove_definition"
    parent: str
    uuid: str

    def describe(self) -> str:
        return f"forget mdev definition {self.uuid} on {self.parent}"


class SetVgpuType(_Action):
    """Vendor-specific VFIO: write a type id (``0`` clears) to the VF's ``current_vgpu_type``; a
    MIG-backed type first names its GPU instance in the VF's ``gpu_instance_id``."""

    kind: Literal["set_vgpu_type"] = "set_vgpu_type"
    vf: str
    type_id: str
    gpu_instance: int | None = None

    def describe(self) -> str:
        if self.type_id == "0":
            return f"clear the vGPU on VF {self.vf}"
        on = f" on GPU instance {self.gpu_instance}" if self.gpu_instance is not None else ""
        return f"set VF {self.vf} to vGPU type {self.type_id}{on}"


class SetMigMode(_Action):
    """NVML: switch the GPU's MIG mode (only while it holds no vGPU and no GPU instance)."""

    kind: Literal["set_mig_mode"] = "set_mig_mode"
    enabled: bool

    def describe(self) -> str:
        return f"{'enable' if self.enabled else 'disable'} MIG mode on {self.gpu}"


class CreateGpuInstance(_Action):
    """NVML: create a GPU instance of profile ``profile_id`` at memory slices [start, start + size)."""

    kind: Literal["create_gpu_instance"] = "create_gpu_instance"
    profile_id: int
    profile: str
    start: int
    size: int

    def describe(self) -> str:
        return (f"create GPU instance {self.profile} (profile {self.profile_id}) at slices "
                f"{self.start}-{self.start + self.size - 1} on {self.gpu}")


class DestroyGpuInstance(_Action):
    kind: Literal["destroy_gpu_instance"] = "destroy_gpu_instance"
    gpu_instance: int
    profile: str
    start: int

    def describe(self) -> str:
        return f"destroy GPU instance {self.gpu_instance} ({self.profile} at slice {self.start}) on {self.gpu}"


class SaveMigRecord(_Action):
    """Record the GPU instances the layout keeps (placement and the vGPU on each; empty forgets), so
    ``restore`` re-creates them at the same placements after a reboot, before their vGPUs."""

    kind: Literal["save_mig_record"] = "save_mig_record"
    instances: list[dict]

    def describe(self) -> str:
        if not self.instances:
            return f"forget the GPU instances of {self.gpu}"
        return f"persist {len(self.instances)} GPU instance(s) of {self.gpu}"


class SetMixedSize(_Action):
    """NVML: switch the GPU's mixed-size (heterogeneous) vGPU mode (only while it holds no vGPU)."""

    kind: Literal["set_mixed_size"] = "set_mixed_size"
    enabled: bool

    def describe(self) -> str:
        return f"{'enable' if self.enabled else 'disable'} mixed-size vGPU mode on {self.gpu}"


class SetPlacement(_Action):
    """Move a new vGPU (created at the lowest creatable placement) to ``placement`` by writing its
    ``nvidia/placement_id``; read back, a different value fails the step."""

    kind: Literal["set_placement"] = "set_placement"
    vgpu: str = Field(description="mdev UUID or VF address")
    parent: str
    type_id: str
    placement: int
    size: int

    def describe(self) -> str:
        return (f"place vGPU {self.vgpu} ({self.type_id}) at slot {self.placement} "
                f"(slots {self.placement}-{self.placement + self.size - 1})")


class SavePlacementRecord(_Action):
    """Record that the GPU runs in mixed-size mode and where its layout's vGPUs sit (``mixed`` False
    forgets it), so ``restore`` sets the mode again after a reboot and re-creates them there."""

    kind: Literal["save_placement_record"] = "save_placement_record"
    mixed: bool
    vgpus: dict[str, int] = {}

    def describe(self) -> str:
        if not self.mixed:
            return f"forget the mixed-size placements of {self.gpu}"
        return f"persist mixed-size mode and {len(self.vgpus)} placement(s) of {self.gpu}"


class SaveVendorRecord(_Action):
    """Record (or with ``type_id`` None forget) a vendor-VFIO vGPU so a reboot can re-create it."""

    kind: Literal["save_vendor_record"] = "save_vendor_record"
    vf: str
    type_id: str | None

    def describe(self) -> str:
        return f"persist VF {self.vf} as type {self.type_id}" if self.type_id else f"forget VF {self.vf}"


class SavePassthrough(_Action):
    """Remember (``keep``) or forget a function the layout passes through, so ``restore`` binds it
    again after a reboot: a GPU already on vfio-pci gets no bind step that would record it."""

    kind: Literal["save_passthrough"] = "save_passthrough"
    address: str
    keep: bool

    def describe(self) -> str:
        return f"persist {self.address} as passed through" if self.keep else f"forget {self.address} as passed through"


Action = Annotated[
    EnableVfs | DisableVfs | BindDriver | SaveDefinition | CreateMdev | RemoveMdev | RemoveDefinition | SetVgpuType
    | SaveVendorRecord | SavePassthrough | SetMigMode | CreateGpuInstance | DestroyGpuInstance | SaveMigRecord
    | SetMixedSize | SetPlacement | SavePlacementRecord,
    Field(discriminator="kind"),
]

# Steps that change what the GPU offers: the reconciler runs them, discovers again and re-plans
# (a new GPU instance's id, and the MIG-backed types it makes creatable, are known only then).
STRUCTURAL = (EnableVfs, DisableVfs, BindDriver, SetMigMode, CreateGpuInstance, DestroyGpuInstance, SetMixedSize)


class Skip(BaseModel):
    device: str
    reason: str
    # a saved vGPU with no device that a workload names and the plan cannot re-create now: who
    # names it (it stays saved; the node is blocked on it) and its GPU
    held_by: list[str] = []
    gpu: str = ""


class Plan(BaseModel):
    actions: list[Action] = []
    skipped: list[Skip] = []
    notes: list[str] = []
    waiting: list[Skip] = []  # entries naming a GPU that left the bus: applied once it is back

    def structural(self) -> bool:
        return any(isinstance(a, STRUCTURAL) for a in self.actions)
