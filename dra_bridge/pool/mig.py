"""The DRA devices of a GPU in MIG mode: one per (GPU-instance profile, placement), in NVIDIA's
counter vocabulary, so MIG-backed vGPUs carry the claim semantics of physical MIG slices.

As NVIDIA's DRA driver publishes MIG devices (kubernetes-sigs/dra-driver-nvidia-gpu,
``cmd/gpu-kubelet-plugin``: ``partitions.go``, ``mig.go``): one counter set per physical GPU,
``gpu-<i>-counter-set``, holding ``multiprocessors``, ``copy-engines``, ``decoders``, ``encoders``,
``jpeg-engines``, ``ofa-engines`` and ``memory`` (bytes) at the full profile's values (the
maximum over the profiles), and one ``memory-slice-<k>`` counter of 1 per memory slice. A
placement device consumes its profile's values plus ``memory-slice-<k>`` for each slice it
spans; the whole GPU consumes everything. Two placements that overlap, one profile beyond its
engines (a second ``+me``), or the whole GPU beside any placement are thus never allocated
together: exactly NVML's placement rules (checked exhaustively in the tests).

The vGPU a placement's claim gets is the MIG-backed type of that profile (``A100-3-20C`` on
``3g.20gb``; NVIDIA's user guide names each after the profile it takes whole). Where the layout
names a type several of which share an instance (MIG time-slicing, GB20x: ``DC-1-6Q``, 4 per
``1g.24gb``), each placement offers one device per vGPU placement inside the instance
(``gpu-2-mig-1g24gb-14-1-at-6``) on the grid of :mod:`.migshare` instead of the memory-slice and
engine counters, where that grid fits a counter set. Pure.
"""

from __future__ import annotations

from dra_bridge.api.attributes import (
    ATTR_FRAMEWORK,
    ATTR_MIG_BACKED,
    ATTR_MIG_ENABLED,
    ATTR_PARENT_PCI_BUS_ID,
    ATTR_PARENT_UUID,
    ATTR_PLACEMENT_SIZE,
    ATTR_PLACEMENT_START,
    ATTR_PROFILE,
    ATTR_SERIES,
    ATTR_TYPE,
    ATTR_TYPE_ID,
    ATTR_TYPE_NAME,
    ATTR_UUID,
    ATTR_VGPU_PLACEMENT,
    ATTR_VGPU_TYPE,
    ATTR_VGPU_TYPES,
)
from dra_bridge.api.names import counter_set_name, mig_device_name, passthrough_device_name, type_is_mig_backed
from dra_bridge.pool.migshare import Grid, share_grid
from dra_bridge.pool.model import (
    ATTR_PCI_BUS_ID,
    AttrValue,
    Consumption,
    CounterSet,
    GpuPolicy,
    Pool,
    PoolDevice,
    attr_bool,
    attr_int,
    attr_string,
    format_mib,
)
from mdev_manager.models import Gpu, GpuInstanceProfile, MigPlacement, MigState, VgpuType
from mdev_manager.names import mig_profile_of, type_series

#: NVIDIA's counter names for a profile's engines (camelToDNSName of NVML's field names), and the
#: capacity names of a MIG device (camelCase), each with the profile field it counts.
ENGINE_COUNTERS = (("multiprocessors", "multiprocessors", "multiprocessors"),
                   ("copy-engines", "copyEngines", "copy_engines"),
                   ("decoders", "decoders", "decoders"),
                   ("encoders", "encoders", "encoders"),
                   ("jpeg-engines", "jpegEngines", "jpeg_engines"),
                   ("ofa-engines", "ofaEngines", "ofa_engines"))


def memory_slice(k: int) -> str:
    return f"memory-slice-{k}"


def full_profile(mig: MigState) -> GpuInstanceProfile:
    return max(mig.profiles, key=lambda p: (p.slices, p.memory_mib, p.multiprocessors))


