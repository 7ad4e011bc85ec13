"""MIG and vGPU mixed-size mode through NVML: a small typed API over a swappable transport.

The transport speaks NVML's calls, keyed by the GPU's PCI address, in NVML's terms (profile
ids as ``nvmlGpuInstanceProfileInfo_t.id``, placements as ``nvmlGpuInstancePlacement_t``) and
fails with NVML's return codes (:class:`NvmlError`). Production uses :class:`PynvmlTransport`
over ``nvidia-ml-py`` (NVIDIA's official bindings); the simulated host supplies its own
transport; nothing above this module knows which one it has.

Calls used, as NVML documents them (https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html):
``nvmlDeviceGetMigMode``, ``nvmlDeviceSetMigMode``, ``nvmlDeviceGetGpuInstanceProfileInfo``,
``nvmlDeviceGetGpuInstancePossiblePlacements_v2``, ``nvmlDeviceGetGpuInstances``,
``nvmlGpuInstanceGetInfo``, ``nvmlDeviceCreateGpuInstanceWithPlacement``, ``nvmlGpuInstanceDestroy``;
for mixed-size ("heterogeneous") vGPU mode (nvml.h; the same names in nvidia-ml-py):
``nvmlDeviceGetVgpuHeterogeneousMode``, ``nvmlDeviceSetVgpuHeterogeneousMode``,
``nvmlDeviceGetVgpuTypeSupportedPlacements``, ``nvmlDeviceGetVgpuTypeCreatablePlacements``,
``nvmlVgpuInstanceGetPlacementId``. A vGPU type is named by its NVML type id, taken to be the
number in its mdev type id (``nvidia-468``) and its vendor-VFIO id (``1145``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol, TypeVar

_T = TypeVar("_T")

# the pynvml module (nvidia-ml-py ships no types) or a stand-in with its names; its calls answer ctypes structures
_Pynvml = Any

# NVML return codes (nvml.h, nvmlReturn_t)
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x0000000000000008  # nvmlEventTypeXidCriticalError (nvml.h)
#: a vGPU in no GPU instance (nvmlVgpuInstanceGetGpuInstanceId; a VF's nvidia/gpu_instance_id): 0xFFFFFFFF
NO_GPU_INSTANCE = 0xFFFFFFFF

NVML_GPU_INSTANCE_PROFILE_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_* constants 0..17 (nvml.h)
NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1  # nvmlVgpuHeterogeneousMode_t.mode
NVML_VGPU_PGPU_HETEROGENEOUS_MODE = 0  # nvmlVgpuPlacementList_v2_t.mode: the mixed-size placements
NVML_INVALID_VGPU_PLACEMENT_ID = 0xFFFF

_NAMES = {1: "uninitialized", 2: "invalid argument", 3: "not supported", 4: "insufficient permissions",
          6: "not found", 9: "driver not loaded", 12: "NVML library not found", 19: "in use",
          23: "insufficient resources", 10: "timeout", 15: "GPU is lost"}


class NvmlError(Exception):
    """An NVML call failed with ``code`` (an ``nvmlReturn_t``)."""

    def __init__(self, code: int, what: str = ""):
        self.code = code
        self.what = what
        super().__init__(f"NVML: {_NAMES.get(code, f'error {code}')}" + (f": {what}" if what else ""))


class NvmlTransport(Protocol):
    """NVML's MIG and vGPU-placement calls for the GPU at a PCI address (``0000:41:00.0``)."""

    def mig_mode(self, bus_id: str) -> tuple[int, int]: ...
    def set_mig_mode(self, bus_id: str, mode: int) -> None: ...
    def gpu_instance_profiles(self, bus_id: str) -> list[dict]: ...
    def memory_slices(self, bus_id: str) -> int: ...
    def gpu_instances(self, bus_id: str) -> list[tuple[int, int, int, int]]: ...
    def create_gpu_instance(self, bus_id: str, profile_id: int, start: int, size: int) -> int: ...
    def destroy_gpu_instance(self, bus_id: str, gi_id: int) -> None: ...
    def uuid(self, bus_id: str) -> str: ...
    def vgpu_heterogeneous_mode(self, bus_id: str) -> int: ...
    def set_vgpu_heterogeneous_mode(self, bus_id: str, mode: int) -> None: ...
    def vgpu_type_supported_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]: ...
    def vgpu_type_creatable_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]: ...
    def vgpu_placement_id(self, bus_id: str, vgpu: str) -> int: ...
    def vgpu_gpu_instance_id(self, bus_id: str, vgpu: str) -> int: ...
    # read-only facts for the probe (vgpuctl nvml-probe): which GPUs NVML sees, what each is
    def bus_ids(self) -> list[str]: ...
    def driver_version(self) -> str: ...
    def device_info(self, bus_id: str) -> dict: ...
    def supported_vgpu_types(self, bus_id: str) -> list[dict]: ...
    # health (the agent's watch, dra_bridge/agent/health.py): critical Xid events since the last call,
    # and ECC page retirement waiting for a reset; a lost GPU fails any call with NVML_ERROR_GPU_IS_LOST
    def critical_xids(self, bus_id: str) -> list[int]: ...
    def retired_pages_pending(self, bus_id: str) -> bool: ...


