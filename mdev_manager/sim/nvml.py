"""NVML of a simulated host: MIG mode and GPU instances, vGPU mixed-size mode and placements.

Implements :class:`mdev_manager.host.nvml.NvmlTransport` over the host's state, with NVML's
rules and return codes (https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html):

* a GPU without MIG answers ``NOT_SUPPORTED``; an unknown address ``NOT_FOUND``;
* MIG mode changes only while the GPU holds no vGPU and no GPU instance (``IN_USE``); the mode
  survives a reboot (NVIDIA keeps it on the board), GPU instances do not;
* a GPU instance is created only in MIG mode (``NOT_SUPPORTED`` otherwise), at one of its
  profile's possible placements (``INVALID_ARGUMENT`` otherwise), on memory slices no other
  instance holds, within the profile's instance count and the GPU's engines
  (``INSUFFICIENT_RESOURCES`` otherwise);
* a GPU instance a vGPU lives on is not destroyed (``IN_USE``).

MIG-backed vGPU types become creatable on the VFs while a free GPU instance of their profile
exists (:meth:`free_instances`, read by the kernel model's refresh). On a board with MIG
time-slicing (GB20x: the RTX PRO 6000) several vGPUs of one type share a GPU instance, each at a
placement inside it (:func:`rooms`; the instance's record keeps ``shared``: vGPU -> placement,
``type``, and ``vgpu``: one of them); an instance is in use while any of them lives on it.

Mixed-size ("heterogeneous") mode (nvml.h, ``nvmlDeviceSetVgpuHeterogeneousMode`` and its
neighbours; ../shared/reference/heterogeneous-vgpu.md):

* a board without a known placement table answers ``NOT_SUPPORTED`` (nothing is guessed), and
  so does every GPU while MIG is on; the mode is ``NVML_FEATURE_ENABLED`` / ``_DISABLED``;
* the mode changes only while the GPU holds no vGPU (``IN_USE``), and only on a GPU the nvidia
  driver holds (NVML sees no other: ``NOT_FOUND``); reboot, driver reload and enabling or disabling
  VFs clear it (the kernel model); enabling MIG clears it too (assumed: the facts are silent);
* supported placements are the board's table (:mod:`mdev_manager.catalog_placements`), with
  ``placementSize`` the type's GiB; creatable ones are those whose slots are free, answered in
  mixed-size mode only (equal-size placements are not modelled: ``NOT_SUPPORTED``);
* a vGPU's placement id is ``NVML_INVALID_VGPU_PLACEMENT_ID`` in equal-size mode.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractContextManager
from typing import Any, Protocol

from mdev_manager import catalog
from mdev_manager.catalog import TypeSpec
from mdev_manager.catalog_mig import MEMORY_SLICES, has_mig, mig_profiles
from mdev_manager.catalog_placements import instance_placements
from mdev_manager.host.nvml import (
    NO_GPU_INSTANCE,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NvmlError,
)
from mdev_manager.models import GpuInstanceProfile
from mdev_manager.sim import slots
from mdev_manager.sim.hostspec import HostSpec

ENGINES = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")


class SimNvmlHost(Protocol):
    """What the simulated NVML needs of its host: :class:`~.kernel.SimHost`, or a stand-in holding
    one GPU's state (``state`` is the host's JSON state)."""

    state: dict[str, Any]

    def _locked(self) -> AbstractContextManager[None]: ...
    def _gpu_read(self, pf: str) -> AbstractContextManager[None]: ...
    def _existing(self, gpu: dict) -> list[tuple[str, str, str]]: ...
    def _refresh(self, gpu: dict) -> None: ...
    def _save(self) -> None: ...
    def _driver(self, addr: str) -> str | None: ...


def mig_record(gpu: dict) -> dict:
    """The GPU's MIG state in the host state (made on first use)."""
    return gpu.setdefault("mig", {"current": 0, "pending": 0, "gis": []})


def free_instances(gpu: dict, profile_name: str) -> list[dict]:
    """GPU instances of ``profile_name`` no vGPU lives on, lowest id first."""
    if not has_mig(gpu["board"]):
        return []
    mig = mig_record(gpu)
    ids = {p.id for p in mig_profiles(gpu["board"]) if p.name == profile_name}
    return sorted((g for g in mig["gis"] if g["profile"] in ids and not g.get("vgpu")), key=lambda g: g["id"])


