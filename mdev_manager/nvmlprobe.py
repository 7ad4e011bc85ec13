"""A read-only record of what NVIDIA's driver reports for each GPU (``vgpuctl nvml-probe``).

The catalog's MIG profiles and placements and its mixed-size placement tables come from NVIDIA's
documentation and the driver's source; a recording from a real GPU is how they are checked against
the driver itself (tests/mdev_manager/test_nvml_probe.py compares recordings with the catalog and
the simulated NVML). The probe changes nothing: it gets a transport that exposes NVML's reading
calls only (:class:`ReadOnly`), so a setter cannot be reached even by mistake: never MIG mode,
never mixed-size mode, never a reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from mdev_manager import catalog, catalog_placements
from mdev_manager.catalog_mig import MIG_INFERRED, mig_profiles
from mdev_manager.host.nvml import NvmlError, NvmlTransport

#: The transport calls that only read (everything the probe may call).
READS = ("bus_ids", "driver_version", "device_info", "uuid", "mig_mode", "gpu_instance_profiles", "memory_slices",
         "supported_vgpu_types", "vgpu_heterogeneous_mode", "vgpu_type_supported_placements")

T = TypeVar("T")


class ReadOnly:
    """A transport's reading calls, nothing else (a setter is an AttributeError)."""

    def __init__(self, transport: NvmlTransport):
        self._t = transport

    def __getattr__(self, name: str) -> Any:
        if name not in READS:
            raise AttributeError(f"the NVML probe reads only; {name} is not a reading call")
        return getattr(self._t, name)


class MigRecord(BaseModel):
    current: int
    pending: int
    memory_slices: int | None = None
    profiles: list[dict] = Field([], description="NVML's GPU-instance profiles with their possible placements")


class VgpuTypeRecord(BaseModel):
    id: int
    name: str
    framebuffer_mib: int
    max_instances: int
    placement_size: int | None = None
    placements: list[int] | None = Field(None, description="supported placement ids (mixed-size mode)")


class GpuRecord(BaseModel):
    bus_id: str
    name: str | None = None
    memory_mib: int | None = None
    uuid: str | None = None
    mig: MigRecord | None = Field(None, description="None: not MIG-capable")
    heterogeneous_mode: int | None = Field(None, description="vGPU mixed-size mode (1 on); None: not supported")
    vgpu_types: list[VgpuTypeRecord] = []
    errors: dict[str, str] = Field({}, description="what NVML refused to answer, by field")
    catalog_board: str | None = Field(None, description="the catalog's board for the GPU's PCI ids, if any")
    catalog_differences: list[str] = Field([], description=(
        "what the driver reports otherwise than the catalog (the driver is right; the catalog fills the simulator)"))


class ProbeRecord(BaseModel):
    driver_version: str | None = None
    gpus: list[GpuRecord] = []
    errors: dict[str, str] = {}


def _ask(errors: dict[str, str], field: str, call: Callable[[], T]) -> T | None:
    """``call()``, or None with NVML's refusal recorded under ``field``."""
    try:
        return call()
    except NvmlError as exc:
        errors[field] = str(exc)
        return None


def probe_gpu(t: ReadOnly, bus_id: str) -> GpuRecord:
    rec = GpuRecord(bus_id=bus_id)
    err = rec.errors
    info = _ask(err, "device", lambda: t.device_info(bus_id))
    if info:
        rec.name, rec.memory_mib = info["name"], info["memory_bytes"] // (1024 * 1024)
    rec.uuid = _ask(err, "uuid", lambda: t.uuid(bus_id))
    mode = _ask(err, "mig", lambda: t.mig_mode(bus_id))
    if mode is not None:
        rec.mig = MigRecord(current=mode[0], pending=mode[1],
                            memory_slices=_ask(err, "mig.memory_slices", lambda: t.memory_slices(bus_id)),
                            profiles=_ask(err, "mig.profiles", lambda: t.gpu_instance_profiles(bus_id)) or [])
    rec.heterogeneous_mode = _ask(err, "heterogeneous_mode", lambda: t.vgpu_heterogeneous_mode(bus_id))
    for vt in _ask(err, "vgpu_types", lambda: t.supported_vgpu_types(bus_id)) or []:
        one = VgpuTypeRecord(id=vt["id"], name=vt["name"], framebuffer_mib=vt["framebuffer_bytes"] // (1024 * 1024),
                             max_instances=vt["max_instances"])
        if rec.heterogeneous_mode is not None:
            type_id: int = vt["id"]

            def placements(type_id: int = type_id) -> tuple[int, list[int]]:
                return t.vgpu_type_supported_placements(bus_id, type_id)

            placed = _ask(err, f"placements.{type_id}", placements)
            if placed is not None:
                one.placement_size, one.placements = placed[0], sorted(placed[1])
        rec.vgpu_types.append(one)
    return rec


