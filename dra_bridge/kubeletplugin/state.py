"""The prepared-claim state (as dra-example-driver's ``state.go``): per claim uid, the devices its
prepare made or bound, the files it wrote, the boot they were made in and how far it got
(``preparing``, ``prepared``, ``unpreparing``). :mod:`.checkpoint` keeps it on disk; the driver,
recovery, the overlap refusal and the node manager's in-use accounting (:meth:`Checkpoint.usage`)
read it here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, field_validator, model_validator

from dra_bridge.kubeletplugin.paths import check_label, check_name, check_namespace, check_request, check_uid
from mdev_manager.models import Usage

CURRENT_VERSION = 3


class PreparedDeviceRecord(BaseModel):
    request: str
    pool: str
    device: str
    kind: Literal["vgpu", "passthrough"]
    gpu: str
    framework: str | None = None  # mdev | vendor-vfio for vGPUs
    vgpu_id: str | None = None  # mdev UUID or VF address
    parent: str | None = None
    type_id: str | None = None
    iommu_group: int | None = None
    rebound: list[str] = []  # functions this prepare moved to vfio-pci (passthrough)
    vfs_disabled: int = 0  # SR-IOV VFs this prepare turned off to pass the GPU through
    cdi_ids: list[str] = []
    # MIG-backed: the GPU instance prepare creates for the vGPU (profile id and placement: its
    # intent, on disk before the create), and its id once made
    gi_profile: int | None = None
    gi_start: int | None = None
    gi_size: int | None = None
    gpu_instance: int | None = None
    # mixed-size mode: the placement the vGPU is moved to after its (first-fit) create, and its slots;
    # MIG time-slicing (gi_* set): its placement inside the GPU instance it shares
    placement: int | None = None
    placement_size: int | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_label(v, "device")

    @field_validator("request")
    @classmethod
    def _request(cls, v: str) -> str:
        return v and check_request(v)  # "" : not known (rebuilt from a CDI spec alone)


class ClaimRecord(BaseModel):
    uid: str
    namespace: str  # "" when not known (rebuilt from a CDI spec alone)
    name: str
    # preparing: devices being made (intent); prepared: answered; unpreparing: being removed (intent)
    state: Literal["preparing", "prepared", "unpreparing"] = "preparing"
    devices: list[PreparedDeviceRecord] = []
    cdi_files: list[str] = []
    metadata_files: list[str] = []
    boot_id: str | None = None  # the boot the devices were made in; None: not known (version 1)

    @field_validator("uid")
    @classmethod
    def _uid(cls, v: str) -> str:
        return check_uid(v)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return v and check_namespace(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v and check_name(v)


class Checkpoint(BaseModel):
    version: int = CURRENT_VERSION
    claims: dict[str, ClaimRecord] = {}

    @model_validator(mode="after")
    def _keys_are_uids(self) -> Checkpoint:
        for key, rec in self.claims.items():
            if key != rec.uid:
                raise ValueError(f"claim key {key!r} differs from its record's uid {rec.uid!r}")
        return self

    def usage(self) -> Usage:
        """Devices held by prepared claims, as the node manager counts what is in use (the daemon's
        reconcile and ``vgpuctl apply`` alike)."""
        mdevs: dict[str, list[str]] = {}
        pci: dict[str, list[str]] = {}
        claimed: dict[str, list[str]] = {}
        for rec in self.claims.values():
            who = f"ResourceClaim {rec.namespace}/{rec.name}" if rec.namespace else f"ResourceClaim uid {rec.uid}"
            for d in rec.devices:
                if d.kind == "vgpu" and d.vgpu_id:
                    claimed.setdefault(d.vgpu_id.lower(), []).append(who)
                if d.kind == "vgpu" and d.framework == "mdev" and d.vgpu_id:
                    mdevs.setdefault(d.vgpu_id, []).append(who)
                elif d.vgpu_id or d.gpu:
                    pci.setdefault(d.vgpu_id or d.gpu, []).append(who)
                if d.kind == "passthrough" and d.gpu:
                    claimed.setdefault(d.gpu.lower(), []).append(who)
        return Usage(mdevs=mdevs, pci=pci, claimed=claimed)