class Mig:
    """The node's MIG control: read a GPU's state, switch its mode, create and destroy GPU instances."""

    def __init__(self, transport: NvmlTransport):
        self.t = transport

    def state(self, bus_id: str) -> dict | None:
        """The GPU's MIG state (the fields of :class:`mdev_manager.models.MigState`); None when it has
        no MIG (or no NVML answers for it)."""
        try:
            current, pending = self.t.mig_mode(bus_id)
            profiles = self.t.gpu_instance_profiles(bus_id)
            slices = self.t.memory_slices(bus_id)
            raw = self.t.gpu_instances(bus_id) if current else []
        except NvmlError as e:
            if e.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_LIBRARY_NOT_FOUND,
                          NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise
        instances = [{"id": gid, "profile_id": pid, "placement": {"start": start, "size": size}}
                     for gid, pid, start, size in sorted(raw)]
        try:
            uuid = self.t.uuid(bus_id)
        except NvmlError:
            uuid = None  # published "where known" only
        return {"enabled": bool(current), "pending": bool(pending), "memory_slices": slices, "profiles": profiles,
                "instances": instances, "uuid": uuid}

    def set_mode(self, bus_id: str, enabled: bool) -> None:
        self.t.set_mig_mode(bus_id, 1 if enabled else 0)

    def create(self, bus_id: str, profile_id: int, start: int, size: int) -> int:
        """Create a GPU instance at a placement; returns its id."""
        return self.t.create_gpu_instance(bus_id, profile_id, start, size)

    def destroy(self, bus_id: str, gi_id: int) -> None:
        self.t.destroy_gpu_instance(bus_id, gi_id)


_SILENT = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED,
           NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT)


class VgpuModes:
    """The node's mixed-size control: read a GPU's mode and its types' placements, switch the mode."""

    def __init__(self, transport: NvmlTransport):
        self.t = transport

    def state(self, bus_id: str, type_ids: dict[str, int]) -> dict | None:
        """The fields of :class:`mdev_manager.models.VgpuPlacements` for the GPU's time-sliced types
        (``type_ids``: our id -> NVML's type id); None when NVML reports no mixed-size mode for it."""
        try:
            enabled = self.t.vgpu_heterogeneous_mode(bus_id) == NVML_FEATURE_ENABLED
        except NvmlError as e:
            if e.code in _SILENT:
                return None
            raise
        types: dict[str, dict] = {}
        for tid, number in type_ids.items():
            try:
                size, ids = self.t.vgpu_type_supported_placements(bus_id, number)
            except NvmlError as e:
                if e.code in _SILENT:
                    continue
                raise
            if ids:  # a type NVML places nowhere is never creatable in mixed-size mode
                types[tid] = {"size": size, "ids": sorted(ids)}
        slots = max((p + t["size"] for t in types.values() for p in t["ids"]), default=0)
        return {"enabled": enabled, "slots": slots, "types": types}

    def set_mode(self, bus_id: str, enabled: bool) -> None:
        self.t.set_vgpu_heterogeneous_mode(bus_id, NVML_FEATURE_ENABLED if enabled else NVML_FEATURE_DISABLED)