def gpu_counters(mig: MigState) -> dict[str, int | str]:
    """The GPU's counter set: each engine and the memory at the full profile's values, one counter per memory slice."""
    full = full_profile(mig)
    out: dict[str, int | str] = {name: getattr(full, field) for name, _, field in ENGINE_COUNTERS}
    out["memory"] = format_mib(full.memory_mib)
    out.update({memory_slice(k): 1 for k in range(mig.memory_slices)})
    return out


def profile_consumption(prof: GpuInstanceProfile, start: int, size: int) -> dict[str, str]:
    out = {name: str(getattr(prof, field)) for name, _, field in ENGINE_COUNTERS}
    out["memory"] = format_mib(prof.memory_mib)
    out.update({memory_slice(k): "1" for k in range(start, start + size)})
    return out


def mig_types(gpu: Gpu, pol: GpuPolicy, warnings: list[str]) -> dict[int, VgpuType]:
    """GPU-instance profile id -> the MIG-backed type its placements offer (the policy's order
    first; ``None`` in the policy: every MIG-backed type the GPU offers, the one filling its instance first)."""
    assert gpu.mig is not None
    refs = pol.vgpu_types
    if refs is None:
        # MIG time-slicing (GB20x): a placement's claim gets its instance whole, so the type that
        # fills it (DC-1-24Q on 1g.24gb, the Q series first) rather than a 2 GB one wasting 22 GB
        chosen = sorted((t for t in gpu.types if type_is_mig_backed(t)),
                        key=lambda t: ((t.max_per_instance or 1) > 1, "QCAB".find(type_series(t.name) or "Q")))
    else:
        chosen = []
        for ref in refs:
            t = gpu.type_by_ref(ref)
            if t is None or not type_is_mig_backed(t):
                warnings.append(f"GPU {gpu.address}: {ref!r} is not a MIG-backed type of this GPU, which is in MIG "
                                "mode; skipped")
            elif t not in chosen:
                chosen.append(t)
    out: dict[int, VgpuType] = {}
    for t in chosen:
        prof = gpu.mig.profile(t.gpu_instance_profile or mig_profile_of(t.name) or "")
        if prof is None:
            warnings.append(f"GPU {gpu.address}: {t.short_name} needs GPU-instance profile "
                            f"{t.gpu_instance_profile or mig_profile_of(t.name)!r}, which NVML does not list; skipped")
            continue
        if prof.id in out and (t.max_per_instance or 1) > 1:
            warnings.append(f"GPU {gpu.address}: {t.short_name} not offered: {out[prof.id].short_name} is offered on "
                            f"{prof.name} (an instance holds one type)")
        out.setdefault(prof.id, t)
    return out


