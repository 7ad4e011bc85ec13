"""A layout entry checked against the GPU it selects, before any step: the types it names exist
there and fit (counts, sizes, MIG placements, VFs), and no foreign driver holds the GPU. Pure.

Every problem names the entry's field as the file writes it; one type missing on many GPUs is
said once.
"""

from __future__ import annotations

from mdev_manager.config import ConfigError, GpuLayout, did_you_mean_type
from mdev_manager.migplan import check_mig_layout
from mdev_manager.models import Gpu, Usage, VgpuType, occupancy
from mdev_manager.offers import NVIDIA, gpu_label, native_driver, offered_types, resolve_type
from mdev_manager.placeplan import board_name, check_mixed_layout, refused, slot_map


def _mixed_hint(entry: GpuLayout) -> str:
    if entry.field_name("mixed_size"):
        return "add mixedSize: true: vgpuctl then switches the GPU to mixed-size mode and places each vGPU"
    return ("vgpu-device-manager's format cannot declare mixed-size mode; for a GPU switched to it, "
            "write this entry as a vgpuctl/v1 layout with mixedSize: true")


class _UnknownType(str):
    """A layout entry's type that a GPU does not offer: one problem per GPU, merged per field by
    :func:`once_per_field` (an entry selecting 7 GPUs says it once)."""

    field: str
    ref: str
    gpu: Gpu
    offers: str

    def __new__(cls, text: str, *, field: str, ref: str, gpu: Gpu, offers: str) -> _UnknownType:
        self = super().__new__(cls, text)
        self.field, self.ref, self.gpu, self.offers = field, ref, gpu, offers
        return self


def once_per_field(problems: list[str], selects: dict[str, int] | None = None) -> list[str]:
    """An unknown type selected on several GPUs, in one line: the GPUs grouped by what they offer.
    ``selects``: how many GPUs each entry (its ``vgpus`` field) selects, to say how many of them lack it."""
    groups: dict[tuple[str, str], list[_UnknownType]] = {}
    for p in problems:
        if isinstance(p, _UnknownType):
            groups.setdefault((p.field, p.ref), []).append(p)
    out: list[str] = []
    for p in problems:
        if not isinstance(p, _UnknownType):
            out.append(p)
            continue
        group = groups.pop((p.field, p.ref), None)
        if group is None:
            continue  # said with its group
        if len(group) == 1:
            out.append(str(p))
            continue
        by_offer: dict[str, list[Gpu]] = {}
        for q in group:
            by_offer.setdefault(q.offers, []).append(q.gpu)
        parts = [f"GPU {', '.join(str(g.index) for g in gpus)} ({', '.join(dict.fromkeys(g.model for g in gpus))}) "
                 f"offer{'s' if len(gpus) == 1 else ''} {offers}" for offers, gpus in by_offer.items()]
        total = (selects or {}).get(p.field[:-len(p.ref) - 1], len(group))
        lack = (f"none of the {len(group)} GPUs this entry selects offers" if total <= len(group) else
                f"{len(group)} of the {total} GPUs this entry selects offer no")
        out.append(f"{p.field}: {lack} vGPU type {p.ref!r}" + (f" (the other {total - len(group)} do)"
                                                                if total > len(group) else "") + ": " + "; ".join(parts))
    return out


