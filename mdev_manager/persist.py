"""Saved vGPU definitions, so vGPUs come back after a reboot.

mdevs are kept in mdevctl's own format (``<mdevctl_root>/<parent>/<uuid>``) so mdevctl,
libvirt and admins see the same definitions we do. Vendor-VFIO vGPUs have no mdevctl
format; they get a small JSON file of our own.

mdevctl 1.2.0 rejects its *whole* listing when one file is bad (unparsable JSON, missing
``start``, an attr that is not a one-key object, ``attrs`` not a list) and panics on a
non-string attr value, so nothing here ever writes such a file, and the loader flags them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.names import (
    VENDOR_TYPE_ID,
    NameError_,
    check_pci_address,
    check_type_id,
    check_uuid,
    safe_component,
)

log = logging.getLogger(__name__)

SCRIPTS_DIR = "scripts.d"


class MdevDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uuid: str
    parent: str
    mdev_type: str
    start: Literal["auto", "manual"] = "auto"
    attrs: list[dict[str, str]] = []

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, v: str) -> str:
        return check_uuid(v)

    @field_validator("parent")
    @classmethod
    def _parent(cls, v: str) -> str:
        return _canonical_pci(v, "parent")

    @field_validator("mdev_type")
    @classmethod
    def _type(cls, v: str) -> str:
        return check_type_id(v, "mdev_type")

    @field_validator("attrs")
    @classmethod
    def _attrs(cls, v: list[dict[str, str]]) -> list[dict[str, str]]:
        """One key each (mdevctl's format); keys become paths below the mdev directory."""
        for a in v:
            if len(a) != 1:
                raise ValueError(f"attrs: {a!r} must hold exactly one attribute")
            (name,) = a
            if name.startswith("/"):
                raise ValueError(f"attrs: {name!r} must be relative to the mdev directory")
            for part in name.split("/"):
                safe_component(part, "attrs")
        return v


def _canonical_pci(value: str, field: str) -> str:
    """Exactly the name the kernel uses: mdevctl joins the directory name to sysfs as is."""
    addr = check_pci_address(value, field)
    if addr != value:
        raise NameError_(f"{field}: {value!r} must be written as {addr!r}")
    return addr


def definition_path(env: HostEnv, parent: str, uuid: str) -> Path:
    return env.mdevctl_root / _canonical_pci(parent, "parent") / check_uuid(uuid)


def ensure_layout(env: HostEnv) -> None:
    """mdevctl refuses to run at all without ``scripts.d/callouts``."""
    for sub in ("callouts", "notifiers"):
        (env.mdevctl_root / SCRIPTS_DIR / sub).mkdir(parents=True, exist_ok=True)


def _parse(parent: str, name: str, text: str) -> MdevDefinition:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "mdev_type" not in data:
        raise ValueError("missing mdev_type")
    if "start" not in data:
        raise ValueError("missing start (mdevctl rejects the file)")
    return MdevDefinition(
        uuid=name, parent=parent, mdev_type=data["mdev_type"],
        start=data["start"], attrs=data.get("attrs", []),
    )


def _reason(e: Exception) -> str:
    if isinstance(e, ValidationError):
        parts = []
        for x in e.errors():
            loc = ".".join(map(str, x["loc"])) or "file"
            msg = x["msg"].removeprefix("Value error, ")
            parts.append(msg if msg.startswith(f"{loc}:") else f"{loc}: {msg}")
        return "; ".join(parts)
    if isinstance(e, json.JSONDecodeError):
        return f"bad JSON: {e}"
    return str(e)


def load_definitions(env: HostEnv, io: HostIO) -> tuple[list[MdevDefinition], list[str]]:
    """Every well-formed definition, and ``"<path>: <reason>"`` for each one that is not.

    File names may be upper-case UUIDs (mdevctl accepts them); the definition's uuid is
    lower case either way. Non-PCI parents (``mtty``, s390 devices) are reported, not kept.
    """
    root = env.mdevctl_root
    defs: list[MdevDefinition] = []
    problems: list[str] = []
    for parent in io.listdir(root):
        pdir = root / parent
        if parent == SCRIPTS_DIR or parent.startswith(".") or not io.is_dir(pdir):
            continue  # mdevctl ignores stray files here too
        try:
            _canonical_pci(parent, "parent")
        except NameError_ as e:
            problems.append(f"{pdir}: {e}")
            continue
        for name in io.listdir(pdir):
            if name.startswith("."):
                continue  # our own in-flight .tmp files
            path = pdir / name
            try:
                defs.append(_parse(parent, name, io.read(path)))
            except (OSError, ValueError, ValidationError) as e:
                problems.append(f"{path}: {_reason(e)}")
    return defs, problems


def save_definition(env: HostEnv, io: HostIO, d: MdevDefinition, durable: bool = True) -> Path:
    """Write (or replace) one definition atomically; returns its path.

    ``durable=False`` leaves the fsync to the caller (the executor syncs once per run).
    """
    d = MdevDefinition.model_validate(d.model_dump())  # re-check a mutated model
    path = definition_path(env, d.parent, d.uuid)
    ensure_layout(env)
    path.parent.mkdir(parents=True, exist_ok=True)  # HostIO has no mkdir; write_atomic may
    body = {"mdev_type": d.mdev_type, "start": d.start, "attrs": d.attrs}
    io.write_atomic(path, json.dumps(body, indent=2, sort_keys=True) + "\n", durable=durable)
    return path


def remove_definition(env: HostEnv, io: HostIO, parent: str, uuid: str) -> None:
    """Forget a definition (any case of its file name); drop the parent dir once empty."""
    path = definition_path(env, parent, uuid)
    for name in io.listdir(path.parent):
        if name.lower() == path.name:
            io.remove(path.parent / name)
    try:
        os.rmdir(path.parent)
    except OSError:
        pass


# --- vendor-VFIO vGPUs ----------------------------------------------------------------

_VENDOR_VERSION = 1


def _check_vendor_entry(vf: str, type_id: str) -> tuple[str, str]:
    vf = _canonical_pci(vf, "vf")
    if not isinstance(type_id, str) or not VENDOR_TYPE_ID.match(type_id):
        raise NameError_(f"type: {type_id!r} is not a vendor-VFIO vGPU type id (decimal, not 0)")
    return vf, type_id


def load_vendor_vfio(env: HostEnv, io: HostIO) -> dict[str, str]:
    """VF address -> vGPU type id. Missing file: empty. Corrupt file or entries: skipped, logged."""
    path = env.vendor_vfio_state
    try:
        text = io.read(path)
    except FileNotFoundError:
        return {}
    except OSError as e:
        log.warning("cannot read %s: %s; no saved vendor-VFIO vGPUs", path, e)
        return {}
    try:
        data = json.loads(text)
        vfs = data["vfs"]
        if not isinstance(vfs, dict):
            raise ValueError("'vfs' is not an object")
    except (ValueError, KeyError, TypeError) as e:
        log.warning("corrupt %s (%s); no saved vendor-VFIO vGPUs", path, e)
        return {}
    out: dict[str, str] = {}
    for vf, type_id in vfs.items():
        try:
            k, v = _check_vendor_entry(vf, type_id)
        except NameError_ as e:
            log.warning("%s: skipping entry: %s", path, e)
            continue
        out[k] = v
    return out


def save_vendor_vfio(env: HostEnv, io: HostIO, mapping: dict[str, str]) -> None:
    """Replace the whole store atomically. Raises ``NameError_`` on a bad address or type."""
    checked = dict(sorted(_check_vendor_entry(vf, t) for vf, t in mapping.items()))
    env.vendor_vfio_state.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": _VENDOR_VERSION, "vfs": checked}
    io.write_atomic(env.vendor_vfio_state, json.dumps(body, indent=2, sort_keys=True) + "\n")