def add_mig_gpu(pool: Pool, gpu: Gpu, pol: GpuPolicy, common: dict[str, AttrValue], *, share: bool = True) -> None:
    """The counter set and devices of a GPU in MIG mode (see the module docstring); ``share``:
    instances may be shared (not on a dual-mode GPU, whose counters hold both modes')."""
    mig = gpu.mig
    assert mig is not None and mig.enabled
    if not mig.profiles:
        pool.warnings.append(f"GPU {gpu.address}: in MIG mode but NVML lists no GPU-instance profile; not offered")
        return
    cs = counter_set_name(gpu.index)
    offered = mig_types(gpu, pol, pool.warnings)
    if not offered and not pol.passthrough:
        return
    grid = share_grid(gpu, offered, pool.warnings) if share else None
    if not share and any((t.max_per_instance or 1) > 1 for t in offered.values()):
        pool.warnings.append(f"GPU {gpu.address}: offered one vGPU per GPU instance (migMode: auto keeps both modes' "
                             "counters; instances are shared with migMode: true)")
    counters: dict[str, int | str] = dict(grid.counters) if grid else gpu_counters(mig)
    pool.counter_sets.append(CounterSet(name=cs, counters=counters))
    full = full_profile(mig)
    if pol.passthrough:
        pool.devices.append(PoolDevice(
            name=passthrough_device_name(gpu.index), kind="passthrough", gpu=gpu.address,
            attributes={ATTR_TYPE: attr_string("passthrough"), ATTR_PROFILE: attr_string(gpu.model),
                        ATTR_FRAMEWORK: attr_string("vfio-pci"), ATTR_MIG_ENABLED: attr_bool(True), **common,
                        ATTR_PCI_BUS_ID: attr_string(gpu.address),
                        **({ATTR_UUID: attr_string(mig.uuid)} if mig.uuid else {})},
            capacity={"memory": format_mib(full.memory_mib)},
            consumes=[Consumption(counter_set=cs, counters={k: str(v) for k, v in counters.items()})]))
    by_profile: list[tuple[GpuInstanceProfile, VgpuType]] = []
    for pid, t in offered.items():
        prof = mig.profile(pid)
        assert prof is not None  # mig_types offers only the profiles NVML lists
        by_profile.append((prof, t))
    for prof, t in sorted(by_profile, key=lambda pt: (-pt[0].slices, pt[0].id)):
        attrs: dict[str, AttrValue] = {
            ATTR_TYPE: attr_string("vgpu"),
            ATTR_PROFILE: attr_string(prof.name),
            ATTR_VGPU_TYPE: attr_string(t.short_name),
            ATTR_VGPU_TYPES: attr_string(f" {t.short_name} "),
            ATTR_TYPE_NAME: attr_string(t.name),
            ATTR_TYPE_ID: attr_string(t.id),
            ATTR_FRAMEWORK: attr_string(t.framework),
            ATTR_MIG_BACKED: attr_bool(True),
            **common,
            ATTR_PARENT_PCI_BUS_ID: attr_string(gpu.address),
        }
        if mig.uuid:
            attrs[ATTR_PARENT_UUID] = attr_string(mig.uuid)
        if (series := type_series(t.name)) is not None:
            attrs[ATTR_SERIES] = attr_string(series)
        cap = {"memory": format_mib(prof.memory_mib),
               **{cap_name: str(getattr(prof, field)) for _, cap_name, field in ENGINE_COUNTERS}}
        for pl in prof.placements:
            base = PoolDevice(
                name=mig_device_name(gpu.index, prof.name, prof.id, pl.start), kind="vgpu", gpu=gpu.address,
                type_id=t.id, gpu_instance_profile=prof.id, placement=pl, profile_instances=prof.instances,
                attributes={**attrs, ATTR_PLACEMENT_START: attr_int(pl.start), ATTR_PLACEMENT_SIZE: attr_int(pl.size)},
                capacity=dict(cap),
                consumes=[Consumption(counter_set=cs, counters=profile_consumption(prof, pl.start, pl.size))])
            pool.devices += shared_devices(base, grid, prof, t) if grid else [base]


def shared_devices(base: PoolDevice, grid: Grid, prof: GpuInstanceProfile, t: VgpuType) -> list[PoolDevice]:
    """An instance placement's devices on the grid: one per vGPU placement inside the instance
    (``-at-<placement id>``), or the instance whole where its type takes it whole."""
    assert base.placement is not None
    inside = grid.inside.get(prof.id) or []
    if not inside:
        return [base.model_copy(update={"consumes": [Consumption(counter_set=base.consumes[0].counter_set,
                                                                 counters=grid.cells(prof, base.placement, 0))]})]
    out = []
    for q, at in enumerate(inside):
        cap = {**base.capacity, "memory": format_mib(t.framebuffer_mib or 0)}
        out.append(base.model_copy(deep=True, update={
            "name": f"{base.name}-at-{at.start}", "inside": MigPlacement(start=at.start, size=at.size), "capacity": cap,
            "attributes": {**base.attributes, ATTR_VGPU_PLACEMENT: attr_int(at.start)},
            "consumes": [Consumption(counter_set=base.consumes[0].counter_set,
                                     counters=grid.cells(prof, base.placement, q))]}))
    return out