def validate_layout(gpu: Gpu, entry: GpuLayout, i: int) -> dict[str, int]:
    """Type id -> count for a vgpu/dra entry, or a list of problems naming the field."""
    types = offered_types(gpu)
    problems: list[str] = []
    wanted: dict[str, tuple[VgpuType, int]] = {}
    for ref, count in entry.vgpus.items():
        t = resolve_type(types, ref)
        field = f"{entry.at(i, 'vgpus')}.{ref}"
        if t is None:
            usable = [t.short_name for t in types if not t.mig_backed or gpu.mig is not None]
            names = ", ".join(usable) or "none (not a vGPU-capable GPU)"
            close = did_you_mean_type(ref, usable)
            problems.append(_UnknownType(f"{field}: {gpu_label(gpu)} offers no vGPU type {ref!r}; it offers {names}{close}",
                                         field=field, ref=str(ref), gpu=gpu, offers=f"{names}{close}"))
            continue
        if t.mig_backed and entry.mode == "dra" and not entry.mig_mode:
            problems.append(f"{field}: {t.name} is MIG-backed; a dra GPU offers MIG-backed types in MIG mode "
                            "only: add migMode: true (or auto) to this entry")
            continue
        if not t.mig_backed and entry.mode == "dra" and entry.mig_mode is True:
            problems.append(f"{field}: {t.name} is time-sliced; a GPU in MIG mode (migMode: true) offers "
                            "MIG-backed types only")
            continue
        if t.id in wanted:
            problems.append(f"{field}: names the same type as another key ({t.name}); list each type once")
            continue
        if t.max_instances is not None and count > t.max_instances:
            problems.append(f"{field}: {count} is more than the {t.max_instances} {t.short_name} vGPUs {gpu_label(gpu)} holds")
            continue
        wanted[t.id] = (t, count)
    active = [(t, n) for t, n in wanted.values() if n > 0]
    if any(t.mig_backed for t, _ in active):  # GPU instances, not shares: placements decide what fits
        if entry.mode == "vgpu":  # a dra entry's keys name what is offered; claims take the placements
            problems += check_mig_layout(gpu, active, entry.at(i, "vgpus"), gpu_label(gpu))
        if entry.mixed_size:
            problems.append(f"{entry.at(i, 'mixed_size')}: mixed-size mode places time-sliced vGPUs; this entry "
                            "holds MIG-backed ones (GPU instances are placed by MIG)")
        active = []
    if entry.mixed_size and entry.mig_mode is True:
        problems.append(f"{entry.at(i, 'mixed_size')}: a GPU in MIG mode (migMode: true) has no mixed-size mode")
    sizes = sorted({t.framebuffer_mib for t, _ in active if t.framebuffer_mib})
    placed = (entry.mixed_size or gpu.mixed_size is True) and gpu.vendor_id == NVIDIA
    smap = slot_map(gpu, types) if placed else None
    if entry.mixed_size and gpu.vendor_id == NVIDIA and smap is None:
        problems.append(f"{entry.at(i, 'mixed_size')}: {refused(gpu, gpu_label(gpu))}")
    elif len(sizes) > 1 and not entry.mixed_size and gpu.vendor_id == NVIDIA:
        detail = ", ".join(f"{t.short_name} ({t.framebuffer_mib} MiB)" for t, _ in active)
        mode = ("runs in mixed-size mode, but a reboot clears that: a layout mixing sizes declares it" if gpu.mixed_size
                else "is in equal-size mode and holds one framebuffer size")
        hint = _mixed_hint(entry) if slot_map(gpu, types) is not None else (  # only a fix that works
            f"board {board_name(gpu)} has no known mixed-size placement table, so no mixed-size mode: "
            "give the GPU vGPUs of one size")
        problems.append(f"{entry.at(i, 'vgpus')}: {gpu_label(gpu)} {mode}; this layout mixes {detail} ({hint})")
    elif smap is not None:
        if entry.mode == "vgpu":
            problems += check_mixed_layout(smap, active, entry.at(i, "vgpus"), gpu_label(gpu))
    elif entry.mode == "vgpu" and occupancy(active) > 1:
        detail = " + ".join(f"{n} x {t.short_name} (max {t.max_instances})" for t, n in active)
        problems.append(f"{entry.at(i, 'vgpus')}: {detail} is more than {gpu_label(gpu)} holds")
    total = sum(n for _, n in wanted.values() if n > 0)
    vf_bound = gpu.sriov_total_vfs if gpu.framework != "mdev" else 0
    if entry.mode == "vgpu" and vf_bound and total > vf_bound:
        problems.append(f"{entry.at(i, 'vgpus')}: {total} vGPUs need {total} VFs; {gpu_label(gpu)} has {vf_bound}")
    if problems:
        raise ConfigError(problems)
    return {tid: n for tid, (t, n) in wanted.items()}


def workload_conflicts(gpu: Gpu, entry: GpuLayout, usage: Usage, i: int) -> list[str]:
    """A GPU held by a workload in another form cannot change form under it."""
    out = []
    where = entry.at(i, "mode")
    # A GPU a workload holds in another form (passed through, or vGPUs in use) is not a layout
    # error: the layout is reached once the workload lets go (a "converging" node, blocked_by_use).
    # A foreign driver is one: vgpuctl never unbinds a driver it does not manage.
    if entry.mode in ("vgpu", "dra"):
        native = native_driver(gpu)
        if gpu.driver not in (None, "vfio-pci", native):
            out.append(f"{where}: {gpu_label(gpu)} is bound to {gpu.driver}, not {native}; "
                       "unbind it or mark the GPU unmanaged")
    return out
