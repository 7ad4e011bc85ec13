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
