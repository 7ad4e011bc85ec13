"""The grid encoding for several vGPUs per GB20x GPU instance (dra_bridge/pool/migshare.py), checked
exhaustively on the RTX PRO 6000's GPU-instance placements: the counters admit a set of devices
exactly when NVML could create their instances (no two overlapping) with at most k vGPUs in each."""

from __future__ import annotations

import itertools

from dra_bridge.pool.migshare import device_cells, grid_counters, grid_size
from mdev_manager.catalog_mig import MEMORY_SLICES, mig_profiles

RTX = "RTX-PRO-6000-BSE"
PLACEMENTS = {p.name: [(pl.start, pl.size) for pl in p.placements] for p in mig_profiles(RTX)
              if p.name in ("1g.24gb", "2g.48gb", "4g.96gb")}


def check(share: dict[str, int]) -> int:
    slices = MEMORY_SLICES[RTX]
    capacity = grid_counters(slices, PLACEMENTS, share)
    devices = [(p, s, z, q) for p, pls in PLACEMENTS.items() for s, z in pls for q in range(share[p])]
    cells = [set(device_cells(PLACEMENTS, share, p, s, z, q)) for p, s, z, q in devices]
    assert all(c <= set(capacity) for c in cells)
    admitted_sets = 0
    for n in range(len(devices) + 1):
        for chosen in itertools.combinations(range(len(devices)), n):
            taken: list[str] = [c for i in chosen for c in cells[i]]
            admitted = len(taken) == len(set(taken))  # every counter has capacity 1
            instances = {devices[i][:3] for i in chosen}
            creatable = not any(set(range(a[1], a[1] + a[2])) & set(range(b[1], b[1] + b[2]))
                                for a, b in itertools.combinations(instances, 2))
            assert admitted == creatable, [devices[i] for i in chosen]
            admitted_sets += admitted
    return admitted_sets


def test_the_grid_admits_exactly_the_creatable_sets():
    assert check({"1g.24gb": 2, "2g.48gb": 2, "4g.96gb": 3}) > 100
    assert check({"1g.24gb": 1, "2g.48gb": 1, "4g.96gb": 1}) > 10  # one per instance: NVIDIA's slices


def test_its_cost_is_the_product_of_the_maxima_per_slice():
    slices = MEMORY_SLICES[RTX]
    assert grid_size(slices, PLACEMENTS, {"1g.24gb": 4, "2g.48gb": 2, "4g.96gb": 3}) == 4 * 4 * 2 * 3
    two = {k: v for k, v in PLACEMENTS.items() if k != "4g.96gb"}
    assert grid_size(slices, two, {"1g.24gb": 4, "2g.48gb": 2}) == 32  # DC-1-6Q and DC-2-24Q: one set of 32


def test_engines_are_implied_by_the_plain_profiles_placements_not_beside_a_plus_me():
    """Why the grid may leave the engine counters out: every set of non-overlapping plain instances is
    within the GPU's engines; a +me profile (one per GPU, an OFA engine the 4g instance also needs) is not."""
    from dra_bridge.pool.migshare import engines_implied

    profiles = {p.name: p for p in mig_profiles(RTX)}
    full = profiles["4g.96gb"]
    assert engines_implied([profiles[n] for n in ("1g.24gb", "2g.48gb", "4g.96gb")], full)
    assert not engines_implied([profiles["1g.24gb+me"]], full)  # four placements, one instance at most
    assert not engines_implied([profiles["1g.24gb+me"], profiles["1g.24gb+me.all"]], full)


def test_vgpus_sit_inside_their_instance_by_the_blackwell_rule():
    """floor(region * j / k) over the instance's nominal GiB (the type taking it whole), as the
    driver's _kvgpumgrSetHeterogeneousResources_GB100 with maxInstancePerGI."""
    from dra_bridge.pool.migshare import inside_placements
    from mdev_manager.models import Gpu, VgpuType

    def t(name, fb, k, prof):
        return VgpuType(id=name, name=name, short_name=name, framework="vendor-vfio", framebuffer_mib=fb * 1024,
                        mig_backed=True, gpu_instance_profile=prof, max_per_instance=k)

    types = [t("DC-1-2Q", 2, 12, "1g.24gb"), t("DC-1-24Q", 24, 1, "1g.24gb"), t("DC-4-32Q", 32, 3, "4g.96gb"),
             t("DC-4-96Q", 96, 1, "4g.96gb"), t("DC-2-12Q", 12, 4, "2g.48gb")]
    gpu = Gpu.model_construct(types=types)
    assert [(p.start, p.size) for p in inside_placements(gpu, types[0])] == [(j * 2, 2) for j in range(12)]
    assert [(p.start, p.size) for p in inside_placements(gpu, types[2])] == [(0, 32), (32, 32), (64, 32)]
    assert inside_placements(gpu, types[1]) == []  # takes its instance whole
    assert inside_placements(gpu, types[4]) == []  # no type tells the 2g instance's size: not offered shared
