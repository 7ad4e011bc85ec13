"""Saved vGPU definitions, so vGPUs come back after a reboot.

mdevs are kept in mdevctl's own format (``<mdevctl_root>/<parent>/<uuid>``) so mdevctl,
libvirt and admins see the same definitions we do. Vendor-VFIO vGPUs have no mdevctl
format; they get a small JSON file of our own, and so do the functions a layout passed
through to vfio-pci (a reboot returns them to their native driver, and nothing else on the
host remembers the decision).

mdevctl 1.2.0 rejects its *whole* listing when one file is bad (unparsable JSON, missing
``start``, an attr that is not a one-key object, ``attrs`` not a list) and panics on a
non-string attr value, so nothing here ever writes such a file, and the loader flags them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import MdevDefinition, canonical_pci
from mdev_manager.names import VENDOR_TYPE_ID, NameError_, check_uuid

log = logging.getLogger(__name__)

SCRIPTS_DIR = "scripts.d"


def definition_path(env: HostEnv, parent: str, uuid: str) -> Path:
    return env.mdevctl_root / canonical_pci(parent, "parent") / check_uuid(uuid)


def ensure_layout(env: HostEnv, io: HostIO) -> None:
    """mdevctl refuses to run at all without ``scripts.d/callouts``."""
    for sub in ("callouts", "notifiers"):
        io.makedirs(env.mdevctl_root / SCRIPTS_DIR / sub)


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
            canonical_pci(parent, "parent")
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


def save_definition(env: HostEnv, io: HostIO, d: MdevDefinition, durable: bool = True,
                    layout_made: bool = False) -> Path:
    """Write (or replace) one definition atomically; returns its path.

    ``durable=False`` leaves the fsync to the caller (the executor syncs once per run);
    ``layout_made``: :func:`ensure_layout` was done by the caller (once per run, not per file).
    """
    d = MdevDefinition.model_validate(d.model_dump())  # re-check a mutated model
    path = definition_path(env, d.parent, d.uuid)
    if not layout_made:
        ensure_layout(env, io)
    io.makedirs(path.parent)
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
        io.rmdir(path.parent)
    except OSError:
        pass  # not empty (another definition, a stray file): keep it


# --- vendor-VFIO vGPUs ----------------------------------------------------------------

_VENDOR_VERSION = 1


def _check_vendor_entry(vf: str, type_id: str) -> tuple[str, str]:
    vf = canonical_pci(vf, "vf")
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
    io.makedirs(env.vendor_vfio_state.parent)
    body = {"version": _VENDOR_VERSION, "vfs": checked}
    io.write_atomic(env.vendor_vfio_state, json.dumps(body, indent=2, sort_keys=True) + "\n")


# --- passthrough bindings -------------------------------------------------------------

_PASSTHROUGH_VERSION = 1


def _read_map(io: HostIO, path: Path, key: str, what: str) -> dict:
    """The object under ``key`` of a JSON state file. Missing file: empty; one that cannot be used (not
    JSON, not this shape) is logged and read as empty, so restore leaves ``what`` to the next apply."""
    try:
        found = json.loads(io.read(path))[key]
        if not isinstance(found, dict):
            raise ValueError(f"'{key}' is not an object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("cannot use %s (%s); no saved %s", path, e, what)
        return {}
    return found


def load_passthrough(env: HostEnv, io: HostIO) -> dict[str, str]:
    """PCI function -> its physical GPU, for each function a layout passed through.

    Missing file: empty. A corrupt file or entry is skipped and logged: restore then leaves
    those GPUs on their native driver, which the next apply corrects.
    """
    path = env.passthrough_state
    functions = _read_map(io, path, "functions", "passthrough bindings")
    out: dict[str, str] = {}
    for fn, gpu in functions.items():
        try:
            out[canonical_pci(fn, "function")] = canonical_pci(gpu, "gpu")
        except (NameError_, AttributeError) as e:  # AttributeError: not a string
            log.warning("%s: skipping entry %r: %s", path, fn, e)
    return out


def save_passthrough(env: HostEnv, io: HostIO, mapping: dict[str, str], durable: bool = True) -> None:
    """Replace the whole store atomically (``durable=False``: the caller syncs once per run)."""
    checked = dict(sorted((canonical_pci(f, "function"), canonical_pci(g, "gpu")) for f, g in mapping.items()))
    path = env.passthrough_state
    io.makedirs(path.parent)
    body = {"version": _PASSTHROUGH_VERSION, "functions": checked}
    io.write_atomic(path, json.dumps(body, indent=2, sort_keys=True) + "\n", durable=durable)


# --- GPU instances a layout keeps (MIG) ------------------------------------------------

_MIG_VERSION = 1


def _check_mig_entry(entry: object) -> dict:
    """``{"profile": id, "start": s, "size": n, "vgpu": VF address or mdev UUID}``."""
    if not isinstance(entry, dict):
        raise ValueError(f"{entry!r} is not an object")
    out = {k: entry[k] for k in ("profile", "start", "size")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out.values()) or out["size"] < 1:
        raise ValueError(f"{entry!r}: profile, start and size are counts")
    vgpu = entry.get("vgpu")
    if vgpu is not None:
        if not isinstance(vgpu, str):
            raise ValueError(f"{entry!r}: vgpu is a VF address or an mdev UUID")
        out["vgpu"] = check_uuid(vgpu) if "-" in vgpu else canonical_pci(vgpu, "vgpu")
    shared = entry.get("vgpus")  # MIG time-slicing: every vGPU sharing the instance
    if shared is not None:
        if not isinstance(shared, list) or not all(isinstance(v, str) for v in shared):
            raise ValueError(f"{entry!r}: vgpus is a list of VF addresses or mdev UUIDs")
        out["vgpus"] = [check_uuid(v) if "-" in v else canonical_pci(v, "vgpu") for v in shared]
    return out


def load_mig(env: HostEnv, io: HostIO) -> dict[str, list[dict]]:
    """GPU address -> the GPU instances its layout keeps. Missing file: empty; a corrupt file or
    entry is skipped and logged (restore then leaves those instances to the next apply)."""
    path = env.mig_state
    gpus = _read_map(io, path, "gpus", "GPU instances")
    out: dict[str, list[dict]] = {}
    for gpu, entries in gpus.items():
        try:
            out[canonical_pci(gpu, "gpu")] = [_check_mig_entry(e) for e in entries]
        except (NameError_, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("%s: skipping GPU %r: %s", path, gpu, e)
    return out


def save_mig(env: HostEnv, io: HostIO, mapping: dict[str, list[dict]]) -> None:
    """Replace the whole store atomically; GPUs without instances are dropped."""
    checked = {canonical_pci(g, "gpu"): sorted((_check_mig_entry(e) for e in entries), key=lambda e: e["start"])
               for g, entries in sorted(mapping.items()) if entries}
    io.makedirs(env.mig_state.parent)
    io.write_atomic(env.mig_state, json.dumps({"version": _MIG_VERSION, "gpus": checked}, indent=2, sort_keys=True) + "\n")


# --- mixed-size mode and placements a layout keeps ----------------------------------------

_PLACEMENT_VERSION = 1


def _check_placement_entry(entry: object) -> dict:
    """``{"mixed": true, "vgpus": {VF address or mdev UUID: placement id}}``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("mixed"), bool):
        raise ValueError(f"{entry!r}: mixed is true or false")
    vgpus = entry.get("vgpus", {})
    if not isinstance(vgpus, dict):
        raise ValueError(f"{entry!r}: vgpus is an object")
    out = {}
    for vgpu, p in vgpus.items():
        if not isinstance(vgpu, str) or not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise ValueError(f"{vgpu!r}: {p!r} is not a placement id")
        out[check_uuid(vgpu) if "-" in vgpu else canonical_pci(vgpu, "vgpu")] = p
    return {"mixed": entry["mixed"], "vgpus": dict(sorted(out.items()))}


