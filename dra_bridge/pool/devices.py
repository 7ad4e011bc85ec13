"""The DRA device model of a node: which devices to publish and what they consume.

Pure functions, no I/O. :func:`build_pool` turns the node :class:`~mdev_manager.models.Inventory`
and a :class:`PoolPolicy` into a :class:`Pool`: one counter set per physical GPU and the devices
(whole-GPU passthrough, one device per possible vGPU instance) that consume it. The counters are
chosen so that every combination of devices the scheduler can pick is creatable on the GPU
(see ``schema.md`` next to this file for the reasoning). :mod:`dra_bridge.pool.slices` turns a pool
into ResourceSlice objects for a given API server version.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from dra_bridge.api.attributes import (
    ATTR_ARCHITECTURE,
    ATTR_DEVICE_ID,
    ATTR_FRAMEWORK,
    ATTR_GPU_INDEX,
    ATTR_NUMA_NODE,
    ATTR_PARENT_PCI_BUS_ID,
    ATTR_PRODUCT_NAME,
    ATTR_PROFILE,
    ATTR_SERIES,
    ATTR_TYPE,
    ATTR_TYPE_ID,
    ATTR_TYPE_NAME,
    ATTR_VENDOR_ID,
    ATTR_VGPU_TYPES,
)
from dra_bridge.api.compat import COMPATIBILITY_GROUPS_SINCE, OLDEST
from dra_bridge.api.k8sname import dns_safe, is_dns_subdomain
from dra_bridge.api.names import (
    DEFAULT_DRIVER,
    compatibility_group,
    counter_set_name,
    passthrough_device_name,
    type_is_mig_backed,
    vgpu_device_name,
)
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.dualmode import in_mig_mode, merge_modes, mig_policy, time_sliced_policy
from dra_bridge.pool.mig import add_mig_gpu
from dra_bridge.pool.mixed import add_mixed_gpu, mixed_slot_map
from dra_bridge.pool.model import (  # noqa: F401  re-exported: the pool's data is read from here
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    SERIES_ORDER,
    AttrKey,
    AttrValue,
    Consumption,
    CounterSet,
    GpuPolicy,
    Pool,
    PoolDevice,
    PoolPolicy,
    _hex_id,
    _is_nvidia,
    attr_bool,
    attr_int,
    attr_string,
    attr_version,
    format_kib,
    format_mib,
    gpu_framebuffer_mib,
    gpu_vgpu_limit,
    nvidia_architecture,
    type_framebuffer_mib,
    type_max_instances,
    vgpu_types_attr,
)
from mdev_manager.models import Gpu, Inventory, VgpuType
from mdev_manager.names import short_type_name, type_series

# --------------------------------------------------------------------------- build


def build_pool(
    inventory: Inventory,
    policy: PoolPolicy,
    driver: str = DEFAULT_DRIVER,
    *,
    server_version: tuple[int, int] | None = None,
    pcie_roots: dict[str, str] | None = None,
    binding_conditions: bool = False,
    first_allocation_sizes: bool = False,
) -> Pool:
    """The devices and counter sets to publish for ``inventory`` under ``policy``.

    ``server_version`` is the API server's (major, minor); None is treated as the oldest
    supported server (no compatibility groups), the safe choice. ``pcie_roots`` maps a GPU's
    PCI address to its PCIe root (``pci0000:40``) for the standard ``pcieRoot`` attribute.
    ``binding_conditions``: the server keeps KEP-5007 binding conditions, so where it has no
    compatibility groups an empty GPU still offers every size, each vGPU device bound only once
    the agent confirmed its size (:mod:`dra_bridge.agent.binder`). ``first_allocation_sizes``
    (opt-in, servers without groups or binding conditions): an empty GPU offers every size with no
    conditions and the agent republishes it with the size of its first allocation as soon as it sees
    it; allocations of another size made before that fail at prepare (``benchmarks/bench_race.py``
    measures the window).
    """
    if not is_dns_subdomain(driver) or len(driver) > 63:
        raise ValueError(f"driver: {driver!r} is not a DNS subdomain of at most 63 characters")
    version = (server_version[0], server_version[1]) if server_version else OLDEST
    groups_supported = version >= COMPATIBILITY_GROUPS_SINCE
    roots = {k.lower(): v for k, v in (pcie_roots or {}).items()}

    pool = Pool()
    seen_index: dict[int, str] = {}
    for addr in policy.gpus:
        if inventory.gpu(addr) is None:
            pool.warnings.append(f"policy names GPU {addr}, which is not on this node")
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if gpu.index in seen_index:
            raise ValueError(f"GPUs {seen_index[gpu.index]} and {gpu.address} share index {gpu.index}")
        seen_index[gpu.index] = gpu.address
        pol = policy.for_gpu(gpu.address)
        if pol is None:
            continue
        _add_gpu(pool, gpu, pol, groups_supported, roots.get(gpu.address.lower()), version=version,
                 binding=binding_conditions and not groups_supported, driver=driver,
                 unbound=first_allocation_sizes and not groups_supported and not binding_conditions)

    dup = {n for n, k in Counter(d.name for d in pool.devices).items() if k > 1}
    if dup:  # cannot happen with distinct GPU indices; a guard for future edits
        raise ValueError(f"duplicate device names: {sorted(dup)}")
    return pool


def _select_types(gpu: Gpu, pol: GpuPolicy, warnings: list[str]) -> list[VgpuType]:
    if pol.vgpu_types is None:
        return [t for t in gpu.types if not type_is_mig_backed(t)]
    out: list[VgpuType] = []
    for ref in pol.vgpu_types:
        t = gpu.type_by_ref(ref)
        if t is None:
            warnings.append(f"GPU {gpu.address}: type {ref!r} is not offered by this GPU; skipped")
        elif type_is_mig_backed(t):
            warnings.append(f"GPU {gpu.address}: {t.short_name} is MIG-backed: offered while the GPU is in MIG mode "
                            "(migMode: true or auto in the layout); skipped")
        elif t not in out:
            out.append(t)
    return out


def _equal_size_choice(
    gpu: Gpu, pol: GpuPolicy, types: list[VgpuType], warnings: list[str]
) -> int | None:
    """The one framebuffer size to publish on servers without compatibility groups.

    Order: the configured ``equal_size_fb_mib``; else the size of the vGPUs already on the GPU;
    else (empty GPU, nothing configured) the smallest offered size, the one with the most
    instances. None means: publish no vGPU of this GPU.
    """
    by_id = {t.id: t for t in gpu.types}
    held_sizes = {type_framebuffer_mib(by_id[v.type_id]) if v.type_id in by_id else None for v in gpu.vgpus}
    if None in held_sizes:
        warnings.append(f"GPU {gpu.address}: a present vGPU has a type of unknown size")
    existing = {s for s in held_sizes if s is not None}
    if len(existing) > 1:
        warnings.append(
            f"GPU {gpu.address}: present vGPUs have sizes {sorted(existing)} MiB although the GPU is "
            "not in mixed-size mode; no vGPU published"
        )
        return None
    present = next(iter(existing), None)
    if pol.equal_size_fb_mib is not None:
        if present is not None and present != pol.equal_size_fb_mib:
            warnings.append(
                f"GPU {gpu.address}: configured for {pol.equal_size_fb_mib} MiB vGPUs but holds "
                f"{present} MiB vGPUs; no vGPU published until they agree"
            )
            return None
        return pol.equal_size_fb_mib
    if present is not None:
        return present
    sizes = [fb for t in types if (fb := type_framebuffer_mib(t))]
    return min(sizes) if sizes else None


def _add_gpu(pool: Pool, gpu: Gpu, pol: GpuPolicy, groups_supported: bool, pcie_root: str | None, *,
             version: tuple[int, int] = OLDEST, binding: bool = False, driver: str = DEFAULT_DRIVER,
             unbound: bool = False) -> None:
    if pol.mig_auto and groups_supported and gpu.mig is not None and gpu.mig.profiles:
        sliced, mig = Pool(), Pool()  # both modes, merged onto one counter set (dualmode.py)
        _add_time_sliced(sliced, gpu, time_sliced_policy(gpu, pol), True, pcie_root)
        add_mig_gpu(mig, in_mig_mode(gpu), mig_policy(gpu, pol), _common_attributes(gpu, pcie_root), share=False)
        merge_modes(pool, gpu, sliced, mig)
        return
    if gpu.mig is not None and gpu.mig.enabled:
        add_mig_gpu(pool, gpu, pol, _common_attributes(gpu, pcie_root))
        return
    if pol.mixed_size and _is_nvidia(gpu) and (smap := mixed_slot_map(gpu)) is not None:
        add_mixed_gpu(pool, gpu, pol, _select_types(gpu, pol, pool.warnings), smap, _common_attributes(gpu, pcie_root),
                      version)  # every size at its placements, kept apart by the slots' counters (mixed.py)
        return
    _add_time_sliced(pool, gpu, pol, groups_supported, pcie_root, binding=binding, driver=driver, unbound=unbound)


def _add_time_sliced(pool: Pool, gpu: Gpu, pol: GpuPolicy, groups_supported: bool, pcie_root: str | None, *,
                     binding: bool = False, driver: str = DEFAULT_DRIVER, unbound: bool = False) -> None:
    warnings = pool.warnings
    total_fb = gpu_framebuffer_mib(gpu)
    equal_size = _is_nvidia(gpu) and not pol.mixed_size

    # --- which types, and how many of each
    offered: list[tuple[VgpuType, int, int | None]] = []  # (type, max instances, fb MiB)
    types = _select_types(gpu, pol, warnings)
    # every size of an empty GPU, each vGPU bound only once the agent confirmed its size (KEP-5007)
    bind_sizes = (binding or unbound) and equal_size and not gpu.vgpus and pol.equal_size_fb_mib is None and \
        len({type_framebuffer_mib(t) for t in types}) > 1
    if equal_size and not groups_supported and types and not bind_sizes:
        size = _equal_size_choice(gpu, pol, types, warnings)
        kept = [t for t in types if type_framebuffer_mib(t) == size]
        if size is not None and not kept:
            warnings.append(f"GPU {gpu.address}: no offered type has {size} MiB of framebuffer; no vGPU published")
        types = kept
    by_id, theirs = {t.id: t for t in gpu.types}, set(pol.outside_vgpus)
    outside = [by_id.get(v.type_id) for v in gpu.vgpus if v.id in theirs]
    if equal_size and groups_supported and outside:  # no allocation shows their size to the scheduler
        held = {type_framebuffer_mib(t) if t else None for t in outside}
        types = [t for t in types if type_framebuffer_mib(t) in held] if len(held) == 1 and None not in held else []
    for t in types:
        n = type_max_instances(t, total_fb)
        fb = type_framebuffer_mib(t)
        if not n:
            warnings.append(f"GPU {gpu.address}: {t.short_name} has no known instance limit; skipped")
            continue
        if equal_size and groups_supported and fb is None:
            warnings.append(f"GPU {gpu.address}: {t.short_name} has no known framebuffer size; skipped")
            continue
        offered.append((t, n, fb))
    if not offered and not pol.passthrough:
        return

    # --- the counter set. The rule to enforce (any mix of types the scheduler picks must be
    # creatable): sum over types of count / max_instances <= 1. Each vGPU consumes
    # total / max_instances of one counter; the total is rounded down to a multiple of the lcm
    # of the max instances so that every share is exact (a no-op for every real board).
    cs = counter_set_name(gpu.index)
    lcm = math.lcm(*(n for _, n, _ in offered)) if offered else 1
    counters: dict[str, int | str] = {}
    share_counter: str
    fmt: Callable[[int], str]
    if total_fb:
        share_counter = "memory"
        total_units = (total_fb * 1024) // lcm * lcm  # KiB
        if total_units == 0:
            raise ValueError(f"GPU {gpu.address}: framebuffer {total_fb} MiB cannot be shared {lcm} ways")
        if total_units != total_fb * 1024:
            warnings.append(
                f"GPU {gpu.address}: memory counter rounded down to {format_kib(total_units)} so that every "
                "type's share is exact"
            )
        counters["memory"] = format_kib(total_units)
        fmt = format_kib
    else:  # framebuffer unknown (e.g. Intel GVT-g): a unitless share counter enforces the same rule
        share_counter = "share"
        total_units = lcm
        counters["share"] = lcm
        fmt = str
    vgpu_limit = gpu_vgpu_limit(gpu)
    counters["vgpus"] = vgpu_limit
    left = (total_units, vgpu_limit)
    if outside:
        left = _take_outside(counters, share_counter, total_units, vgpu_limit, outside, total_fb, fmt)
        pool.warnings.append(f"GPU {gpu.address}: {len(outside)} vGPU(s) no claim holds take their room from the "
                             "claims (remove them, or let the layout do so once they are free)")
    pool.counter_sets.append(CounterSet(name=cs, counters=counters))

    common = _common_attributes(gpu, pcie_root)

    # --- passthrough: consumes the whole set, so it never co-allocates with a vGPU of this GPU
    if pol.passthrough and not outside:  # a GPU holding vGPUs cannot be passed through
        attrs: dict[str, AttrValue] = {
            ATTR_TYPE: attr_string("passthrough"),
            ATTR_PROFILE: attr_string(gpu.model),
            ATTR_FRAMEWORK: attr_string("vfio-pci"),
            **common,
            ATTR_PCI_BUS_ID: attr_string(gpu.address),
        }
        cap = {"memory": format_mib(total_fb)} if total_fb else {}
        pool.devices.append(
            PoolDevice(
                name=passthrough_device_name(gpu.index),
                attributes=attrs,
                capacity=cap,
                consumes=[
                    Consumption(
                        counter_set=cs,
                        counters={share_counter: fmt(total_units), "vgpus": str(vgpu_limit)},
                    )
                ],
                gpu=gpu.address,
                kind="passthrough",
            )
        )

    # --- vGPUs: one device per size slot (framebuffer size x instance index), each consuming a fair
    # share; the types of one size and instance limit (A, B, C, Q series) share the slots, the claim's
    # opaque config choosing the type (else the slot's default, its `profile`)
    slots = size_slots(offered)
    for slot in slots:
        t, n, fb = slot[0]
        if total_units // n > left[0] or left[1] < 1:
            continue  # no room left for this size beside the vGPUs no claim holds
        middle = slot_name(slot, slots)
        # sizes kept apart by groups (1.37+), or by the agent's binding conditions (bind_sizes)
        groups = [compatibility_group(fb)] if equal_size and fb and not bind_sizes else []
        attrs = {
            ATTR_TYPE: attr_string("vgpu"),
            ATTR_PROFILE: attr_string(t.short_name or short_type_name(t.name)),
            ATTR_TYPE_NAME: attr_string(t.name),
            ATTR_TYPE_ID: attr_string(t.id),
            ATTR_FRAMEWORK: attr_string(t.framework),
            ATTR_VGPU_TYPES: attr_string(vgpu_types_attr(x for x, _, _ in slot)),
            **common,
            ATTR_PARENT_PCI_BUS_ID: attr_string(gpu.address),
        }
        if (series := type_series(t.name)) is not None:
            attrs[ATTR_SERIES] = attr_string(series)
        cap = {"memory": format_mib(fb)} if fb else {}
        consumption = Consumption(
            counter_set=cs,
            counters={share_counter: fmt(total_units // n), "vgpus": "1"},
            compatibility_groups=groups,
        )
        choices = {x.short_name: x.id for x, _, _ in slot}
        conditions = binding_conditions(driver) if bind_sizes and binding else ([], [])
        first = PoolDevice(
            name=vgpu_device_name(gpu.index, middle, 0),
            attributes=attrs,
            capacity=cap,
            consumes=[consumption],
            gpu=gpu.address,
            kind="vgpu",
            type_id=t.id,
            type_choices=choices,
            binding_conditions=conditions[0],
            binding_failure_conditions=conditions[1],
        )
        pool.devices += renamed(first, [vgpu_device_name(gpu.index, middle, k) for k in range(n)])


def _take_outside(counters: dict[str, int | str], share_counter: str, total_units: int, vgpu_limit: int,
                  outside: list[VgpuType | None], total_fb: int | None, fmt: Callable[[int], str]) -> tuple[int, int]:
    """Take the share of each vGPU no claim holds (``outside``) from the GPU's counter set, as an
    allocated slot of its type consumes it (rounded up; a type of unknown limit takes everything), so
    what the counters leave is what claims can still get; (share, vGPUs) left, never below zero. A
    device that consumes more than that is left out (it could never be allocated)."""
    share, vgpus = total_units, vgpu_limit
    for t in outside:
        n = type_max_instances(t, total_fb) if t is not None else None
        share -= -(-total_units // n) if n else total_units
        vgpus -= 1
    counters[share_counter] = fmt(max(0, share))
    counters["vgpus"] = max(0, vgpus)
    return max(0, share), max(0, vgpus)


def renamed(first: PoolDevice, names: list[str]) -> list[PoolDevice]:
    """``first`` under each of ``names``, the copies sharing its (validated) values and field set.

    A slot's devices differ by name only, and a large node has thousands, built again at every full
    resync (bench-large: 1,744, 9.8 MB as separate models, 2.1 MB shared: #37's memory bound). Sharing
    is safe because nothing changes a pool's device in place: the pool's later steps (health, cordon,
    the safe shape, dual mode) make copies with ``model_copy`` or assign a new value to one device."""
    fields = first.model_fields_set
    values = first.__dict__
    return [first if name == first.name else PoolDevice.model_construct(fields, **{**values, "name": name})
            for name in names]


def binding_conditions(driver: str) -> tuple[list[str], list[str]]:
    """(bindingConditions, bindingFailureConditions) of a vGPU slot whose size the agent confirms."""
    return [f"{driver}/{SIZE_ASSIGNED}"], [f"{driver}/{SIZE_CONFLICT}"]


#: The condition types the agent sets on a slot's allocation (claim ``status.devices[].conditions``).
SIZE_ASSIGNED = "SizeAssigned"
SIZE_CONFLICT = "SizeConflict"


def size_slots(offered: list[tuple[VgpuType, int, int | None]]) -> list[list[tuple[VgpuType, int, int | None]]]:
    """The offered types grouped into slots: one group per (framebuffer size, instance limit), in
    the order the sizes first appear, each group's default type first (series Q, C, B, A). A type of
    unknown size stays alone, and a group whose ``vgpuTypes`` attribute would pass the 64-byte
    limit of a string attribute is split (a selector must find every name whole)."""
    groups: dict[tuple, list] = {}
    for entry in offered:
        t, n, fb = entry
        key = (fb, n) if fb else ("type", t.id)
        groups.setdefault(key, []).append(entry)
    out = []
    for members in groups.values():
        members = sorted(members, key=lambda e: (SERIES_ORDER.get(type_series(e[0].name) or "", 9), members.index(e)))
        chunk: list = []
        for e in members:
            if chunk and len(vgpu_types_attr(x for x, _, _ in chunk + [e]).encode()) > 64:
                out.append(chunk)
                chunk = []
            chunk.append(e)
        out.append(chunk)
    return out


def slot_name(slot: list, slots: list[list]) -> str:
    """The middle of a slot's device names: its size (``2gb``, ``512mb``) when no other slot of the
    GPU has that size; else the default type's short name (with its id if that repeats too)."""
    t, _, fb = slot[0]
    if fb and sum(1 for other in slots if other[0][2] == fb) == 1:
        return f"{fb // 1024}gb" if fb % 1024 == 0 else f"{fb}mb"
    part = dns_safe(t.short_name or short_type_name(t.name))
    same = [o for o in slots if dns_safe(o[0][0].short_name or short_type_name(o[0][0].name)) == part]
    return part if len(same) == 1 else f"{part}-{dns_safe(t.id)}"


def _common_attributes(gpu: Gpu, pcie_root: str | None) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {
        ATTR_PRODUCT_NAME: attr_string(gpu.model),
        ATTR_VENDOR_ID: attr_string(_hex_id(gpu.vendor_id)),
        ATTR_DEVICE_ID: attr_string(_hex_id(gpu.device_id)),
        ATTR_GPU_INDEX: attr_int(gpu.index),
    }
    if arch := nvidia_architecture(gpu.vendor_id, gpu.model):
        attrs[ATTR_ARCHITECTURE] = attr_string(arch)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[ATTR_NUMA_NODE] = attr_int(gpu.numa_node)
    if pcie_root:
        attrs[ATTR_PCIE_ROOT] = attr_string(pcie_root)
    return attrs


# --------------------------------------------------------------------------- scheduler model


def co_allocatable(pool: Pool, device_names: Iterable[str], *, compatibility_groups: bool = True) -> bool:
    """Whether the scheduler may allocate all of ``device_names`` at once (each at most once).

    Mirrors the scheduler's rules for partitionable devices: per counter set, the summed
    consumption of every counter stays within the set; with ``compatibility_groups`` (1.37+),
    the group lists of the devices consuming one set must share a name, or all be empty.
    """
    names = list(device_names)
    wanted = set(names)
    if len(wanted) != len(names):
        return False
    devices = [d for d in pool.devices if d.name in wanted]
    if len(devices) != len(wanted):
        raise KeyError(sorted(wanted - {d.name for d in devices}))
    used: dict[str, dict[str, Fraction]] = {}
    groups: dict[str, list[frozenset[str]]] = {}
    for dev in devices:
        for c in dev.consumes:
            per = used.setdefault(c.counter_set, {})
            for counter, q in c.counters.items():
                per[counter] = per.get(counter, Fraction(0)) + parse_quantity(q)
            groups.setdefault(c.counter_set, []).append(frozenset(c.compatibility_groups))
    for set_name, per in used.items():
        cs = pool.counter_set(set_name)
        if cs is None:
            return False
        for counter, amount in per.items():
            if counter not in cs.counters or amount > parse_quantity(cs.counters[counter]):
                return False
    if compatibility_groups:
        for lists in groups.values():
            if len(lists) < 2:
                continue
            if all(not g for g in lists):
                continue
            if any(not g for g in lists) or not frozenset.intersection(*lists):
                return False
    return True


def device_summary(dev: PoolDevice) -> dict[str, Any]:
    """A short, log-friendly view of a device."""
    return {
        "name": dev.name,
        "kind": dev.kind,
        "gpu": dev.gpu,
        "type": dev.type_id,
        "consumes": {c.counter_set: c.counters for c in dev.consumes},
    }