def rooms(gpu: dict, t: TypeSpec) -> list[tuple[dict, list[int]]]:
    """MIG time-slicing: the GPU instances of ``t``'s profile a new vGPU of ``t`` may join, each with
    its free placements, lowest instance id first: empty ones, and those holding ``t`` with room
    (one type per instance: equal-size inside it). The per-instance maximum is the placements' count."""
    if not has_mig(gpu["board"]):
        return []
    size, ids = instance_placements(gpu["board"], t)
    prof = {p.id for p in mig_profiles(gpu["board"]) if p.name == t.gpu_instance_profile}
    out = []
    for gi in sorted(mig_record(gpu)["gis"], key=lambda g: g["id"]):
        shared = gi.get("shared") or {}
        if gi["profile"] not in prof or (gi.get("vgpu") and not shared) or (shared and gi.get("type") != str(t.num)):
            continue
        taken = {s for p in shared.values() for s in range(p, p + size)}
        free = [p for p in ids if taken.isdisjoint(range(p, p + size))]
        if free:
            out.append((gi, free))
    return out


def mig_enabled(gpu: dict) -> bool:
    return has_mig(gpu["board"]) and bool(mig_record(gpu)["current"])


class SimNvml:
    """The simulated host's NVML (the transport :class:`~mdev_manager.host.nvml.Mig` drives)."""

    def __init__(self, host: SimNvmlHost) -> None:
        self.host = host

    # ------------------------------------------------------------------ helpers
    def _gpu(self, bus_id: str) -> dict:
        addr = bus_id.lower()
        gpu = next((g for g in self.host.state["gpus"] if g["pf"] == addr), None)
        if gpu is None:
            raise NvmlError(NVML_ERROR_NOT_FOUND, f"no GPU at {bus_id}")
        if not has_mig(gpu["board"]):
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} ({gpu['board']}) has no MIG")
        return gpu

    def _read(self, bus_id: str) -> dict:
        gpu = self._gpu(bus_id)  # a GPU's board never changes: one without MIG answers without the lock
        with self.host._gpu_read(gpu["pf"]):
            return self._gpu(bus_id)

    @staticmethod
    def _profile(gpu: dict, profile_id: int) -> GpuInstanceProfile:
        prof = next((p for p in mig_profiles(gpu["board"]) if p.id == profile_id), None)
        if prof is None:
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"no GPU instance profile {profile_id}")
        return prof

    # ------------------------------------------------------------------ transport
    def mig_mode(self, bus_id: str) -> tuple[int, int]:
        mig = mig_record(self._read(bus_id))
        return mig["current"], mig["pending"]

    def set_mig_mode(self, bus_id: str, mode: int) -> None:
        with self.host._locked():
            gpu = self._gpu(bus_id)
            mig = mig_record(gpu)
            if mig["current"] == int(bool(mode)):
                return
            if mig["gis"] or self.host._existing(gpu):
                raise NvmlError(NVML_ERROR_IN_USE, f"{bus_id} holds vGPUs or GPU instances")
            mig["current"] = mig["pending"] = int(bool(mode))
            if mode:
                slots.clear(gpu)
            self.host._refresh(gpu)
            self.host._save()

    def gpu_instance_profiles(self, bus_id: str) -> list[dict]:
        return [p.model_dump() for p in mig_profiles(self._read(bus_id)["board"])]

    def uuid(self, bus_id: str) -> str:
        """``GPU-`` and a UUID, as ``nvidia-smi -L`` prints it; stable per host and address."""
        gpu = self._read(bus_id)
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpuctl-sim:{getattr(self.host, 'root', '')}:{gpu['pf']}"))

    def memory_slices(self, bus_id: str) -> int:
        return MEMORY_SLICES[self._read(bus_id)["board"]]

    def gpu_instances(self, bus_id: str) -> list[tuple[int, int, int, int]]:
        mig = mig_record(self._read(bus_id))
        if not mig["current"]:
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} is not in MIG mode")
        return [(g["id"], g["profile"], g["start"], g["size"]) for g in mig["gis"]]

    def create_gpu_instance(self, bus_id: str, profile_id: int, start: int, size: int) -> int:
        with self.host._locked():
            gpu = self._gpu(bus_id)
            mig = mig_record(gpu)
            if not mig["current"]:
                raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} is not in MIG mode")
            prof = self._profile(gpu, profile_id)
            if not any(p.start == start and p.size == size for p in prof.placements):
                raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"{prof.name} cannot be placed at {start}:{size}")
            taken = {s for g in mig["gis"] for s in range(g["start"], g["start"] + g["size"])}
            if taken & set(range(start, start + size)):
                raise NvmlError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"memory slices {start}..{start + size - 1} are taken")
            if sum(1 for g in mig["gis"] if g["profile"] == profile_id) >= prof.instances:
                raise NvmlError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"{prof.instances} {prof.name} exist already")
            full = max(mig_profiles(gpu["board"]), key=lambda p: (p.slices, p.memory_mib))
            for engine in ENGINES:
                used = sum(getattr(self._profile(gpu, g["profile"]), engine) for g in mig["gis"])
                if used + getattr(prof, engine) > getattr(full, engine):
                    raise NvmlError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"no {engine.replace('_', ' ')} left")
            gid = min(set(range(1, 64)) - {g["id"] for g in mig["gis"]})
            mig["gis"].append({"id": gid, "profile": profile_id, "start": start, "size": size})
            self.host._refresh(gpu)
            self.host._save()
            return gid

    def destroy_gpu_instance(self, bus_id: str, gi_id: int) -> None:
        with self.host._locked():
            gpu = self._gpu(bus_id)
            mig = mig_record(gpu)
            gi = next((g for g in mig["gis"] if g["id"] == gi_id), None)
            if gi is None:
                raise NvmlError(NVML_ERROR_NOT_FOUND, f"no GPU instance {gi_id} on {bus_id}")
            if gi.get("vgpu"):
                raise NvmlError(NVML_ERROR_IN_USE, f"GPU instance {gi_id} holds vGPU {gi['vgpu']}")
            mig["gis"].remove(gi)
            self.host._refresh(gpu)
            self.host._save()

    # ------------------------------------------------------------------ mixed-size mode, placements
    def _vgpu_gpu(self, bus_id: str, mig_check: bool = True) -> dict:
        addr = bus_id.lower()
        gpu = next((g for g in self.host.state["gpus"] if g["pf"] == addr), None)
        if gpu is None:
            raise NvmlError(NVML_ERROR_NOT_FOUND, f"no GPU at {bus_id}")
        if not slots.supports(gpu["board"]):
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} ({gpu['board']}): no known mixed-size placements")
        if mig_check and mig_enabled(gpu):
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} is in MIG mode")
        return gpu

    def _type_size(self, gpu: dict, type_id: int) -> int:
        size = slots.size_of(gpu["board"], str(type_id))
        if size is None:
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"no time-sliced vGPU type {type_id} on {gpu['board']}")
        return size

    def vgpu_heterogeneous_mode(self, bus_id: str) -> int:
        gpu = self._vgpu_gpu(bus_id, mig_check=False)  # a board without a table answers without the lock
        with self.host._gpu_read(gpu["pf"]):
            return int(slots.mixed(self._vgpu_gpu(bus_id)))

    def set_vgpu_heterogeneous_mode(self, bus_id: str, mode: int) -> None:
        if mode not in (0, 1):
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"mode {mode} is neither enabled (1) nor disabled (0)")
        with self.host._locked():
            gpu = self._vgpu_gpu(bus_id)
            if self.host._driver(gpu["pf"]) != "nvidia":
                raise NvmlError(NVML_ERROR_NOT_FOUND, f"{bus_id} is not on the nvidia driver")
            if slots.mixed(gpu) == bool(mode):
                return
            if self.host._existing(gpu):
                raise NvmlError(NVML_ERROR_IN_USE, f"{bus_id} holds vGPUs")
            gpu["mixed_size"], gpu["placements"] = bool(mode), {}
            self.host._refresh(gpu)
            self.host._save()

    def vgpu_type_supported_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]:
        """(placementSize, ids) of a type in mixed-size mode. The board's table never changes: only a
        MIG-capable GPU (whose MIG mode refuses the call) is read under the lock."""
        gpu = self._vgpu_gpu(bus_id, mig_check=False)
        if has_mig(gpu["board"]):
            with self.host._gpu_read(gpu["pf"]):
                gpu = self._vgpu_gpu(bus_id)
        size = self._type_size(gpu, type_id)
        return size, list(slots.supported(gpu["board"], str(type_id)))

    def vgpu_type_creatable_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]:
        with self.host._gpu_read(bus_id.lower()):
            gpu = self._vgpu_gpu(bus_id)
            size = self._type_size(gpu, type_id)
            if not slots.mixed(gpu):
                raise NvmlError(NVML_ERROR_NOT_SUPPORTED, f"{bus_id} is in equal-size mode")
            return size, slots.creatable(gpu, self.host._existing(gpu), str(type_id))

    def vgpu_placement_id(self, bus_id: str, vgpu: str) -> int:
        """A vGPU's placement, by mdev UUID or VF address (NVML's vGPU instance, found by its device)."""
        with self.host._gpu_read(bus_id.lower()):
            gpu = self._vgpu_gpu(bus_id)
            if vgpu.lower() not in {v for _, v, _ in self.host._existing(gpu)}:
                raise NvmlError(NVML_ERROR_NOT_FOUND, f"no vGPU {vgpu} on {bus_id}")
            if not slots.mixed(gpu):
                return slots.INVALID_PLACEMENT_ID
            return gpu.get("placements", {}).get(vgpu.lower(), slots.INVALID_PLACEMENT_ID)

    def vgpu_gpu_instance_id(self, bus_id: str, vgpu: str) -> int:
        """The GPU instance a vGPU was made in (NVML's vGPU instance, found by its mdev UUID);
        0xFFFFFFFF for one in none (time-sliced)."""
        with self.host._gpu_read(bus_id.lower()):
            gpu = self._gpu(bus_id)
            me = vgpu.lower()
            if me not in {v for _, v, _ in self.host._existing(gpu)}:
                raise NvmlError(NVML_ERROR_NOT_FOUND, f"no vGPU {vgpu} on {bus_id}")
            for gi in mig_record(gpu)["gis"] if "mig" in gpu else []:
                if gi.get("vgpu") == me or me in (gi.get("shared") or {}):
                    return int(gi["id"])
            return NO_GPU_INSTANCE

    # ------------------------------------------------------------------ read-only facts (the probe)
    def bus_ids(self) -> list[str]:
        return sorted(g["pf"] for g in self.host.state["gpus"] if catalog.board(g["board"]).vendor_id == "0x10de")

    # ------------------------------------------------------------------ health (SimHost.health raises faults)
    def _health(self, bus_id: str) -> dict:
        gpu = next((g for g in self.host.state["gpus"] if g["pf"] == bus_id.lower()), None)
        if gpu is None:
            raise NvmlError(NVML_ERROR_NOT_FOUND, f"no GPU at {bus_id}")
        h = gpu.get("health") or {}
        if h.get("lost"):
            raise NvmlError(NVML_ERROR_GPU_IS_LOST, bus_id)
        if h.get("hang"):
            raise NvmlError(NVML_ERROR_TIMEOUT, f"{bus_id} does not answer")
        return h

    def critical_xids(self, bus_id: str) -> list[int]:
        """The Xids raised since the last call (NVML's event queue, drained). A GPU with none answers
        under its read lock, as most calls do; one with some is drained under the node lock."""
        with self.host._gpu_read(bus_id.lower()):
            if not self._health(bus_id).get("xids"):
                return []
        with self.host._locked():
            h = self._health(bus_id)
            xids = list(h.get("xids") or [])
            if xids:
                h["xids"] = []
                self.host._save()
            return xids

    def retired_pages_pending(self, bus_id: str) -> bool:
        with self.host._gpu_read(bus_id.lower()):
            return bool(self._health(bus_id).get("ecc"))

    def driver_version(self) -> str:
        return str(self.host.state["spec"].get("driver_version") or HostSpec.model_fields["driver_version"].default)

    def _any_gpu(self, bus_id: str) -> dict:
        gpu = next((g for g in self.host.state["gpus"] if g["pf"] == bus_id.lower()), None)
        if gpu is None or catalog.board(gpu["board"]).vendor_id != "0x10de":
            raise NvmlError(NVML_ERROR_NOT_FOUND, f"no NVIDIA GPU at {bus_id}")
        return gpu

    def device_info(self, bus_id: str) -> dict:
        board = catalog.board(self._any_gpu(bus_id)["board"])
        return {"name": f"NVIDIA {board.key}", "memory_bytes": board.framebuffer_mib * 1024 * 1024}

    def supported_vgpu_types(self, bus_id: str) -> list[dict]:
        board = catalog.board(self._any_gpu(bus_id)["board"])
        return [{"id": int(t.num), "name": t.name, "framebuffer_bytes": (t.fb_mib or 0) * 1024 * 1024,
                 "max_instances": t.max_instances} for t in board.types if isinstance(t.num, int)]