def load_placements(env: HostEnv, io: HostIO) -> dict[str, dict]:
    """GPU address -> ``{"mixed": bool, "vgpus": {vGPU: placement id}}``. Missing file: empty; a corrupt
    file or entry is skipped and logged (restore then leaves those GPUs to the next apply)."""
    path = env.placement_state
    gpus = _read_map(io, path, "gpus", "mixed-size placements")
    out: dict[str, dict] = {}
    for gpu, entry in gpus.items():
        try:
            out[canonical_pci(gpu, "gpu")] = _check_placement_entry(entry)
        except (NameError_, ValueError, AttributeError) as e:
            log.warning("%s: skipping GPU %r: %s", path, gpu, e)
    return out


def save_placements(env: HostEnv, io: HostIO, mapping: dict[str, dict]) -> None:
    """Replace the whole store atomically; GPUs not in mixed-size mode are dropped."""
    checked = {canonical_pci(g, "gpu"): _check_placement_entry(e) for g, e in sorted(mapping.items())}
    body = {"version": _PLACEMENT_VERSION, "gpus": {g: e for g, e in checked.items() if e["mixed"]}}
    io.makedirs(env.placement_state.parent)
    io.write_atomic(env.placement_state, json.dumps(body, indent=2, sort_keys=True) + "\n")
