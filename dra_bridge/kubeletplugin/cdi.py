"""CDI specs: one transient spec per claim under the CDI dir (dra.md, CDI section).

Device names are ``<claimUID>-<device>``, ids ``<driver>/claim=<claimUID>-<device>``.
cdiVersion 0.5.0 is the oldest that allows ``hostPath`` and names starting with a digit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dra_bridge.kubeletplugin.paths import check_uid, contained
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO

CDI_VERSION = "0.5.0"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def claim_kind(driver: str) -> str:
    return f"{driver}/claim"


def device_name(claim_uid: str, device: str) -> str:
    name = f"{claim_uid}-{device}"
    if not _NAME.match(name):
        raise ValueError(f"CDI device name {name!r} is not valid")
    return name


def cdi_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{claim_kind(driver)}={device_name(claim_uid, device)}"


def vfio_nodes(env: HostEnv, iommu_group: int | None, vfio_dev: str | None = None, iommufd: bool = False) -> list[dict]:
    """Container device nodes for one vfio device; ``hostPath`` points into the host's dev root."""
    nodes = [("/dev/vfio/vfio", env.vfio_dir / "vfio")]
    if iommu_group is not None:
        nodes.append((f"/dev/vfio/{iommu_group}", env.vfio_group(iommu_group)))
    if iommufd and vfio_dev:
        nodes += [("/dev/iommu", env.iommufd), (f"/dev/vfio/devices/{vfio_dev}", env.vfio_dir / "devices" / vfio_dev)]
    return [{"path": p, "hostPath": str(h), "type": "c", "permissions": "rwm"} for p, h in nodes]


def claim_spec(driver: str, claim_uid: str, devices: dict[str, list[dict]],
               env: dict[str, list[str]] | None = None) -> dict:
    """``env``: device -> ``NAME=value`` entries its containers get (KubeVirt's resource variables)."""
    out = []
    for d, nodes in sorted(devices.items()):
        edits: dict = {"deviceNodes": nodes}
        if env and env.get(d):
            edits["env"] = list(env[d])
        out.append({"name": device_name(claim_uid, d), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": claim_kind(driver), "devices": out}


def spec_path(cdi_root: Path, driver: str, claim_uid: str) -> Path:
    """The claim's spec file; UnsafeName unless ``claim_uid`` is a UUID and the file stays in ``cdi_root``."""
    return contained(cdi_root, Path(cdi_root) / f"{driver}-claim_{check_uid(claim_uid)}.json")


def parse_spec_name(driver: str, file_name: str) -> str | None:
    """The claim uid a claim spec file is named for (recovery), None for any other file."""
    prefix, suffix = f"{driver}-claim_", ".json"
    if not (file_name.startswith(prefix) and file_name.endswith(suffix)):
        return None
    uid = file_name[len(prefix):-len(suffix)]
    try:
        return check_uid(uid)
    except ValueError:
        return None


def write_spec(io: HostIO, path: Path, spec: dict) -> None:
    io.write_atomic(path, json.dumps(spec, indent=2), durable=False)
