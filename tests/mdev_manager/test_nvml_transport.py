"""The production NVML transport's mixed-size calls, against nvidia-ml-py's own names and shapes.

No NVIDIA driver here: the calls are checked to exist in the installed nvidia-ml-py (so a typo
cannot reach a real host) and driven through a stand-in library with pynvml's signatures.
"""

from __future__ import annotations

import ctypes

import pytest

from mdev_manager.host.nvml import (
    NO_GPU_INSTANCE,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlError,
    PynvmlTransport,
    VgpuModes,
)

CALLS = ["nvmlDeviceGetVgpuHeterogeneousMode", "nvmlDeviceSetVgpuHeterogeneousMode",
         "nvmlDeviceGetVgpuTypeSupportedPlacements", "nvmlDeviceGetVgpuTypeCreatablePlacements",
         "nvmlVgpuInstanceGetPlacementId", "nvmlDeviceGetActiveVgpus", "nvmlVgpuInstanceGetMdevUUID",
         "nvmlVgpuInstanceGetGpuInstanceId"]


def test_the_calls_exist_in_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    assert [c for c in CALLS if not callable(getattr(pynvml, c, None))] == []
    assert pynvml.NVML_VGPU_PGPU_HETEROGENEOUS_MODE == 0


class _Err(Exception):
    def __init__(self, value):
        self.value = value


class FakeLib:
    """pynvml's shapes: a handle per bus id, placement lists as nvmlVgpuPlacementList_v2_t."""

    def __init__(self):
        self.mode = 0
        self.calls = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return bus

    def nvmlDeviceGetVgpuHeterogeneousMode(self, h):
        return self.mode

    def nvmlDeviceSetVgpuHeterogeneousMode(self, h, mode):
        self.calls.append(("set", h, mode))
        self.mode = mode

    @staticmethod
    def _list(size, ids):
        class PlacementList(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint), ("placementSize", ctypes.c_uint), ("count", ctypes.c_uint),
                        ("placementIds", ctypes.POINTER(ctypes.c_uint)), ("mode", ctypes.c_uint)]
        arr = (ctypes.c_uint * len(ids))(*ids)
        out = PlacementList(0, size, len(ids), ctypes.cast(arr, ctypes.POINTER(ctypes.c_uint)), 0)
        out._keep = arr
        return out

    def nvmlDeviceGetVgpuTypeSupportedPlacements(self, h, type_id, mode=0, version=1):
        self.calls.append(("supported", type_id, mode, version))
        if type_id == 1145:  # a 1 GiB type: not supported
            raise _Err(NVML_ERROR_NOT_SUPPORTED)
        return self._list(8, [0, 16, 24, 40])

    def nvmlDeviceGetVgpuTypeCreatablePlacements(self, h, type_id, version=1):
        return self._list(8, [24, 40])

    def nvmlDeviceGetActiveVgpus(self, h):
        return [7, 9]

    def nvmlVgpuInstanceGetMdevUUID(self, inst):
        return {7: b"aaaaaaaa-0000-4000-8000-000000000001", 9: b"bbbbbbbb-0000-4000-8000-000000000002"}[inst]

    def nvmlVgpuInstanceGetPlacementId(self, inst):
        return {7: 0, 9: 16}[inst]

    def nvmlVgpuInstanceGetGpuInstanceId(self, inst):
        return {7: 0xFFFFFFFF, 9: 3}[inst]


@pytest.fixture
def transport(monkeypatch):
    monkeypatch.setattr(PynvmlTransport, "_ready", True)
    monkeypatch.setattr(PynvmlTransport, "_failed", None)
    return PynvmlTransport(FakeLib())


def test_mode_and_placements_map_nvml_calls(transport):
    modes = VgpuModes(transport)
    state = modes.state("0000:41:00.0", {"1152": 1152, "1145": 1145})
    assert state == {"enabled": False, "slots": 48, "types": {"1152": {"size": 8, "ids": [0, 16, 24, 40]}}}
    assert ("supported", 1152, 0, 2) in transport._lib.calls  # heterogeneous placements, struct version 2
    modes.set_mode("0000:41:00.0", True)
    assert transport._lib.calls[-1] == ("set", b"0000:41:00.0", 1)
    assert transport.vgpu_heterogeneous_mode("0000:41:00.0") == 1
    assert transport.vgpu_type_creatable_placements("0000:41:00.0", 1152) == (8, [24, 40])


def test_an_instance_is_found_by_its_mdev_uuid_only(transport):
    assert transport.vgpu_placement_id("0000:41:00.0", "BBBBBBBB-0000-4000-8000-000000000002") == 16
    with pytest.raises(NvmlError) as e:  # how NVML names a VF's vGPU is unconfirmed: not guessed
        transport.vgpu_placement_id("0000:41:00.0", "0000:41:00.4")
    assert e.value.code == NVML_ERROR_NOT_FOUND


def test_a_vgpus_gpu_instance_is_nvmls_answer_for_its_mdev_uuid(transport):
    assert transport.vgpu_gpu_instance_id("0000:41:00.0", "bbbbbbbb-0000-4000-8000-000000000002") == 3
    assert transport.vgpu_gpu_instance_id("0000:41:00.0", "aaaaaaaa-0000-4000-8000-000000000001") == NO_GPU_INSTANCE
    with pytest.raises(NvmlError) as e:
        transport.vgpu_gpu_instance_id("0000:41:00.0", "cccccccc-0000-4000-8000-000000000003")
    assert e.value.code == NVML_ERROR_NOT_FOUND