class NoNvml:
    """A host without NVIDIA's library: no GPU has MIG or mixed-size mode."""

    def _none(self, *_a: object, **_k: object) -> NoReturn:
        raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND)

    mig_mode = set_mig_mode = gpu_instance_profiles = memory_slices = gpu_instances = _none
    create_gpu_instance = destroy_gpu_instance = uuid = _none
    vgpu_heterogeneous_mode = set_vgpu_heterogeneous_mode = vgpu_type_supported_placements = _none
    vgpu_type_creatable_placements = vgpu_placement_id = vgpu_gpu_instance_id = _none
    bus_ids = driver_version = device_info = supported_vgpu_types = _none
    critical_xids = retired_pages_pending = _none


class PynvmlTransport:
    """NVML through ``nvidia-ml-py`` (``import pynvml``), initialised on first use.

    Not exercised here (no NVIDIA driver on these machines); every call maps one NVML call, and
    NVML's exceptions become :class:`NvmlError` with the same return code.
    """

    _lock = threading.Lock()
    _ready = False
    _failed: int | None = None  # nvmlInit's error: a host without the driver answers at once after the first try

    def __init__(self, lib: _Pynvml | None = None):
        self._lib = lib
        self._xid_sets: dict[str, object] = {}  # bus id -> its NVML event set, registered once

    def _nvml(self) -> _Pynvml:
        if self._lib is None:
            try:
                import pynvml  # nvidia-ml-py: loaded on first use (~14 ms); a host without it has no NVML
            except ImportError:
                raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, "nvidia-ml-py is not installed") from None
            self._lib = pynvml
        with self._lock:
            if PynvmlTransport._failed is not None:
                raise NvmlError(PynvmlTransport._failed, "NVML did not initialise")
            if not PynvmlTransport._ready:
                try:
                    self._call(self._lib.nvmlInit)
                except NvmlError as e:
                    PynvmlTransport._failed = e.code
                    raise
                PynvmlTransport._ready = True
        return self._lib

    def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        try:
            return fn(*args)
        except Exception as e:  # pynvml.NVMLError carries .value (the nvmlReturn_t)
            code = getattr(e, "value", None)
            if isinstance(code, int):
                raise NvmlError(code, str(e)) from None
            raise

    def _handle(self, bus_id: str) -> tuple[_Pynvml, object]:
        lib = self._nvml()
        return lib, self._call(lib.nvmlDeviceGetHandleByPciBusId, bus_id.upper().encode())

    def mig_mode(self, bus_id: str) -> tuple[int, int]:
        lib, h = self._handle(bus_id)
        current, pending = self._call(lib.nvmlDeviceGetMigMode, h)
        return int(current), int(pending)

    def set_mig_mode(self, bus_id: str, mode: int) -> None:
        lib, h = self._handle(bus_id)
        self._call(lib.nvmlDeviceSetMigMode, h, mode)

    def _infos(self, lib: _Pynvml, h: object) -> Iterator[Any]:
        for const in range(NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                yield self._call(lib.nvmlDeviceGetGpuInstanceProfileInfo, h, const)
            except NvmlError as e:
                if e.code not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    raise

    def _placements(self, lib: _Pynvml, h: object, profile_id: int) -> list[dict]:
        arr = (lib.c_nvmlGpuInstancePlacement_t * 32)()
        count = lib.c_uint(32)
        self._call(lib.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, arr, lib.byref(count))
        return [{"start": arr[i].start, "size": arr[i].size} for i in range(count.value)]

    def gpu_instance_profiles(self, bus_id: str) -> list[dict]:
        lib, h = self._handle(bus_id)
        out = []
        for info in self._infos(lib, h):
            name = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
            out.append(dict(
                id=info.id, name=name.removeprefix("MIG "), slices=info.sliceCount, instances=info.instanceCount,
                memory_mib=info.memorySizeMB, multiprocessors=info.multiprocessorCount,
                copy_engines=info.copyEngineCount, decoders=info.decoderCount, encoders=info.encoderCount,
                jpeg_engines=info.jpegCount, ofa_engines=info.ofaCount,
                placements=self._placements(lib, h, info.id)))
        return out

    def memory_slices(self, bus_id: str) -> int:
        """The widest placement's end: the full profile spans every memory slice."""
        return max((p["start"] + p["size"] for prof in self.gpu_instance_profiles(bus_id) for p in prof["placements"]),
                   default=0)

    def gpu_instances(self, bus_id: str) -> list[tuple[int, int, int, int]]:
        lib, h = self._handle(bus_id)
        out = []
        for info in self._infos(lib, h):
            arr = (lib.c_nvmlGpuInstance_t * max(1, info.instanceCount))()
            count = lib.c_uint(0)
            self._call(lib.nvmlDeviceGetGpuInstances, h, info.id, arr, lib.byref(count))
            for i in range(count.value):
                gi = self._call(lib.nvmlGpuInstanceGetInfo, arr[i])
                out.append((gi.id, gi.profileId, gi.placement.start, gi.placement.size))
        return out

    def create_gpu_instance(self, bus_id: str, profile_id: int, start: int, size: int) -> int:
        lib, h = self._handle(bus_id)
        placement = lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = self._call(lib.nvmlDeviceCreateGpuInstanceWithPlacement, h, profile_id, lib.byref(placement))
        return int(self._call(lib.nvmlGpuInstanceGetInfo, gi).id)

    def uuid(self, bus_id: str) -> str:
        lib, h = self._handle(bus_id)
        u = self._call(lib.nvmlDeviceGetUUID, h)
        return u.decode() if isinstance(u, bytes) else str(u)

    def destroy_gpu_instance(self, bus_id: str, gi_id: int) -> None:
        lib, h = self._handle(bus_id)
        gi = self._call(lib.nvmlDeviceGetGpuInstanceById, h, gi_id)
        self._call(lib.nvmlGpuInstanceDestroy, gi)

    # ------------------------------------------------------------------ mixed-size mode, placements
    def vgpu_heterogeneous_mode(self, bus_id: str) -> int:
        lib, h = self._handle(bus_id)
        return int(self._call(lib.nvmlDeviceGetVgpuHeterogeneousMode, h))

    def set_vgpu_heterogeneous_mode(self, bus_id: str, mode: int) -> None:
        lib, h = self._handle(bus_id)
        self._call(lib.nvmlDeviceSetVgpuHeterogeneousMode, h, mode)

    @staticmethod
    def _placement_list(plist: Any) -> tuple[int, list[int]]:
        return int(plist.placementSize), [int(plist.placementIds[i]) for i in range(plist.count)]

    def vgpu_type_supported_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]:
        """The mixed-size placements (``nvmlVgpuPlacementList_v2_t.mode`` heterogeneous) of a type."""
        lib, h = self._handle(bus_id)
        return self._placement_list(self._call(lib.nvmlDeviceGetVgpuTypeSupportedPlacements, h, type_id,
                                               NVML_VGPU_PGPU_HETEROGENEOUS_MODE, 2))

    def vgpu_type_creatable_placements(self, bus_id: str, type_id: int) -> tuple[int, list[int]]:
        lib, h = self._handle(bus_id)
        return self._placement_list(self._call(lib.nvmlDeviceGetVgpuTypeCreatablePlacements, h, type_id, 2))

    def vgpu_placement_id(self, bus_id: str, vgpu: str) -> int:
        """The placement of the active vGPU instance whose mdev UUID is ``vgpu``. How NVML names the
        vGPU of a vendor-VFIO VF is unconfirmed: a VF address is answered NOT_FOUND, not guessed."""
        lib, inst = self._active_vgpu(bus_id, vgpu)
        return int(self._call(lib.nvmlVgpuInstanceGetPlacementId, inst))

    def vgpu_gpu_instance_id(self, bus_id: str, vgpu: str) -> int:
        """The GPU instance the active vGPU whose mdev UUID is ``vgpu`` runs in
        (``nvmlVgpuInstanceGetGpuInstanceId``; 0xFFFFFFFF for a time-sliced vGPU): an mdev names none
        in sysfs, so which of a profile's instances holds which MIG-backed mdev is NVML's to say."""
        lib, inst = self._active_vgpu(bus_id, vgpu)
        return int(self._call(lib.nvmlVgpuInstanceGetGpuInstanceId, inst))

    def _active_vgpu(self, bus_id: str, vgpu: str) -> tuple[_Pynvml, object]:
        lib, h = self._handle(bus_id)
        for inst in self._call(lib.nvmlDeviceGetActiveVgpus, h):
            mdev = self._call(lib.nvmlVgpuInstanceGetMdevUUID, inst)
            mdev = mdev.decode() if isinstance(mdev, bytes) else str(mdev)
            if mdev.strip().lower() == vgpu.strip().lower():
                return lib, inst
        raise NvmlError(NVML_ERROR_NOT_FOUND, f"no active vGPU instance {vgpu} on {bus_id}")

    # ------------------------------------------------------------------ read-only facts (the probe)
    def bus_ids(self) -> list[str]:
        """Every GPU NVML sees, as PCI addresses (``0000:41:00.0``), in its own order."""
        lib = self._nvml()
        out = []
        for i in range(int(self._call(lib.nvmlDeviceGetCount))):
            pci = self._call(lib.nvmlDeviceGetPciInfo, self._call(lib.nvmlDeviceGetHandleByIndex, i))
            bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
            out.append(bus.lower()[-12:])  # NVML pads the domain to 8 digits: 00000000:41:00.0
        return out

    def critical_xids(self, bus_id: str) -> list[int]:
        """The critical Xid errors NVML reported for the GPU since the last call (nvmlEventSetCreate,
        nvmlDeviceRegisterEvents for nvmlEventTypeXidCriticalError, then nvmlEventSetWait_v2 with no wait
        until it times out): the events NVIDIA's DRA driver watches for its xid taint."""
        lib, h = self._handle(bus_id)
        events = self._xid_sets.get(bus_id)
        if events is None:
            events = self._call(lib.nvmlEventSetCreate)
            self._call(lib.nvmlDeviceRegisterEvents, h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, events)
            self._xid_sets[bus_id] = events
        out: list[int] = []
        while True:
            try:
                data = self._call(lib.nvmlEventSetWait_v2, events, 0)
            except NvmlError as e:
                if e.code == NVML_ERROR_TIMEOUT:
                    return out
                raise
            out.append(int(data.eventData))

    def retired_pages_pending(self, bus_id: str) -> bool:
        """nvmlDeviceGetRetiredPagesPendingStatus: ECC errors retired pages that take effect at the next reset."""
        lib, h = self._handle(bus_id)
        return bool(self._call(lib.nvmlDeviceGetRetiredPagesPendingStatus, h))

    def driver_version(self) -> str:
        lib = self._nvml()
        v = self._call(lib.nvmlSystemGetDriverVersion)
        return v.decode() if isinstance(v, bytes) else str(v)

    def device_info(self, bus_id: str) -> dict:
        """``{"name", "memory_bytes"}`` (nvmlDeviceGetName, nvmlDeviceGetMemoryInfo)."""
        lib, h = self._handle(bus_id)
        name = self._call(lib.nvmlDeviceGetName, h)
        mem = self._call(lib.nvmlDeviceGetMemoryInfo, h)
        return {"name": name.decode() if isinstance(name, bytes) else str(name), "memory_bytes": int(mem.total)}

    def supported_vgpu_types(self, bus_id: str) -> list[dict]:
        """``[{"id", "name", "framebuffer_bytes", "max_instances"}]`` (nvmlDeviceGetSupportedVgpus and the
        nvmlVgpuTypeGet* calls); NOT_SUPPORTED on a GPU without vGPU support."""
        lib, h = self._handle(bus_id)
        out = []
        for tid in self._call(lib.nvmlDeviceGetSupportedVgpus, h):
            name = self._call(lib.nvmlVgpuTypeGetName, tid)
            out.append({"id": int(tid), "name": name.decode() if isinstance(name, bytes) else str(name),
                        "framebuffer_bytes": int(self._call(lib.nvmlVgpuTypeGetFramebufferSize, tid)),
                        "max_instances": int(self._call(lib.nvmlVgpuTypeGetMaxInstances, h, tid))})
        return out

