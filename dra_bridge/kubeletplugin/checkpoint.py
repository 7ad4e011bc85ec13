"""The prepared-claims checkpoint: written atomically (fsync, rename) before prepare answers.

An entry is first written ``preparing`` with the vGPU ids it is about to create, then
``prepared``; a restart finds any ``preparing`` entry and undoes what it may have made,
so a crash between creating a vGPU and recording it leaves no orphan.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from mdev_manager.host.io import HostIO, RealIO

log = logging.getLogger(__name__)


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


class ClaimRecord(BaseModel):
    uid: str
    namespace: str
    name: str
    state: Literal["preparing", "prepared"] = "preparing"
    devices: list[PreparedDeviceRecord] = []
    cdi_files: list[str] = []
    metadata_files: list[str] = []


class Checkpoint(BaseModel):
    version: int = 1
    claims: dict[str, ClaimRecord] = {}


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


class CheckpointStore:
    def __init__(self, path: Path, io: HostIO | None = None):
        self.path = Path(path)
        self.io = io or RealIO()

    def load(self) -> Checkpoint:
        try:
            doc = json.loads(self.io.read(self.path))
        except FileNotFoundError:
            return Checkpoint()
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"checkpoint {self.path} is unreadable ({exc}); move it aside to start fresh") from exc
        body = json.dumps(doc.get("data", {}), sort_keys=True)
        if doc.get("checksum") != _digest(body):
            raise RuntimeError(f"checkpoint {self.path} fails its checksum; move it aside to start fresh")
        return Checkpoint.model_validate(doc["data"])

    def save(self, cp: Checkpoint) -> None:
        data = cp.model_dump(mode="json")
        body = json.dumps(data, sort_keys=True)
        self.io.write_atomic(self.path, json.dumps({"checksum": _digest(body), "data": data}, sort_keys=True))