def probe(transport: NvmlTransport) -> ProbeRecord:
    """Everything NVML answers about every GPU it sees; refusals are recorded, not raised."""
    t = ReadOnly(transport)
    out = ProbeRecord()
    out.driver_version = _ask(out.errors, "driver_version", t.driver_version)
    for bus_id in _ask(out.errors, "bus_ids", t.bus_ids) or []:
        out.gpus.append(probe_gpu(t, bus_id))
    return out


# ------------------------------------------------------------------ the driver beside the catalog
# The catalog fills the simulator and the previews made before a GPU's VFs exist; on a real host the
# driver's answers are used. Where they differ the driver is right, and a difference in a fact the
# catalog marks inferred (docs/blackwell.md) is how an inference gets checked on real hardware.

def _mark(inferred: bool) -> str:
    return " (the catalog's is inferred)" if inferred else ""


def differences(rec: GpuRecord, board: catalog.BoardSpec) -> list[str]:
    """One line per fact the driver reports otherwise than the catalog (empty: they agree)."""
    out: list[str] = []
    specs = {int(t.num): t for t in board.types if isinstance(t.num, int)}
    seen = set()
    for vt in rec.vgpu_types:
        t = specs.get(vt.id)
        seen.add(vt.id)
        if t is None:
            same = next((s for s in board.types if s.short_name == vt.name.split()[-1]), None)
            hint = f"; the catalog has {same.short_name} as {same.num}{_mark('id' in same.inferred)}" if same else ""
            out.append(f"type {vt.id} {vt.name!r}: not in the catalog{hint}")
            continue
        if vt.name != t.name:
            out.append(f"type {vt.id}: driver names it {vt.name!r}, the catalog {t.name!r}")
        if vt.max_instances != t.max_instances:
            out.append(f"type {vt.id} ({t.short_name}): driver max {vt.max_instances}, catalog {t.max_instances}"
                       + _mark("max_instances" in t.inferred))
        ids = catalog_placements.type_placements(board.key, t.fb_mib) if not t.mig_backed else ()
        if vt.placements is not None and ids and list(ids) != vt.placements:
            out.append(f"type {vt.id} ({t.short_name}): driver places it at {vt.placements}, the catalog at {list(ids)}")
    out += [f"type {n} ({t.short_name}): in the catalog, not reported by the driver{_mark('id' in t.inferred)}"
            for n, t in sorted(specs.items()) if n not in seen and rec.vgpu_types]
    if rec.mig is not None and rec.mig.profiles:
        mig_inferred = bool(MIG_INFERRED.get(board.key))
        known = {p.id: p for p in mig_profiles(board.key)}
        for p in rec.mig.profiles:
            mine = known.get(p["id"])
            if mine is None:
                out.append(f"MIG profile {p['id']} {p['name']}: not in the catalog{_mark(mig_inferred)}")
                continue
            starts = sorted((pl["start"], pl["size"]) for pl in p.get("placements") or [])
            ours = sorted((pl.start, pl.size) for pl in mine.placements)
            for what, theirs, cat in (("name", p["name"], mine.name), ("instances", p["instances"], mine.instances),
                                      ("placements", starts, ours)):
                if theirs != cat:
                    out.append(f"MIG profile {p['id']} {mine.name}: driver {what} {theirs}, catalog {cat}"
                               + _mark(mig_inferred))
    return out
