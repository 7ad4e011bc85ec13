"""The steps a plan is made of. Each names the device it touches; the executor runs them."""

from __future__ import annotations

from typing import Annotated, Literal, Union

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
    kind: Literal["save_definition"] = "save_definition"
    parent: str
    uuid: str
    type_id: str

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
    """Vendor-specific VFIO: write a type id (``0`` clears) to the VF's ``current_vgpu_type``."""

    kind: Literal["set_vgpu_type"] = "set_vgpu_type"
    vf: str
    type_id: str

    def describe(self) -> str:
        return f"clear the vGPU on VF {self.vf}" if self.type_id == "0" else f"set VF {self.vf} to vGPU type {self.type_id}"


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
    Union[EnableVfs, DisableVfs, BindDriver, SaveDefinition, CreateMdev, RemoveMdev, RemoveDefinition,
          SetVgpuType, SaveVendorRecord, SavePassthrough],
    Field(discriminator="kind"),
]

# Steps that change what the GPU offers: the reconciler runs them, discovers again and re-plans.
STRUCTURAL = (EnableVfs, DisableVfs, BindDriver)


class Skip(BaseModel):
    device: str
    reason: str


class Plan(BaseModel):
    actions: list[Action] = []
    skipped: list[Skip] = []
    notes: list[str] = []

    def structural(self) -> bool:
        return any(isinstance(a, STRUCTURAL) for a in self.actions)
