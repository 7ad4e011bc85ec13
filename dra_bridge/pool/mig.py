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
``3g.20gb``; NVIDIA's user guide names each after the profile it takes whole). Pure.
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
    ATTR_VGPU_TYPE,
    ATTR_VGPU_TYPES,
)
from dra_bridge.api.names import counter_set_name, mig_device_name, passthrough_device_name, type_is_mig_backed
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
from mdev_manager.models import Gpu, GpuInstanceProfile, MigState, VgpuType
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
    first; ``None`` in the policy: every MIG-backed type the GPU offers)."""
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
        if (t.max_per_instance or 1) > 1 and prof.id not in out:
            warnings.append(f"GPU {gpu.address}: {t.short_name} is offered one per GPU instance ({prof.name}): "
                            f"DRA does not yet publish the {t.max_per_instance} an instance can share")
        out.setdefault(prof.id, t)
    return out


def add_mig_gpu(pool: Pool, gpu: Gpu, pol: GpuPolicy, common: dict[str, AttrValue]) -> None:
    """The counter set and devices of a GPU in MIG mode (see the module docstring)."""
    mig = gpu.mig
    assert mig is not None and mig.enabled
    if not mig.profiles:
        pool.warnings.append(f"GPU {gpu.address}: in MIG mode but NVML lists no GPU-instance profile; not offered")
        return
    cs = counter_set_name(gpu.index)
    counters = gpu_counters(mig)
    offered = mig_types(gpu, pol, pool.warnings)
    if not offered and not pol.passthrough:
        return
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
            pool.devices.append(PoolDevice(
                name=mig_device_name(gpu.index, prof.name, prof.id, pl.start), kind="vgpu", gpu=gpu.address,
                type_id=t.id, gpu_instance_profile=prof.id, placement=pl, profile_instances=prof.instances,
                attributes={**attrs, ATTR_PLACEMENT_START: attr_int(pl.start), ATTR_PLACEMENT_SIZE: attr_int(pl.size)},
                capacity=dict(cap),
                consumes=[Consumption(counter_set=cs, counters=profile_consumption(prof, pl.start, pl.size))]))
