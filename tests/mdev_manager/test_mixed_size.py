"""NVIDIA's mixed-size mode: told from sysfs where it shows, declared by the admin where not.

sysfs has no attribute for the mode (``nvidia-smi vgpu -shm 1`` sets it). Discovery infers
it from the vGPUs a GPU holds: in equal-size mode every other framebuffer size then reads
0 available (kernel.md). A layout entry may declare ``mixedSize: true``; one that mixes
sizes without it is refused, and one that declares it on a GPU shown to be in equal-size
mode is refused with the fix.
"""

from __future__ import annotations

from collections import Counter

import pytest

from mdev_manager.config import ConfigError
from mdev_manager.discovery import infer_mixed_size
from mdev_manager.models import Vgpu, VgpuType
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import layout

MIXED = {"T4-1Q": 4, "T4-4Q": 2}  # 1 GiB and 4 GiB: 4/16 + 2/4 of the GPU


def spec(board: str, mixed: bool) -> HostSpec:
    return HostSpec(name="h", node="h", gpus=[GpuGroup(board=board, count=1, mixed_size=mixed)])


def sizes(inv) -> Counter:
    return Counter(v.type_name for v in inv.all_vgpus())


@pytest.mark.parametrize("board, one", [("T4", "T4-1Q"), ("A16", "A16-1Q"), ("L40S", "L40S-1Q")])
@pytest.mark.parametrize("mixed", [False, True])
def test_discovery_tells_the_mode_once_a_vgpu_exists(make_sim, board, one, mixed):
    sim = make_sim(spec(board, mixed))
    assert reconcile(sim.env, sim.io, layout({"all": True, "vgpus": {}})).ok
    assert sim.discover().gpus[0].mixed_size is None  # no vGPU yet: nothing to tell it by
    assert reconcile(sim.env, sim.io, layout({"all": True, "vgpus": {one: 1}})).ok
    assert sim.discover().gpus[0].mixed_size is mixed


def test_intel_and_full_gpus_say_nothing():
    t = lambda tid, fb, mx, avail: VgpuType(id=tid, name=tid, short_name=tid, framework="mdev",  # noqa: E731
                                             available_instances=avail, max_instances=mx, framebuffer_mib=fb)
    full = [t("a", 1024, 16, 0), t("b", 4096, 4, 0)]
    held = [Vgpu(id="u", framework="mdev", type_id="a", type_name="a", parent="p", gpu="g")]
    assert infer_mixed_size("0x10de", full, held * 16) is None  # full: equal or mixed read the same
    assert infer_mixed_size("0x8086", [t("a", 1024, 16, 3), t("b", 4096, 4, 0)], held) is None
    # 15/16 free: a 16 GiB type would not fit even in mixed-size mode, so its 0 says nothing
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("c", 16384, 1, 0)], held) is None
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("b", 4096, 4, 0)], held) is False
    assert infer_mixed_size("0x10de", [t("a", 1024, 16, 15), t("b", 4096, 4, 3)], held) is True


def test_mixed_layout_needs_the_declaration(make_sim):
    sim = make_sim(spec("T4", mixed=True))
    with pytest.raises(ConfigError) as exc:
        reconcile(sim.env, sim.io, layout({"all": True, "vgpus": MIXED}))
    assert "gpus[0].vgpus" in str(exc.value) and "mixedSize: true" in str(exc.value)
    assert sim.discover().all_vgpus() == []  # refused before any write
    out = reconcile(sim.env, sim.io, layout({"all": True, "mixedSize": True, "vgpus": MIXED}))
    assert out.ok
    assert sizes(sim.discover()) == Counter({"GRID T4-1Q": 4, "GRID T4-4Q": 2})
    again = reconcile(sim.env, sim.io, layout({"all": True, "mixedSize": True, "vgpus": MIXED}))
    assert again.changed == 0


def test_declaring_mixed_on_an_equal_size_gpu_is_refused_with_the_fix(make_sim):
    sim = make_sim(spec("T4", mixed=False))
    assert reconcile(sim.env, sim.io, layout({"all": True, "vgpus": {"T4-1Q": 2}})).ok
    with pytest.raises(ConfigError) as exc:
        reconcile(sim.env, sim.io, layout({"all": True, "mixedSize": True, "vgpus": MIXED}))
    msg = str(exc.value)
    assert "gpus[0].mixedSize" in msg and "equal-size mode" in msg and "-shm 1" in msg
    assert sizes(sim.discover()) == Counter({"GRID T4-1Q": 2})


def test_a_wrong_declaration_on_an_empty_gpu_fails_per_device_and_keeps_what_fits(make_sim):
    # Nothing to tell the mode by: the declaration is trusted, the kernel refuses the second size.
    sim = make_sim(spec("T4", mixed=False))
    out = reconcile(sim.env, sim.io, layout({"all": True, "mixedSize": True, "vgpus": MIXED}))
    assert not out.ok
    assert {r.error for r in out.rounds[-1].report.failed if not r.skipped} == {"EUSERS"}
    assert sizes(sim.discover()) == Counter({"GRID T4-1Q": 4})  # the 1 GiB ones exist and stay
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.mixedSize"):  # now the GPU shows its mode
        reconcile(sim.env, sim.io, layout({"all": True, "mixedSize": True, "vgpus": MIXED}))


def test_mixed_size_is_only_for_vgpu_modes():
    with pytest.raises(ConfigError, match="mixedSize"):
        layout({"all": True, "mode": "passthrough", "mixedSize": True})
